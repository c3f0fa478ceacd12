package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/drover/drover/api"
	"github.com/go-resty/resty/v2"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/drover/drover/agent/apply"
	"github.com/drover/drover/internal/atomicfile"
	"github.com/drover/drover/manifest"
	agentpb "github.com/drover/drover/proto"
	"github.com/drover/drover/signing"
)

// SyncResult is the outcome of one sync.
type SyncResult struct {
	At          time.Time `json:"at"`
	Outcome     string    `json:"outcome"` // applied | unchanged | rejected | apply_failed | error
	Serial      uint64    `json:"serial,omitempty"`
	Error       string    `json:"error,omitempty"`
	NotModified bool      `json:"not_modified,omitempty"`
	// Expired: the manifest in force has expired (see ManifestStatus's
	// manifest_expired); the sync loop retries within expiredRetryMax.
	Expired bool `json:"expired,omitempty"`
	// FromStream: the manifest came on the stream with SyncNow (no poll).
	FromStream bool `json:"from_stream,omitempty"`
}

// Sync outcomes.
const (
	OutcomeApplied     = "applied"
	OutcomeUnchanged   = "unchanged"
	OutcomeRejected    = "rejected"
	OutcomeApplyFailed = "apply_failed"
	OutcomeError       = "error"
	OutcomeNone        = "none" // the server has no manifest for this agent yet
)

// payloadDir holds verified payloads by digest, so unchanged pipes are not
// downloaded again and the stored manifest can be applied offline.
const payloadDir = "payloads"

// rejection is a manifest that failed verification: it changes nothing and
// is reported.
type rejection struct{ err error }

func (r *rejection) Error() string { return r.err.Error() }
func (r *rejection) Unwrap() error { return r.err }

// expiredRetryMax caps the retry delay while the manifest in force is
// expired: "retried hard".
const expiredRetryMax = 15 * time.Second

// aliveEvery is how often the sync loop marks itself alive while it waits
// for the next poll, so that the watchdog's bound (watchdogLoop) does not
// grow with sync_interval_streaming.
const aliveEvery = time.Minute

// syncLoop pulls the manifest every interval (with jitter), at once when
// asked, and with backoff after errors, until ctx is done. The interval is
// sync_interval while the stream is down and sync_interval_streaming while
// it is up: the stream's SyncNow announces every change (and the server
// sends one after a reconnect's Hello, or two heartbeats, that show the
// agent behind), so the interval poll is the backstop, and a fleet at rest
// holds one socket per agent (the poll connection closes after
// pollIdleTimeout). When the stream
// comes up or goes down during a wait, the wait is measured again from the
// last poll with the other interval.
func (a *Agent) syncLoop(ctx context.Context) {
	bo := newBackoff(time.Second, a.cfg.MaxBackoff)
	var waiting []chan SyncResult
	for {
		a.markAlive()
		res := a.syncOnce(ctx)
		if ctx.Err() != nil {
			return
		}
		for _, w := range waiting {
			w <- res
		}
		waiting = nil
		done := time.Now()
		failed := res.Outcome == OutcomeError
		var d time.Duration
		f := jitterFactor(0.1)
		if failed {
			d = bo.next()
			if res.Expired {
				d = min(d, expiredRetryMax)
			}
			a.log.Warn("sync failed; retrying", "err", res.Error, "retry_in", d.Round(time.Millisecond))
		} else {
			bo.reset()
			d = scaled(a.cfg.pollInterval(a.streamConnected()), f)
		}
		t := time.NewTimer(d)
		alive := time.NewTicker(aliveEvery)
	wait:
		for {
			select {
			case <-ctx.Done():
				t.Stop()
				alive.Stop()
				return
			case <-alive.C:
				a.markAlive()
			case w := <-a.syncReq:
				waiting = append(waiting, w)
				break wait
			case <-a.streamChanged:
				if failed {
					continue
				}
				// The interval changed with the stream: the same jitter,
				// from the same poll.
				t.Stop()
				next := scaled(a.cfg.pollInterval(a.streamConnected()), f)
				t = time.NewTimer(max(0, time.Until(done.Add(next))))
			case <-t.C:
				break wait
			}
		}
		t.Stop()
		alive.Stop()
		// Coalesce requests that arrived together.
		for more := true; more; {
			select {
			case w := <-a.syncReq:
				waiting = append(waiting, w)
			default:
				more = false
			}
		}
	}
}

// RequestSync asks the sync loop to pull at once; the result is sent on the
// returned channel (buffered).
func (a *Agent) RequestSync() <-chan SyncResult {
	ch := make(chan SyncResult, 1)
	select {
	case a.syncReq <- ch:
	default:
		// Enough requests are queued; they all trigger the same pull.
		go func() { a.syncReq <- ch }()
	}
	return ch
}

// syncOnce runs one sync and records its result for status.
func (a *Agent) syncOnce(ctx context.Context) SyncResult {
	res := a.doSync(ctx)
	res.At = time.Now()
	a.mu.Lock()
	a.lastSync = res.At
	a.lastSyncErr = res.Error
	a.mu.Unlock()
	return res
}

// pushedManifest is a manifest the server sent on the stream with SyncNow,
// not yet looked at: the exact body a poll's 200 would carry, its ETag and
// the serial the server says it has (a hint; the envelope decides).
type pushedManifest struct {
	env    []byte
	etag   string
	serial uint64
}

// pushManifest keeps a manifest that came with a SyncNow for the next sync,
// after checking its sizes (the envelope is checked in full by the sync);
// it reports whether the manifest was kept. A later one replaces an
// earlier one unless its serial is lower.
func (a *Agent) pushManifest(sn *agentpb.SyncNow) bool {
	env, tag := sn.GetManifest(), sn.GetManifestEtag()
	if len(env) == 0 {
		return false
	}
	var problem string
	switch {
	case len(env) > agentpb.MaxSyncNowManifestBytes || len(env) > a.cfg.MaxManifestBytes:
		problem = fmt.Sprintf("sync_now.manifest: %d bytes, more than %d", len(env), min(agentpb.MaxSyncNowManifestBytes, a.cfg.MaxManifestBytes))
	case len(tag) > agentpb.MaxSyncNowManifestETag:
		problem = fmt.Sprintf("sync_now.manifest_etag: %d bytes, more than %d", len(tag), agentpb.MaxSyncNowManifestETag)
	case sn.GetManifestSerial() < sn.GetSerial():
		problem = fmt.Sprintf("sync_now.manifest_serial: %d is lower than the serial announced, %d", sn.GetManifestSerial(), sn.GetSerial())
	}
	if problem != "" {
		a.streamRefused.Add(1)
		a.log.Warn("the manifest on the stream is out of bounds; polling", "problem", problem)
		return false
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.pushed == nil || sn.GetManifestSerial() >= a.pushed.serial {
		a.pushed = &pushedManifest{env: env, etag: tag, serial: sn.GetManifestSerial()}
	}
	return true
}

// takePushed returns the manifest the stream brought and forgets it.
func (a *Agent) takePushed() *pushedManifest {
	a.mu.Lock()
	defer a.mu.Unlock()
	p := a.pushed
	a.pushed = nil
	return p
}

// doSync takes the manifest the stream brought, if any, and otherwise (or
// when that one is not usable) polls the server for it.
func (a *Agent) doSync(ctx context.Context) SyncResult {
	id := a.identity()
	if p := a.takePushed(); p != nil {
		if res, ok := a.syncPushed(ctx, id, p); ok {
			return res
		}
	}
	return a.poll(ctx, id)
}

// syncPushed takes a manifest that came on the stream exactly as a poll's
// answer: the ETag the agent holds is a 304, anything else goes through
// accept as a 200 does. It reports false when the manifest is not usable
// (it did not verify, or verifying needed the server and failed): it was
// logged and counted, and the caller polls at once. A verified manifest
// older than the one accepted is ignored (a SyncNow queued before a poll
// brought a newer one).
func (a *Agent) syncPushed(ctx context.Context, id *Identity, p *pushedManifest) (SyncResult, bool) {
	a.mu.Lock()
	held := a.etag
	a.mu.Unlock()
	if held != "" && p.etag == held {
		res := a.notModified(ctx)
		res.FromStream = true
		a.streamManifests.Add(1)
		return res, true
	}
	res, err := a.accept(ctx, id, p.env, p.etag, true)
	if err != nil {
		if errors.Is(err, signing.ErrRollback) {
			a.log.Info("ignoring an older manifest from the stream", "serial", p.serial)
			ms, _ := a.manifestState()
			return SyncResult{Outcome: OutcomeUnchanged, Serial: ms.Serial, FromStream: true}, true
		}
		a.streamRefused.Add(1)
		a.log.Warn("the manifest on the stream was not accepted; polling", "serial", p.serial, "err", err)
		return SyncResult{}, false
	}
	a.streamManifests.Add(1)
	res.FromStream = true
	return res, true
}

// poll gets the manifest from the server (If-None-Match: the ETag held)
// and accepts a 200's body.
func (a *Agent) poll(ctx context.Context, id *Identity) SyncResult {
	a.mu.Lock()
	etag := a.etag
	a.mu.Unlock()

	req := a.httpClient().R().SetContext(ctx).SetResponseBodyLimit(a.cfg.MaxManifestBytes).SetDoNotParseResponse(false)
	if etag != "" {
		req.SetHeader("If-None-Match", etag)
	}
	resp, err := req.Get(pathManifest)
	err = checkResponse(resp, err)
	a.noteAuth(err)
	if err != nil {
		var ae *api.Error
		switch {
		case errors.Is(err, resty.ErrResponseBodyTooLarge):
			rj := fmt.Errorf("manifest: %w: more than %d bytes", signing.ErrTooLarge, a.cfg.MaxManifestBytes)
			a.reportRejected(id, []byte("too large"), rj)
			return SyncResult{Outcome: OutcomeRejected, Error: rj.Error()}
		case errors.As(err, &ae) && ae.Status == 404 && ae.Code == api.CodeNotFound:
			// Enrolled, but the server has compiled no manifest yet.
			return SyncResult{Outcome: OutcomeNone}
		}
		return SyncResult{Outcome: OutcomeError, Error: fmt.Sprintf("get manifest: %v", err)}
	}
	if resp.StatusCode() == 304 {
		return a.notModified(ctx)
	}
	res, _ := a.accept(ctx, id, resp.Body(), resp.Header().Get("ETag"), false)
	return res
}

// accept is the one path of a new manifest envelope, however it came (a
// poll's 200, or a SyncNow that carried it): verify (signature first,
// against the trust root and key list held; serial and expiry rules), and
// when it is new fetch its payloads by digest and its secrets, store it
// and apply it; on success the ETag it came with is remembered for the
// next poll. From the stream (pushed), a manifest that does not verify is
// not reported as rejected: it is returned as an error, and the caller
// polls for the server's answer.
func (a *Agent) accept(ctx context.Context, id *Identity, env []byte, newTag string, pushed bool) (SyncResult, error) {
	acc, tr, err := a.verify(ctx, id, env)
	if err != nil {
		if pushed {
			return SyncResult{}, err
		}
		var rj *rejection
		if errors.As(err, &rj) {
			a.reportRejected(id, env, rj.err)
			return SyncResult{Outcome: OutcomeRejected, Error: rj.Error()}, nil
		}
		return SyncResult{Outcome: OutcomeError, Error: err.Error()}, nil
	}
	a.mu.Lock()
	inForce := a.current != nil && a.applyOK && acc.Digest == a.currentDigest
	a.mu.Unlock()
	if acc.Unchanged && inForce {
		res := a.reapply(ctx)
		if res.Outcome == OutcomeUnchanged {
			a.setETag(newTag)
		}
		return res, nil
	}

	payloads, err := a.fetchPayloads(ctx, acc.Manifest)
	if err != nil {
		var rj *rejection
		if errors.As(err, &rj) {
			a.reportRejected(id, env, rj.err)
			return SyncResult{Outcome: OutcomeRejected, Serial: acc.Manifest.Serial, Error: rj.Error()}, nil
		}
		return SyncResult{Outcome: OutcomeError, Error: err.Error()}, nil
	}
	secrets, err := a.fetchSecrets(ctx, acc.Manifest)
	if err != nil {
		return SyncResult{Outcome: OutcomeError, Error: err.Error()}, nil
	}
	if err := a.store.AcceptManifest(id.AgentID, env, acc.Manifest.Serial, acc.Digest, tr); err != nil {
		return SyncResult{Outcome: OutcomeError, Error: fmt.Sprintf("store manifest: %v", err)}, nil
	}
	a.mu.Lock()
	a.lastReject = ""
	a.mu.Unlock()
	res := a.apply(ctx, acc.Manifest, env, acc.Digest, payloads, secrets, true, false)
	if res.Outcome == OutcomeApplied {
		a.setETag(newTag)
		a.prunePayloads(acc.Manifest)
	}
	return res, nil
}

// notModified handles the server's 304: the manifest in force is applied
// again (drift), and reported frozen when it has expired.
func (a *Agent) notModified(ctx context.Context) SyncResult {
	a.mu.Lock()
	cur := a.current
	a.mu.Unlock()
	if cur == nil {
		// Nothing in force: forget the tag and pull in full next time.
		a.setETag("")
		return SyncResult{Outcome: OutcomeError, Error: "304 without a manifest in force"}
	}
	res := a.reapply(ctx)
	res.NotModified = true
	if now := time.Now(); !cur.ExpiresAt.IsZero() && !now.Before(cur.ExpiresAt) {
		// Freeze: nothing newer comes, and what is in force expired.
		// Its pipes keep running (a dead server must not stop the
		// fleet); it is reported, and the next pulls ask for the full
		// manifest, soon.
		a.setETag("")
		res.Outcome, res.Expired = OutcomeError, true
		res.Error = fmt.Sprintf("the manifest in force (serial %d) expired at %s and the server sends nothing newer (304)",
			cur.Serial, cur.ExpiresAt.UTC().Format(time.RFC3339))
		a.log.Error("manifest in force expired; its pipes keep running", "serial", cur.Serial, "expired_at", cur.ExpiresAt)
	}
	return res
}

func (a *Agent) setETag(tag string) {
	a.mu.Lock()
	a.etag = tag
	a.mu.Unlock()
}

// verify checks env with signing.AcceptManifest against the stored state.
// When the manifest names a newer key list (or the held one expired) the
// key list is refreshed from the server once; the returned trust root is
// then the refreshed one, to be stored with the manifest, else nil.
func (a *Agent) verify(ctx context.Context, id *Identity, env []byte) (*signing.Accepted, *signing.TrustRoot, error) {
	tr, err := a.store.TrustRoot()
	if err != nil {
		return nil, nil, fmt.Errorf("load trust root: %w", err)
	}
	if tr == nil {
		return nil, nil, errors.New("no trust root stored")
	}
	ms, err := a.manifestState()
	if err != nil {
		return nil, nil, fmt.Errorf("load manifest state: %w", err)
	}
	st := signing.State{AgentID: id.AgentID, Serial: ms.Serial, Digest: ms.Digest}
	acc, err := signing.AcceptManifest(env, tr, st, time.Now(), a.cfg.MaxManifestBytes)
	if err == nil {
		return acc, nil, nil
	}
	// A newer key list is needed when the manifest names one, when the held
	// one expired, and when the manifest is signed by a key the held list
	// does not know (a rotation: the signature check comes first).
	if !errors.Is(err, signing.ErrKeyListStale) && !errors.Is(err, signing.ErrKeyListExpired) && !errors.Is(err, signing.ErrUnknownKey) {
		return nil, nil, &rejection{err}
	}
	a.log.Info("refreshing the key list", "reason", err)
	next, rerr := a.fetchTrust(ctx, tr)
	if rerr != nil {
		if errors.Is(err, signing.ErrUnknownKey) || errors.Is(rerr, signing.ErrKeyListRollback) {
			// No newer list: the manifest stands rejected for its own reason.
			return nil, nil, &rejection{err}
		}
		return nil, nil, fmt.Errorf("%v; key list refresh failed: %w", err, rerr)
	}
	acc, err = signing.AcceptManifest(env, next, st, time.Now(), a.cfg.MaxManifestBytes)
	if err != nil {
		return nil, nil, &rejection{err}
	}
	return acc, next, nil
}

// fetchTrust gets the current key list and returns a copy of tr updated
// with it. A key list that is not newer leaves the copy as it was.
func (a *Agent) fetchTrust(ctx context.Context, tr *signing.TrustRoot) (*signing.TrustRoot, error) {
	var out signing.TrustRoot
	resp, err := a.httpClient().R().SetContext(ctx).SetResult(&out).Get(pathTrust)
	if err := checkResponse(resp, err); err != nil {
		return nil, fmt.Errorf("get trust: %w", err)
	}
	kl, err := compactJSON(out.KeyList)
	if err != nil {
		return nil, fmt.Errorf("trust: key_list: %w", err)
	}
	next := &signing.TrustRoot{
		RootKeys: append([]signing.PublicKey(nil), tr.RootKeys...),
		KeyList:  append(json.RawMessage(nil), tr.KeyList...),
	}
	// Root keys are pinned at enrollment and never taken from the server.
	if err := next.UpdateKeyList(kl, time.Now()); err != nil {
		return nil, err
	}
	return next, nil
}

// fetchPayloads returns the verified bytes of every payload m names: from
// the local cache when present and intact, else from the server with a
// byte cap equal to the declared size. A digest or size mismatch rejects
// the manifest.
func (a *Agent) fetchPayloads(ctx context.Context, m *manifest.Manifest) (map[string][]byte, error) {
	out := map[string][]byte{}
	for _, p := range m.Pipes {
		d, size := p.Payload.Digest, p.Payload.Size
		if _, ok := out[d]; ok {
			continue
		}
		if size > a.cfg.MaxPayloadBytes {
			return nil, &rejection{fmt.Errorf("pipe %s: payload of %d bytes exceeds the cap of %d", p.Name, size, a.cfg.MaxPayloadBytes)}
		}
		if b, ok := a.cachedPayload(d, size); ok {
			out[d] = b
			continue
		}
		resp, err := a.httpClient().R().SetContext(ctx).SetResponseBodyLimit(int(max(size, 1))).Get(pathPayloads + d)
		if err := checkResponse(resp, err); err != nil {
			if errors.Is(err, resty.ErrResponseBodyTooLarge) {
				return nil, &rejection{fmt.Errorf("pipe %s: payload %s is larger than its declared %d bytes", p.Name, d, size)}
			}
			return nil, fmt.Errorf("get payload %s: %w", d, err)
		}
		b := resp.Body()
		if int64(len(b)) != size {
			return nil, &rejection{fmt.Errorf("pipe %s: payload %s has %d bytes, the manifest declares %d", p.Name, d, len(b), size)}
		}
		if got := manifest.Digest(b); got != d {
			return nil, &rejection{fmt.Errorf("pipe %s: payload digest mismatch: got %s, the manifest declares %s", p.Name, got, d)}
		}
		if err := a.cachePayload(d, b); err != nil {
			a.log.Warn("cache payload", "digest", d, "err", err)
		}
		out[d] = b
	}
	return out, nil
}

func payloadPath(dataDir, digest string) string {
	return filepath.Join(dataDir, payloadDir, strings.Replace(digest, ":", "-", 1))
}

func (a *Agent) cachedPayload(digest string, size int64) ([]byte, bool) {
	b, err := os.ReadFile(payloadPath(a.cfg.DataDir, digest))
	if err != nil || int64(len(b)) != size || manifest.Digest(b) != digest {
		return nil, false
	}
	return b, true
}

func (a *Agent) cachePayload(digest string, b []byte) error {
	dir := filepath.Join(a.cfg.DataDir, payloadDir)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	return atomicfile.Write(payloadPath(a.cfg.DataDir, digest), b, 0o600)
}

// prunePayloads removes cached payloads m does not name.
func (a *Agent) prunePayloads(m *manifest.Manifest) {
	keep := map[string]bool{}
	for _, p := range m.Pipes {
		keep[filepath.Base(payloadPath("", p.Payload.Digest))] = true
	}
	dir := filepath.Join(a.cfg.DataDir, payloadDir)
	ents, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	for _, e := range ents {
		if !keep[e.Name()] {
			_ = os.Remove(filepath.Join(dir, e.Name()))
		}
	}
}

type secretsResponse struct {
	Secrets map[string]string `json:"secrets"`
}

// fetchSecrets gets the secret values when a pipe of m names secrets.
func (a *Agent) fetchSecrets(ctx context.Context, m *manifest.Manifest) (map[string]string, error) {
	need := false
	for _, p := range m.Pipes {
		if len(p.Spec.Secrets) > 0 {
			need = true
		}
	}
	if !need {
		return map[string]string{}, nil
	}
	var out secretsResponse
	resp, err := a.httpClient().R().SetContext(ctx).SetResult(&out).Get(pathSecrets)
	if err := checkResponse(resp, err); err != nil {
		return nil, fmt.Errorf("get secrets: %w", err)
	}
	if out.Secrets == nil {
		out.Secrets = map[string]string{}
	}
	return out.Secrets, nil
}

// PipeResult is what the last apply did for one pipe.
type PipeResult struct {
	Name           string
	Version        uint64
	NextFireTimes  []time.Time
	Error          string
	DriftRestored  bool
	DropInsRemoved []string
	// ElapseMismatch: the scheduler's next elapse disagrees with the
	// evaluator (apply.ElapseMismatch).
	ElapseMismatch string
	// LeaseUntil is the end of this agent's lease on a held pipe
	// (placement: one; zero otherwise); LeaseEnded says it passed
	// unrenewed and the pipe is stopped here.
	LeaseUntil time.Time
	LeaseEnded bool
}

// applyInput builds the backend's input: payloads from the verified set,
// and each pipe's secrets from the values the server sent.
func applyInput(m *manifest.Manifest, payloads map[string][]byte, secrets map[string]string) apply.Input {
	per := map[string]map[string]string{}
	for _, p := range m.Pipes {
		if len(p.Spec.Secrets) == 0 {
			continue
		}
		vals := map[string]string{}
		for _, name := range p.Spec.Secrets {
			if v, ok := secrets[name]; ok {
				vals[name] = v
			}
		}
		per[p.Name] = vals
	}
	return apply.Input{
		Manifest: m,
		Payloads: func(p *manifest.Pipe) ([]byte, error) {
			b, ok := payloads[p.Payload.Digest]
			if !ok {
				return nil, fmt.Errorf("payload %s was not fetched", p.Payload.Digest)
			}
			return b, nil
		},
		Secrets: per,
	}
}

// apply hands m to the backend (or, with check, only restores drift
// against the last apply), records the result, and reports it when report
// is set or something changed.
func (a *Agent) apply(ctx context.Context, m *manifest.Manifest, env []byte, digest string, payloads map[string][]byte, secrets map[string]string, report, check bool) SyncResult {
	var (
		errs  map[string]string
		drift []apply.Step
		err   error
	)
	if check {
		drift, err = a.backend.Check(ctx)
		// An update is not drift: the render changed (the DST correction
		// window moved with the clock), nobody edited anything.
		drift = slices.DeleteFunc(drift, func(s apply.Step) bool { return !s.Changes() || s.Action == apply.ActionUpdate })
	} else {
		var res *apply.Result
		res, err = a.backend.Apply(ctx, applyInput(m, payloads, secrets))
		if res != nil {
			errs, drift = res.Errors, res.Drift
		}
	}
	results := a.pipeResults(ctx, m, errs, drift)
	a.mu.Lock()
	wasOK := a.applyOK
	a.current, a.currentEnv, a.currentDigest, a.payloads, a.secrets = m, env, digest, payloads, secrets
	a.applyOK = err == nil
	if !check || err == nil {
		a.results = results
	}
	leases := leaseState(results)
	leaseChanged := leases != a.reportedLeases
	if err == nil {
		a.reportedLeases = leases
	}
	a.mu.Unlock()
	a.kickLeases()

	st := &agentpb.ManifestStatus{Serial: m.Serial, Digest: digest, At: timestamppb.New(time.Now()), Pipes: pipeStatuses(results)}
	expired := !m.ExpiresAt.IsZero() && !time.Now().Before(m.ExpiresAt)
	if !m.ExpiresAt.IsZero() {
		st.ExpiresAt = timestamppb.New(m.ExpiresAt)
	}
	st.ManifestExpired = expired
	a.mu.Lock()
	expiryChanged := a.reportedExpired != expired
	a.reportedExpired = expired
	a.mu.Unlock()
	if err != nil {
		a.log.Error("apply failed", "serial", m.Serial, "err", err)
		st.State = agentpb.ManifestStatus_STATE_APPLY_FAILED
		st.Error = err.Error()
		ms, _ := a.manifestState()
		st.AppliedSerial = ms.AppliedSerial
		if report || wasOK {
			a.enqueueStatus(m.AgentID, st)
		}
		return SyncResult{Outcome: OutcomeApplyFailed, Serial: m.Serial, Error: err.Error()}
	}
	if !check {
		if serr := a.store.SetApplied(m.Serial, digest); serr != nil {
			a.log.Error("store applied state", "err", serr)
		}
	}
	st.State = agentpb.ManifestStatus_STATE_APPLIED
	st.AppliedSerial = m.Serial
	if report {
		a.log.Info("manifest applied", "serial", m.Serial, "pipes", len(m.Pipes), "failed_pipes", len(errs))
	}
	for _, s := range drift {
		a.log.Warn("restored drift", "step", s.String())
	}
	if report || !wasOK || len(drift) > 0 || expiryChanged || leaseChanged || hasDropIns(results) {
		a.enqueueStatus(m.AgentID, st)
	}
	if report {
		return SyncResult{Outcome: OutcomeApplied, Serial: m.Serial}
	}
	return SyncResult{Outcome: OutcomeUnchanged, Serial: m.Serial}
}

// pipeResults describes each pipe of m after an apply: its apply error,
// whether drift was restored, and its next fire times (the backend's next
// elapse, then the schedule evaluator's).
func (a *Agent) pipeResults(ctx context.Context, m *manifest.Manifest, errs map[string]string, drift []apply.Step) []PipeResult {
	next := map[string]time.Time{}
	state := map[string]apply.PipeState{}
	if states, err := a.backend.Status(ctx); err == nil {
		for _, s := range states {
			next[s.Name] = s.Next
			state[s.Name] = s
		}
	}
	drifted := map[string]bool{}
	dropIns := map[string][]string{}
	for _, s := range drift {
		drifted[s.Pipe] = true
		if s.Reason == apply.DropInReason {
			dropIns[s.Pipe] = append(dropIns[s.Pipe], s.File)
		}
	}
	now := time.Now()
	out := make([]PipeResult, 0, len(m.Pipes))
	for _, p := range m.Pipes {
		r := PipeResult{Name: p.Name, Version: p.Version, Error: errs[p.Name], DriftRestored: drifted[p.Name], DropInsRemoved: dropIns[p.Name]}
		if p.Spec.IsEnabled() {
			r.NextFireTimes = nextFires(&p.Spec, next[p.Name], now, 3)
		}
		if st, ok := state[p.Name]; ok && r.Error == "" {
			if r.ElapseMismatch = apply.ElapseMismatch(&p.Spec, st, now); r.ElapseMismatch != "" {
				a.log.Warn("next elapse disagrees with the schedule", "pipe", p.Name, "detail", r.ElapseMismatch)
			}
		}
		out = append(out, r)
	}
	setLeases(out, m, now)
	return out
}

// nextFires returns up to n fire times: first (when set), then the
// evaluator's.
func nextFires(spec *manifest.Spec, first, now time.Time, n int) []time.Time {
	var out []time.Time
	after := now
	if !first.IsZero() {
		out = append(out, first)
		after = first
	}
	sched, err := manifest.ParseSchedule(spec.Schedule)
	if err != nil {
		return out
	}
	if _, every := sched.Every(); every {
		return out
	}
	loc, err := manifest.LoadLocation(spec.Timezone)
	if err != nil {
		return out
	}
	for len(out) < n {
		t := sched.Next(after, loc)
		if t.IsZero() {
			break
		}
		out = append(out, t)
		after = t
	}
	return out
}

// reapply restores drift against the manifest in force (a full apply again
// when the last one failed) and reports only what changed.
func (a *Agent) reapply(ctx context.Context) SyncResult {
	a.mu.Lock()
	m, env, digest, payloads, secrets, ok := a.current, a.currentEnv, a.currentDigest, a.payloads, a.secrets, a.applyOK
	a.mu.Unlock()
	return a.apply(ctx, m, env, digest, payloads, secrets, false, ok)
}

// applyStored applies the stored manifest at start, so the host matches it
// even before the server answers (and after a crash in the middle of an
// apply). A stored manifest that no longer verifies is left alone.
func (a *Agent) applyStored(ctx context.Context) {
	ms, err := a.manifestState()
	if err != nil || len(ms.Envelope) == 0 {
		return
	}
	tr, err := a.store.TrustRoot()
	if err != nil || tr == nil {
		return
	}
	id := a.identity()
	st := signing.State{AgentID: id.AgentID, Serial: ms.Serial, Digest: ms.Digest}
	acc, err := signing.AcceptManifest(ms.Envelope, tr, st, time.Now(), a.cfg.MaxManifestBytes)
	if err != nil {
		a.log.Warn("the stored manifest no longer verifies; waiting for the server", "serial", ms.Serial, "err", err)
		a.fenceExpiredStored(ms, tr, st, err)
		return
	}
	payloads := map[string][]byte{}
	for _, p := range acc.Manifest.Pipes {
		b, ok := a.cachedPayload(p.Payload.Digest, p.Payload.Size)
		if !ok {
			a.log.Info("payloads of the stored manifest are missing; waiting for the server", "serial", ms.Serial)
			return
		}
		payloads[p.Payload.Digest] = b
	}
	applied := ms.AppliedSerial == ms.Serial && ms.AppliedDigest == ms.Digest
	if hasSecrets(acc.Manifest) {
		// Secret values live on the server only: applying without them
		// would empty the pipes' secrets. The first sync applies.
		a.mu.Lock()
		a.current, a.currentEnv, a.currentDigest, a.payloads, a.applyOK = acc.Manifest, ms.Envelope, acc.Digest, payloads, false
		a.mu.Unlock()
		// The units in place are the last apply's; the lease loop still
		// stops the held pipes whose lease this manifest says ended.
		a.kickLeases()
		return
	}
	a.apply(ctx, acc.Manifest, ms.Envelope, acc.Digest, payloads, map[string]string{}, !applied, false)
}

// fenceExpiredStored: the stored manifest did not verify at start because
// it expired (a frozen server) while the host kept running it. It is not
// applied, but its leases still end: when it verifies as of just before
// its expiry, it becomes the manifest in force for the lease loop (and for
// status), so that a held pipe's timer stops at the end of its lease even
// after a restart with the server away.
func (a *Agent) fenceExpiredStored(ms ManifestState, tr *signing.TrustRoot, st signing.State, err error) {
	if !errors.Is(err, signing.ErrExpired) {
		return
	}
	var env struct {
		Payload []byte `json:"payload"`
	}
	if json.Unmarshal(ms.Envelope, &env) != nil {
		return
	}
	m, derr := manifest.DecodeManifest(env.Payload)
	if derr != nil || m.ExpiresAt.IsZero() {
		return
	}
	acc, err := signing.AcceptManifest(ms.Envelope, tr, st, m.ExpiresAt.Add(-time.Second), a.cfg.MaxManifestBytes)
	if err != nil {
		return
	}
	a.mu.Lock()
	if a.current == nil {
		a.current, a.currentEnv, a.currentDigest, a.applyOK = acc.Manifest, ms.Envelope, acc.Digest, false
	}
	a.mu.Unlock()
	a.kickLeases()
}

func hasSecrets(m *manifest.Manifest) bool {
	for _, p := range m.Pipes {
		if len(p.Spec.Secrets) > 0 {
			return true
		}
	}
	return false
}

// reportRejected reports a rejected manifest once per distinct envelope,
// as agent id's (the identity the sync ran with: a sync that began before
// a re-enrollment reports nothing for the new agent).
func (a *Agent) reportRejected(id *Identity, env []byte, err error) {
	d := signing.Digest(env) + " " + err.Error()
	a.mu.Lock()
	dup := a.lastReject == d
	a.lastReject = d
	a.mu.Unlock()
	a.log.Error("manifest rejected; nothing changed", "err", err)
	if dup || id == nil {
		return
	}
	ms, _ := a.manifestState()
	a.enqueueStatus(id.AgentID, &agentpb.ManifestStatus{
		State:         agentpb.ManifestStatus_STATE_REJECTED,
		Error:         err.Error(),
		At:            timestamppb.New(time.Now()),
		AppliedSerial: ms.AppliedSerial,
	})
}

func pipeStatuses(rs []PipeResult) []*agentpb.PipeStatus {
	out := make([]*agentpb.PipeStatus, 0, len(rs))
	for _, r := range rs {
		ps := &agentpb.PipeStatus{Name: r.Name, Version: r.Version, ApplyError: r.Error, DriftRestored: r.DriftRestored,
			ElapseMismatch: r.ElapseMismatch, DropInsRemoved: r.DropInsRemoved, LeaseEnded: r.LeaseEnded}
		if !r.LeaseUntil.IsZero() {
			ps.LeaseUntil = timestamppb.New(r.LeaseUntil)
		}
		for _, t := range r.NextFireTimes {
			ps.NextFireTimes = append(ps.NextFireTimes, timestamppb.New(t))
		}
		out = append(out, ps)
	}
	return out
}

// enqueue puts a record in the outbox and wakes the stream.
func (a *Agent) enqueue(msg *agentpb.AgentMessage) {
	if err := a.store.Enqueue(msg); err != nil {
		a.log.Error("outbox enqueue", "err", err)
		return
	}
	a.kickOutbox()
}

func (a *Agent) kickOutbox() {
	select {
	case a.outboxCh <- struct{}{}:
	default:
	}
}

func hasDropIns(rs []PipeResult) bool {
	for _, r := range rs {
		if len(r.DropInsRemoved) > 0 {
			return true
		}
	}
	return false
}
