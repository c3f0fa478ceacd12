package server

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/drover/drover/internal/testkit"
)

// fakeLock stands in for PostgreSQL's advisory lock in the one case the
// replica tests cannot cause: a holder whose pings hang (a network cut
// that leaves its connection open) while the database has already ended
// its session and released the lock.
type fakeLock struct {
	mu     sync.Mutex
	holder *fakeSession
}

type fakeSession struct {
	lock *fakeLock
	mu   sync.Mutex
	hang bool
}

func (f *fakeSession) TryLock(context.Context) (bool, error) {
	f.lock.mu.Lock()
	defer f.lock.mu.Unlock()
	if f.lock.holder == nil {
		f.lock.holder = f
	}
	return f.lock.holder == f, nil
}

func (f *fakeSession) Ping(ctx context.Context) error {
	f.mu.Lock()
	hang := f.hang
	f.mu.Unlock()
	if hang {
		<-ctx.Done()
		return ctx.Err()
	}
	return nil
}

func (f *fakeSession) Close() {
	f.lock.mu.Lock()
	defer f.lock.mu.Unlock()
	if f.lock.holder == f {
		f.lock.holder = nil
	}
}

// A holder cut off from the database (its pings hang) stops its singleton
// before the replica that took the released lock starts its own.
func TestLockLeaderCutOffHolder(t *testing.T) {
	lock := &fakeLock{}
	sp := &spans{open: map[string]*span{}}
	var sessions []*fakeSession
	var leaders []*lockLeader
	ctx, cancel := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	for i := range 2 {
		fs := &fakeSession{lock: lock}
		l := newLockLeader(fs, testLogger(t))
		l.poll = 100 * time.Millisecond
		sessions, leaders = append(sessions, fs), append(leaders, l)
		hook := sp.hook(i)
		wg.Add(2)
		go func() { defer wg.Done(); l.run(ctx) }()
		go func() {
			defer wg.Done()
			l.lead(ctx, "job", func(ctx context.Context) {
				hook("job", true)
				<-ctx.Done()
				time.Sleep(300 * time.Millisecond) // a pass finishing its work
				hook("job", false)
			})
		}()
	}
	defer func() { cancel(); wg.Wait() }()
	testkit.WaitFor(t, 10*time.Second, "a leader", func() bool { return leaders[0].leading() || leaders[1].leading() })
	holder := 0
	if leaders[1].leading() {
		holder = 1
	}
	other := 1 - holder
	// The cut: the holder's pings hang, and the database drops its session.
	sessions[holder].mu.Lock()
	sessions[holder].hang = true
	sessions[holder].mu.Unlock()
	cut := time.Now()
	lock.mu.Lock()
	lock.holder = nil
	lock.mu.Unlock()
	testkit.WaitFor(t, 10*time.Second, "the holder to stop", func() bool { return !leaders[holder].leading() })
	stopped := time.Since(cut)
	testkit.WaitFor(t, 15*time.Second, "the other to lead", func() bool { return leaders[other].leading() })
	t.Logf("cut-off holder stopped after %v; the other leads after %v", stopped.Round(time.Millisecond), time.Since(cut).Round(time.Millisecond))
	if stopped > leaderLease+leaderPingTimeout {
		t.Fatalf("the cut-off holder stopped after %v", stopped)
	}
	cancel()
	wg.Wait()
	if n := sp.check(t)["job"]; n != 2 {
		t.Fatalf("%d spans, want 2", n)
	}
}
