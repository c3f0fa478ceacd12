package agent

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/drover/drover/agent/apply"
	"github.com/drover/drover/agent/internal/sdtest"
	"github.com/drover/drover/internal/testkit"
	"github.com/drover/drover/manifest"
	agentpb "github.com/drover/drover/proto"
	"github.com/drover/drover/units"
)

// accountRig is an agent on the real user manager whose pipe services run
// the executable at bin (rewritten by the tests: a script whose interpreter
// does not exist gives 203/EXEC; a wrapper around this test binary is the
// real runner).
type accountRig struct {
	t       *testing.T
	srv     *fakeServer
	cfg     Config
	bin     string
	ta      *testAgent
	backend apply.Backend
	agentID string
}

func newAccountRig(t *testing.T) *accountRig {
	sdtest.Require(t)
	uniqBase.Store(time.Now().UnixNano())
	r := &accountRig{t: t, srv: newFakeServer(t)}
	r.cfg = testConfig(t, r.srv)
	r.cfg.Backend = BackendSystemd
	r.cfg.HeartbeatInterval = time.Second
	r.bin = filepath.Join(filepath.Dir(r.cfg.DataDir), "pipe-bin")
	r.setBin("#!/bin/true\n")
	must(t, os.WriteFile(r.cfg.TokenFile, []byte(r.srv.token(time.Hour)), 0o600))
	r.start()
	r.agentID = r.ta.enrolled(10 * time.Second).AgentID
	r.waitStream()
	return r
}

// setBin replaces the executable the pipe services run.
func (r *accountRig) setBin(script string) {
	tmp := r.bin + ".tmp"
	must(r.t, os.WriteFile(tmp, []byte(script), 0o755))
	must(r.t, os.Rename(tmp, r.bin))
}

// useRunner makes the services run the real runner (this test binary).
func (r *accountRig) useRunner() {
	exe, err := os.Executable()
	must(r.t, err)
	r.setBin(fmt.Sprintf("#!/bin/sh\n%s=1 exec %s \"$@\"\n", envTestRunner, exe))
}

func (r *accountRig) start() {
	b, err := apply.Select(context.Background(), apply.BackendSystemd, apply.Config{
		DataDir: r.cfg.DataDir, Scope: units.ScopeUser, AgentPath: r.bin,
	})
	must(r.t, err)
	r.backend = b
	r.ta = startAgent(r.t, r.cfg, b, WithSpoolRoots(DefaultSpoolRoots(r.cfg)...))
	r.t.Cleanup(func() { b.Close() })
}

func (r *accountRig) stop() {
	r.ta.stop()
	r.backend.Close()
}

func (r *accountRig) waitStream() {
	testkit.WaitFor(r.t, 15*time.Second, "the stream", func() bool {
		r.srv.mu.Lock()
		defer r.srv.mu.Unlock()
		return r.srv.streams[r.agentID] != nil
	})
}

func (r *accountRig) runNow(pipe, req string) {
	r.t.Helper()
	if !r.srv.send(r.agentID, &agentpb.ServerMessage{Body: &agentpb.ServerMessage_RunNow{RunNow: &agentpb.RunNow{Pipe: pipe, RequestId: req}}}) {
		r.t.Fatal("no stream to send RunNow on")
	}
}

// finished waits for the RunFinished records match accepts, then checks,
// after more accounting passes, that exactly one arrived.
func (r *accountRig) finishedOnce(what string, match func(*agentpb.RunFinished) bool) *agentpb.RunFinished {
	r.t.Helper()
	return r.finishedOnceWithin(30*time.Second, what, match)
}

func (r *accountRig) finishedOnceWithin(timeout time.Duration, what string, match func(*agentpb.RunFinished) bool) *agentpb.RunFinished {
	r.t.Helper()
	testkit.WaitFor(r.t, timeout, what, func() bool { return len(r.srv.finishedWhere(match)) > 0 })
	// More passes (signals, status passes, a pass at start) add nothing.
	for range 3 {
		r.ta.a.kickAccount()
		time.Sleep(300 * time.Millisecond)
	}
	got := r.srv.finishedWhere(match)
	if len(got) != 1 {
		r.t.Fatalf("%s: %d RunFinished records, want exactly 1: %v", what, len(got), got)
	}
	return got[0]
}

var invocationRE = regexp.MustCompile(`^[0-9a-f]{32}$`)

// checkDaemonRecord checks a record the daemon wrote for a failed invocation.
func checkDaemonRecord(t *testing.T, f *agentpb.RunFinished, reason string, trigger agentpb.Trigger) {
	t.Helper()
	if f.GetStatus() != agentpb.RunStatus_RUN_STATUS_FAILED || f.GetReason() != reason || f.GetWrittenBy() != WrittenByDaemon ||
		f.GetTrigger() != trigger || f.GetAttempts() != 1 || f.GetStartedAt() == nil || f.GetFinishedAt() == nil {
		t.Fatalf("daemon record: want failed, reason %q, trigger %s, written_by daemon; got %v", reason, trigger, f)
	}
}

// TestSystemdAccountsForEveryInvocation: on a real user manager, every start
// of a pipe service ends in exactly one run record on the (fake, real-gRPC)
// server: a run-now whose service cannot exec (203/EXEC) and a run killed
// with SIGKILL get a failed record from the daemon, keyed by the
// InvocationID, with systemd's reason; so does an invocation that failed
// while the daemon was stopped, once it starts again; a run whose runner
// wrote its own final record gets no second record; a runner killed after
// it reported the run started gets its run closed.
func TestSystemdAccountsForEveryInvocation(t *testing.T) {
	r := newAccountRig(t)
	p, b := testPipe(t, "acct", "17 3 * * *", "exit 3\n", 1)
	r.srv.publish(r.agentID, []manifest.Pipe{p}, b)
	svc := units.ServiceName("acct")
	testkit.WaitFor(t, 20*time.Second, "the timer", func() bool { _, ok := sdtest.ListTimers(t)[units.TimerName("acct")]; return ok })

	// 1. Run-now; the service's executable has an interpreter that does not exist.
	r.setBin("#!/nonexistent/interpreter\n")
	r.runNow("acct", uniq("req-exec"))
	f := r.finishedOnce("the 203/EXEC run", func(f *agentpb.RunFinished) bool { return f.GetRequestId() == uniq("req-exec") })
	checkDaemonRecord(t, f, "systemd: 203/EXEC", agentpb.Trigger_TRIGGER_API)
	if !invocationRE.MatchString(f.GetRunId()) || f.GetRunId() != strings.ReplaceAll(sdtest.Show(t, svc, "InvocationID"), "-", "") {
		t.Fatalf("run id %q is not the service's InvocationID %q", f.GetRunId(), sdtest.Show(t, svc, "InvocationID"))
	}

	// 2. A run killed with SIGKILL mid-run (started by hand: trigger manual).
	r.setBin("#!/bin/sh\nexec sleep 300\n")
	sdtest.Systemctl(t, "start", "--no-block", svc)
	sdtest.WaitState(t, svc, "activating", 20*time.Second)
	inv := sdtest.Show(t, svc, "InvocationID")
	// The heartbeat lists the running invocation.
	testkit.WaitFor(t, 20*time.Second, "the heartbeat's running run", func() bool {
		hb := r.srv.lastHeartbeat()
		return hb != nil && len(hb.GetRunningRunIds()) == 1 && hb.GetRunningRunIds()[0] == inv
	})
	if hb := r.srv.lastHeartbeat(); hb.GetLoad1() == 0 && hb.GetLoad5() == 0 && hb.GetLoad15() == 0 {
		t.Logf("host load all zero: %v", hb) // possible on an idle host; /proc/loadavg is read
	}
	sdtest.Systemctl(t, "kill", "--signal=SIGKILL", svc)
	f = r.finishedOnce("the SIGKILL run", func(f *agentpb.RunFinished) bool { return f.GetRunId() == inv })
	checkDaemonRecord(t, f, "signal SIGKILL", agentpb.Trigger_TRIGGER_MANUAL)
	if f.GetSignal() != "SIGKILL" {
		t.Fatalf("signal %q", f.GetSignal())
	}

	// 3. The daemon is stopped while a start fails; it settles it when it
	// starts again (and nothing settled before comes back).
	r.stop()
	r.setBin("#!/nonexistent/interpreter\n")
	_, _ = sdtest.SystemctlErr("start", svc)
	sdtest.WaitState(t, svc, "failed", 20*time.Second)
	down := sdtest.Show(t, svc, "InvocationID")
	r.start()
	r.waitStream()
	f = r.finishedOnce("the run that failed while the daemon was down", func(f *agentpb.RunFinished) bool { return f.GetRunId() == down })
	checkDaemonRecord(t, f, "systemd: 203/EXEC", agentpb.Trigger_TRIGGER_MANUAL)
	for _, id := range []string{inv} {
		if n := len(r.srv.finishedWhere(func(f *agentpb.RunFinished) bool { return f.GetRunId() == id })); n != 1 {
			t.Fatalf("run %s: %d records after the restart", id, n)
		}
	}

	// 4. The real runner writes its own final record: no second one.
	r.useRunner()
	r.runNow("acct", uniq("req-runner"))
	f = r.finishedOnce("the runner's record", func(f *agentpb.RunFinished) bool { return f.GetRequestId() == uniq("req-runner") })
	if f.GetWrittenBy() != "runner" || f.GetReason() != "exit 3" || f.GetStatus() != agentpb.RunStatus_RUN_STATUS_FAILED {
		t.Fatalf("runner record %v", f)
	}

	// 5. The runner reported the run started, then it was killed: the
	// daemon closes that run.
	p2, b2 := testPipe(t, "acct", "17 3 * * *", "sleep 300\n", 2)
	r.srv.publish(r.agentID, []manifest.Pipe{p2}, b2)
	testkit.WaitFor(t, 20*time.Second, "version 2", func() bool {
		return strings.Contains(sdtest.Show(t, svc, "ExecStart"), r.bin) && r.ta.a.pipeVersion("acct") == 2
	})
	r.runNow("acct", uniq("req-kill"))
	testkit.WaitFor(t, 30*time.Second, "the runner's RunStarted", func() bool {
		for _, s := range r.srv.runsStarted() {
			if s.GetRequestId() == uniq("req-kill") {
				return true
			}
		}
		return false
	})
	killed := sdtest.Show(t, svc, "InvocationID")
	sdtest.Systemctl(t, "kill", "--signal=SIGKILL", svc)
	f = r.finishedOnce("the killed runner's run", func(f *agentpb.RunFinished) bool { return f.GetRunId() == killed })
	checkDaemonRecord(t, f, "signal SIGKILL", agentpb.Trigger_TRIGGER_API)
	if f.GetRequestId() != uniq("req-kill") {
		t.Fatalf("request id %q", f.GetRequestId())
	}
}

// TestCronAccountsForKilledRunner: on the cron backend, a runner killed
// mid-run (SIGKILL, so it writes nothing) ends in one failed record written
// by the daemon from the backend's account of its spawn, not in a run
// stuck running; the account is a file that outlives the daemon.
func TestCronAccountsForKilledRunner(t *testing.T) {
	uniqBase.Store(time.Now().UnixNano())
	srv := newFakeServer(t)
	cfg := testConfig(t, srv)
	cfg.HeartbeatInterval = time.Second
	bin := filepath.Join(filepath.Dir(cfg.DataDir), "runner")
	must(t, os.WriteFile(bin, []byte("#!/bin/sh\nexec sleep 300\n"), 0o755))
	backend, err := apply.NewCron(apply.Config{DataDir: cfg.DataDir, Scope: units.ScopeUser, AgentPath: bin})
	must(t, err)
	t.Cleanup(func() { backend.Close() })
	must(t, os.WriteFile(cfg.TokenFile, []byte(srv.token(time.Hour)), 0o600))
	ta := startAgent(t, cfg, backend)
	agentID := ta.enrolled(10 * time.Second).AgentID
	testkit.WaitFor(t, 15*time.Second, "the stream", func() bool {
		srv.mu.Lock()
		defer srv.mu.Unlock()
		return srv.streams[agentID] != nil
	})
	p, b := testPipe(t, "cronkill", "17 3 * * *", "true\n", 1)
	srv.publish(agentID, []manifest.Pipe{p}, b)
	testkit.WaitFor(t, 20*time.Second, "the pipe", func() bool { return ta.a.pipeVersion("cronkill") == 1 })
	srv.send(agentID, &agentpb.ServerMessage{Body: &agentpb.ServerMessage_RunNow{RunNow: &agentpb.RunNow{Pipe: "cronkill", RequestId: uniq("req-cron")}}})
	var runID string
	testkit.WaitFor(t, 20*time.Second, "the run", func() bool {
		st, _ := backend.Status(context.Background())
		for _, s := range st {
			if s.Running {
				runID = s.RunID
			}
		}
		return runID != ""
	})
	acct, err := os.ReadFile(filepath.Join(cfg.DataDir, "cron-runs", runID+".json"))
	must(t, err)
	var rec struct {
		PID int `json:"pid"`
	}
	must(t, json.Unmarshal(acct, &rec))
	// The heartbeat lists the run while it runs.
	testkit.WaitFor(t, 20*time.Second, "the heartbeat's running run", func() bool {
		hb := srv.lastHeartbeat()
		return hb != nil && slices.Contains(hb.GetRunningRunIds(), runID)
	})
	must(t, syscall.Kill(rec.PID, syscall.SIGKILL))
	rig := &accountRig{t: t, srv: srv, ta: ta}
	f := rig.finishedOnce("the killed runner's run", func(f *agentpb.RunFinished) bool { return f.GetRunId() == runID })
	checkDaemonRecord(t, f, "signal SIGKILL", agentpb.Trigger_TRIGGER_API)
	if f.GetRequestId() != uniq("req-cron") {
		t.Fatalf("request id %q", f.GetRequestId())
	}
	if _, err := os.Stat(filepath.Join(cfg.DataDir, "cron-runs", runID+".json")); !os.IsNotExist(err) {
		t.Fatalf("the settled account is still there: %v", err)
	}
}

// TestFreezeAndTamper: a server (or a proxy) that answers 304 for ever past
// the manifest's expiry does not stop the host: the pipes keep running,
// the agent reports manifest_expired (ManifestStatus, status) and keeps
// asking. A payload edited on disk is refused at its next run (the real
// runner: failed, payload_mismatch) and restored by the next sync; a
// drop-in beside a managed unit is removed by the next sync and reported.
func TestFreezeAndTamper(t *testing.T) {
	r := newAccountRig(t)
	r.useRunner()
	marker := filepath.Join(t.TempDir(), "ran")
	script := "echo run >> " + marker + "\n"
	r.srv.mu.Lock()
	r.srv.manifestLifetime = 8 * time.Second
	r.srv.mu.Unlock()
	p, b := testPipe(t, "frozen", "17 3 * * *", script, 1)
	r.srv.publish(r.agentID, []manifest.Pipe{p}, b)
	svc := units.ServiceName("frozen")
	testkit.WaitFor(t, 20*time.Second, "the pipe", func() bool { return r.ta.a.pipeVersion("frozen") == 1 })
	st := r.ta.a.Status(t.Context())
	if st.ManifestExpired || st.ManifestExpiresAt.IsZero() {
		t.Fatalf("fresh manifest: expired %v at %s", st.ManifestExpired, st.ManifestExpiresAt)
	}

	// From now on every manifest request gets 304.
	var polls atomic.Int64
	r.srv.setIntercept(func(w http.ResponseWriter, req *http.Request, _ string) bool {
		if req.URL.Path != pathManifest {
			return false
		}
		polls.Add(1)
		w.WriteHeader(http.StatusNotModified)
		return true
	})
	time.Sleep(time.Until(st.ManifestExpiresAt) + time.Second)
	res := r.ta.syncNow()
	if !res.Expired || res.Outcome != OutcomeError || !res.NotModified {
		t.Fatalf("sync past expiry: %+v", res)
	}
	st = r.ta.a.Status(t.Context())
	if !st.ManifestExpired {
		t.Fatalf("status does not say expired: %+v", st)
	}
	testkit.WaitFor(t, 10*time.Second, "manifest_expired in a ManifestStatus", func() bool {
		for _, ms := range r.srv.manifestStatuses() {
			if ms.GetManifestExpired() && ms.GetExpiresAt().AsTime().Equal(st.ManifestExpiresAt) {
				return true
			}
		}
		return false
	})
	// Retried hard: the sync loop asks again within expiredRetryMax.
	before := polls.Load()
	testkit.WaitFor(t, expiredRetryMax+10*time.Second, "another pull", func() bool { return polls.Load() > before })

	// The pipe keeps running.
	r.runNow("frozen", uniq("req-frozen"))
	f := r.finishedOnce("a run under the expired manifest", func(f *agentpb.RunFinished) bool { return f.GetRequestId() == uniq("req-frozen") })
	if f.GetStatus() != agentpb.RunStatus_RUN_STATUS_SUCCEEDED || f.GetWrittenBy() != "runner" {
		t.Fatalf("run %v", f)
	}

	// A payload edited on disk is refused at its next run...
	// The expired manifest's sync retries (every second or two) also
	// restore drift, and one may put the payload back between the edit and
	// the run: then the run succeeds with the payload as published, and the
	// edit is made again.
	payload := filepath.Join(r.cfg.DataDir, "pipes", "frozen", "payload", manifest.ScriptFile)
	for attempt := 0; ; attempt++ {
		must(t, os.WriteFile(payload, []byte("echo tampered >> "+marker+"\n"), 0o755))
		req := uniq(fmt.Sprintf("req-tampered-%d", attempt))
		r.runNow("frozen", req)
		f = r.finishedOnce("the tampered run", func(f *agentpb.RunFinished) bool { return f.GetRequestId() == req })
		restored, _ := os.ReadFile(payload)
		if f.GetStatus() == agentpb.RunStatus_RUN_STATUS_SUCCEEDED && string(restored) == script && attempt < 5 {
			continue // a sync restored the payload first
		}
		if f.GetStatus() != agentpb.RunStatus_RUN_STATUS_FAILED || f.GetReason() != "payload_mismatch" || f.GetWrittenBy() != "runner" {
			t.Fatalf("tampered run (attempt %d) %v", attempt+1, f)
		}
		break
	}
	if got, _ := os.ReadFile(marker); strings.Contains(string(got), "tampered") {
		t.Fatal("the edited payload ran")
	}
	// ...and restored by the next sync.
	r.ta.syncNow()
	if got, err := os.ReadFile(payload); err != nil || string(got) != script {
		t.Fatalf("payload not restored: %q %v", got, err)
	}
	r.runNow("frozen", uniq("req-restored"))
	f = r.finishedOnce("the restored run", func(f *agentpb.RunFinished) bool { return f.GetRequestId() == uniq("req-restored") })
	if f.GetStatus() != agentpb.RunStatus_RUN_STATUS_SUCCEEDED {
		t.Fatalf("restored run %v", f)
	}

	// A drop-in beside the service is drift: removed and reported.
	env := sdtest.Current()
	dropDir := filepath.Join(env.UnitDir(), svc+".d")
	must(t, os.MkdirAll(dropDir, 0o755))
	must(t, os.WriteFile(filepath.Join(dropDir, "evil.conf"), []byte("[Service]\nEnvironment=EVIL=1\n"), 0o644))
	sdtest.Systemctl(t, "daemon-reload")
	r.ta.syncNow()
	// The status right after the pass that removed the drop-in: the expired
	// manifest makes the sync loop retry every second or two, and a later
	// pass that finds nothing to remove reports nothing.
	st = r.ta.a.Status(t.Context())
	if _, err := os.Stat(dropDir); !os.IsNotExist(err) {
		t.Fatalf("the drop-in directory is still there: %v", err)
	}
	if dp := sdtest.Show(t, svc, "DropInPaths"); dp != "" {
		t.Fatalf("systemd still loads drop-ins: %q", dp)
	}
	want := svc + ".d/evil.conf"
	testkit.WaitFor(t, 10*time.Second, "drop_ins_removed in a ManifestStatus", func() bool {
		for _, ms := range r.srv.manifestStatuses() {
			for _, ps := range ms.GetPipes() {
				if slices.Contains(ps.GetDropInsRemoved(), want) && ps.GetDriftRestored() {
					return true
				}
			}
		}
		return false
	})
	if len(st.Pipes) != 1 || !slices.Contains(st.Pipes[0].DropInsRemoved, want) {
		t.Fatalf("status pipes %+v", st.Pipes)
	}
}

// TestMachineIDAndLoad: the machine id (from machine_id_file) goes with the
// enrollment request and every Hello; heartbeats carry the host load as
// /proc/loadavg (here a file the test writes) says.
func TestMachineIDAndLoad(t *testing.T) {
	srv := newFakeServer(t)
	cfg := testConfig(t, srv)
	cfg.HeartbeatInterval = time.Second
	base := filepath.Dir(cfg.DataDir)
	const mid = "0123456789abcdef0123456789abcdef"
	cfg.MachineIDFile = filepath.Join(base, "machine-id")
	must(t, os.WriteFile(cfg.MachineIDFile, []byte(strings.ToUpper(mid)+"\n"), 0o644))
	load := filepath.Join(base, "loadavg")
	must(t, os.WriteFile(load, []byte("0.52 1.25 2.50 3/456 7890\n"), 0o644))
	must(t, os.WriteFile(cfg.TokenFile, []byte(srv.token(time.Hour)), 0o600))
	ta := startAgent(t, cfg, nil, WithLoadAvgPath(load))
	ta.enrolled(10 * time.Second)
	testkit.WaitFor(t, 15*time.Second, "a heartbeat", func() bool { return srv.lastHeartbeat() != nil })
	srv.mu.Lock()
	ids, hellos := slices.Clone(srv.enrollMachineIDs), slices.Clone(srv.hellos)
	srv.mu.Unlock()
	if len(ids) != 1 || ids[0] != mid {
		t.Fatalf("enrollment machine ids %q", ids)
	}
	if len(hellos) == 0 || hellos[0].GetMachineId() != mid {
		t.Fatalf("hello %v", hellos)
	}
	hb := srv.lastHeartbeat()
	if hb.GetLoad1() != 0.52 || hb.GetLoad5() != 1.25 || hb.GetLoad15() != 2.5 {
		t.Fatalf("heartbeat load %v", hb)
	}
	if ReadMachineID(filepath.Join(base, "nope")) != "" {
		t.Fatal("a missing machine-id file gives an id")
	}
	must(t, os.WriteFile(filepath.Join(base, "bad"), []byte("not-hex\n"), 0o644))
	if ReadMachineID(filepath.Join(base, "bad")) != "" {
		t.Fatal("a malformed machine id is accepted")
	}
}

// TestAgentPathDefault: an empty agent_path is the running binary; a path
// that is not an executable file is refused at start with a clear error.
func TestAgentPathDefault(t *testing.T) {
	cfg := DefaultConfig()
	if cfg.AgentPath != "" {
		t.Fatalf("default agent_path %q", cfg.AgentPath)
	}
	must(t, cfg.ResolveAgentPath())
	exe, _ := os.Executable()
	exe, _ = filepath.EvalSymlinks(exe)
	if cfg.AgentPath != exe {
		t.Fatalf("agent_path %q, the running binary is %q", cfg.AgentPath, exe)
	}
	dir := t.TempDir()
	notExec := filepath.Join(dir, "drover-agent")
	must(t, os.WriteFile(notExec, []byte("x"), 0o644))
	for _, p := range []string{filepath.Join(dir, "missing"), notExec, dir} {
		c := DefaultConfig()
		c.AgentPath = p
		if err := c.ResolveAgentPath(); err == nil || !strings.Contains(err.Error(), "agent_path") {
			t.Errorf("%s: %v", p, err)
		}
	}
	srv := newFakeServer(t)
	c := testConfig(t, srv)
	c.AgentPath = notExec
	if _, err := New(c, nil, WithStore(&BoltStore{}), WithBackend(&fakeBackend{})); err == nil || !strings.Contains(err.Error(), "not executable") {
		t.Fatalf("New with a non-executable agent_path: %v", err)
	}
}

// uniq makes a request id unique to this process: the runner remembers the
// last request it served (in its spool, which outlives a test on the shared
// user manager), so ids must not repeat between runs of a test.
func uniq(id string) string { return fmt.Sprintf("%s-%d", id, uniqBase.Load()) }

// uniqBase changes with every test that makes an accountRig (the tests of
// this package do not run in parallel).
var uniqBase atomic.Int64

func init() { uniqBase.Store(time.Now().UnixNano()) }

// TestSystemdTimerFailureHasScheduledAt: a timer-started invocation that
// could not exec is recorded with trigger schedule and the fire time it
// served (scheduled_at).
func TestSystemdTimerFailureHasScheduledAt(t *testing.T) {
	r := newAccountRig(t)
	r.setBin("#!/nonexistent/interpreter\n")
	p, b := testPipe(t, "ticking", "* * * * *", "true\n", 1)
	r.srv.publish(r.agentID, []manifest.Pipe{p}, b)
	testkit.WaitFor(t, 20*time.Second, "the timer", func() bool { _, ok := sdtest.ListTimers(t)[units.TimerName("ticking")]; return ok })
	f := r.finishedOnceWithin(90*time.Second, "the scheduled run", func(f *agentpb.RunFinished) bool { return f.GetPipe() == "ticking" })
	checkDaemonRecord(t, f, "systemd: 203/EXEC", agentpb.Trigger_TRIGGER_SCHEDULE)
	at := f.GetScheduledAt().AsTime()
	if f.GetScheduledAt() == nil || at.Second() != 0 || at.Nanosecond() != 0 || f.GetStartedAt().AsTime().Sub(at) > time.Minute || at.After(f.GetStartedAt().AsTime()) {
		t.Fatalf("scheduled_at %v for a run started %v", f.GetScheduledAt(), f.GetStartedAt())
	}
}
