package e2e

import (
	"encoding/json"
	"github.com/drover/drover/api"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/drover/drover/internal/testkit"
	"github.com/drover/drover/units"
)

// runsOnce checks that the server holds exactly one run with id for pipe
// (the agent's records of one invocation can never count twice) and
// returns it. The server does not store reasons yet: want checks the rest.
func runsOnce(t *testing.T, srv *serverProc, pipe, agentID, id string, want func(api.Run) bool) api.Run {
	t.Helper()
	var got []api.Run
	for _, r := range srv.runs(pipe, agentID) {
		if r.ID == id {
			got = append(got, r)
		}
	}
	if len(got) != 1 || !want(got[0]) {
		t.Fatalf("runs of %s with id %s: %+v", pipe, id, got)
	}
	return got[0]
}

// waitRun waits until the server has run id of pipe in one of statuses.
func waitRun(t *testing.T, srv *serverProc, pipe, agentID, id string, timeout time.Duration, statuses ...string) api.Run {
	t.Helper()
	var got api.Run
	testkit.WaitFor(t, timeout, "run "+id+" of "+pipe+" to be "+strings.Join(statuses, "|"), func() bool {
		for _, r := range srv.runs(pipe, agentID) {
			for _, st := range statuses {
				if r.ID == id && r.Status == st {
					got = r
					return true
				}
			}
		}
		return false
	})
	return got
}

// lastReason is the reason `drover-agent status` shows for pipe's last run.
func lastReason(a *agentProc, pipe string) (string, string) {
	st := a.status()
	if st == nil {
		return "", ""
	}
	for _, p := range st.Pipes {
		if p.Name == pipe && p.LastRun != nil {
			return p.LastRun.RunID, p.LastRun.Reason
		}
	}
	return "", ""
}

func waitReason(t *testing.T, a *agentProc, pipe, runID, reason string) {
	t.Helper()
	testkit.WaitFor(t, 30*time.Second, pipe+"'s last run "+runID+" with reason "+reason, func() bool {
		id, r := lastReason(a, pipe)
		return id == runID && r == reason
	})
}

// TestEveryRunAccountedUserScope: a drover-agent binary outside /usr/bin,
// with no agent_path set, runs its pipes (the units name the running
// binary). A run-now whose service cannot exec its binary (203/EXEC) and a
// run killed with SIGKILL mid-run each end as one failed run on the real
// server, with systemd's reason in the agent's record; so do both when they
// happen while the daemon is stopped and it is started later.
func TestEveryRunAccountedUserScope(t *testing.T) {
	mgr, srv, tags := userScenario(t, "account")

	// The agent binary lives in a directory of its own, not /usr/bin.
	binDir := testkit.ShortTempDir(t, "bin")
	bin := filepath.Join(binDir, "drover-agent")
	orig, err := os.ReadFile(agentBin())
	if err != nil {
		t.Fatal(err)
	}
	install := func(b []byte) {
		t.Helper()
		if err := os.WriteFile(bin+".tmp", b, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(bin+".tmp", bin); err != nil {
			t.Fatal(err)
		}
	}
	install(orig)
	// What a broken install looks like to systemd: the binary's
	// interpreter does not exist (execve fails: 203/EXEC).
	broken := []byte("#!/nonexistent/interpreter\n")

	a, id := enrolledAgent(t, srv, agentOpts{name: "agent-account", backend: "systemd", mgr: &mgr, tags: tags, binary: bin, noAgentPath: true, heartbeat: 2 * time.Second})
	srv.putPipe("acc-ok", pipeSpec{Schedule: far, Script: "echo accounted\n", Targets: byTags(tags)})
	srv.putPipe("acc-kill", pipeSpec{Schedule: far, Script: "echo started\nsleep 300\n", Targets: byTags(tags)})
	a.waitPipes(60*time.Second, "acc-ok", "acc-kill")
	unit, err := os.ReadFile(filepath.Join(mgr.UnitDir(), units.ServiceName("acc-ok")))
	if err != nil || !strings.Contains(string(unit), "ExecStart="+bin+" run acc-ok") {
		t.Fatalf("the unit does not run the agent's own binary %s: %v\n%s", bin, err, unit)
	}

	// A pipe runs with no extra setting.
	ok := srv.runOfRequest(srv.runNow("acc-ok", id).RequestID, 60*time.Second, "succeeded", "failed")
	if ok.Status != "succeeded" || !strings.Contains(srv.logText(ok.ID), "accounted") {
		t.Fatalf("run %+v, log %q", ok, srv.logText(ok.ID))
	}

	// 203/EXEC on a run-now: one failed run, with the request id.
	install(broken)
	req := srv.runNow("acc-ok", id).RequestID
	failed := srv.runOfRequest(req, 60*time.Second, "failed")
	install(orig)
	runsOnce(t, srv, "acc-ok", id, failed.ID, func(r api.Run) bool {
		return r.Trigger == "api" && r.RequestID == req && r.Reason == "systemd: 203/EXEC" && r.WrittenBy == "daemon"
	})
	waitReason(t, a, "acc-ok", failed.ID, "systemd: 203/EXEC")

	// SIGKILL mid-run: the runner reported it running; it ends failed.
	req = srv.runNow("acc-kill", id).RequestID
	running := srv.runOfRequest(req, 60*time.Second, "running")
	mgr.Systemctl(t, "kill", "--signal=SIGKILL", units.ServiceName("acc-kill"))
	waitRun(t, srv, "acc-kill", id, running.ID, 60*time.Second, "failed")
	runsOnce(t, srv, "acc-kill", id, running.ID, func(r api.Run) bool { return r.Signal == "SIGKILL" && r.Reason == "signal SIGKILL" })
	waitReason(t, a, "acc-kill", running.ID, "signal SIGKILL")

	// Both again while the daemon is stopped.
	a.stop()
	install(broken)
	_, _ = mgr.SystemctlErr("start", units.ServiceName("acc-ok"))
	mgr.WaitProperty(t, units.ServiceName("acc-ok"), "ActiveState", 20*time.Second, func(v string) bool { return v == "failed" })
	execID := strings.ReplaceAll(mgr.Show(t, units.ServiceName("acc-ok"), "InvocationID"), "-", "")
	install(orig)
	mgr.Systemctl(t, "start", "--no-block", units.ServiceName("acc-kill"))
	spool := filepath.Join(mgr.ConfigHome, "drover-runs", "acc-kill", "spool")
	if _, err := os.Stat(filepath.Join(mgr.StateHome, "drover-runs")); err == nil {
		spool = filepath.Join(mgr.StateHome, "drover-runs", "acc-kill", "spool")
	}
	testkit.WaitFor(t, 30*time.Second, "the runner to spool its RunStarted", func() bool {
		ents, _ := os.ReadDir(spool)
		for _, e := range ents {
			if strings.HasSuffix(e.Name(), ".pb") {
				return true
			}
		}
		return false
	})
	killID := strings.ReplaceAll(mgr.Show(t, units.ServiceName("acc-kill"), "InvocationID"), "-", "")
	mgr.Systemctl(t, "kill", "--signal=SIGKILL", units.ServiceName("acc-kill"))
	mgr.WaitProperty(t, units.ServiceName("acc-kill"), "ActiveState", 20*time.Second, func(v string) bool { return v == "failed" })
	a.start()
	waitRun(t, srv, "acc-ok", id, execID, 60*time.Second, "failed")
	waitRun(t, srv, "acc-kill", id, killID, 60*time.Second, "failed")
	runsOnce(t, srv, "acc-ok", id, execID, func(r api.Run) bool { return r.Trigger == "manual" && r.Reason == "systemd: 203/EXEC" })
	runsOnce(t, srv, "acc-kill", id, killID, func(r api.Run) bool { return r.Signal == "SIGKILL" && r.Reason == "signal SIGKILL" })
	waitReason(t, a, "acc-ok", execID, "systemd: 203/EXEC")
	waitReason(t, a, "acc-kill", killID, "signal SIGKILL")
	// Every run so far is on the server once, none is left running.
	for _, pipe := range []string{"acc-ok", "acc-kill"} {
		seen := map[string]bool{}
		for _, r := range srv.runs(pipe, id) {
			if seen[r.ID] || r.Status == "running" {
				t.Fatalf("%s: run %s twice or still running: %+v", pipe, r.ID, r)
			}
			seen[r.ID] = true
		}
	}
	if n := len(srv.runs("acc-ok", id)); n != 3 {
		t.Fatalf("acc-ok: %d runs, want 3", n)
	}
	if n := len(srv.runs("acc-kill", id)); n != 2 {
		t.Fatalf("acc-kill: %d runs, want 2", n)
	}
}

// TestCronRunnerKilledAccounted: on the cron backend, a runner killed
// mid-run is a failed run on the server, not one stuck running — while the
// daemon runs, and when the daemon was killed first and the runner died
// while it was down (settled at the next start from the spawn's record).
func TestCronRunnerKilledAccounted(t *testing.T) {
	t.Parallel()
	srv := startServer(t)
	tags := map[string]string{"e2e": "cron-account"}
	a, id := enrolledAgent(t, srv, agentOpts{name: "agent-cron-account", backend: "cron", tags: tags})
	srv.putPipe("ck", pipeSpec{Schedule: far, Script: "echo started\nsleep 300\n", Targets: byTags(tags)})
	a.waitPipes(60*time.Second, "ck")
	runnerPID := func(runID string) int {
		t.Helper()
		b, err := os.ReadFile(filepath.Join(a.dataDir, "cron-runs", runID+".json"))
		if err != nil {
			t.Fatalf("the spawn's record: %v", err)
		}
		var rec struct {
			PID int `json:"pid"`
		}
		if err := json.Unmarshal(b, &rec); err != nil || rec.PID <= 0 {
			t.Fatalf("the spawn's record %s: %v", b, err)
		}
		return rec.PID
	}

	// Killed while the daemon runs.
	run := srv.runOfRequest(srv.runNow("ck", id).RequestID, 60*time.Second, "running")
	if err := syscall.Kill(runnerPID(run.ID), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitRun(t, srv, "ck", id, run.ID, 60*time.Second, "failed")
	runsOnce(t, srv, "ck", id, run.ID, func(r api.Run) bool { return r.Signal == "SIGKILL" && r.Reason == "signal SIGKILL" })
	waitReason(t, a, "ck", run.ID, "signal SIGKILL")

	// The daemon dies first; the runner dies while it is down.
	run = srv.runOfRequest(srv.runNow("ck", id).RequestID, 60*time.Second, "running")
	pid := runnerPID(run.ID)
	a.kill()
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	a.start()
	waitRun(t, srv, "ck", id, run.ID, 60*time.Second, "failed")
	runsOnce(t, srv, "ck", id, run.ID, func(r api.Run) bool {
		return r.Trigger == "api" && r.Reason == "runner lost (it ended while the agent was down)"
	})
	waitReason(t, a, "ck", run.ID, "runner lost (it ended while the agent was down)")
	for _, r := range srv.runs("ck", id) {
		if r.Status == "running" {
			t.Fatalf("a run is still running: %+v", r)
		}
	}
}
