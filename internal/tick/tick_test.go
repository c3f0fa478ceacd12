package tick

import (
	"context"
	"testing"
	"time"
)

// run starts f in a goroutine and returns a cancel that waits for it.
func run(t *testing.T, f func(ctx context.Context)) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		f(ctx)
	}()
	stop = func() {
		cancel()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			t.Fatal("the loop did not return when its context ended")
		}
	}
	t.Cleanup(stop)
	return stop
}

func TestEveryWaitsForTheFirstTickThenRepeats(t *testing.T) {
	const d = 40 * time.Millisecond
	calls := make(chan time.Time, 16)
	start := time.Now()
	stop := run(t, func(ctx context.Context) { Every(ctx, d, nil, func() { calls <- time.Now() }) })
	first := <-calls
	if el := first.Sub(start); el < d {
		t.Fatalf("first call after %s, want at least one period (%s)", el, d)
	}
	second := <-calls
	if gap := second.Sub(first); gap < d/2 {
		t.Fatalf("second call %s after the first, want about a period (%s)", gap, d)
	}
	stop()
	n := len(calls)
	time.Sleep(2 * d)
	if len(calls) != n {
		t.Fatal("fn called after the context ended")
	}
}

func TestEveryWakesAtOnce(t *testing.T) {
	wake := make(chan struct{})
	calls := make(chan struct{}, 16)
	run(t, func(ctx context.Context) { Every(ctx, time.Hour, wake, func() { calls <- struct{}{} }) })
	for range 3 {
		wake <- struct{}{}
		select {
		case <-calls:
		case <-time.After(5 * time.Second):
			t.Fatal("a wake did not call fn")
		}
	}
}

func TestEveryKeepsThePeriodDespiteSlowCalls(t *testing.T) {
	// A ticker's period does not stretch by fn's run time: with fn taking
	// a period and a half, calls follow each other with no pause.
	// (Were the period restarted after each call, they would be a period
	// further apart.)
	const d = 100 * time.Millisecond
	calls := make(chan time.Time, 16)
	run(t, func(ctx context.Context) {
		Every(ctx, d, nil, func() {
			time.Sleep(d * 3 / 2)
			calls <- time.Now()
		})
	})
	a, b := <-calls, <-calls
	if gap := b.Sub(a); gap >= d*3/2+d/2 {
		t.Fatalf("calls %s apart, want about the call's own %s (no pause after it)", gap, d*3/2)
	}
}

func TestPacedFirstDelayThenNextFromTheEndOfEachCall(t *testing.T) {
	const first, next, work = 20 * time.Millisecond, 60 * time.Millisecond, 30 * time.Millisecond
	starts, ends := make(chan time.Time, 16), make(chan time.Time, 16)
	start := time.Now()
	run(t, func(ctx context.Context) {
		Paced(ctx, first, func() time.Duration { return next }, nil, func() {
			starts <- time.Now()
			time.Sleep(work)
			ends <- time.Now()
		})
	})
	s1 := <-starts
	if el := s1.Sub(start); el < first {
		t.Fatalf("first call after %s, want at least %s", el, first)
	}
	e1 := <-ends
	s2 := <-starts
	if gap := s2.Sub(e1); gap < next {
		t.Fatalf("second call %s after the end of the first, want at least %s", gap, next)
	}
}

func TestPacedWakeCallsAtOnceAndRestartsTheDelay(t *testing.T) {
	const next = 80 * time.Millisecond
	wake := make(chan struct{})
	calls := make(chan time.Time, 16)
	run(t, func(ctx context.Context) {
		Paced(ctx, time.Hour, func() time.Duration { return next }, wake, func() { calls <- time.Now() })
	})
	woke := time.Now()
	wake <- struct{}{}
	select {
	case <-calls:
	case <-time.After(5 * time.Second):
		t.Fatal("a wake did not call fn")
	}
	// The hour-long first delay was dropped: the next call comes next after
	// the woken one.
	select {
	case at := <-calls:
		if gap := at.Sub(woke); gap < next {
			t.Fatalf("call %s after the wake, want at least %s", gap, next)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no call after the woken one: the delay did not restart")
	}
}

func TestSleep(t *testing.T) {
	start := time.Now()
	if !Sleep(context.Background(), 30*time.Millisecond) {
		t.Fatal("Sleep reported an end of a context that never ends")
	}
	if el := time.Since(start); el < 30*time.Millisecond {
		t.Fatalf("slept %s, want at least 30ms", el)
	}
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(20*time.Millisecond, cancel)
	start = time.Now()
	if Sleep(ctx, time.Hour) {
		t.Fatal("Sleep reported that an hour passed")
	}
	if el := time.Since(start); el > 5*time.Second {
		t.Fatalf("the context's end took %s to stop Sleep", el)
	}
}
