package apply

import (
	"context"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/drover/drover/agent/internal/sdtest"
	"github.com/drover/drover/agent/runreq"
	"github.com/drover/drover/manifest"
	"github.com/drover/drover/units"
)

func TestMain(m *testing.M) {
	// The parallel tests mostly wait on the wall clock (a minute boundary,
	// the kills of the crash test), not on the CPU: let them all overlap,
	// even where -parallel defaults to GOMAXPROCS = 2.
	flag.Parse()
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == "test.parallel" })
	if !set {
		_ = flag.Set("test.parallel", "4")
	}
	sdtest.Main(m)
}

// newSystemd returns a user-scope backend on the test manager. When the test
// ends it applies an empty manifest, so the next test starts clean.
// newOwnSystemd starts a user manager of its own and a backend on it, for
// tests that run beside others: Apply owns every drover-pipe-* unit of its
// manager.
func newOwnSystemd(t *testing.T, dataDir string) (*Systemd, sdtest.Env) {
	t.Helper()
	env := sdtest.NewManager(t)
	cfg := userConfig(t, dataDir)
	cfg.UnitDir, cfg.StampDir, cfg.BusAddress = env.UnitDir(), env.StampDir(), env.BusAddress
	cfg.RuntimeDir = filepath.Join(env.RuntimeDir, "drover")
	b, err := NewSystemd(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return b, env
}

func newSystemd(t testing.TB, dataDir string) *Systemd {
	t.Helper()
	sdtest.Require(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	b, err := NewSystemd(ctx, userConfig(t, dataDir))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		mustApply(t, b, input(t))
		b.Close()
	})
	return b
}

func nextOf(t testing.TB, s manifest.Spec, after time.Time) time.Time {
	t.Helper()
	sc, err := manifest.ParseSchedule(s.Schedule)
	if err != nil {
		t.Fatal(err)
	}
	tz := s.Timezone
	if tz == "" {
		tz = "UTC"
	}
	loc, err := manifest.LoadLocation(tz)
	if err != nil {
		t.Fatal(err)
	}
	return sc.Next(after, loc)
}

func TestSystemdApply(t *testing.T) {
	env := sdtest.Require(t)
	data := t.TempDir()
	b := newSystemd(t, data)
	specs := []manifest.Spec{
		spec("backup-db", "30 2 * * *", withTZ("Europe/Berlin")),
		spec("weekdays", "0 */6 * * 1-5"),
		spec("hourly-ny", "@hourly", withTZ("America/New_York")),
		spec("monthly", "15 10 1 * *", withCatchup(manifest.CatchupSkip)),
		spec("both-days", "0 12 13 * 5", withTZ("Asia/Kolkata")),
		spec("dst", "30 2 * * *", withTZ("America/New_York")),
		spec("off", "0 0 * * 0", disabled()),
	}
	in := input(t, specs...)
	t0 := time.Now()
	res := mustApply(t, b, in)
	t1 := time.Now()
	if len(res.Errors) > 0 || res.Reloads != 1 {
		t.Fatalf("errors %v, reloads %d", res.Errors, res.Reloads)
	}
	t.Logf("applied %d pipes in %v", len(specs), res.Duration)

	timers := sdtest.ListTimers(t)
	for _, s := range specs {
		name := units.TimerName(s.Name)
		tm, ok := timers[name]
		if !s.IsEnabled() {
			if _, err := os.Stat(filepath.Join(env.UnitDir(), name)); err != nil {
				t.Errorf("disabled pipe's timer: %v", err)
			}
			if st := sdtest.Show(t, name, "ActiveState"); st != "inactive" {
				t.Errorf("%s: disabled pipe's timer is %s", name, st)
			}
			if st, _ := sdtest.SystemctlErr("is-enabled", name); strings.TrimSpace(st) != "disabled" {
				t.Errorf("%s: is-enabled = %q", name, st)
			}
			continue
		}
		if !ok {
			t.Errorf("%s not in list-timers", name)
			continue
		}
		// The next elapse is Next(activation time), which lies in [t0, t1].
		w0, w1 := nextOf(t, s, t0), nextOf(t, s, t1)
		if !tm.Next.Equal(w0) && !tm.Next.Equal(w1) {
			t.Errorf("%s: list-timers next %v, evaluator %v", name, tm.Next, w0)
		}
		if st, _ := sdtest.SystemctlErr("is-enabled", name); strings.TrimSpace(st) != "enabled" {
			t.Errorf("%s: is-enabled = %q", name, st)
		}
	}

	// The cron backend fires at the same instants.
	cb, err := NewCron(userConfig(t, t.TempDir()))
	if err != nil {
		t.Fatal(err)
	}
	mustApply(t, cb, in)
	fires := cb.NextFires(t1)
	cb.Close()
	for _, s := range specs {
		if !s.IsEnabled() {
			continue
		}
		if got, want := fires[s.Name], timers[units.TimerName(s.Name)].Next; !got.Equal(want) && !got.Equal(nextOf(t, s, t1)) {
			t.Errorf("%s: cron next %v, systemd %v", s.Name, got, want)
		}
	}

	// Status agrees with list-timers.
	st, err := b.Status(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(st) != len(specs) {
		t.Fatalf("status has %d pipes", len(st))
	}
	for _, ps := range st {
		if tm := timers[units.TimerName(ps.Name)]; ps.Scheduled && !ps.Next.Equal(tm.Next) {
			t.Errorf("status %s next %v, list-timers %v", ps.Name, ps.Next, tm.Next)
		}
	}

	// Again: nothing to do, no reload.
	res = mustApply(t, b, in)
	if c := changedSteps(res.Steps); len(c) > 0 || res.Reloads != 0 {
		t.Errorf("second apply: %v, %d reloads", c, res.Reloads)
	}

	// An unmanaged file holding a pipe's unit name is left alone and reported;
	// the other pipes are applied.
	foreign := filepath.Join(env.UnitDir(), "drover-pipe-foreign.timer")
	foreignBody := []byte("[Timer]\nOnCalendar=daily\n")
	if err := os.WriteFile(foreign, foreignBody, 0o644); err != nil {
		t.Fatal(err)
	}
	defer os.Remove(foreign)
	specs2 := append(specs[1:len(specs):len(specs)], spec("foreign", "@daily"), spec("added", "5 4 * * *"))
	in2 := input(t, specs2...)
	res = mustApply(t, b, in2)
	if res.Reloads != 1 {
		t.Errorf("create + remove apply: %d reloads, want exactly 1", res.Reloads)
	}
	if !strings.Contains(res.Errors["foreign"], "conflict") {
		t.Errorf("foreign: errors %v", res.Errors)
	}
	if len(res.Errors) != 1 {
		t.Errorf("errors %v", res.Errors)
	}
	if got, _ := os.ReadFile(foreign); string(got) != string(foreignBody) {
		t.Errorf("unmanaged file changed: %q", got)
	}
	if _, err := os.Stat(filepath.Join(env.UnitDir(), "drover-pipe-foreign.service")); err == nil {
		t.Errorf("the conflicting pipe's service was installed")
	}
	// The removed pipe's units are gone, from disk and from the manager.
	for _, u := range []string{units.TimerName("backup-db"), units.ServiceName("backup-db")} {
		if _, err := os.Stat(filepath.Join(env.UnitDir(), u)); !os.IsNotExist(err) {
			t.Errorf("%s still on disk", u)
		}
		if ls := sdtest.Show(t, u, "LoadState"); ls != "not-found" {
			t.Errorf("%s: LoadState %s", u, ls)
		}
	}
	if _, err := os.Lstat(PipeDir(data, "backup-db")); !os.IsNotExist(err) {
		t.Errorf("removed pipe's directory remains")
	}
	if _, ok := sdtest.ListTimers(t)[units.TimerName("added")]; !ok {
		t.Errorf("added pipe's timer not listed")
	}
	okIn := input(t, append(specs[1:len(specs):len(specs)], spec("added", "5 4 * * *"))...)
	assertUnitDir(t, env.UnitDir(), okIn, b.cfg.renderOptions(), "drover-pipe-foreign.timer")
}

func TestSystemdSecretsAndPipeDir(t *testing.T) {
	sdtest.Require(t)
	data := t.TempDir()
	b := newSystemd(t, data)
	in := input(t, spec("sec", "@daily", withSecrets("PW", "TOKEN")), spec("plain", "@daily"))
	in.Secrets = map[string]map[string]string{"sec": {"PW": "hunter2", "TOKEN": "t0k"}}
	mustApply(t, b, in)
	b1, err := os.ReadFile(filepath.Join(data, "secrets", "sec", "PW"))
	if err != nil || string(b1) != "hunter2" {
		t.Fatalf("secret: %q %v", b1, err)
	}
	for p, mode := range map[string]os.FileMode{
		data: 0o700, filepath.Join(data, "secrets", "sec"): 0o700 | os.ModeDir,
		filepath.Join(data, "secrets", "sec", "PW"):               0o600,
		filepath.Join(PipeDir(data, "sec"), pipeJSON):             0o644,
		filepath.Join(PipeDir(data, "sec"), payloadDir, "script"): 0o755,
	} {
		st, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if got := st.Mode() & (os.ModePerm | os.ModeDir); got&os.ModePerm != mode&os.ModePerm {
			t.Errorf("%s: mode %v, want %v", p, got, mode)
		}
	}
	// A secret dropped and the pipe's script changed: new generation, stale
	// secret removed, old generation gone.
	in2 := input(t, spec("sec", "@daily", withSecrets("PW"), withScript("echo v2\n")), spec("plain", "@daily"))
	in2.Secrets = map[string]map[string]string{"sec": {"PW": "hunter3"}}
	res := mustApply(t, b, in2)
	if _, err := os.Stat(filepath.Join(data, "secrets", "sec", "TOKEN")); !os.IsNotExist(err) {
		t.Errorf("stale secret remains")
	}
	if got, _ := os.ReadFile(filepath.Join(PipeDir(data, "sec"), payloadDir, "script")); string(got) != "echo v2\n" {
		t.Errorf("payload not updated: %q", got)
	}
	for _, s := range res.Steps {
		if s.Pipe == "plain" && s.Changes() {
			t.Errorf("unchanged pipe touched: %v", s)
		}
	}
	assertDataDir(t, data, in2)
	// A removed pipe's secrets go too.
	mustApply(t, b, input(t, spec("plain", "@daily")))
	if _, err := os.Stat(filepath.Join(data, "secrets", "sec")); !os.IsNotExist(err) {
		t.Errorf("removed pipe's secrets remain")
	}
}

func TestSystemdDrift(t *testing.T) {
	env := sdtest.Require(t)
	data := t.TempDir()
	b := newSystemd(t, data)
	ctx := context.Background()
	in := input(t, spec("edited", "0 3 * * *"), spec("deleted", "0 4 * * *"), spec("stopped", "0 5 * * *"))
	mustApply(t, b, in)
	if steps, err := b.Check(ctx); err != nil || len(steps) != 0 {
		t.Fatalf("check on a clean host: %v %v", steps, err)
	}

	edited := filepath.Join(env.UnitDir(), units.TimerName("edited"))
	f, _ := os.OpenFile(edited, os.O_APPEND|os.O_WRONLY, 0)
	f.WriteString("OnCalendar=*:*:00\n")
	f.Close()
	os.Remove(filepath.Join(env.UnitDir(), units.ServiceName("deleted")))
	sdtest.Systemctl(t, "daemon-reload")
	sdtest.Systemctl(t, "stop", units.TimerName("stopped"))

	steps, err := b.Check(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]Action{
		"edited " + units.TimerName("edited"):     ActionRestore,
		"deleted " + units.ServiceName("deleted"): ActionRestore,
		"stopped " + units.TimerName("stopped"):   ActionStart,
	}
	for _, s := range steps {
		if s.Action == ActionRestart || s.Action == ActionStart && s.Pipe != "stopped" {
			continue // the restored timer is restarted under the guard
		}
		k := s.Pipe + " " + s.File
		if want[k] != s.Action {
			t.Errorf("unexpected step %v", s)
		}
		delete(want, k)
	}
	if len(want) > 0 {
		t.Errorf("missing steps %v (got %v)", want, steps)
	}
	assertUnitDir(t, env.UnitDir(), in, b.cfg.renderOptions())
	for _, p := range []string{"edited", "deleted", "stopped"} {
		if st := sdtest.Show(t, units.TimerName(p), "ActiveState"); st != "active" {
			t.Errorf("%s timer %s after check", p, st)
		}
	}
	if n := len(readRuns(t, data)); n != 0 {
		t.Errorf("%d runs during drift repair", n)
	}

	// A managed file whose header was removed by hand is no longer ours.
	svc := filepath.Join(env.UnitDir(), units.ServiceName("edited"))
	body, _ := os.ReadFile(svc)
	mine := []byte(strings.Replace(string(body), units.Header+"\n", "# mine now\n", 1))
	os.WriteFile(svc, mine, 0o644)
	defer os.Remove(svc)
	res := mustApply(t, b, in)
	if !strings.Contains(res.Errors["edited"], "conflict") {
		t.Errorf("errors %v", res.Errors)
	}
	if got, _ := os.ReadFile(svc); string(got) != string(mine) {
		t.Errorf("unmanaged file was modified")
	}
}

func TestSystemdRunNowCancel(t *testing.T) {
	sdtest.Require(t)
	data := t.TempDir()
	b := newSystemd(t, data)
	ctx := context.Background()
	mustApply(t, b, input(t, spec("sleeper", "0 0 1 1 *", withScript("sleep 60\n"))))
	if err := b.RunNow(ctx, "nope", "r0"); !errors.Is(err, ErrUnknownPipe) {
		t.Errorf("RunNow unknown pipe: %v", err)
	}
	if err := b.RunNow(ctx, "sleeper", "req-1"); err != nil {
		t.Fatal(err)
	}
	runs := waitRun(t, data, "sleeper", 0, 10*time.Second)
	if runs[0].Fields["req"] != "req-1" {
		t.Errorf("runner saw request %q", runs[0].Raw)
	}
	if err := b.RunNow(ctx, "sleeper", "req-2"); !errors.Is(err, ErrAlreadyRunning) {
		t.Errorf("second RunNow: %v", err)
	}
	st, err := b.Status(ctx)
	if err != nil || len(st) != 1 || !st[0].Running {
		t.Fatalf("status %+v %v", st, err)
	}
	if inv := runs[0].Fields["inv"]; !sameRunID(st[0].RunID, inv) {
		t.Errorf("status run id %s, INVOCATION_ID %s", st[0].RunID, inv)
	}
	if err := b.Cancel(ctx, "sleeper", "0123456789abcdef0123456789abcdef"); !errors.Is(err, ErrNotRunning) {
		t.Errorf("Cancel with another run id: %v", err)
	}
	start := time.Now()
	if err := b.Cancel(ctx, "sleeper", st[0].RunID); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("cancel took %v", d)
	}
	svc := units.ServiceName("sleeper")
	if as := sdtest.Show(t, svc, "ActiveState"); as == "active" || as == "activating" {
		t.Errorf("service %s after cancel", as)
	}
	if pids := sdtest.Show(t, svc, "ControlGroup"); pids != "" {
		cg := strings.TrimSpace(pids)
		if b, err := os.ReadFile(filepath.Join("/sys/fs/cgroup/unified", cg, "cgroup.procs")); err == nil && len(strings.TrimSpace(string(b))) > 0 {
			t.Errorf("processes left in %s: %s", cg, b)
		}
	}
	if err := b.Cancel(ctx, "sleeper", ""); !errors.Is(err, ErrNotRunning) {
		t.Errorf("Cancel when idle: %v", err)
	}
	// The request file is removed once the run ended.
	deadline := time.Now().Add(5 * time.Second)
	for {
		if _, err := os.Stat(runreq.Path(runreq.Dir(b.cfg.RuntimeDir), "sleeper")); os.IsNotExist(err) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("request file not removed")
		}
		time.Sleep(50 * time.Millisecond)
	}
}
