// Package tick runs a function periodically until a context ends: the one
// loop behind the daemons' periodic work (watchdog pings, the leases loop,
// maintenance) and the simulator's paced agents; and it waits for a
// while unless a context ends first (Sleep).
//
// Any package of this module may import it; it imports nothing of it.
package tick

import (
	"context"
	"time"
)

// Every calls fn each time a ticker of period d fires, and at once each
// time wake receives (a nil wake never does), until ctx is done. The first
// call comes after the first tick, not at once. The period does not
// stretch by fn's run time and a wake does not reset it: as with
// time.Ticker, a call that outlasts d is followed at once by the next, and
// ticks missed meanwhile are dropped.
func Every(ctx context.Context, d time.Duration, wake <-chan struct{}, fn func()) {
	t := time.NewTicker(d)
	defer t.Stop()
	loop(ctx, t.C, wake, func(bool) { fn() })
}

// Paced calls fn first after the delay first, then after next() from the
// end of each call, and at once each time wake receives (a nil wake never
// does; the pending delay is dropped, and the next one starts after that
// call), until ctx is done.
func Paced(ctx context.Context, first time.Duration, next func() time.Duration, wake <-chan struct{}, fn func()) {
	t := time.NewTimer(first)
	defer t.Stop()
	loop(ctx, t.C, wake, func(woke bool) {
		if woke && !t.Stop() {
			select {
			case <-t.C:
			default:
			}
		}
		fn()
		t.Reset(next())
	})
}

// Sleep waits d, or less when ctx ends first; it reports whether d passed
// (false: ctx ended). When both happen at once either may be reported.
func Sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// loop calls fn each time c or wake receives (woke: it was wake), until
// ctx is done.
func loop(ctx context.Context, c <-chan time.Time, wake <-chan struct{}, fn func(woke bool)) {
	for {
		woke := false
		select {
		case <-ctx.Done():
			return
		case <-c:
		case <-wake:
			woke = true
		}
		fn(woke)
	}
}
