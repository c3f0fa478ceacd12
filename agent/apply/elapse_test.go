package apply

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/drover/drover/agent/internal/sdtest"
	"github.com/drover/drover/manifest"
	"github.com/drover/drover/units"
)

func TestElapseMismatchCases(t *testing.T) {
	now := time.Date(2026, 12, 1, 10, 2, 30, 0, time.UTC)
	at := func(s string) time.Time {
		tm, err := time.Parse(time.RFC3339, s)
		if err != nil {
			t.Fatal(err)
		}
		return tm
	}
	jit := func(d time.Duration) pipeOpt { return func(s *manifest.Spec) { s.Jitter = manifest.Duration(d) } }
	for _, c := range []struct {
		name string
		spec manifest.Spec
		st   PipeState
		want string // substring; "" means agreement
	}{
		{"exact", spec("a", "*/5 * * * *"), PipeState{Scheduled: true, Next: at("2026-12-01T10:05:00Z")}, ""},
		{"off by a minute", spec("a", "*/5 * * * *"), PipeState{Scheduled: true, Next: at("2026-12-01T10:06:00Z")},
			"next elapse 2026-12-01T10:06:00Z differs from the schedule's next fire time 2026-12-01T10:05:00Z"},
		{"microseconds ignored", spec("a", "*/5 * * * *"), PipeState{Scheduled: true, Next: at("2026-12-01T10:05:00Z").Add(300 * time.Microsecond)}, ""},
		{"within jitter", spec("a", "*/5 * * * *", jit(3*time.Minute)), PipeState{Scheduled: true, Next: at("2026-12-01T10:07:59Z")}, ""},
		{"jitter pending past now", spec("a", "0 * * * *", jit(10*time.Minute)), PipeState{Scheduled: true, Next: at("2026-12-01T10:04:00Z"), LastTrigger: at("2026-12-01T09:04:00Z")}, ""},
		{"beyond jitter", spec("a", "*/5 * * * *", jit(3*time.Minute)), PipeState{Scheduled: true, Next: at("2026-12-01T10:08:00Z")}, "(jitter up to 3m)"},
		{"before the fire time", spec("a", "*/5 * * * *", jit(3*time.Minute)), PipeState{Scheduled: true, Next: at("2026-12-01T10:04:00Z")}, "differs"},
		{"from last trigger", spec("a", "30 2 * * *"), PipeState{Scheduled: true, Next: at("2026-12-02T02:30:00Z"), LastTrigger: at("2026-12-01T02:30:00Z")}, ""},
		{"catch-up due", spec("a", "30 2 * * *"), PipeState{Scheduled: true, Next: at("2026-11-30T02:30:00Z")}, ""},
		{"no next elapse", spec("a", "45 * * * *", withTZ("Pacific/Chatham")), PipeState{Scheduled: true},
			"reports no next elapse; the schedule's next fire time is 2026-12-01T11:00:00Z"},
		{"gap instant", spec("a", "30 2 14 3 *", withTZ("America/New_York")), PipeState{Scheduled: true, Next: at("2027-03-14T07:00:00Z")}, ""},
		{"systemd skipping the gap", spec("a", "30 2 14 3 *", withTZ("America/New_York")), PipeState{Scheduled: true, Next: at("2028-03-14T06:30:00Z")},
			"differs from the schedule's next fire time 2027-03-14T07:00:00Z"},
		{"unscheduled", spec("a", "*/5 * * * *"), PipeState{Next: at("2030-01-01T00:00:00Z")}, ""},
		{"disabled", spec("a", "*/5 * * * *", disabled()), PipeState{Scheduled: true, Next: at("2030-01-01T00:00:00Z")}, ""},
		{"interval", spec("a", "@every 7m"), PipeState{Scheduled: true, Next: at("2030-01-01T00:00:00Z")}, ""},
	} {
		got := ElapseMismatch(&c.spec, c.st, now)
		if c.want == "" && got != "" || c.want != "" && !strings.Contains(got, c.want) {
			t.Errorf("%s: ElapseMismatch = %q, want %q", c.name, got, c.want)
		}
	}
}

// TestElapseMatchesSystemd applies pipes to a real user manager, DST-zone
// ones with correction lines and a jittered one among them, and checks that
// systemd's NextElapseUSecRealtime agrees with the evaluator for each, and
// that the cron backend's next fires are the same instants. "30 2 14 3 *" in
// New York: 02:30 does not exist on 2027-03-14, so until then its next fire
// time (03:00 EDT, 07:00Z) is a correction instant, which systemd would
// otherwise skip (to 2028).
func TestElapseMatchesSystemd(t *testing.T) {
	sdtest.Require(t)
	t.Parallel()
	b, _ := newOwnSystemd(t, t.TempDir())
	jittered := spec("el-jitter", "*/5 * * * *", withTZ("Europe/Berlin"))
	jittered.Jitter = manifest.Duration(3 * time.Minute)
	specs := []manifest.Spec{
		spec("el-gap", "30 2 14 3 *", withTZ("America/New_York")),
		spec("el-chatham", "45 * * * *", withTZ("Pacific/Chatham")),
		spec("el-every5", "*/5 * * * *", withTZ("America/New_York")),
		spec("el-dublin", "0 1-5 * * *", withTZ("Europe/Dublin")),
		jittered,
	}
	in := input(t, specs...)
	t0 := time.Now()
	mustApply(t, b, in)
	st, err := b.Status(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	if len(st) != len(specs) {
		t.Fatalf("status has %d pipes, want %d", len(st), len(specs))
	}
	byName := map[string]PipeState{}
	for _, ps := range st {
		byName[ps.Name] = ps
	}
	for i := range specs {
		s := &specs[i]
		ps := byName[s.Name]
		if !ps.Scheduled || ps.Next.IsZero() {
			t.Errorf("%s: not scheduled (%+v)", s.Name, ps)
			continue
		}
		if m := ElapseMismatch(s, ps, now); m != "" {
			t.Errorf("%s: %s", s.Name, m)
		}
	}

	gap := byName["el-gap"]
	want := nextOf(t, specs[0], t0)
	if !gap.Next.Equal(want) {
		t.Errorf("el-gap: systemd next %s, evaluator %s", gap.Next.UTC(), want.UTC())
	}
	sched, _ := manifest.ParseSchedule(specs[0].Schedule)
	corr, err := units.Corrections(sched, "America/New_York", t0)
	if err != nil {
		t.Fatal(err)
	}
	if t0.Before(time.Date(2027, 3, 14, 7, 0, 0, 0, time.UTC)) && !slices.Contains(corr, "2027-03-14 07:00:00 UTC") {
		t.Errorf("el-gap: next fire %s is not a correction instant: %q", want.UTC(), corr)
	}

	// The cron backend fires at the same instants (jitter aside: its offset
	// is its own).
	cb, err := NewCron(userConfig(t, t.TempDir()))
	if err != nil {
		t.Fatal(err)
	}
	defer cb.Close()
	mustApply(t, cb, in)
	fires := cb.NextFires(now)
	for _, s := range specs[:4] {
		if got, sd := fires[s.Name], byName[s.Name].Next; !got.Equal(sd) && !got.Equal(nextOf(t, s, now)) {
			t.Errorf("%s: cron next %s, systemd %s", s.Name, got.UTC(), sd.UTC())
		}
	}
}

// TestCorrectionWindowRenewed: the drift check renders with the backend's
// clock, so when the 400-day window of correction lines moves, the timer is
// rewritten and reloaded, without any manifest change.
func TestCorrectionWindowRenewed(t *testing.T) {
	sdtest.Require(t)
	t.Parallel()
	env := sdtest.NewManager(t)
	cfg := userConfig(t, t.TempDir())
	cfg.UnitDir, cfg.StampDir, cfg.BusAddress = env.UnitDir(), env.StampDir(), env.BusAddress
	cfg.RuntimeDir = filepath.Join(env.RuntimeDir, "drover")
	clock := time.Date(2027, 3, 1, 12, 0, 0, 0, time.UTC)
	cfg.Now = func() time.Time { return clock }
	b, err := NewSystemd(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	in := input(t, spec("renew", "30 2 * * *", withTZ("America/New_York")))
	mustApply(t, b, in)
	timer := filepath.Join(env.UnitDir(), units.TimerName("renew"))
	before, err := os.ReadFile(timer)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(before), "OnCalendar=2027-03-14 07:00:00 UTC\n") {
		t.Fatalf("timer at %s:\n%s", clock, before)
	}
	// Same day: nothing to do.
	clock = clock.Add(6 * time.Hour)
	if steps, err := b.Check(context.Background()); err != nil || len(steps) != 0 {
		t.Fatalf("check the same day: %v, %v", steps, err)
	}
	// Three weeks on: 2027-03-14 has left the window.
	clock = clock.Add(21 * 24 * time.Hour)
	steps, err := b.Check(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var updated bool
	for _, s := range steps {
		if s.File == units.TimerName("renew") && s.Action == ActionUpdate {
			updated = true
		}
	}
	after, _ := os.ReadFile(timer)
	if !updated || strings.Contains(string(after), "2027-03-14") || !strings.Contains(string(after), "OnCalendar=2027-11-07 07:30:00 UTC\n") {
		t.Fatalf("steps %v; timer:\n%s", steps, after)
	}
	// systemd loaded the new lines.
	if v := env.Show(t, units.TimerName("renew"), "TimersCalendar"); strings.Contains(v, "2027-03-14") || !strings.Contains(v, "2027-11-07 07:30:00 UTC") {
		t.Errorf("TimersCalendar=%s", v)
	}
}
