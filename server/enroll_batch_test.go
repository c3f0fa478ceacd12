package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/drover/drover/api"
	"github.com/drover/drover/server/errs"
	"github.com/drover/drover/server/store"
	"github.com/drover/drover/server/store/sqlite"
)

// gatedStore is a real SQLite store whose EnrollAgents calls can be held
// (so that a test knows which enrollments wait together: the timing of
// real requests cannot be made to) and made to fail (a transaction that
// does not commit, which a healthy SQLite file cannot be made to do on
// demand: the real store is called with a cancelled context, so the
// failure is the store's own).
type gatedStore struct {
	*sqlite.DB
	mu      sync.Mutex
	hold    chan struct{} // the first call waits for it, if set
	entered chan struct{} // closed when the first call is held
	fail    bool
	batches [][]string // the token ids of every call
}

func (g *gatedStore) EnrollAgents(ctx context.Context, es []store.Enrollment) ([]error, error) {
	g.mu.Lock()
	var toks []string
	for _, e := range es {
		toks = append(toks, e.TokenID)
	}
	g.batches = append(g.batches, toks)
	hold, fail := g.hold, g.fail
	g.hold = nil
	g.mu.Unlock()
	if hold != nil {
		close(g.entered)
		<-hold
	}
	if fail {
		cctx, cancel := context.WithCancel(ctx)
		cancel()
		ctx = cctx
	}
	return g.DB.EnrollAgents(ctx, es)
}

func newGatedQueue(t *testing.T) (*enrollQueue, *gatedStore, *[][]string) {
	t.Helper()
	db, err := sqlite.Open(t.Context(), filepath.Join(t.TempDir(), "server.db"), "normal")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	g := &gatedStore{DB: db}
	var compiled [][]string
	var mu sync.Mutex
	q := &enrollQueue{store: g, log: slog.New(slog.DiscardHandler), compile: func(_ context.Context, ids []string) error {
		mu.Lock()
		defer mu.Unlock()
		compiled = append(compiled, slices.Clone(ids))
		return nil
	}}
	return q, g, &compiled
}

func testEnrollment(t *testing.T, db store.TokenStore, tok string, now time.Time) store.Enrollment {
	t.Helper()
	if _, err := db.GetToken(t.Context(), tok); errors.Is(err, errs.ErrNotFound) {
		if err := db.CreateToken(t.Context(), &store.EnrollmentToken{ID: tok, SecretHash: []byte("h"), CreatedAt: now, ExpiresAt: now.Add(time.Hour)}); err != nil {
			t.Fatal(err)
		}
	}
	id := fmt.Sprintf("agt-%s-%d", tok, now.UnixNano())
	return store.Enrollment{TokenID: tok, Now: now, Agent: &store.Agent{ID: id, Name: id, Hostname: id, CreatedAt: now, CertSerial: id},
		Audit: &store.AuditEntry{At: now, Action: actionEnroll, Target: "agent/" + id}}
}

// TestEnrollQueueBatches: enrollments that arrive while a batch commits
// are committed together in the next one, and a token used twice in that
// batch enrolls once; each one is answered with its own outcome, and the
// batch's agents are compiled together.
func TestEnrollQueueBatches(t *testing.T) {
	q, g, compiled := newGatedQueue(t)
	now := time.Now()
	release := make(chan struct{})
	g.hold, g.entered = release, make(chan struct{})

	first := make(chan error, 1)
	e0 := testEnrollment(t, g, "t0", now)
	go func() { first <- q.enroll(e0) }()
	<-g.entered // t0's batch is committing; the next ones wait behind it

	const n = 10
	es := make([]store.Enrollment, n)
	for i := range es {
		es[i] = testEnrollment(t, g, fmt.Sprintf("t%d", 1+i%(n-1)), now.Add(time.Duration(i))) // t1 twice
	}
	results := make([]error, n)
	var wg sync.WaitGroup
	for i := range es {
		wg.Add(1)
		go func() { defer wg.Done(); results[i] = q.enroll(es[i]) }()
	}
	waitFor(t, func() bool { q.mu.Lock(); defer q.mu.Unlock(); return len(q.waiting) == n })
	close(release)
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	wg.Wait()

	if len(g.batches) != 2 || len(g.batches[1]) != n {
		t.Fatalf("batches %v: want [t0] and then all %d waiting enrollments in one", g.batches, n)
	}
	used := 0
	for i, err := range results {
		switch {
		case err == nil:
		case errors.Is(err, errs.ErrTokenUsed) && es[i].TokenID == "t1":
			used++
		default:
			t.Fatalf("enrollment %d (token %s): %v", i, es[i].TokenID, err)
		}
	}
	if used != 1 {
		t.Fatalf("token t1 was presented twice in one batch and refused %d times, want once", used)
	}
	agents, err := g.ListAgents(t.Context())
	if err != nil || len(agents) != n {
		t.Fatalf("%d agents (%v), want %d: one per token", len(agents), err, n)
	}
	if len(*compiled) != 2 || len((*compiled)[1]) != n-1 {
		t.Fatalf("compiled %v: want t0's agent, then the batch's %d new agents in one compile", *compiled, n-1)
	}
}

// TestEnrollQueueFailedCommit: when a batch's transaction fails, every
// enrollment in it gets the error and none is applied (no agent, the
// token unused, no audit entry); the next batch works.
func TestEnrollQueueFailedCommit(t *testing.T) {
	q, g, compiled := newGatedQueue(t)
	now := time.Now()
	g.fail = true
	e := testEnrollment(t, g, "f1", now)
	if err := q.enroll(e); err == nil {
		t.Fatal("an enrollment whose transaction failed was answered as enrolled")
	}
	if _, err := g.GetAgent(t.Context(), e.Agent.ID); !errors.Is(err, errs.ErrNotFound) {
		t.Fatalf("the failed enrollment left an agent: %v", err)
	}
	if tok, err := g.GetToken(t.Context(), "f1"); err != nil || !tok.UsedAt.IsZero() {
		t.Fatalf("the failed enrollment used its token: %+v %v", tok, err)
	}
	if list, err := g.ListAudit(t.Context(), store.AuditFilter{Action: actionEnroll, Limit: 10}); err != nil || len(list) != 0 {
		t.Fatalf("the failed enrollment left audit entries: %v %v", list, err)
	}
	if len(*compiled) != 0 {
		t.Fatalf("agents of a failed batch were compiled: %v", *compiled)
	}
	g.fail = false
	if err := q.enroll(e); err != nil {
		t.Fatalf("the same token after the failed batch: %v", err)
	}
}

// TestEnrollQueueCompileRetried: agents whose first compile failed are
// answered as enrolled (their enrollment is committed) and compiled again
// with the next batch.
func TestEnrollQueueCompileRetried(t *testing.T) {
	q, g, _ := newGatedQueue(t)
	var calls [][]string
	q.compile = func(_ context.Context, ids []string) error {
		calls = append(calls, slices.Clone(ids))
		if len(calls) == 1 {
			return errors.New("signing key unavailable")
		}
		return nil
	}
	now := time.Now()
	a, b := testEnrollment(t, g, "c1", now), testEnrollment(t, g, "c2", now)
	if err := q.enroll(a); err != nil {
		t.Fatalf("an enrollment committed but not compiled: %v (want it answered as enrolled)", err)
	}
	if err := q.enroll(b); err != nil {
		t.Fatal(err)
	}
	if len(calls) != 2 || !slices.Equal(calls[1], []string{a.Agent.ID, b.Agent.ID}) {
		t.Fatalf("compiles %v: want the failed agent again with the next one", calls)
	}
}

// TestEnrollBatchedOverHTTP: many enrollments at once through the real
// handler all succeed, each with its manifest and exactly one audit entry.
func TestEnrollBatchedOverHTTP(t *testing.T) {
	ts := startServer(t)
	const n = 24
	toks := make([]string, n)
	for i := range toks {
		toks[i] = ts.token(map[string]string{"role": "web"})
	}
	agents := make([]*testAgent, n)
	errsOf := make([]error, n)
	var wg sync.WaitGroup
	for i := range toks {
		wg.Add(1)
		go func() { defer wg.Done(); agents[i], errsOf[i] = enroll(ts.base, toks[i], fmt.Sprintf("web-%d", i)) }()
	}
	wg.Wait()
	for i, err := range errsOf {
		if err != nil {
			t.Fatalf("enrollment %d: %v", i, err)
		}
		defer agents[i].close()
	}
	for _, a := range agents {
		if _, err := a.pullManifest(); err != nil {
			t.Fatalf("agent %s: first manifest: %v", a.id, err)
		}
	}
	var audit api.AuditList
	ts.adminOK("GET", "/api/v1/audit?action="+actionEnroll+"&limit=100", nil, &audit)
	seen := map[string]int{}
	for _, e := range audit.Entries {
		seen[e.Target]++
	}
	for _, a := range agents {
		if seen["agent/"+a.id] != 1 {
			t.Fatalf("agent %s has %d audit entries, want 1 (%v)", a.id, seen["agent/"+a.id], seen)
		}
	}
	if len(audit.Entries) != n {
		t.Fatalf("%d enrollment audit entries, want %d", len(audit.Entries), n)
	}
}

// waitFor polls cond until it holds (bounded).
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("condition not reached in 10 s")
		}
	}
}
