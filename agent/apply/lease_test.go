package apply

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/drover/drover/agent/lease"
	"github.com/drover/drover/internal/testkit"
	"github.com/drover/drover/manifest"
	"github.com/drover/drover/units"
)

// TestPrepareLeases: prepare judges leases at the time given: an ended
// lease plans the pipe like a disabled one (LeaseEnded), a valid one with
// a last fire time served asks for a catch-up from it, except for a pipe
// that was disabled in the previous manifest (re-enabled: counts from now).
func TestPrepareLeases(t *testing.T) {
	now := time.Date(2026, 3, 1, 12, 0, 30, 0, time.UTC)
	b, err := manifest.ScriptBundle("true\n")
	if err != nil {
		t.Fatal(err)
	}
	pipe := func(name string, until, served time.Time) manifest.Pipe {
		return manifest.Pipe{Name: name, Version: 1, Spec: manifest.Spec{Name: name, Schedule: "* * * * *", Script: "true\n"},
			Payload: manifest.Payload{Digest: manifest.Digest(b), Size: int64(len(b))}, LeaseUntil: until, LastFireServed: served}
	}
	served := now.Add(-150 * time.Second)
	m := &manifest.Manifest{Pipes: []manifest.Pipe{
		pipe("free", time.Time{}, time.Time{}),
		pipe("ended", now.Add(lease.Lead), served),
		pipe("held", now.Add(time.Minute), served),
		pipe("fresh", now.Add(time.Minute), time.Time{}),
	}}
	preps, err := prepare(m, units.Options{AgentPath: "/x", Scope: units.ScopeUser, DataDir: "/d", Now: now}, true, now, nil)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]Desired{}
	for _, p := range preps {
		got[p.pipe.Name] = p.desired
	}
	if d := got["free"]; !d.Enabled || d.LeaseEnded || !d.CatchupFrom.IsZero() {
		t.Fatalf("free: %+v", d)
	}
	if d := got["ended"]; d.Enabled || !d.LeaseEnded || !d.CatchupFrom.IsZero() {
		t.Fatalf("ended: %+v", d)
	}
	if d := got["held"]; !d.Enabled || d.LeaseEnded || !d.CatchupFrom.Equal(served) {
		t.Fatalf("held: %+v", d)
	}
	if d := got["fresh"]; !d.Enabled || !d.CatchupFrom.IsZero() {
		t.Fatalf("fresh: %+v", d)
	}
	prev := &manifest.Manifest{Pipes: []manifest.Pipe{pipe("held", now.Add(time.Minute), served)}}
	prev.Pipes[0].Spec.Enabled = new(bool)
	preps, err = prepare(m, units.Options{AgentPath: "/x", Scope: units.ScopeUser, DataDir: "/d", Now: now}, true, now, prev)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range preps {
		if p.pipe.Name == "held" && !p.desired.CatchupFrom.IsZero() {
			t.Fatal("a re-enabled pipe catches up")
		}
	}

	// The plan stops the ended pipe's timer, saying why; the held one's
	// start (stopped timer) catches up from the fire time served, a
	// schedule change does not.
	ended := desiredFor("ended", "daily", "1111eeeeeeeeeeee", false)
	ended.LeaseEnded = true
	cur := installed(desiredFor("ended", "daily", "1111eeeeeeeeeeee", true))
	steps := Plan([]Desired{ended}, cur)
	if len(steps) != 1 || steps[0].Action != ActionStop || steps[0].Reason != ReasonLeaseEnded {
		t.Fatalf("ended: %v", steps)
	}
	held := desiredFor("held", "daily", "1111hhhhhhhhhhhh", true)
	held.CatchupFrom = served
	cur = installed(held)
	cur.Timers["drover-pipe-held.timer"] = TimerState{}
	steps = Plan([]Desired{held}, cur)
	jobs := sortSteps(steps, nil, map[string]bool{"drover-pipe-held.timer": true}, map[string]time.Time{"drover-pipe-held.timer": served})
	if from, ok := jobs.catchup["drover-pipe-held.timer"]; !ok || !from.Equal(served) || len(jobs.guarded) != 1 {
		t.Fatalf("renewal: steps %v jobs %+v", steps, jobs)
	}
	edited := desiredFor("held", "hourly", "2222hhhhhhhhhhhh", true)
	steps = Plan([]Desired{edited}, installed(held))
	jobs = sortSteps(steps, nil, map[string]bool{"drover-pipe-held.timer": true}, map[string]time.Time{"drover-pipe-held.timer": served})
	if len(jobs.catchup) != 0 || len(jobs.guarded) != 1 {
		t.Fatalf("schedule change: steps %v jobs %+v", steps, jobs)
	}
}

// TestCronFence: the cron backend's fast fence removes the entry of a held
// pipe whose lease ended (clock moved with a fake: the scheduler itself is
// not asked to fire), leaves alone one whose lease the caller saw is not
// the applied one (a renewal won the race), and a later apply keeps the
// ended pipe stopped until a renewal schedules it again.
func TestCronFence(t *testing.T) {
	clock := &testkit.Clock{}
	cfg := userConfig(t, t.TempDir())
	cfg.RuntimeDir = filepath.Join(t.TempDir(), "drover")
	cfg.Now = clock.Now
	cb, err := NewCron(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cb.Close(); cb.Wait() })
	in := input(t, spec("held", "17 3 * * *"), spec("free", "17 3 * * *"))
	until := clock.Now().Add(time.Minute).Truncate(time.Second)
	in.Manifest.Pipes[0].LeaseUntil = until
	mustApply(t, cb, in)
	scheduled := func(name string) bool {
		st, _ := cb.Status(context.Background())
		for _, s := range st {
			if s.Name == name {
				return s.Scheduled
			}
		}
		return false
	}
	if !scheduled("held") || !scheduled("free") {
		t.Fatal("not scheduled")
	}
	if steps, _ := cb.Fence(context.Background(), map[string]time.Time{"held": until}); len(steps) != 0 {
		t.Fatalf("fenced inside the lease: %v", steps)
	}
	clock.Advance(time.Minute)
	if steps, _ := cb.Fence(context.Background(), map[string]time.Time{"held": until.Add(time.Hour)}); len(steps) != 0 {
		t.Fatalf("fenced for a lease that is not the applied one: %v", steps)
	}
	steps, err := cb.Fence(context.Background(), map[string]time.Time{"held": until, "free": {}})
	if err != nil || len(steps) != 1 || steps[0].Pipe != "held" || steps[0].Reason != ReasonLeaseEnded {
		t.Fatalf("fence: %v %v", steps, err)
	}
	if scheduled("held") || !scheduled("free") {
		t.Fatal("fence stopped the wrong pipe")
	}
	if changes, err := cb.Check(context.Background()); err != nil || len(changes) != 0 || scheduled("held") {
		t.Fatalf("check after the fence: %v %v", changes, err)
	}
	in.Manifest.Pipes[0].LeaseUntil = clock.Now().Add(time.Hour)
	res := mustApply(t, cb, in)
	if !scheduled("held") {
		t.Fatalf("the renewal did not schedule it: %v", res.Steps)
	}
}
