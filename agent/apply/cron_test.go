package apply

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/drover/drover/internal/testkit"
	"github.com/drover/drover/manifest"
)

func TestCronBackend(t *testing.T) {
	t.Parallel()
	data := t.TempDir()
	cfg := userConfig(t, data)
	if os.Getenv("XDG_RUNTIME_DIR") == "" {
		// No test manager: the fake runner then takes DROVER_REQUEST_ID.
		cfg.RuntimeDir = filepath.Join(t.TempDir(), "drover")
	}
	ctx := context.Background()

	specs := []manifest.Spec{
		spec("tick", "* * * * *"),
		spec("sleeper", "0 0 1 1 *", withScript("sleep 60\n")),
		spec("once", "@hourly"),
		spec("all", "@hourly", withCatchup(manifest.CatchupAll)),
		spec("skip", "@hourly", withCatchup(manifest.CatchupSkip)),
		spec("edited", "@hourly"),
	}
	// The agent was down for a while: it last fired the hourly pipes 3h10m ago.
	now := time.Now()
	last := now.Add(-3*time.Hour - 10*time.Minute)
	st := cronState{Version: 1, Pipes: map[string]cronPipeState{}}
	for _, s := range specs[2:] {
		n := s.Clone()
		n.Normalize()
		st.Pipes[s.Name] = cronPipeState{Key: cronKey(n), LastFire: last}
	}
	st.Pipes["edited"] = cronPipeState{Key: "0 5 * * *|UTC|0s|true", LastFire: last}
	b, _ := json.Marshal(st)
	if err := os.WriteFile(filepath.Join(data, cronStateFile), b, 0o600); err != nil {
		t.Fatal(err)
	}
	sc, _ := manifest.ParseSchedule("@hourly")
	missed := evalSchedule{s: sc, loc: time.UTC}.missed(last, now, manifest.MaxCatchup)

	cb, err := NewCron(cfg)
	if err != nil {
		t.Fatal(err)
	}
	cb.SetOutput(testkit.LogWriter(t, ""))
	t.Cleanup(func() { cb.Close(); cb.Wait() })
	t0 := time.Now()
	res := mustApply(t, cb, input(t, specs...))
	t1 := time.Now() // the schedule was set up between t0 and t1
	if len(res.Errors) > 0 {
		t.Fatal(res.Errors)
	}

	// RunNow, then Cancel kills the whole process group.
	if err := cb.RunNow(ctx, "sleeper", "req-9"); err != nil {
		t.Fatal(err)
	}
	r := waitRun(t, data, "sleeper", 0, 10*time.Second)[0]
	if r.Fields["trigger"] != "api" || r.Fields["req"] != "req-9" || r.Fields["run"] == "" {
		t.Errorf("RunNow run: %s", r.Raw)
	}
	if err := cb.RunNow(ctx, "sleeper", "req-10"); !errors.Is(err, ErrAlreadyRunning) {
		t.Errorf("second RunNow: %v", err)
	}
	status, _ := cb.Status(ctx)
	var pgid int
	for _, ps := range status {
		if ps.Name == "sleeper" {
			if !ps.Running || ps.RunID != r.Fields["run"] {
				t.Errorf("status %+v, run %s", ps, r.Fields["run"])
			}
		}
	}
	cb.mu.Lock()
	for _, p := range cb.pipes["sleeper"].procs {
		pgid = p.cmd.Process.Pid
	}
	cb.mu.Unlock()
	if err := cb.Cancel(ctx, "sleeper", "0190aaaa-0000-7000-8000-000000000000"); !errors.Is(err, ErrNotRunning) {
		t.Errorf("Cancel other run: %v", err)
	}
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := cb.Cancel(cctx, "sleeper", r.Fields["run"]); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(3 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		live := groupMembers(pgid)
		if len(live) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("process group %d still has %v after cancel", pgid, live)
			break
		}
	}

	// Catch-up: once -> one run, all -> every missed instant, oldest first,
	// skip and an edited schedule -> none.
	waitRun(t, data, "once", 0, 10*time.Second)
	allRuns := waitRun(t, data, "all", len(missed)-1, 20*time.Second)
	for _, r := range allRuns {
		if r.Fields["trigger"] != "catchup" {
			t.Errorf("catch-up run: %s", r.Raw)
		}
	}

	// The every-minute pipe fires at the boundary.
	// (t0 and t1 may straddle a minute: either boundary.)
	boundary := t0.Truncate(time.Minute).Add(time.Minute)
	lastB := t1.Truncate(time.Minute).Add(time.Minute)
	tick := waitRun(t, data, "tick", 0, time.Until(lastB)+10*time.Second)[0]
	if d := tick.At.Sub(lastB); d >= 0 && d <= 5*time.Second {
		boundary = lastB
	}
	if d := tick.At.Sub(boundary); d < 0 || d > 5*time.Second || tick.Fields["trigger"] != "schedule" {
		t.Errorf("tick: %s, boundary %v", tick.Raw, boundary)
	}
	time.Sleep(time.Second)
	// (Only catch-up runs count: an hour boundary may pass during the test.)
	var runs []runLine
	for _, r := range readRuns(t, data) {
		if r.Fields["trigger"] == "catchup" {
			runs = append(runs, r)
		}
	}
	if n := len(runsOf(runs, "once")); n != 1 {
		t.Errorf("once: %d catch-up runs", n)
	}
	// (An hour boundary between computing missed and the apply adds one.)
	if n := len(runsOf(runs, "all")); n != len(missed) && n != len(missed)+1 {
		t.Errorf("all: %d catch-up runs, want %d", n, len(missed))
	}
	for _, p := range []string{"skip", "edited"} {
		if n := len(runsOf(runs, p)); n != 0 {
			t.Errorf("%s: %d runs", p, n)
		}
	}
	// The state file remembers the fire.
	var after cronState
	b, _ = os.ReadFile(filepath.Join(data, cronStateFile))
	if err := json.Unmarshal(b, &after); err != nil || !after.Pipes["tick"].LastFire.Equal(boundary) {
		t.Errorf("state after fire: %+v %v", after.Pipes["tick"], err)
	}
}

// groupMembers lists the live (not zombie) processes of a process group.
func groupMembers(pgid int) []string {
	var out []string
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// pid (comm) state ppid pgrp ...
		s := string(b)
		i := strings.LastIndexByte(s, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(s[i+1:])
		if len(f) > 2 && f[0] != "Z" && f[2] == strconv.Itoa(pgid) {
			out = append(out, e.Name()+" "+s[:i+1])
		}
	}
	return out
}

func TestCronScheduleMatchesEvaluator(t *testing.T) {
	for _, c := range []struct{ expr, tz string }{
		{"30 2 * * *", "Europe/Berlin"}, {"0 0 * * 0", "UTC"}, {"*/7 * * * *", "Asia/Kolkata"},
		{"0 12 13 * 5", "America/New_York"}, {"@monthly", "Australia/Lord_Howe"},
	} {
		s, err := manifest.ParseSchedule(c.expr)
		if err != nil {
			t.Fatal(err)
		}
		loc, err := manifest.LoadLocation(c.tz)
		if err != nil {
			t.Fatal(err)
		}
		es := evalSchedule{s: s, loc: loc}
		at := time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)
		for i := 0; i < 200; i++ {
			n := es.Next(at)
			if want := s.Next(at, loc); !n.Equal(want) {
				t.Fatalf("%s %s: Next(%v) = %v, evaluator %v", c.expr, c.tz, at, n, want)
			}
			at = n
		}
	}
	// A fixed jitter offset shifts every instant by the same amount.
	s, _ := manifest.ParseSchedule("0 * * * *")
	es := evalSchedule{s: s, loc: time.UTC, offset: 90 * time.Second}
	at := time.Date(2026, 3, 1, 10, 0, 30, 0, time.UTC)
	if got, want := es.Next(at), time.Date(2026, 3, 1, 10, 1, 30, 0, time.UTC); !got.Equal(want) {
		t.Errorf("jittered next %v, want %v", got, want)
	}
	if got := es.prev(time.Date(2026, 3, 1, 10, 1, 30, 5e8, time.UTC)); !got.Equal(time.Date(2026, 3, 1, 10, 1, 30, 0, time.UTC)) {
		t.Errorf("prev %v", got)
	}
}
