package server

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
)

// Leadership of several replicas on PostgreSQL (docs/postgres.md,
// "Replicas"): the replica whose session holds an advisory lock runs the
// singletons (leader.lead); the others try to take the lock every
// leaderPoll. The holder pings its session every leaderPing and stops its
// singletons once no ping has succeeded for leaderLease; a replica that
// takes the lock waits leaderGrace before it starts them. Since the lock
// is released no earlier than the old holder's session ends, and the old
// holder notices within leaderLease of that, the grace keeps two
// replicas' singletons from overlapping even when the holder is cut off
// rather than dead.
const (
	leaderPoll        = 2 * time.Second
	leaderPing        = time.Second
	leaderPingTimeout = 2 * time.Second
	leaderLease       = 3 * time.Second
	leaderGrace       = 5 * time.Second
)

// lockSession is the database session holding the leader lock
// (postgres.SessionLock).
type lockSession interface {
	TryLock(ctx context.Context) (bool, error)
	Ping(ctx context.Context) error
	Close()
}

// lockLeader is the leader seam over a lockSession. run elects; lead runs a
// singleton during each term this replica holds the lock.
type lockLeader struct {
	session lockSession
	log     *slog.Logger
	poll    time.Duration
	grace   time.Duration
	// onChange, if set, is told each change of leadership (metrics).
	onChange func(leading bool)

	mu      sync.Mutex
	term    *leaderTerm   // nil while not leading
	changed chan struct{} // closed and replaced when a term begins
	leader  atomic.Bool
}

// leaderTerm is one stretch of holding the lock: its context ends the
// singletons, and wg counts those running.
type leaderTerm struct {
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

func newLockLeader(session lockSession, log *slog.Logger) *lockLeader {
	return &lockLeader{session: session, log: log, poll: leaderPoll, grace: leaderGrace, changed: make(chan struct{})}
}

func (l *lockLeader) leading() bool { return l.leader.Load() }

// run tries to take the lock until ctx ends, holding it whenever it can.
func (l *lockLeader) run(ctx context.Context) {
	defer l.session.Close()
	failing := false
	for {
		got, err := l.session.TryLock(ctx)
		switch {
		case err != nil && ctx.Err() == nil:
			if !failing {
				l.log.Warn("leader lock: cannot reach the database; trying again", "err", err)
			}
			failing = true
		case err == nil:
			if failing {
				l.log.Info("leader lock: the database answers again")
			}
			failing = false
		}
		if got {
			l.hold(ctx)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(l.poll):
		}
	}
}

// hold keeps the lock: after the grace it begins a term, and it ends the
// term (waiting for the singletons to return) when ctx ends or the session
// stops answering; then it closes the session, releasing the lock.
func (l *lockLeader) hold(ctx context.Context) {
	acquired := time.Now()
	lastOK := acquired
	l.log.Info("leader lock taken; the singletons start after the grace", "grace", l.grace)
	var t *leaderTerm
	defer func() {
		l.endTerm(t)
		l.session.Close()
	}()
	tick := time.NewTicker(leaderPing)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		pctx, cancel := context.WithTimeout(ctx, leaderPingTimeout)
		err := l.session.Ping(pctx)
		cancel()
		if ctx.Err() != nil {
			return
		}
		if err == nil {
			lastOK = time.Now()
		}
		if err != nil || time.Since(lastOK) > leaderLease {
			l.log.Warn("leader lock: lost the session that holds it; stopping the singletons", "err", err, "last_ok", lastOK)
			return
		}
		if t == nil && time.Since(acquired) >= l.grace {
			t = l.beginTerm(ctx)
		}
	}
}

func (l *lockLeader) beginTerm(ctx context.Context) *leaderTerm {
	tctx, cancel := context.WithCancel(ctx)
	t := &leaderTerm{ctx: tctx, cancel: cancel}
	l.mu.Lock()
	l.term = t
	close(l.changed)
	l.changed = make(chan struct{})
	l.mu.Unlock()
	l.leader.Store(true)
	if l.onChange != nil {
		l.onChange(true)
	}
	l.log.Info("leader: this replica runs the singletons")
	return t
}

func (l *lockLeader) endTerm(t *leaderTerm) {
	if t == nil {
		return
	}
	l.mu.Lock()
	l.term = nil
	l.mu.Unlock()
	t.cancel()
	t.wg.Wait()
	l.leader.Store(false)
	if l.onChange != nil {
		l.onChange(false)
	}
	l.log.Info("leader: this replica stopped the singletons")
}

// lead runs fn during every term of this replica until ctx ends: fn's
// context ends with the term. A fn that returns early waits for the next
// term.
func (l *lockLeader) lead(ctx context.Context, _ string, fn func(context.Context)) {
	for {
		t := l.waitTerm(ctx)
		if t == nil {
			return
		}
		fctx, cancel := context.WithCancel(t.ctx)
		stop := context.AfterFunc(ctx, cancel)
		fn(fctx)
		stop()
		cancel()
		t.wg.Done()
		select {
		case <-t.ctx.Done():
		case <-ctx.Done():
			return
		}
	}
}

// waitTerm returns the current term, counted in its wg, once there is one;
// nil when ctx ends first.
func (l *lockLeader) waitTerm(ctx context.Context) *leaderTerm {
	for {
		l.mu.Lock()
		t, ch := l.term, l.changed
		if t != nil {
			t.wg.Add(1)
			l.mu.Unlock()
			return t
		}
		l.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return nil
		}
	}
}
