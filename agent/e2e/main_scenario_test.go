package e2e

import (
	"bytes"
	"github.com/drover/drover/api"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/drover/drover/agent/internal/sdtest"
	"github.com/drover/drover/internal/testkit"
	"github.com/drover/drover/units"
)

// far is a schedule that does not fire while the tests run.
const far = "0 3 1 1 *"

// pipeHost is where an agent under test installs its pipes: a private user
// manager on this machine, or the system manager of a booted container.
// The main scenario's steps below work on either.
type pipeHost struct {
	unitDir   string                            // as the host sees it
	readFile  func(path string) ([]byte, error) // a file of the host
	writeFile func(path string, b []byte) error
	timers    func() map[string]sdtest.Timer // list-timers
	show      func(unit, prop string) string // systemctl show -P
	sync      func() string                  // `drover-agent sync`: the outcome
	alive     func(pid int) bool             // a pid of the host runs (not a zombie)
}

// mainSpecs are the main scenario's pipes: tick fires every minute, the
// others never on their own (RunNow, Cancel, timeout).
func mainSpecs(tags map[string]string, slowPIDs, tmoPIDs string) map[string]pipeSpec {
	return map[string]pipeSpec{
		"tick": {Schedule: "* * * * *", Script: "echo \"tick at $(date -u +%H:%M:%S)\"\n", Targets: byTags(tags)},
		"api":  {Schedule: far, Script: "echo \"api-run $E2E_WORD\"\n", Env: map[string]string{"E2E_WORD": "hello-env"}, Targets: byTags(tags)},
		"slow": {Schedule: far, Targets: byTags(tags),
			Script: "sleep 300 & echo $! > " + slowPIDs + "\nsleep 301 & echo $! >> " + slowPIDs + "\necho slow-started\nwait\n"},
		"tmo": {Schedule: far, Timeout: "2s", Targets: byTags(tags),
			Script: "sleep 120 & echo $! > " + tmoPIDs + "\necho tmo-started\nwait\n"},
	}
}

// TestUserManagerEndToEnd is the main scenario on a real systemd user
// manager with real server and agent processes: enrollment from a token
// file; pipes created through the admin API; list-timers showing each
// timer with the evaluator's next elapse; RunNow, Cancel (the process tree
// is gone) and a timeout; a scheduled run whose status and log reach the
// server; two schedule edits around the old fire time with no extra run
// (the second one would make systemd catch up an elapsed Persistent timer
// without the agent's guard); a hand-edited unit restored by the next
// sync and reported; removing the pipes removes both units.
func TestUserManagerEndToEnd(t *testing.T) {
	mgr, srv, tags := userScenario(t, "main")
	ag, id := enrolledAgent(t, srv, agentOpts{name: "agent-main", backend: "systemd", mgr: &mgr, tags: tags})

	work := t.TempDir()
	h := &pipeHost{
		unitDir:   mgr.UnitDir(),
		readFile:  os.ReadFile,
		writeFile: func(p string, b []byte) error { return os.WriteFile(p, b, 0o644) },
		timers:    func() map[string]sdtest.Timer { return mgr.ListTimers(t) },
		show:      func(unit, prop string) string { return mgr.Show(t, unit, prop) },
		sync:      ag.syncCLI,
		alive:     pidAlive,
	}
	specs := mainSpecs(tags, filepath.Join(work, "slow.pids"), filepath.Join(work, "tmo.pids"))
	for _, name := range []string{"tick", "api", "slow", "tmo"} {
		srv.putPipe(name, specs[name])
	}
	ag.waitPipes(60*time.Second, "tick", "api", "slow", "tmo")
	checkTimers(t, h, specs)
	proveRunNow(t, srv, id)
	specs["late"] = pipeSpec{Schedule: far, Script: "echo late-run\n", Targets: byTags(tags)}
	proveRunNowNewPipe(t, srv, id, "late", specs["late"])
	proveCancel(t, srv, h, id, filepath.Join(work, "slow.pids"))
	proveTimeout(t, srv, h, id, filepath.Join(work, "tmo.pids"))
	firstScheduledRun(t, srv, id)
	proveScheduleEdits(t, srv, h, id, specs["tick"], func() { proveDrift(t, srv, h, id) })
	removePipes(t, srv, h, specs)
}

// checkTimers: list-timers shows every pipe's timer, activating its
// service, with the evaluator's next elapse.
func checkTimers(t *testing.T, h *pipeHost, specs map[string]pipeSpec) {
	t.Helper()
	before := time.Now()
	timers := h.timers()
	after := time.Now()
	for name, sp := range specs {
		tm, ok := timers[units.TimerName(name)]
		if !ok {
			t.Fatalf("list-timers does not show %s: %v", units.TimerName(name), timers)
		}
		if tm.Activates != units.ServiceName(name) {
			t.Errorf("%s activates %q", tm.Unit, tm.Activates)
		}
		w1, w2 := nextFire(t, sp.Schedule, sp.Timezone, before), nextFire(t, sp.Schedule, sp.Timezone, after)
		if !tm.Next.Equal(w1) && !tm.Next.Equal(w2) {
			t.Fatalf("%s: list-timers next elapse %s, the evaluator says %s", tm.Unit, tm.Next.UTC(), w1.UTC())
		}
	}
	t.Logf("list-timers: %d timers with the evaluator's next elapse (tick: %s)", len(specs), timers[units.TimerName("tick")].Next.UTC().Format(time.RFC3339))
}

// proveRunNow: RunNow runs with trigger api and the request id, the pipe's
// env, and the log reaches the server.
func proveRunNow(t *testing.T, srv *serverProc, id string) api.Run {
	t.Helper()
	req := srv.runNow("api", id)
	r := srv.runOfRequest(req.RequestID, 60*time.Second, "succeeded", "failed", "timed_out", "canceled")
	if r.Status != "succeeded" || r.Trigger != "api" || r.RequestID != req.RequestID || r.AgentID != id {
		t.Fatalf("RunNow run: %+v", r)
	}
	if got := srv.logText(r.ID); !strings.Contains(got, "api-run hello-env") {
		t.Fatalf("RunNow run's log on the server: %q", got)
	}
	return r
}

// proveRunNowNewPipe: a pipe run at once after it is created (before the
// agent can have applied it) runs: the agent syncs first.
func proveRunNowNewPipe(t *testing.T, srv *serverProc, id, name string, sp pipeSpec) {
	t.Helper()
	srv.putPipe(name, sp)
	req := srv.runNow(name, id)
	r := srv.runOfRequest(req.RequestID, 60*time.Second, "succeeded", "failed", "timed_out", "canceled", "skipped")
	if r.Status != "succeeded" || r.Trigger != "api" {
		t.Fatalf("run of a pipe created just before: %+v", r)
	}
	if got := srv.logText(r.ID); !strings.Contains(got, "late-run") {
		t.Fatalf("its log on the server: %q", got)
	}
}

// proveCancel: a running run canceled through the API ends as canceled,
// its unit stops and its whole process tree is gone. A RunNow while it runs
// is recorded as skipped (runs never overlap), with the reason.
func proveCancel(t *testing.T, srv *serverProc, h *pipeHost, id, pidPath string) {
	t.Helper()
	req := srv.runNow("slow", id)
	r := srv.runOfRequest(req.RequestID, 60*time.Second, "running")
	pids := waitPIDs(t, h, pidPath, 2)
	again := srv.runNow("slow", id)
	sk := srv.runOfRequest(again.RequestID, 60*time.Second, "skipped", "succeeded", "failed", "running", "canceled")
	if sk.Status != "skipped" || sk.Trigger != "api" || sk.ID == r.ID || !strings.Contains(sk.Error, "in progress") {
		t.Fatalf("RunNow during a run: %+v", sk)
	}
	var cancel api.CancelResponse
	srv.api("POST", "/api/v1/runs/"+r.ID+"/cancel", nil, &cancel)
	if !cancel.Sent || cancel.AgentID != id {
		t.Fatalf("cancel: %+v", cancel)
	}
	r = srv.runOfRequest(req.RequestID, 60*time.Second, "canceled", "succeeded", "failed", "timed_out")
	if r.Status != "canceled" {
		t.Fatalf("canceled run: %+v", r)
	}
	waitGone(t, h, pids)
	if st := h.show(units.ServiceName("slow"), "ActiveState"); st == "active" || st == "activating" {
		t.Fatalf("the canceled service is still %s", st)
	}
}

// proveTimeout: a run past its timeout ends as timed_out, tree and all.
func proveTimeout(t *testing.T, srv *serverProc, h *pipeHost, id, pidPath string) {
	t.Helper()
	req := srv.runNow("tmo", id)
	r := srv.runOfRequest(req.RequestID, 60*time.Second, "timed_out", "succeeded", "failed", "canceled")
	if r.Status != "timed_out" {
		t.Fatalf("run past its timeout: %+v", r)
	}
	if r.DurationMS < 1500 || r.DurationMS > 30000 {
		t.Errorf("timed-out run lasted %d ms (timeout 2s)", r.DurationMS)
	}
	waitGone(t, h, waitPIDs(t, h, pidPath, 1))
	if got := srv.logText(r.ID); !strings.Contains(got, "tmo-started") {
		t.Errorf("timed-out run's log: %q", got)
	}
}

// firstScheduledRun waits for a scheduled run of tick: trigger schedule, at
// a whole minute, with its status and log on the server, and no other run
// of tick. It returns that run.
func firstScheduledRun(t *testing.T, srv *serverProc, id string) api.Run {
	t.Helper()
	var first api.Run
	testkit.WaitFor(t, 90*time.Second, "a scheduled run of tick", func() bool {
		for _, r := range srv.runs("tick", id) {
			if r.Trigger == "schedule" && r.Status == "succeeded" {
				first = r
				return true
			}
		}
		return false
	})
	if first.ScheduledAt == nil || first.ScheduledAt.Second() != 0 || first.ScheduledAt.Nanosecond() != 0 {
		t.Fatalf("scheduled run's scheduled_at: %+v", first)
	}
	if got := srv.logText(first.ID); !strings.Contains(got, "tick at ") {
		t.Fatalf("scheduled run's log: %q", got)
	}
	for _, r := range srv.runs("tick", id) {
		if r.Trigger != "schedule" {
			t.Fatalf("unplanned run of tick: %+v", r)
		}
	}
	t.Logf("scheduled run %s at %s: %s, log %d bytes", first.ID, first.ScheduledAt.UTC().Format(time.RFC3339), first.Status, first.LogBytes)
	return first
}

// proveScheduleEdits edits tick's schedule twice around its next fire time
// F+1m: first to a far one (F+1m must not fire), then, after F+1m, back to
// every minute (systemd would catch the elapsed F+1m up at once, tick being
// Persistent, without the agent's guard). Neither the server nor systemd
// may see a run from the first edit to 10 s after the second. during runs
// while the window is open.
func proveScheduleEdits(t *testing.T, srv *serverProc, h *pipeHost, id string, spec pipeSpec, during func()) {
	t.Helper()
	timerPath := filepath.Join(h.unitDir, units.TimerName("tick"))
	var fire time.Time
	for {
		runs := srv.runs("tick", id)
		last := runs[len(runs)-1]
		fire = *last.ScheduledAt
		if time.Now().Before(fire.Add(45*time.Second)) && last.Status != "running" {
			break
		}
		// Too close to the next fire to edit before it: take that one.
		n := len(runs)
		testkit.WaitFor(t, 90*time.Second, "the next scheduled run of tick", func() bool {
			rs := srv.runs("tick", id)
			return len(rs) > n && rs[len(rs)-1].Status == "succeeded"
		})
	}
	runsBefore := len(srv.runs("tick", id))
	startedBefore := h.show(units.ServiceName("tick"), "ExecMainStartTimestampMonotonic")
	oldTimer, err := h.readFile(timerPath)
	if err != nil {
		t.Fatal(err)
	}
	spec.Schedule = far
	srv.putPipe("tick", spec)
	testkit.WaitFor(t, 30*time.Second, "the tick timer rewritten", func() bool {
		b, err := h.readFile(timerPath)
		return err == nil && !bytes.Equal(b, oldTimer) && h.timers()[units.TimerName("tick")].Next.Equal(nextFire(t, far, "", time.Now()))
	})
	editedAt := time.Now()
	if during != nil {
		during()
	}

	sleepUntil(fire.Add(time.Minute + 8*time.Second))
	newTimer, _ := h.readFile(timerPath)
	spec.Schedule = "* * * * *"
	srv.putPipe("tick", spec)
	testkit.WaitFor(t, 30*time.Second, "the tick timer rewritten back", func() bool {
		b, err := h.readFile(timerPath)
		return err == nil && !bytes.Equal(b, newTimer)
	})
	var want time.Time
	testkit.WaitFor(t, 10*time.Second, "tick's next elapse", func() bool {
		want = nextFire(t, "* * * * *", "", time.Now())
		return h.timers()[units.TimerName("tick")].Next.Equal(want)
	})
	// The window ends 10 s after the second edit, before the next planned
	// fire (F+2m).
	end := time.Now().Add(10 * time.Second)
	if end.After(want.Add(-time.Second)) {
		t.Fatalf("too slow: the window would reach the next planned fire %s", want)
	}
	sleepUntil(end)
	if got := h.show(units.ServiceName("tick"), "ExecMainStartTimestampMonotonic"); got != startedBefore {
		t.Fatalf("systemd started tick during the edits (ExecMainStartTimestampMonotonic %s -> %s)", startedBefore, got)
	}
	if runs := srv.runs("tick", id); len(runs) != runsBefore {
		t.Fatalf("%d runs of tick after the schedule edits, want %d: %+v", len(runs), runsBefore, runs[runsBefore:])
	}
	t.Logf("schedule edits at %s and %s around the old fire time %s: no extra run (%s window)",
		editedAt.UTC().Format("15:04:05"), time.Now().Add(-10*time.Second).UTC().Format("15:04:05"),
		fire.Add(time.Minute).UTC().Format("15:04:05"), time.Since(editedAt).Round(time.Second))
}

// proveDrift: a hand-edited unit (header kept, so still the agent's) is
// restored by the next sync, reloaded, and reported to the server.
func proveDrift(t *testing.T, srv *serverProc, h *pipeHost, id string) {
	t.Helper()
	svcPath := filepath.Join(h.unitDir, units.ServiceName("api"))
	orig, err := h.readFile(svcPath)
	if err != nil {
		t.Fatal(err)
	}
	hand := bytes.Replace(orig, []byte("Description="), []byte("Description=edited by hand "), 1)
	if bytes.Equal(hand, orig) || !bytes.HasPrefix(hand, []byte(units.Header)) {
		t.Fatalf("cannot hand-edit %s:\n%s", svcPath, orig)
	}
	if err := h.writeFile(svcPath, hand); err != nil {
		t.Fatal(err)
	}
	if out := h.sync(); out != "unchanged" {
		t.Fatalf("drover-agent sync after a hand edit: %s", out)
	}
	if got, _ := h.readFile(svcPath); !bytes.Equal(got, orig) {
		t.Fatalf("the hand-edited unit was not restored:\n%s", got)
	}
	if d := h.show(units.ServiceName("api"), "Description"); strings.Contains(d, "edited by hand") {
		t.Fatalf("systemd still has the hand-edited unit loaded: %q", d)
	}
	testkit.WaitFor(t, 30*time.Second, "the server to see the drift report", func() bool {
		for _, p := range srv.agentView(id).Pipes {
			if p.Name == "api" && p.DriftRestored {
				return true
			}
		}
		return false
	})
}

// removePipes deletes the pipes on the server; both units of each go, and
// so do their timers and enable links.
func removePipes(t *testing.T, srv *serverProc, h *pipeHost, specs map[string]pipeSpec) {
	t.Helper()
	for name := range specs {
		srv.api("DELETE", "/api/v1/pipes/"+name, nil, nil)
	}
	testkit.WaitFor(t, 60*time.Second, "every unit to go", func() bool {
		for name := range specs {
			for _, u := range []string{units.ServiceName(name), units.TimerName(name)} {
				if _, err := h.readFile(filepath.Join(h.unitDir, u)); err == nil {
					return false
				}
			}
		}
		return true
	})
	for name := range h.timers() {
		if strings.HasPrefix(name, "drover-pipe-") {
			t.Fatalf("list-timers still shows %s", name)
		}
	}
	for name := range specs {
		if _, err := h.readFile(filepath.Join(h.unitDir, "timers.target.wants", units.TimerName(name))); err == nil {
			t.Fatalf("timers.target.wants still links %s", units.TimerName(name))
		}
	}
}

// waitPIDs waits until a pipe's script wrote n pids to path.
func waitPIDs(t *testing.T, h *pipeHost, path string, n int) []int {
	t.Helper()
	var pids []int
	testkit.WaitFor(t, 30*time.Second, "the pids in "+path, func() bool {
		b, _ := h.readFile(path)
		pids = pids[:0]
		for _, f := range strings.Fields(string(b)) {
			if p, err := strconv.Atoi(f); err == nil {
				pids = append(pids, p)
			}
		}
		return len(pids) == n
	})
	return pids
}

// waitGone waits until none of pids runs.
func waitGone(t *testing.T, h *pipeHost, pids []int) {
	t.Helper()
	testkit.WaitFor(t, 20*time.Second, "the process tree to be gone", func() bool {
		for _, p := range pids {
			if h.alive(p) {
				return false
			}
		}
		return true
	})
}

// pidAlive tells whether a process of this machine runs (zombies run
// nothing: they count as gone).
func pidAlive(pid int) bool {
	if syscall.Kill(pid, 0) != nil {
		return false
	}
	b, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	i := bytes.LastIndexByte(b, ')')
	return i < 0 || i+2 >= len(b) || b[i+2] != 'Z'
}
