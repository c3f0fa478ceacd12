package testkit

import (
	"context"
	"testing"
	"time"
)

// pollMin and pollMax bound the interval between two checks of a
// condition: quick at first, then no busier than ten checks a second, so a
// condition that costs a request or a systemctl call does not load a
// small machine.
const (
	pollMin = 5 * time.Millisecond
	pollMax = 100 * time.Millisecond
)

// WaitFor checks cond until it holds, and fails t when timeout has passed
// first: "timed out after <timeout> waiting for <what>".
func WaitFor(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	if !Eventually(timeout, cond) {
		t.Fatalf("timed out after %s waiting for %s", timeout, what)
	}
}

// Eventually checks cond until it holds or timeout has passed, and reports
// whether it held. cond is checked at least once, and once more after the
// deadline.
func Eventually(timeout time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	interval := pollMin
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(interval)
		interval = min(2*interval, pollMax)
	}
	return true
}

// Go runs run in a goroutine with a context that stop cancels. stop then
// waits at most timeout for run to return, and fails the test if it
// returned an error or did not return; later calls do nothing. name says
// what ran ("server", "agent").
func Go(t testing.TB, name string, timeout time.Duration, run func(context.Context) error) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx) }()
	stopped := false
	return func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("%s Run: %v", name, err)
			}
		case <-time.After(timeout):
			t.Errorf("%s did not stop within %s", name, timeout)
		}
	}
}
