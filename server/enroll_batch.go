package server

import (
	"context"
	"errors"
	"log/slog"
	"sync"

	"github.com/drover/drover/server/errs"
	"github.com/drover/drover/server/store"
)

// Enrollments are group-committed: each request checks its token, issues
// its certificate and then hands its enrollment to the enrollQueue, which
// commits every enrollment waiting at that moment in one transaction (the
// token used, the agent created and its audit entry written; one fsync for
// all of them) and compiles the new agents' first manifests together (one
// read of the compile inputs, one save). While one batch commits, the next
// gathers, so the batch grows with the load and a lone enrollment waits for
// nobody. An enrollment is answered only after its batch committed: a crash
// before that leaves its token unused and no agent row, and the agent tries
// again with the same token. One refused enrollment in a batch (its token
// used meanwhile, by a concurrent request or another replica) is rolled back
// alone; the others are committed.

// maxEnrollBatch bounds the enrollments committed in one transaction, and
// maxEnrollQueued those waiting: past it a request is refused as busy (the
// HTTP concurrency limit keeps it far from that in practice).
const (
	maxEnrollBatch  = 256
	maxEnrollQueued = 4 * maxEnrollBatch
)

// enrollStore is what the queue commits to.
type enrollStore interface {
	EnrollAgents(ctx context.Context, es []store.Enrollment) ([]error, error)
}

// enrollQueue batches enrollments (see above). Its drain goroutine runs
// only while enrollments are waiting.
type enrollQueue struct {
	store enrollStore
	// compile compiles the first manifests of newly enrolled agents.
	compile func(ctx context.Context, ids []string) error
	log     *slog.Logger

	mu      sync.Mutex
	waiting []*pendingEnroll
	running bool
	// uncompiled are agents enrolled whose first compile failed: they are
	// compiled again with the next batch.
	uncompiled []string
}

// pendingEnroll is one enrollment waiting for its batch.
type pendingEnroll struct {
	e    store.Enrollment
	err  error
	done chan struct{}
}

// newEnrollQueue is the server's queue, committing to its store and
// compiling with its compiler.
func (s *Server) newEnrollQueue() *enrollQueue {
	return &enrollQueue{store: s.store, log: s.log, compile: func(ctx context.Context, ids []string) error {
		_, err := s.compiler.Compile(ctx, ids)
		return err
	}}
}

// enroll commits e with the enrollments waiting alongside it and returns
// once it is committed and its manifest compiled: nil, or e's own error
// (errs.ErrTokenUsed, ErrTokenExpired, ErrInvalidToken, ErrUnavailable) or
// the batch's. The wait is not cut short by ctx: an enrollment handed over
// runs to its end, as every mutation does.
func (q *enrollQueue) enroll(e store.Enrollment) error {
	p := &pendingEnroll{e: e, done: make(chan struct{})}
	q.mu.Lock()
	if len(q.waiting) >= maxEnrollQueued {
		q.mu.Unlock()
		return errs.New(errs.ErrUnavailable, "server busy: too many enrollments waiting; retry later")
	}
	q.waiting = append(q.waiting, p)
	if !q.running {
		q.running = true
		go q.drain()
	}
	q.mu.Unlock()
	<-p.done
	return p.err
}

// drain commits batches until no enrollment waits.
func (q *enrollQueue) drain() {
	for {
		q.mu.Lock()
		n := min(len(q.waiting), maxEnrollBatch)
		if n == 0 {
			q.running = false
			q.waiting = nil
			q.mu.Unlock()
			return
		}
		batch := make([]*pendingEnroll, n)
		copy(batch, q.waiting)
		q.waiting = q.waiting[n:]
		retry := q.uncompiled
		q.uncompiled = nil
		q.mu.Unlock()
		q.commit(context.Background(), batch, retry)
	}
}

// commit commits one batch, compiles its agents (and retry, agents whose
// earlier compile failed) and answers every enrollment in it.
func (q *enrollQueue) commit(ctx context.Context, batch []*pendingEnroll, retry []string) {
	defer func() {
		for _, p := range batch {
			close(p.done)
		}
	}()
	es := make([]store.Enrollment, len(batch))
	for i, p := range batch {
		es[i] = p.e
	}
	failed, err := q.store.EnrollAgents(ctx, es)
	if err != nil {
		for _, p := range batch {
			p.err = err
		}
		return
	}
	ids := retry
	for i, p := range batch {
		if p.err = failed[i]; p.err == nil {
			ids = append(ids, p.e.Agent.ID)
		}
	}
	q.log.Debug("enrollments committed", "batch", len(batch), "enrolled", len(ids)-len(retry))
	if len(ids) == 0 {
		return
	}
	// The agents are enrolled whatever the compile does: their tokens are
	// used and their certificates valid, so they are answered as enrolled
	// and poll for their manifests; a failed compile is tried again with
	// the next batch (and every later compile of the fleet includes them).
	if err := q.compile(ctx, ids); err != nil && !errors.Is(err, context.Canceled) {
		q.log.Error("compiling the manifests of newly enrolled agents failed; they are compiled again with the next enrollment", "agents", len(ids), "err", err)
		q.mu.Lock()
		q.uncompiled = append(q.uncompiled, ids...)
		if len(q.uncompiled) > maxEnrollQueued {
			q.uncompiled = q.uncompiled[len(q.uncompiled)-maxEnrollQueued:]
		}
		q.mu.Unlock()
	}
}

// actionEnroll is the audit action of an enrollment.
const actionEnroll = "agents.enroll"
