package sim

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/drover/drover/api"
	"github.com/drover/drover/internal/tick"
	"github.com/drover/drover/manifest"
	agentpb "github.com/drover/drover/proto"
	"github.com/drover/drover/signing"
)

// Bounds of one simulated agent.
const (
	sendWindow      = 1024     // records sent and not yet acknowledged
	maxOutbox       = 10000    // records waiting; runs are skipped beyond it
	maxManifest     = 16 << 20 // envelope bytes
	maxPayloadBytes = 10 << 20
	// maxPayloadDeferrals bounds the 429 answers one fetch waits out.
	maxPayloadDeferrals = 20
	maxBackoff          = 30 * time.Second
)

// AgentParams shape every simulated agent's behaviour.
type AgentParams struct {
	PollInterval time.Duration `json:"poll_interval"`
	PollJitter   float64       `json:"poll_jitter"` // each interval is PollInterval * (1 ± PollJitter)
	Heartbeat    time.Duration `json:"heartbeat"`
	RunEvery     time.Duration `json:"run_every"` // 0: no runs
	LogChunks    int           `json:"log_chunks"`
	LogBytes     int           `json:"log_bytes"`
	Verify       bool          `json:"verify"`
	KeepAlive    bool          `json:"keep_alive"` // keep the poll connection open between polls
	// IdleTimeout closes a kept-alive poll connection after this long
	// idle: below the poll interval it models an agent that holds no idle
	// connection between interval polls yet reuses one for the fetches
	// that follow a SyncNow (the next poll resumes the TLS session).
	IdleTimeout time.Duration `json:"idle_timeout"`
	Timeout     time.Duration `json:"timeout"`
	// Probe models drover-agent's liveness probe of an idle stream (a gRPC
	// health check on the stream's connection after probeIdle of silence):
	// "" none, ProbeSilent whenever the server was silent that long (the
	// agent before), ProbeUnanswered only while a record sent is not
	// acknowledged (the agent now), ProbeHeartbeat also after each
	// heartbeat (which the server does not answer).
	Probe string `json:"probe,omitempty"`
}

// Probe modes (AgentParams.Probe) and the agent's timings.
const (
	ProbeSilent         = "silent"
	ProbeUnanswered     = "unanswered"
	ProbeHeartbeat      = "heartbeat"
	streamKeepaliveWait = 10 * time.Second // the agent's is 3 s (see the dial)
	probeIdle           = 3 * time.Second
	probeTimeout        = 3 * time.Second
)

// recKind says what an outbox record counts as once acknowledged.
type recKind int

const (
	recStatus recKind = iota
	recRunStarted
	recChunk
	recRunFinished
)

type outRec struct {
	seq    uint64
	kind   recKind
	size   int
	msg    *agentpb.AgentMessage
	queued time.Time
	onAck  func()
}

// manifestPipe is what the simulator keeps of a pipe in a manifest.
type manifestPipe struct {
	name    string
	version uint64
	digest  string
	size    int64
}

// pushedEnv is a manifest that came on the stream with SyncNow.
type pushedEnv struct {
	env    []byte
	etag   string
	serial uint64
}

// simAgent is one simulated agent: a stream, a poll loop and a run loop.
type simAgent struct {
	w         *worker
	index     int
	src       net.IP
	hostname  string
	machineID string
	id        *identity
	host      string // server name for TLS
	http      *http.Client
	conn      *grpc.ClientConn

	syncCh chan struct{}
	wakeCh chan struct{}

	mu         sync.Mutex
	pushed     *pushedEnv // a manifest a SyncNow carried, for the poll loop
	etag       string
	serial     uint64
	digest     string
	expires    time.Time
	pipes      []manifestPipe
	payloads   map[string]bool
	nextSeq    uint64
	acked      uint64
	outbox     []*outRec
	runN       int
	changeSeen uint64

	appliedOnce bool // an applied status was acknowledged
}

func newSimAgent(w *worker, index int, src net.IP, id *identity) (*simAgent, error) {
	host, _, err := net.SplitHostPort(id.grpcAddr)
	if err != nil {
		return nil, fmt.Errorf("grpc_addr: %w", err)
	}
	p := w.cfg.Agent
	if !w.cfg.AllowRemote {
		if err := checkLoopback(context.Background(), id.grpcAddr); err != nil {
			return nil, fmt.Errorf("grpc_addr: %w", err)
		}
	}
	cert := id.cert
	tlsConf := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: w.cfg.Host, RootCAs: id.caPool,
		Certificates: []tls.Certificate{cert}, ClientSessionCache: tls.NewLRUClientSessionCache(1)}
	tr := &http.Transport{TLSClientConfig: tlsConf, DialContext: dialer(src, p.Timeout), MaxIdleConnsPerHost: 1,
		IdleConnTimeout: p.IdleTimeout, DisableKeepAlives: !p.KeepAlive, TLSHandshakeTimeout: p.Timeout}
	a := &simAgent{w: w, index: index, src: src, id: id, host: host,
		hostname: fmt.Sprintf("sim-%s-%d", w.cfg.Fleet, index), machineID: w.machineID(index),
		http: &http.Client{Timeout: p.Timeout, Transport: tr}, syncCh: make(chan struct{}, 1), wakeCh: make(chan struct{}, 1),
		payloads: map[string]bool{}}
	gtls := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: host, RootCAs: id.caPool, Certificates: []tls.Certificate{cert}}
	d := dialer(src, p.Timeout)
	a.conn, err = grpc.NewClient(id.grpcAddr,
		grpc.WithTransportCredentials(credentials.NewTLS(gtls)),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) { return d(ctx, "tcp", addr) }),
		grpc.WithReadBufferSize(8<<10), grpc.WithWriteBufferSize(8<<10),
		// drover-agent's keepalive interval: a PING after StreamKeepalive
		// without reads (an idle stream reads nothing between SyncNows),
		// so the server answers one per agent every 2 min. Its wait is
		// longer than the agent's 3 s: the workers run at nice 19 on the
		// server's cores and are starved for a second or more during a
		// fleet's change, which an agent on its own host is not (at 3 s,
		// 35 of 19,500 streams were dropped that way).
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: agentpb.StreamKeepalive, Timeout: streamKeepaliveWait, PermitWithoutStream: true}),
		grpc.WithUserAgent("drover-sim"),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(agentpb.MaxServerMessageBytes)), // as drover-agent
		grpc.WithStaticStreamWindowSize(agentpb.StreamWindowBytes), grpc.WithStaticConnWindowSize(agentpb.StreamWindowBytes),
	)
	if err != nil {
		return nil, fmt.Errorf("grpc client: %w", err)
	}
	return a, nil
}

// jitter returns d * (1 ± f), at least a millisecond.
func jitter(d time.Duration, f float64) time.Duration {
	if f <= 0 {
		return d
	}
	return max(time.Duration(float64(d)*(1+f*(2*rand.Float64()-1))), time.Millisecond)
}

func (a *simAgent) wake() {
	select {
	case a.wakeCh <- struct{}{}:
	default:
	}
}

// queue appends a durable record to the outbox with the next seq.
func (a *simAgent) queue(kind recKind, size int, msg *agentpb.AgentMessage, onAck func()) {
	a.mu.Lock()
	a.nextSeq++
	msg.Seq = a.nextSeq
	a.outbox = append(a.outbox, &outRec{seq: a.nextSeq, kind: kind, size: size, msg: msg, queued: time.Now(), onAck: onAck})
	a.mu.Unlock()
	a.w.rec.c.recordsSent.Add(1)
	if kind == recRunFinished {
		a.w.rec.c.runsFinished.Add(1)
	}
	a.wake()
}

// ack removes the records up to seq from the outbox.
func (a *simAgent) ack(seq uint64) {
	a.mu.Lock()
	n := 0
	for n < len(a.outbox) && a.outbox[n].seq <= seq {
		n++
	}
	done := a.outbox[:n:n]
	a.outbox = append([]*outRec(nil), a.outbox[n:]...)
	if seq > a.acked {
		a.acked = seq
	}
	a.mu.Unlock()
	c := &a.w.rec.c
	now := time.Now()
	for _, r := range done {
		c.recordsAcked.Add(1)
		a.w.rec.observe(&a.w.rec.ingest, now.Sub(r.queued))
		switch r.kind {
		case recRunFinished:
			c.runsAcked.Add(1)
		case recChunk:
			c.logChunksAcked.Add(1)
			c.logBytesAcked.Add(int64(r.size))
		case recStatus:
			if r.msg.GetManifestStatus().GetState() == agentpb.ManifestStatus_STATE_APPLIED {
				c.statusesApplied.Add(1)
				a.mu.Lock()
				first := !a.appliedOnce
				a.appliedOnce = true
				a.mu.Unlock()
				if first {
					c.agentsApplied.Add(1)
				}
			}
		}
		if r.onAck != nil {
			r.onAck()
		}
	}
	a.wake()
}

func (a *simAgent) outboxLen() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.outbox)
}

// streamLoop keeps the stream open until ctx is done, reconnecting with
// capped, jittered backoff.
func (a *simAgent) streamLoop(ctx context.Context) {
	defer a.conn.Close()
	bo := time.Second
	for ctx.Err() == nil {
		start := time.Now()
		err := a.streamOnce(ctx)
		if ctx.Err() != nil {
			return
		}
		a.w.rec.fail("stream", err)
		if time.Since(start) > 30*time.Second {
			bo = time.Second
		}
		t := time.NewTimer(jitter(bo, 0.5))
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		bo = min(2*bo, maxBackoff)
	}
}

func (a *simAgent) hello() *agentpb.AgentMessage {
	a.mu.Lock()
	defer a.mu.Unlock()
	return &agentpb.AgentMessage{Body: &agentpb.AgentMessage_Hello{Hello: &agentpb.Hello{
		AgentVersion: "drover-sim", Os: "linux", Arch: "amd64", Hostname: a.hostname, Backend: "cron", Scope: "user",
		ManifestSerial: a.serial, ManifestDigest: a.digest, MachineId: a.machineID}}}
}

func (a *simAgent) streamOnce(ctx context.Context) error {
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	st, err := agentpb.NewAgentClient(a.conn).AgentStream(sctx)
	if err != nil {
		return err
	}
	if err := st.Send(a.hello()); err != nil {
		return fmt.Errorf("send hello: %w", err)
	}
	c := &a.w.rec.c
	c.streamsOpened.Add(1)
	c.connected.Add(1)
	defer c.connected.Add(-1)

	var lastRecv, lastSent atomic.Int64
	lastRecv.Store(time.Now().UnixNano())
	if mode := a.w.cfg.Agent.Probe; mode != "" {
		go a.probe(sctx, mode, &lastRecv, &lastSent)
	}
	recvErr := make(chan error, 1)
	go func() {
		for {
			msg, err := st.Recv()
			if err != nil {
				recvErr <- err
				return
			}
			lastRecv.Store(time.Now().UnixNano())
			switch b := msg.GetBody().(type) {
			case *agentpb.ServerMessage_Ack:
				a.ack(b.Ack.GetSeq())
			case *agentpb.ServerMessage_SyncNow:
				c.syncNows.Add(1)
				a.push(b.SyncNow)
				select {
				case a.syncCh <- struct{}{}:
				default:
				}
			case *agentpb.ServerMessage_RunNow:
				go a.run(agentpb.Trigger_TRIGGER_API, b.RunNow.GetPipe(), b.RunNow.GetRequestId())
			}
		}
	}()

	// The first heartbeat comes at a uniformly random point of the interval,
	// so that the fleet's heartbeat rate is steady from the start.
	hb := time.NewTimer(time.Duration(rand.Int64N(int64(a.w.cfg.Agent.Heartbeat))) + time.Millisecond)
	defer hb.Stop()
	// Every record not yet acknowledged is sent again on a new stream: the
	// server upserts, so a replay never duplicates.
	var sent uint64
	a.mu.Lock()
	sent = a.acked
	a.mu.Unlock()
	for {
		a.mu.Lock()
		var batch []*agentpb.AgentMessage
		for _, r := range a.outbox {
			if r.seq > sent && r.seq <= a.acked+sendWindow {
				batch = append(batch, r.msg)
			}
		}
		a.mu.Unlock()
		for _, m := range batch {
			if err := st.Send(m); err != nil {
				return fmt.Errorf("send: %w", err)
			}
			lastSent.Store(time.Now().UnixNano())
			sent = m.GetSeq()
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case err := <-recvErr:
			return err
		case <-a.wakeCh:
		case <-hb.C:
			a.mu.Lock()
			beat := &agentpb.Heartbeat{SentAt: timestamppb.Now(), OutboxRecords: uint64(len(a.outbox)), ManifestSerial: a.serial}
			a.mu.Unlock()
			msg := &agentpb.AgentMessage{Body: &agentpb.AgentMessage_Heartbeat{Heartbeat: beat}}
			if err := st.Send(msg); err != nil {
				return fmt.Errorf("send heartbeat: %w", err)
			}
			if a.w.cfg.Agent.Probe == ProbeHeartbeat {
				lastSent.Store(time.Now().UnixNano())
			}
			c.heartbeats.Add(1)
			hb.Reset(jitter(a.w.cfg.Agent.Heartbeat, 0.1))
		}
	}
}

// probe sends a health check on the stream's connection, every second
// that the mode finds one due, until ctx ends.
func (a *simAgent) probe(ctx context.Context, mode string, lastRecv, lastSent *atomic.Int64) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	hc := healthpb.NewHealthClient(a.conn)
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		recv := time.Unix(0, lastRecv.Load())
		if time.Since(recv) < probeIdle || mode != ProbeSilent && !time.Unix(0, lastSent.Load()).After(recv) {
			continue
		}
		pctx, cancel := context.WithTimeout(ctx, probeTimeout)
		_, err := hc.Check(pctx, &healthpb.HealthCheckRequest{})
		cancel()
		if ctx.Err() != nil {
			return
		}
		a.w.rec.c.probes.Add(1)
		if err != nil {
			a.w.rec.fail("probe", err)
		}
		lastRecv.Store(time.Now().UnixNano())
	}
}

// pollLoop polls the manifest on a jittered interval and at once on
// SyncNow, taking the manifest the SyncNow carried instead when it can.
func (a *simAgent) pollLoop(ctx context.Context) {
	p := a.w.cfg.Agent
	everyJittered(ctx, p.PollInterval, p.PollJitter, a.syncCh, func() {
		a.mu.Lock()
		pe := a.pushed
		a.pushed = nil
		a.mu.Unlock()
		if pe != nil && a.acceptPushed(ctx, pe) {
			return
		}
		a.poll(ctx)
	})
}

// push keeps the manifest a SyncNow carried for the poll loop, as
// drover-agent does: bounded before any work, a later one replacing an
// earlier one unless its serial is lower.
func (a *simAgent) push(sn *agentpb.SyncNow) {
	env := sn.GetManifest()
	if len(env) == 0 {
		return
	}
	c := &a.w.rec.c
	c.streamManifests.Add(1)
	if len(env) > agentpb.MaxSyncNowManifestBytes || len(sn.GetManifestEtag()) > agentpb.MaxSyncNowManifestETag || sn.GetManifestSerial() < sn.GetSerial() {
		c.streamRefused.Add(1)
		a.w.rec.failKind("stream manifest out of bounds")
		return
	}
	a.mu.Lock()
	if a.pushed == nil || sn.GetManifestSerial() >= a.pushed.serial {
		a.pushed = &pushedEnv{env: env, etag: sn.GetManifestEtag(), serial: sn.GetManifestSerial()}
	}
	a.mu.Unlock()
}

// acceptPushed takes a manifest from the stream as a poll's answer: the
// ETag held is a 304, anything else is accepted as a 200's body. It
// reports false when the manifest did not verify (counted): the caller
// polls.
func (a *simAgent) acceptPushed(ctx context.Context, pe *pushedEnv) bool {
	a.mu.Lock()
	held := a.etag
	a.mu.Unlock()
	if held != "" && pe.etag == held {
		return true
	}
	if !a.accept(ctx, pe.env, pe.etag, true) {
		a.w.rec.c.streamRefused.Add(1)
		a.w.rec.failKind("stream manifest not verified")
		return false
	}
	return true
}

// everyJittered calls fn first at a uniformly random point of every (so
// that a fleet's rate is steady from the start), then every, jittered by
// frac, after each call, and at once when wake fires (nil: never), until
// ctx ends.
func everyJittered(ctx context.Context, every time.Duration, frac float64, wake <-chan struct{}, fn func()) {
	tick.Paced(ctx, time.Duration(rand.Int64N(int64(every))+1), func() time.Duration { return jitter(every, frac) }, wake, fn)
}

func (a *simAgent) get(ctx context.Context, path, etag string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, "GET", a.w.cfg.Server+path, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set(api.MachineIDHeader, a.machineID) // as a real agent does
	if etag != "" {
		req.Header.Set("If-None-Match", etag)
	}
	return a.http.Do(req)
}

func (a *simAgent) poll(ctx context.Context) {
	rec := a.w.rec
	a.mu.Lock()
	etag := a.etag
	a.mu.Unlock()
	start := time.Now()
	rec.c.polls.Add(1)
	resp, err := a.get(ctx, "/api/v1/agents/self/manifest", etag)
	if err != nil {
		if ctx.Err() == nil {
			rec.fail("poll", err)
		}
		return
	}
	defer resp.Body.Close()
	if resp.TLS != nil && resp.TLS.DidResume {
		rec.c.pollsResumed.Add(1)
	}
	switch resp.StatusCode {
	case http.StatusNotModified:
		_, _ = io.Copy(io.Discard, resp.Body)
		rec.observe(&rec.poll, time.Since(start))
		rec.c.polls304.Add(1)
		return
	case http.StatusOK:
	default:
		rec.fail("poll", api.ReadError(resp))
		return
	}
	env, err := io.ReadAll(io.LimitReader(resp.Body, maxManifest+1))
	rec.observe(&rec.poll, time.Since(start))
	if err != nil {
		rec.fail("poll", err)
		return
	}
	rec.c.polls200.Add(1)
	a.accept(ctx, env, resp.Header.Get("ETag"), false)
}

// accept verifies (or, with --no-verify, only decodes) a manifest, fetches
// the payloads it names that the agent does not hold, and reports it
// applied. The manifest came on the stream when pushed; accept reports
// false only for such a one that did not verify (the caller polls then).
func (a *simAgent) accept(ctx context.Context, env []byte, etag string, pushed bool) bool {
	rec := a.w.rec
	a.mu.Lock()
	state := signing.State{AgentID: a.id.agentID, Serial: a.serial, Digest: a.digest}
	a.mu.Unlock()
	m, digest, ok := a.openManifest(ctx, env, etag, state, pushed)
	if m == nil {
		return ok
	}
	pipes := make([]manifestPipe, 0, len(m.Pipes))
	for _, p := range m.Pipes {
		pipes = append(pipes, manifestPipe{name: p.Name, version: p.Version, digest: p.Payload.Digest, size: p.Payload.Size})
	}
	if !a.fetchPayloads(ctx, pipes) {
		return true // nothing changes; the next poll tries again
	}
	var statuses []*agentpb.PipeStatus
	kept := map[string]bool{}
	for _, p := range pipes {
		statuses = append(statuses, &agentpb.PipeStatus{Name: p.name, Version: p.version})
		kept[p.digest] = true
	}
	a.mu.Lock()
	a.serial, a.digest, a.etag, a.pipes, a.expires = m.Serial, digest, etag, pipes, m.ExpiresAt
	for d := range a.payloads {
		if !kept[d] {
			delete(a.payloads, d)
		}
	}
	var onAck func()
	if ch := a.w.change.Load(); ch != nil && a.changeSeen != ch.ID && hasVersion(pipes, ch.Pipe, ch.MinVersion) {
		a.changeSeen = ch.ID
		rec.changeSample(ch.ID, false)
		if pushed {
			rec.c.changesStream.Add(1)
		} else {
			rec.c.changesPoll.Add(1)
		}
		onAck = func() { rec.changeSample(ch.ID, true) }
	}
	a.mu.Unlock()
	a.queue(recStatus, 0, statusMsg(agentpb.ManifestStatus_STATE_APPLIED, m.Serial, digest, "", m.Serial, statuses, m.ExpiresAt), onAck)
	return true
}

// openManifest verifies the envelope (or, without Verify, only decodes it)
// against the manifest in force. It returns the manifest to apply and its
// digest, or nil: rejected (reported), undecodable, or not newer (the etag
// is kept then). A pushed manifest (from the stream) that does not verify
// or decode is not reported: ok is false, and the caller polls.
func (a *simAgent) openManifest(ctx context.Context, env []byte, etag string, state signing.State, pushed bool) (m *manifest.Manifest, digest string, ok bool) {
	rec := a.w.rec
	if !a.w.cfg.Agent.Verify {
		m, digest, err := decodeUnverified(env)
		if err != nil {
			if pushed {
				return nil, "", false
			}
			rec.fail("decode", err)
			return nil, "", true
		}
		if m.Serial <= state.Serial {
			if m.Serial == state.Serial {
				a.setETag(etag)
			}
			return nil, "", true
		}
		return m, digest, true
	}
	acc, err := signing.AcceptManifest(env, a.id.trust, state, time.Now(), maxManifest)
	if err != nil && (errors.Is(err, signing.ErrKeyListStale) || errors.Is(err, signing.ErrUnknownKey) || errors.Is(err, signing.ErrKeyListExpired)) {
		if terr := a.refreshTrust(ctx); terr != nil {
			rec.fail("trust", terr)
		} else {
			acc, err = signing.AcceptManifest(env, a.id.trust, state, time.Now(), maxManifest)
		}
	}
	if err != nil && pushed {
		// An older manifest from the stream is ignored; anything else
		// that fails goes to a poll.
		return nil, "", errors.Is(err, signing.ErrRollback)
	}
	if err != nil {
		rec.failKind("verify: " + verifyKind(err))
		a.queue(recStatus, 0, statusMsg(agentpb.ManifestStatus_STATE_REJECTED, 0, "", err.Error(), state.Serial, nil, time.Time{}), nil)
		return nil, "", true
	}
	rec.c.verified.Add(1)
	if acc.Unchanged {
		a.setETag(etag)
		return nil, "", true
	}
	return acc.Manifest, acc.Digest, true
}

func (a *simAgent) setETag(etag string) {
	a.mu.Lock()
	a.etag = etag
	a.mu.Unlock()
}

// fetchPayloads fetches the payloads of pipes the agent does not hold; it
// reports false when one could not be fetched.
func (a *simAgent) fetchPayloads(ctx context.Context, pipes []manifestPipe) bool {
	for _, p := range pipes {
		a.mu.Lock()
		have := a.payloads[p.digest]
		a.mu.Unlock()
		if have || p.digest == "" {
			continue
		}
		if err := a.fetchPayload(ctx, p.digest, p.size); err != nil {
			if ctx.Err() == nil {
				a.w.rec.fail("payload", err)
			}
			return false
		}
		a.mu.Lock()
		a.payloads[p.digest] = true
		a.mu.Unlock()
	}
	return true
}

func hasVersion(pipes []manifestPipe, name string, v uint64) bool {
	for _, p := range pipes {
		if p.name == name && p.version >= v {
			return true
		}
	}
	return false
}

func verifyKind(err error) string {
	for _, e := range []error{signing.ErrTooLarge, signing.ErrKeyListExpired, signing.ErrMalformedEnvelope, signing.ErrPayloadType,
		signing.ErrUnknownKey, signing.ErrBadSignature, signing.ErrInvalidManifest, signing.ErrWrongAgent, signing.ErrKeyListStale,
		signing.ErrKeyListMismatch, signing.ErrRollback, signing.ErrSerialConflict, signing.ErrExpired, signing.ErrNotYetValid} {
		if errors.Is(err, e) {
			return e.Error()
		}
	}
	return errorKind(err)
}

func statusMsg(state agentpb.ManifestStatus_State, serial uint64, digest, errText string, applied uint64, pipes []*agentpb.PipeStatus, expires time.Time) *agentpb.AgentMessage {
	ms := &agentpb.ManifestStatus{Serial: serial, Digest: digest, State: state, Error: errText, Pipes: pipes,
		At: timestamppb.Now(), AppliedSerial: applied}
	if !expires.IsZero() {
		ms.ExpiresAt = timestamppb.New(expires)
	}
	return &agentpb.AgentMessage{Body: &agentpb.AgentMessage_ManifestStatus{ManifestStatus: ms}}
}

// decodeUnverified reads a manifest out of its DSSE envelope without
// checking the signature (--no-verify).
func decodeUnverified(env []byte) (*manifest.Manifest, string, error) {
	var e struct {
		PayloadType string `json:"payloadType"`
		Payload     string `json:"payload"`
	}
	if err := json.Unmarshal(env, &e); err != nil {
		return nil, "", fmt.Errorf("envelope: %w", err)
	}
	if e.PayloadType != manifest.PayloadType {
		return nil, "", fmt.Errorf("envelope: payload type %q", e.PayloadType)
	}
	payload, err := base64.StdEncoding.DecodeString(e.Payload)
	if err != nil {
		return nil, "", fmt.Errorf("envelope payload: %w", err)
	}
	var m manifest.Manifest
	if err := json.Unmarshal(payload, &m); err != nil {
		return nil, "", fmt.Errorf("manifest: %w", err)
	}
	return &m, signing.Digest(payload), nil
}

func (a *simAgent) refreshTrust(ctx context.Context) error {
	resp, err := a.get(ctx, "/api/v1/agents/self/trust", "")
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return api.ReadError(resp)
	}
	var tr signing.TrustRoot
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&tr); err != nil {
		return fmt.Errorf("trust: %w", err)
	}
	var kl bytes.Buffer
	if err := json.Compact(&kl, tr.KeyList); err != nil {
		return fmt.Errorf("trust: key_list: %w", err)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.id.trust.UpdateKeyList(kl.Bytes(), time.Now())
}

// fetchPayload fetches a bundle by digest and checks its size and digest.
func (a *simAgent) fetchPayload(ctx context.Context, digest string, size int64) error {
	if size < 0 || size > maxPayloadBytes {
		return fmt.Errorf("payload %s: size %d out of bounds", digest, size)
	}
	var resp *http.Response
	for attempt := 0; ; attempt++ {
		var err error
		resp, err = a.get(ctx, "/api/v1/agents/self/payloads/"+digest, "")
		if err != nil {
			return err
		}
		if resp.StatusCode != http.StatusTooManyRequests || attempt == maxPayloadDeferrals {
			break
		}
		// The server bounds concurrent downloads and says when to come
		// back; a real agent waits too. Counted, not an error.
		resp.Body.Close()
		a.w.rec.c.payloadsDeferred.Add(1)
		wait := time.Duration(100+rand.IntN(400)) * time.Millisecond
		if ra, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil && ra > 0 && ra <= 5 {
			wait += time.Duration(ra) * time.Second / 2
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(wait):
		}
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return api.ReadError(resp)
	}
	h := sha256.New()
	n, err := io.Copy(h, io.LimitReader(resp.Body, size+1))
	if err != nil {
		return err
	}
	if n != size || "sha256:"+hex.EncodeToString(h.Sum(nil)) != digest {
		return fmt.Errorf("payload %s: %d bytes that do not match the manifest", digest, n)
	}
	a.w.rec.c.payloads.Add(1)
	a.w.rec.c.payloadBytes.Add(n)
	return nil
}

// runLoop runs the manifest's pipes in turn, one every RunEvery (jittered).
func (a *simAgent) runLoop(ctx context.Context) {
	if every := a.w.cfg.Agent.RunEvery; every > 0 {
		everyJittered(ctx, every, 0.2, nil, func() { a.run(agentpb.Trigger_TRIGGER_SCHEDULE, "", "") })
	}
}

// run records one run of pipe (empty: the next pipe of the manifest):
// RunStarted, LogChunks, RunFinished, each a durable record.
func (a *simAgent) run(trigger agentpb.Trigger, pipe, requestID string) {
	p := a.w.cfg.Agent
	a.mu.Lock()
	var mp *manifestPipe
	for i := range a.pipes {
		if a.pipes[i].name == pipe {
			mp = &a.pipes[i]
		}
	}
	if pipe == "" && len(a.pipes) > 0 {
		mp = &a.pipes[a.runN%len(a.pipes)]
		a.runN++
	}
	full := len(a.outbox) > maxOutbox
	var name string
	var version uint64
	if mp != nil {
		name, version = mp.name, mp.version
	}
	a.mu.Unlock()
	switch {
	case name == "":
		return
	case full:
		a.w.rec.failKind("run: outbox full, run skipped")
		return
	}
	id := uuid.NewString()
	start := time.Now()
	a.queue(recRunStarted, 0, &agentpb.AgentMessage{Body: &agentpb.AgentMessage_RunStarted{RunStarted: &agentpb.RunStarted{
		RunId: id, Pipe: name, PipeVersion: version, Trigger: trigger, StartedAt: timestamppb.New(start), RequestId: requestID, Attempt: 1}}}, nil)
	for i := range p.LogChunks {
		data := logLine(p.LogBytes, i)
		a.queue(recChunk, len(data), &agentpb.AgentMessage{Body: &agentpb.AgentMessage_LogChunk{LogChunk: &agentpb.LogChunk{
			RunId: id, ChunkSeq: uint64(i), Stream: agentpb.LogStream_LOG_STREAM_STDOUT, Data: data, At: timestamppb.Now()}}}, nil)
	}
	end := time.Now()
	a.queue(recRunFinished, 0, &agentpb.AgentMessage{Body: &agentpb.AgentMessage_RunFinished{RunFinished: &agentpb.RunFinished{
		RunId: id, Pipe: name, PipeVersion: version, Trigger: trigger, Status: agentpb.RunStatus_RUN_STATUS_SUCCEEDED,
		StartedAt: timestamppb.New(start), FinishedAt: timestamppb.New(end), DurationMs: end.Sub(start).Milliseconds(),
		LogChunks: uint64(p.LogChunks), RequestId: requestID, Attempts: 1, WrittenBy: "runner"}}}, nil)
}

// logLine is n bytes of printable log text ending in a newline.
func logLine(n, i int) []byte {
	if n <= 0 {
		return nil
	}
	b := bytes.Repeat([]byte("drover-sim log line "), n/20+1)[:n]
	copy(b, fmt.Sprintf("chunk %d ", i))
	b[n-1] = '\n'
	return b
}
