package lease

import (
	"testing"
	"time"

	"github.com/drover/drover/manifest"
)

func TestRule(t *testing.T) {
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	free := &manifest.Pipe{Name: "all"}
	if !Active(free, now) || Ended(free, now) || !End(free).IsZero() || !CatchupFrom(free, now).IsZero() {
		t.Fatal("a pipe that is not held is always active and never catches up")
	}
	held := &manifest.Pipe{Name: "one", LeaseUntil: now.Add(time.Minute)}
	if !End(held).Equal(now.Add(time.Minute - Lead)) {
		t.Fatalf("end %s", End(held))
	}
	for _, c := range []struct {
		at     time.Time
		active bool
	}{
		{now, true},
		{now.Add(time.Minute - Lead - time.Nanosecond), true},
		{now.Add(time.Minute - Lead), false}, // a timer due at the stop instant must not fire
		{now.Add(time.Minute), false},
		{now.Add(time.Hour), false},
	} {
		if Active(held, c.at) != c.active || Ended(held, c.at) == c.active {
			t.Errorf("at %s: active %v, want %v", c.at, Active(held, c.at), c.active)
		}
	}
	if !CatchupFrom(held, now).IsZero() {
		t.Fatal("no last fire time served: no catch-up")
	}
	held.LastFireServed = now.Add(-2 * time.Minute)
	if got := CatchupFrom(held, now); !got.Equal(held.LastFireServed) {
		t.Fatalf("catch-up from %s", got)
	}
	if !CatchupFrom(held, now.Add(time.Minute)).IsZero() {
		t.Fatal("an ended lease catches up")
	}
	held.Spec.Catchup = manifest.CatchupSkip
	if !CatchupFrom(held, now).IsZero() {
		t.Fatal("catchup: skip catches up")
	}
}
