package server

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/drover/drover/api"
	"github.com/drover/drover/manifest"
	"github.com/drover/drover/server/compile"
	"github.com/drover/drover/server/pki"
	"github.com/drover/drover/server/store"
	"github.com/drover/drover/server/stream"
	"github.com/drover/drover/signing"
)

// compiler turns pipes and agents into signed per-agent manifests
// (docs/design.md, "Flows", Publish): package compile plans each agent's
// manifest (when its serial rises and the exact bytes), the compiler reads
// the inputs, signs those bytes and saves them; the exact signed bytes are
// stored and served as they are.
type compiler struct {
	store    compilerStore
	keys     *pki.Keyring
	clock    Clock
	lifetime time.Duration
	log      *slog.Logger
	// published is called for every agent whose manifest changed, after
	// the new manifest is committed.
	published func(agentID string, serial uint64)
	// placement: one (placement.go)
	leases  compile.Leases
	healthy func(id string, lastSeen, now time.Time) bool // nil: every agent
	// holdUntil: silent holders are not moved before it (after a start,
	// the agents need the time to reconnect).
	holdUntil time.Time
	// leading reports whether this replica decides placement (nil: it
	// does, as a server alone always does).
	leading func() bool
	pending atomic.Pointer[map[string]bool] // agents whose confirmation of a release would hand a pipe over

	// syncKeys, if set, brings the keyring up to date with the store
	// before each compilation (keys shared by replicas).
	syncKeys func(context.Context) error

	// bulk, when set, is told of every save of more than one chunk (the
	// ingester gives way to it on a store with one writer).
	bulk *bulkWrites

	mu sync.Mutex // one compilation at a time keeps serials strictly rising
}

// bulkWrites tells whether a compilation is saving more than one chunk of
// manifests: on SQLite, whose one writer the ingester shares, the
// ingester then holds its commits (stream.Yield) so that the chunks
// follow each other instead of each waiting for an ingest commit (19,500
// agents: the fleet's recompile spent about half its time so waiting).
type bulkWrites struct {
	mu   sync.Mutex
	n    int
	done chan struct{}
}

var _ stream.Yield = (*bulkWrites)(nil)

// begin marks a bulk write; the returned func ends it.
func (b *bulkWrites) begin() (end func()) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.n == 0 {
		b.done = make(chan struct{})
	}
	b.n++
	return func() {
		b.mu.Lock()
		defer b.mu.Unlock()
		if b.n--; b.n == 0 {
			close(b.done)
			b.done = nil
		}
	}
}

// UnderWay is nil when no bulk write is under way, else closed when the
// last one ends.
func (b *bulkWrites) UnderWay() <-chan struct{} {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.done
}

// saveChunk is how many manifests are committed per transaction. While a
// recompile saves, the ingester gives way, so only a
// PUT's own writes queue behind one such commit (~0.1 s); fewer commits
// made the recompile of 19,500 agents 1.4-1.9 s instead of 2.2-2.6 s at 250.
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

// maxStaleRounds bounds how often one compilation compiles again the
// agents whose manifests another replica saved meanwhile.
const maxStaleRounds = 16

// run compiles; workers sign while the calling goroutine commits what they
// produced, in chunks. The compile lock keeps this process's serials
// rising; across replicas, SaveManifests refuses a manifest compiled over a
// serial that is no longer the stored one, and those agents are compiled
// again from fresh inputs (so a serial is never saved twice, and a change
// read by the losing replica is not lost).
func (c *compiler) run(ctx context.Context, ids []string, force bool) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.syncKeys != nil {
		if err := c.syncKeys(ctx); err != nil {
			return 0, fmt.Errorf("compile: %w", err)
		}
	}
	changed := 0
	for round := 1; ; round++ {
		n, stale, err := c.runOnce(ctx, ids, force)
		changed += n
		if err != nil || len(stale) == 0 {
			return changed, err
		}
		if round == maxStaleRounds {
			return changed, fmt.Errorf("compile: %d manifests kept changing under this compilation (another replica compiling the same agents)", len(stale))
		}
		c.log.Debug("manifests saved by another replica meanwhile; compiling them again", "agents", len(stale))
		ids = stale
		// A jittered pause that grows with the rounds, so that two replicas
		// compiling the same agents in step fall out of step.
		select {
		case <-ctx.Done():
			return changed, ctx.Err()
		case <-time.After(time.Duration(rand.Int64N(int64(round) * int64(5*time.Millisecond)))):
		}
	}
}

func (c *compiler) runOnce(ctx context.Context, ids []string, force bool) (int, []string, error) {
	t0 := time.Now()
	pipes, agents, err := c.store.CompileInputs(ctx, ids)
	if err != nil {
		return 0, nil, fmt.Errorf("compile: %w", err)
	}
	holders, err := c.store.Holders(ctx)
	if err != nil {
		return 0, nil, fmt.Errorf("compile: %w", err)
	}
	in := make([]compile.Pipe, len(pipes))
	placed := len(holders) > 0
	for i, p := range pipes {
		in[i] = compilePipe(p)
		placed = placed || compile.IsPlacedOne(&in[i])
	}
	if placed && ids != nil {
		// Placement is decided over the whole fleet, whoever is compiled.
		if pipes, agents, err = c.store.CompileInputs(ctx, nil); err != nil {
			return 0, nil, fmt.Errorf("compile: %w", err)
		}
		in = in[:0]
		for _, p := range pipes {
			in = append(in, compilePipe(p))
		}
	}
	now := c.clock.Now()
	signer, klv := c.keys.Signer()
	comp, err := compile.New(in, klv, now, c.lifetime)
	if err != nil {
		return 0, nil, err
	}
	cas := make([]compile.Agent, len(agents))
	for i, a := range agents {
		cas[i] = compileAgent(a)
	}
	if placed {
		extra, err := c.place(ctx, comp, in, agents, cas, holders, now)
		if err != nil {
			return 0, nil, err
		}
		if ids != nil {
			keep := map[string]bool{}
			for _, id := range ids {
				keep[id] = true
			}
			for _, id := range extra {
				keep[id] = true
			}
			j := 0
			for i := range agents {
				if keep[agents[i].ID] {
					agents[j], cas[j] = agents[i], cas[i]
					j++
				}
			}
			agents, cas = agents[:j], cas[:j]
		}
	}
	if len(agents) == 0 {
		return 0, nil, nil
	}

	tRead := time.Since(t0)
	if c.bulk != nil && len(agents) > saveChunk {
		defer c.bulk.begin()()
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
				m, err := sign(comp, cas[i], signer, force)
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
	var stale []string
	var tSave time.Duration // in SaveManifests: the writer's wait and the commits
	batch := make([]*store.StoredManifest, 0, saveChunk)
	flush := func() error {
		if len(batch) == 0 {
			return nil
		}
		ts := time.Now()
		lost, err := c.store.SaveManifests(ctx, batch)
		tSave += time.Since(ts)
		if err != nil {
			return fmt.Errorf("compile: %w", err)
		}
		stale = append(stale, lost...)
		for _, m := range batch {
			if c.published != nil && !slices.Contains(lost, m.AgentID) {
				c.published(m.AgentID, m.Serial)
			}
		}
		changed += len(batch) - len(lost)
		batch = batch[:0]
		return nil
	}
	for r := range results {
		if r.err != nil {
			return changed, nil, r.err // cancel stops the workers
		}
		if batch = append(batch, r.m); len(batch) == saveChunk {
			if err := flush(); err != nil {
				return changed, nil, err
			}
		}
	}
	if err := flush(); err != nil {
		return changed, nil, err
	}
	if changed > 0 {
		c.log.Debug("manifests published", "changed", changed, "compiled", len(agents),
			"read", tRead, "save", tSave, "total", time.Since(t0))
	}
	return changed, stale, nil
}

// compiled is the outcome of compiling one agent whose manifest changed.
type compiled struct {
	m   *store.StoredManifest
	err error
}

// compilePipe is the compiler's view of a pipe version.
func compilePipe(p *store.PipeVersion) compile.Pipe {
	return compile.Pipe{Name: p.Name, Version: p.Version, Spec: p.Spec, PayloadDigest: p.PayloadDigest, PayloadSize: p.PayloadSize}
}

// compileAgent is the compiler's view of an agent and its stored manifest.
func compileAgent(a *store.CompileAgent) compile.Agent {
	ca := compile.Agent{ID: a.ID, Tags: a.Tags}
	if p := a.Prev; p != nil {
		ca.Prev = &compile.Previous{Serial: p.Serial, ContentHash: p.ContentHash, IssuedAt: p.IssuedAt, KeyListVersion: p.KeyListVersion}
	}
	return ca
}

// sign plans one agent's manifest and signs it, or returns nil when the
// stored one is still current.
func sign(comp *compile.Compilation, a compile.Agent, signer *signing.Signer, force bool) (*store.StoredManifest, error) {
	m, err := comp.Agent(a, force)
	if err != nil || !m.Changed {
		return nil, err
	}
	env, err := signing.Sign(signer, manifest.PayloadType, m.Body)
	if err != nil {
		return nil, fmt.Errorf("compile %s: %w", a.ID, err)
	}
	var prev uint64
	if a.Prev != nil {
		prev = a.Prev.Serial
	}
	return &store.StoredManifest{
		AgentID: a.ID, Serial: m.Serial, PrevSerial: prev, ContentHash: m.ContentHash, Digest: manifest.Digest(env), Envelope: env,
		IssuedAt: comp.IssuedAt(), ExpiresAt: comp.ExpiresAt(), KeyListVersion: comp.KeyListVersion(),
		Payloads: m.Payloads, Secrets: m.Secrets,
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

// publishWait is how long a pipe PUT waits for the fleet's recompile: a
// change to a few thousand agents is compiled, signed and stored within
// it; a larger fleet's recompile goes on after the answer.
const publishWait = 500 * time.Millisecond

// publishRetries bounds the retries of a recompile that failed after the
// answer; publishRetryBase is the first pause (doubling).
const (
	publishRetries   = 5
	publishRetryBase = time.Second
)

// publishAll recompiles every manifest after a pipe change and waits for it
// at most wait. Done: it finished (an error is returned as it is, the
// caller answers with it, as before). Not done: it goes on in the
// background (the server's drain waits for it); should it then fail, it
// is logged and retried from the stored state, which is always safe (a
// recompile of unchanged inputs changes nothing).
func (s *Server) publishAll(ctx context.Context, wait time.Duration) (*api.PublishState, error) {
	type result struct {
		n   int
		err error
	}
	done := make(chan result, 1)
	bg := context.WithoutCancel(ctx)
	// Who answers for a failure: the caller (callerOwns) while it still
	// waits, the background (backgroundOwns) once the caller has answered.
	const (
		callerOwns = iota + 1
		backgroundOwns
	)
	var owner atomic.Int32
	s.publishing.Add(1)
	go func() {
		defer s.publishing.Done()
		n, err := s.compiler.Compile(bg, nil)
		if err != nil && owner.CompareAndSwap(0, callerOwns) {
			done <- result{n, err}
			return
		}
		done <- result{n, err}
		pause := publishRetryBase
		for try := 1; err != nil && try <= publishRetries; try++ {
			s.log.Error("recompiling the manifests after a pipe change; retrying", "err", err, "retry_in", pause, "try", try)
			select {
			case <-s.quit:
				return
			case <-time.After(pause):
			}
			pause *= 2
			_, err = s.compiler.Compile(bg, nil)
		}
		if err != nil {
			s.log.Error("recompiling the manifests after a pipe change failed; the next change or re-sign recompiles them", "err", err)
		}
	}()
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case r := <-done:
		if r.err != nil {
			return nil, r.err
		}
		return &api.PublishState{Done: true, Changed: r.n}, nil
	case <-t.C:
		if !owner.CompareAndSwap(0, backgroundOwns) {
			// It failed just now, and the failure is ours to answer.
			r := <-done
			return nil, r.err
		}
		select {
		case r := <-done: // it landed meanwhile
			if r.err == nil {
				return &api.PublishState{Done: true, Changed: r.n}, nil
			}
		default:
		}
		s.log.Info("the recompile after a pipe change goes on after the answer", "waited", wait)
		return &api.PublishState{}, nil
	}
}
