package apply

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	"github.com/drover/drover/agent/internal/sdtest"
	"github.com/drover/drover/manifest"
	"github.com/drover/drover/units"
)

// TestSystemdNoUnplannedRun proves the guard (guard.go) on the real manager:
// editing a schedule never runs the pipe, for Persistent= timers (stamp in
// the past) and for non-persistent ones (activated before an instant of the
// new schedule), while a control timer changed the naive way does run, a
// genuine catch-up (a start by systemd itself, as at boot) still runs, and a
// `* * * * *` timer really fires its service.
func TestSystemdNoUnplannedRun(t *testing.T) {
	env := sdtest.Require(t)
	t.Parallel()
	data := t.TempDir()
	b := newSystemd(t, data)
	const never = "0 0 1 1 *"
	specs := []manifest.Spec{
		spec("tick", "* * * * *"),
		spec("edit-skip", never, withCatchup(manifest.CatchupSkip)),
		spec("edit-once", never),
		spec("ctl-skip", never, withCatchup(manifest.CatchupSkip)),
		spec("catch", never),
	}
	t0 := time.Now()
	mustApply(t, b, input(t, specs...))
	t1 := time.Now() // tick was activated between t0 and t1
	stamp := func(p string) string { return stampPath(env.StampDir(), units.TimerName(p)) }

	// 1. Persistent timer, last triggered two hours ago (stamp), schedule
	// edited to daily at a time one hour ago: systemd alone would run it at
	// once. (Daily, so no planned instant falls inside the test.)
	old := time.Now().Add(-2 * time.Hour)
	if err := os.Chtimes(stamp("edit-once"), old, old); err != nil {
		t.Fatal(err)
	}
	hourAgo := time.Now().UTC().Add(-time.Hour)
	specs[2] = spec("edit-once", fmt.Sprintf("%d %d * * *", hourAgo.Minute(), hourAgo.Hour()))
	before := time.Now()
	plannedOnce := nextOf(t, specs[2], before)
	res := mustApply(t, b, input(t, specs...))
	hasStep(t, res, ActionRestart, "edit-once")
	tm := sdtest.ListTimers(t)[units.TimerName("edit-once")]
	if w0, w1 := nextOf(t, specs[2], before), nextOf(t, specs[2], time.Now()); !tm.Next.Equal(w0) && !tm.Next.Equal(w1) {
		t.Errorf("edit-once: next %v, evaluator %v", tm.Next, w0)
	}

	// 2. Genuine catch-up: systemd starting a Persistent timer whose stamp
	// predates a missed instant (what happens at boot) runs it once.
	sdtest.Systemctl(t, "stop", units.TimerName("catch"))
	longAgo := time.Now().AddDate(-1, -1, 0)
	if err := os.Chtimes(stamp("catch"), longAgo, longAgo); err != nil {
		t.Fatal(err)
	}
	sdtest.Systemctl(t, "start", units.TimerName("catch"))
	waitRun(t, data, "catch", 0, 10*time.Second)

	// 3. The every-minute timer fires at the next minute boundary after
	// its activation (t0 and t1 may straddle one: either boundary).
	boundary := t0.Truncate(time.Minute).Add(time.Minute)
	last := t1.Truncate(time.Minute).Add(time.Minute)
	runs := waitRun(t, data, "tick", 0, time.Until(last)+15*time.Second)
	if d := runs[0].At.Sub(last); d >= 0 && d <= 5*time.Second {
		boundary = last
	}
	if d := runs[0].At.Sub(boundary); d < 0 || d > 5*time.Second {
		t.Errorf("tick ran at %v, boundary %v", runs[0].At, boundary)
	}
	time.Sleep(time.Until(boundary.Add(time.Second)))

	// 4. Non-persistent timers activated before the boundary, edited after
	// it to every minute. Control: changed by hand and reloaded, systemd
	// runs it at once.
	ctl := filepath.Join(env.UnitDir(), units.TimerName("ctl-skip"))
	body, err := os.ReadFile(ctl)
	if err != nil {
		t.Fatal(err)
	}
	body = regexp.MustCompile(`(?m)^OnCalendar=.*$`).ReplaceAll(body, []byte("OnCalendar=*-*-* *:*:00 UTC"))
	if err := os.WriteFile(ctl, body, 0o644); err != nil {
		t.Fatal(err)
	}
	sdtest.Systemctl(t, "daemon-reload")
	waitRun(t, data, "ctl-skip", 0, 5*time.Second)

	// The same edit through Apply: no run. (ctl-skip is restored too.)
	specs[1] = spec("edit-skip", "* * * * *", withCatchup(manifest.CatchupSkip))
	plannedSkip := nextOf(t, specs[1], time.Now())
	res = mustApply(t, b, input(t, specs...))
	hasStep(t, res, ActionRestart, "edit-skip")
	hasStep(t, res, ActionRestore, "ctl-skip")
	time.Sleep(3 * time.Second)
	if next := sdtest.ListTimers(t)[units.TimerName("edit-skip")].Next; !next.Equal(boundary.Add(time.Minute)) {
		t.Errorf("edit-skip: next %v, want %v", next, boundary.Add(time.Minute))
	}
	all := readRuns(t, data)
	// A run before the first instant of the new schedule is unplanned; one
	// at or after it (a slow machine) is the schedule working.
	for p, planned := range map[string]time.Time{"edit-skip": plannedSkip, "edit-once": plannedOnce} {
		for _, r := range runsOf(all, p) {
			if r.At.Before(planned) {
				t.Errorf("unplanned run of %s at %v (first planned %v): %v", p, r.At, planned, r)
			}
		}
	}
	if r := runsOf(all, "ctl-skip"); len(r) != 1 {
		t.Errorf("ctl-skip: %d runs, want the one of the control", len(r))
	}
	if r := runsOf(all, "catch"); len(r) != 1 {
		t.Errorf("catch: %d runs, want 1", len(r))
	}
}

func hasStep(t testing.TB, res *Result, a Action, pipe string) {
	t.Helper()
	for _, s := range res.Steps {
		if s.Action == a && s.Pipe == pipe {
			return
		}
	}
	t.Errorf("no %s step for %s in %v", a, pipe, res.Steps)
}
