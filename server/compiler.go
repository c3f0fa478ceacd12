package server

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"log/slog"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/drover/drover/manifest"
	"github.com/drover/drover/server/pki"
	"github.com/drover/drover/server/store"
	"github.com/drover/drover/signing"
)

// compiler turns pipes and agents into signed per-agent manifests
// (docs/design.md, "Flows", Publish). A manifest's serial rises only when its
// content (pipes, key-list version) changes or when it is re-signed at half
// its lifetime; the exact signed bytes are stored and served as they are.
type compiler struct {
	store    store.ManifestStore
	keys     *pki.Keyring
	clock    Clock
	lifetime time.Duration
	log      *slog.Logger
	// published is called for every agent whose manifest changed, after
	// the new manifest is committed.
	published func(agentID string, serial uint64)

	mu sync.Mutex // one compilation at a time keeps serials strictly rising
}

// saveChunk is how many manifests are committed per transaction.
const saveChunk = 1000

// compile recompiles the manifests of the given agents (every non-revoked
// agent when ids is nil) and returns how many changed.
func (c *compiler) compile(ctx context.Context, ids []string) (int, error) {
	return c.run(ctx, ids, false)
}

// resign publishes the given agents' manifests with a higher serial even if
// their content is unchanged, so that the agents apply them again (used
// when a secret they reference changes: values are fetched at apply time).
func (c *compiler) resign(ctx context.Context, ids []string) (int, error) {
	if len(ids) == 0 {
		return 0, nil
	}
	return c.run(ctx, ids, true)
}

// run compiles; workers sign while the calling goroutine commits what they
// produced, in chunks.
func (c *compiler) run(ctx context.Context, ids []string, force bool) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	pipes, agents, err := c.store.CompileInputs(ctx, ids)
	if err != nil {
		return 0, fmt.Errorf("compile: %w", err)
	}
	if len(agents) == 0 {
		return 0, nil
	}
	signer, klv := c.keys.Signer()
	now := c.clock.Now().UTC().Truncate(time.Second)
	entries := make([]pipeEntry, len(pipes))
	byAgent := map[string][]int{}
	for i, p := range pipes {
		if entries[i], err = newPipeEntry(p); err != nil {
			return 0, fmt.Errorf("compile: %w", err)
		}
		if t := p.Spec.Targets; t != nil {
			for _, id := range t.Agents {
				byAgent[id] = append(byAgent[id], i)
			}
		}
	}

	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	results := make(chan compiled, 2*saveChunk)
	workers := min(runtime.GOMAXPROCS(0), len(agents))
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < len(agents) && wctx.Err() == nil; i += workers {
				m, err := c.compileOne(agents[i], entries, byAgent, signer, klv, now, force)
				if m != nil || err != nil {
					select {
					case results <- compiled{m: m, err: err}:
					case <-wctx.Done():
						return
					}
				}
			}
		}()
	}
	go func() { wg.Wait(); close(results) }()

	changed := 0
	batch := make([]*store.StoredManifest, 0, saveChunk)
	flush := func() error {
		if len(batch) == 0 {
			return nil
		}
		if err := c.store.SaveManifests(ctx, batch); err != nil {
			return fmt.Errorf("compile: %w", err)
		}
		for _, m := range batch {
			if c.published != nil {
				c.published(m.AgentID, m.Serial)
			}
		}
		changed += len(batch)
		batch = batch[:0]
		return nil
	}
	for r := range results {
		if r.err != nil {
			return changed, r.err // cancel stops the workers
		}
		if batch = append(batch, r.m); len(batch) == saveChunk {
			if err := flush(); err != nil {
				return changed, err
			}
		}
	}
	if err := flush(); err != nil {
		return changed, err
	}
	if changed > 0 {
		c.log.Debug("manifests published", "changed", changed, "compiled", len(agents))
	}
	return changed, nil
}

// compiled is the outcome of compiling one agent whose manifest changed.
type compiled struct {
	m   *store.StoredManifest
	err error
}

// pipeEntry is a pipe prepared once per compilation, with its JSON as it
// appears in every manifest.
type pipeEntry struct {
	name    string
	ref     string // name@version: versions are immutable, so this names the content
	json    []byte
	digest  string
	targets *manifest.Targets
	secrets []string
}

func newPipeEntry(p *store.PipeVersion) (pipeEntry, error) {
	spec := p.Spec.Clone()
	spec.Targets = nil
	spec.Grace = 0 // the server's alone (missed.go); agents that predate the field would refuse it
	mp := manifest.Pipe{Name: p.Name, Version: p.Version, Spec: *spec, Payload: manifest.Payload{Digest: p.PayloadDigest, Size: p.PayloadSize}}
	b, err := encodeJSON(mp)
	if err != nil {
		return pipeEntry{}, err
	}
	return pipeEntry{name: p.Name, ref: p.Name + "@" + strconv.FormatUint(p.Version, 10), json: b,
		digest: p.PayloadDigest, targets: p.Spec.Targets, secrets: p.Spec.Secrets}, nil
}

// encodeJSON encodes v as manifest.Manifest.Encode does: compact, no HTML
// escaping, no trailing newline.
func encodeJSON(v any) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
}

// encodeManifest returns the bytes manifest.Manifest.Encode would return for
// a manifest with these fields and pipes, built from the pipes' JSON encoded
// once per compilation (TestEncodeManifestMatches keeps them identical).
func encodeManifest(agentID string, serial uint64, issued, expires time.Time, klv uint64, pipes [][]byte) ([]byte, error) {
	head, err := encodeJSON(manifest.Manifest{AgentID: agentID, Serial: serial, IssuedAt: issued, ExpiresAt: expires, KeyListVersion: klv, Pipes: []manifest.Pipe{}})
	if err != nil {
		return nil, err
	}
	const empty = `"pipes":[]}`
	if !bytes.HasSuffix(head, []byte(empty)) {
		return nil, fmt.Errorf("encode manifest: unexpected layout %s", head)
	}
	n := len(head)
	for _, p := range pipes {
		n += len(p) + 1
	}
	out := make([]byte, 0, n)
	out = append(out, head[:len(head)-2]...) // up to and including "pipes":[
	for i, p := range pipes {
		if i > 0 {
			out = append(out, ',')
		}
		out = append(out, p...)
	}
	return append(out, ']', '}'), nil
}

// contentHash names what a manifest says apart from its serial and times:
// the agent, the key-list version and the pipe versions in it.
func contentHash(agentID string, klv uint64, refs []string) string {
	h := sha256.New()
	fmt.Fprintf(h, "%s\n%d\n", agentID, klv)
	for _, r := range refs {
		h.Write([]byte(r))
		h.Write([]byte{'\n'})
	}
	return hex.EncodeToString(h.Sum(nil))
}

// compileOne returns the new manifest for one agent, or nil when the stored
// one is still current.
func (c *compiler) compileOne(a *store.CompileAgent, entries []pipeEntry, byAgent map[string][]int, signer *signing.Signer, klv uint64, now time.Time, force bool) (*store.StoredManifest, error) {
	var idx []int
	for i := range entries {
		if t := entries[i].targets; t.SelectsTags(a.Tags) {
			idx = append(idx, i)
		}
	}
	for _, i := range byAgent[a.ID] {
		if !slices.Contains(idx, i) {
			idx = append(idx, i)
		}
	}
	slices.Sort(idx) // entries are sorted by name
	refs := make([]string, len(idx))
	for j, i := range idx {
		refs[j] = entries[i].ref
	}
	hash := contentHash(a.ID, klv, refs)
	if p := a.Prev; !force && p != nil && p.ContentHash == hash && now.Before(p.IssuedAt.Add(c.lifetime/2)) {
		return nil, nil
	}
	serial := uint64(1)
	if a.Prev != nil {
		serial = a.Prev.Serial + 1
	}
	pipes := make([][]byte, len(idx))
	var payloads, secrets []string
	for j, i := range idx {
		pipes[j] = entries[i].json
		payloads = append(payloads, entries[i].digest)
		secrets = append(secrets, entries[i].secrets...)
	}
	expires := now.Add(c.lifetime)
	payload, err := encodeManifest(a.ID, serial, now, expires, klv, pipes)
	if err != nil {
		return nil, fmt.Errorf("compile %s: %w", a.ID, err)
	}
	env, err := signing.Sign(signer, manifest.PayloadType, payload)
	if err != nil {
		return nil, fmt.Errorf("compile %s: %w", a.ID, err)
	}
	slices.Sort(payloads)
	slices.Sort(secrets)
	return &store.StoredManifest{
		AgentID: a.ID, Serial: serial, ContentHash: hash, Digest: manifest.Digest(env), Envelope: env,
		IssuedAt: now, ExpiresAt: expires, KeyListVersion: klv,
		Payloads: slices.Compact(payloads), Secrets: slices.Compact(secrets),
	}, nil
}

// resignDue re-signs manifests that reached half their lifetime.
func (c *compiler) resignDue(ctx context.Context) (int, error) {
	ids, err := c.store.ManifestsDue(ctx, c.clock.Now().Add(-c.lifetime/2))
	if err != nil || len(ids) == 0 {
		return 0, err
	}
	return c.compile(ctx, ids)
}

// secretChanged re-publishes the manifests that reference a secret.
func (c *compiler) secretChanged(ctx context.Context, name string) error {
	ids, err := c.store.AgentsUsingSecret(ctx, name)
	if err != nil {
		return err
	}
	_, err = c.resign(ctx, ids)
	return err
}
