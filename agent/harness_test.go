package agent

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/drover/drover/agent/apply"
	"github.com/drover/drover/internal/testkit"
	"github.com/drover/drover/manifest"
)

// fakeBackend records what the daemon asks of it.
type fakeBackend struct {
	mu       sync.Mutex
	applies  []apply.Input
	bundles  map[string][]byte // pipe -> bundle bytes of the last apply
	checks   int
	runNows  []string
	cancels  []string
	applyErr error
	states   []apply.PipeState
	// runNowErr makes RunNow of a pipe fail: a fake for backends refusing
	// a run, which the real server cannot provoke (it sends RunNow only for
	// pipes the agent's manifest has).
	runNowErr map[string]error
}

func (b *fakeBackend) Name() string { return "cron" }

func (b *fakeBackend) Apply(_ context.Context, in apply.Input) (*apply.Result, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.applyErr != nil {
		return nil, b.applyErr
	}
	b.applies = append(b.applies, in)
	b.bundles = map[string][]byte{}
	b.states = nil
	for i := range in.Manifest.Pipes {
		p := &in.Manifest.Pipes[i]
		data, err := in.Payloads(p)
		if err != nil {
			return nil, err
		}
		if manifest.Digest(data) != p.Payload.Digest {
			return nil, errors.New("fake backend: digest mismatch")
		}
		b.bundles[p.Name] = data
		b.states = append(b.states, apply.PipeState{Name: p.Name, Enabled: true, Scheduled: true, Next: time.Now().Add(time.Hour).Truncate(time.Second)})
	}
	return &apply.Result{}, nil
}

func (b *fakeBackend) Check(context.Context) ([]apply.Step, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.checks++
	return nil, nil
}

func (b *fakeBackend) Status(context.Context) ([]apply.PipeState, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]apply.PipeState(nil), b.states...), nil
}

func (b *fakeBackend) RunNow(_ context.Context, pipe, req string) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.runNows = append(b.runNows, pipe+"/"+req)
	return b.runNowErr[pipe]
}

func (b *fakeBackend) Cancel(_ context.Context, pipe, run string) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.cancels = append(b.cancels, pipe+"/"+run)
	return nil
}

func (b *fakeBackend) Close() error { return nil }

func (b *fakeBackend) applyCount() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.applies)
}

func (b *fakeBackend) lastApply() *apply.Input {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.applies) == 0 {
		return nil
	}
	return &b.applies[len(b.applies)-1]
}

type testAgent struct {
	t       *testing.T
	a       *Agent
	cfg     Config
	store   *BoltStore
	backend apply.Backend
	fake    *fakeBackend
	logs    *testkit.Buffer
	// halt stops the agent's Run (nil once stopped).
	halt func()
}

// testConfig is a configuration for an agent of srv in a fresh directory.
func testConfig(t *testing.T, srv *fakeServer) Config {
	base := testkit.ShortTempDir(t, "dra")
	cfg := DefaultConfig()
	if srv != nil {
		cfg.Server = srv.URL()
	}
	cfg.DataDir = filepath.Join(base, "data")
	cfg.TokenFile = filepath.Join(base, "enroll.token")
	cfg.Backend = BackendCron
	cfg.Scope = ScopeUser
	cfg.SyncInterval = time.Hour // tests sync on demand
	cfg.HeartbeatInterval = time.Hour
	cfg.MaxBackoff = 2 * time.Second
	cfg.RequestTimeout = 10 * time.Second
	return cfg
}

// startAgent runs an agent for cfg in-process until the test ends. With a
// nil backend a fakeBackend is used.
func startAgent(t *testing.T, cfg Config, backend apply.Backend, opts ...Option) *testAgent {
	t.Helper()
	must(t, os.MkdirAll(cfg.DataDir, 0o700))
	st, err := OpenStore(cfg.DataDir, cfg.OutboxMaxBytes, nil)
	must(t, err)
	ta := &testAgent{t: t, cfg: cfg, store: st, logs: &testkit.Buffer{}}
	if backend == nil {
		ta.fake = &fakeBackend{}
		backend = ta.fake
	}
	ta.backend = backend
	log := slog.New(slog.NewTextHandler(ta.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	all := append([]Option{WithStore(st), WithBackend(backend), WithSpoolRoots(filepath.Join(cfg.DataDir, "runs"))}, opts...)
	ta.a, err = New(cfg, log, all...)
	must(t, err)
	ta.halt = testkit.Go(t, "agent", 15*time.Second, ta.a.Run)
	t.Cleanup(func() {
		ta.stop()
		if t.Failed() {
			t.Logf("agent log:\n%s", ta.logs.String())
		}
	})
	return ta
}

// stop stops the agent and closes its store (idempotent).
func (ta *testAgent) stop() {
	if ta.halt == nil {
		return
	}
	ta.halt()
	ta.halt = nil
	ta.store.Close()
}

// enrolled waits until the agent has an identity.
func (ta *testAgent) enrolled(timeout time.Duration) *Identity {
	ta.t.Helper()
	select {
	case <-ta.a.enrolled:
		return ta.a.identity()
	case <-time.After(timeout):
		ta.t.Fatalf("agent did not enroll; log:\n%s", ta.logs.String())
		return nil
	}
}

// syncNow asks the agent to sync and waits for the result.
func (ta *testAgent) syncNow() SyncResult {
	ta.t.Helper()
	select {
	case r := <-ta.a.RequestSync():
		return r
	case <-time.After(30 * time.Second):
		ta.t.Fatal("sync did not finish")
		return SyncResult{}
	}
}

func applyPipeRunning(name, runID string) apply.PipeState {
	return apply.PipeState{Name: name, Enabled: true, Scheduled: true, Running: true, RunID: runID}
}
