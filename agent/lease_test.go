package agent

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/drover/drover/agent/apply"
	"github.com/drover/drover/agent/internal/sdtest"
	"github.com/drover/drover/agent/lease"
	"github.com/drover/drover/internal/testkit"
	"github.com/drover/drover/manifest"
	agentpb "github.com/drover/drover/proto"
	"github.com/drover/drover/units"
)

// heldPipe is an every-minute pipe held by the agent until until, with
// the last fire time any holder served (zero: none known).
func heldPipe(t *testing.T, name, catchup string, until, served time.Time) (manifest.Pipe, []byte) {
	p, b := testPipe(t, name, "* * * * *", "true\n", 1)
	p.Spec.Catchup = catchup
	p.LeaseUntil, p.LastFireServed = until.UTC(), served.UTC()
	return p, b
}

// leaseRig is one backend under the lease scenario.
type leaseRig struct {
	t       *testing.T
	srv     *fakeServer
	agentID string
	agent   func() *testAgent
	// restart stops the agent (and its backend) and starts a new one on
	// the same data.
	restart func()
	// scheduled reports whether the pipe's timer (cron entry) is active,
	// and its next elapse.
	scheduled func(pipe string) (bool, time.Time)
	// disabled reports whether nothing would start the pipe's timer
	// again at boot (systemd: no timers.target.wants link).
	disabled func(pipe string) bool
}

// runs returns the committed RunFinished records of pipe for fire times
// in [from, to].
func (r *leaseRig) runs(pipe string, from, to time.Time) []*agentpb.RunFinished {
	return r.srv.finishedWhere(func(f *agentpb.RunFinished) bool {
		at := f.GetScheduledAt().AsTime()
		return f.GetPipe() == pipe && f.GetScheduledAt() != nil && !at.Before(from) && !at.After(to)
	})
}

func scheduledAts(fs []*agentpb.RunFinished) []time.Time {
	var out []time.Time
	for _, f := range fs {
		out = append(out, f.GetScheduledAt().AsTime())
	}
	slices.SortFunc(out, func(a, b time.Time) int { return a.Compare(b) })
	return out
}

// leaseReported reports whether a ManifestStatus said pipe's lease until
// until is ended (or not).
func (r *leaseRig) leaseReported(pipe string, until time.Time, ended bool) bool {
	for _, ms := range r.srv.manifestStatuses() {
		for _, ps := range ms.GetPipes() {
			if ps.GetName() == pipe && ps.GetLeaseUntil() != nil && ps.GetLeaseUntil().AsTime().Equal(until) && ps.GetLeaseEnded() == ended {
				return true
			}
		}
	}
	return false
}

// runLeaseScenario is the agent side of placement: one on a real backend
// with the real runner, on the real clock (every-minute pipes; about two
// and a half minutes):
//
//  1. two pipes handed over with last_fire_served two fire times ago catch
//     up at once: catchup once with one run for the latest fire time,
//     catchup all with a run for each, oldest first;
//  2. a held pipe runs at the fire time inside its lease; its lease passes
//     unrenewed (serverDown: the server is down; else it answers 304, the
//     manifest has not changed): its timer is stopped and disabled
//     at lease_until minus lease.Lead, the end is reported
//     (ManifestStatus, status), and a restart of the agent keeps it
//     stopped; the next fire time does not run;
//  3. a renewal starts it again; whether the fire time of the gap runs
//     depends on last_fire_served (renewedServed: "another holder served
//     it", no run; else a catch-up run for it).
func runLeaseScenario(t *testing.T, r *leaseRig, serverDown, renewedServed bool) {
	// Fire times: P the latest before now, F1 the first one at least 20 s
	// ahead (the hand-over catch-ups finish before it).
	now := time.Now().UTC().Round(0)
	P := now.Truncate(time.Minute)
	F1 := P.Add(time.Minute)
	if F1.Sub(now) < 20*time.Second {
		F1 = F1.Add(time.Minute)
	}
	F2, F3 := F1.Add(time.Minute), F1.Add(2*time.Minute)
	far := now.Add(10 * time.Minute)
	once, bOnce := heldPipe(t, "lease-once", manifest.CatchupOnce, far, P.Add(-2*time.Minute))
	all, bAll := heldPipe(t, "lease-all", manifest.CatchupAll, far, P.Add(-2*time.Minute))
	until := F1.Add(25 * time.Second)
	held, bHeld := heldPipe(t, "lease-held", manifest.CatchupOnce, until, time.Time{})
	r.srv.publish(r.agentID, []manifest.Pipe{once, all, held}, bOnce, bAll, bHeld)

	// 1. Hand-over catch-up.
	testkit.WaitFor(t, 40*time.Second, "the catch-up runs", func() bool {
		return len(r.runs("lease-once", P.Add(-2*time.Minute), P)) >= 1 && len(r.runs("lease-all", P.Add(-2*time.Minute), P)) >= 2
	})
	time.Sleep(2 * time.Second) // nothing more comes
	if got := scheduledAts(r.runs("lease-once", P.Add(-5*time.Minute), P)); !slices.Equal(got, []time.Time{P}) {
		t.Fatalf("catchup once: runs for %v, want one for %v", got, P)
	}
	if got := scheduledAts(r.runs("lease-all", P.Add(-5*time.Minute), P)); !slices.Equal(got, []time.Time{P.Add(-time.Minute), P}) {
		t.Fatalf("catchup all: runs for %v, want %v and %v", got, P.Add(-time.Minute), P)
	}
	for _, f := range r.runs("lease-all", P.Add(-5*time.Minute), P) {
		if f.GetStatus() != agentpb.RunStatus_RUN_STATUS_SUCCEEDED {
			t.Fatalf("catch-up run %v", f)
		}
	}

	// 2. The held pipe runs inside its lease.
	testkit.WaitFor(t, time.Until(F1)+40*time.Second, "the run at "+F1.Format(time.TimeOnly), func() bool {
		return len(r.runs("lease-held", F1, F1)) == 1
	})
	if f := r.runs("lease-held", F1, F1)[0]; f.GetStatus() != agentpb.RunStatus_RUN_STATUS_SUCCEEDED {
		t.Fatalf("run inside the lease: %v", f)
	}
	if serverDown {
		r.srv.setIntercept(func(w http.ResponseWriter, req *http.Request, _ string) bool {
			if req.URL.Path == pathManifest {
				writeErr(w, 503, "unavailable", "down for the test")
				return true
			}
			return false
		})
	}
	end := lease.End(&held)
	testkit.WaitFor(t, time.Until(end)+10*time.Second, "the fence", func() bool {
		on, _ := r.scheduled("lease-held")
		return !on
	})
	if stopped := time.Now(); stopped.Before(end) || stopped.After(until.Add(5*time.Second)) {
		t.Fatalf("timer stopped at %s; the lease ends at %s (stop due %s)", stopped.Format(time.StampMilli), until.Format(time.StampMilli), end.Format(time.StampMilli))
	}
	if !r.disabled("lease-held") {
		t.Fatal("the fenced timer would come back at boot")
	}
	if on, _ := r.scheduled("lease-once"); !on {
		t.Fatal("the fence stopped a pipe whose lease goes on")
	}
	testkit.WaitFor(t, 15*time.Second, "lease_ended in a ManifestStatus", func() bool { return r.leaseReported("lease-held", until, true) })
	st := r.agent().a.Status(t.Context())
	if i := slices.IndexFunc(st.Pipes, func(p PipeInfo) bool { return p.Name == "lease-held" }); i < 0 ||
		!st.Pipes[i].LeaseEnded || !st.Pipes[i].LeaseUntil.Equal(until) || !st.Pipes[i].NextRun.IsZero() {
		t.Fatalf("status of the fenced pipe: %+v", st.Pipes)
	}
	if res := r.agent().syncNow(); serverDown && res.Outcome != OutcomeError || !serverDown && !res.NotModified {
		t.Fatalf("sync (server down %v): %+v", serverDown, res)
	}
	if on, _ := r.scheduled("lease-held"); on {
		t.Fatal("a sync started the fenced timer again")
	}
	// A restart of the agent (the manifest in force says the lease ended).
	r.restart()
	testkit.WaitFor(t, 20*time.Second, "the restarted agent's manifest", func() bool { return r.agent().a.pipeVersion("lease-held") == 1 })
	time.Sleep(time.Second)
	if on, _ := r.scheduled("lease-held"); on {
		t.Fatal("the restart started the fenced timer again")
	}
	if on, _ := r.scheduled("lease-all"); !on {
		t.Fatal("the restart lost a pipe whose lease goes on")
	}
	// F2 passes without a run here.
	time.Sleep(time.Until(F2.Add(5 * time.Second)))
	if got := r.srv.finishedWhere(func(f *agentpb.RunFinished) bool {
		return f.GetPipe() == "lease-held" && (f.GetScheduledAt() == nil || f.GetScheduledAt().AsTime().After(F1))
	}); len(got) != 0 {
		t.Fatalf("runs of the fenced pipe after its lease: %v", got)
	}

	// 3. The lease is renewed.
	r.srv.setIntercept(nil)
	served := F1
	if renewedServed {
		served = F2 // as if another holder ran it
	}
	renewed, _ := heldPipe(t, "lease-held", manifest.CatchupOnce, time.Now().Add(10*time.Minute), served)
	r.srv.publish(r.agentID, []manifest.Pipe{once, all, renewed}, bOnce, bAll, bHeld)
	testkit.WaitFor(t, 20*time.Second, "the timer again", func() bool { on, next := r.scheduled("lease-held"); return on && !next.IsZero() })
	if _, next := r.scheduled("lease-held"); !next.Equal(F3) {
		t.Fatalf("next elapse after the renewal %s, want %s", next, F3)
	}
	if r.disabled("lease-held") {
		t.Fatal("the renewed timer is not enabled")
	}
	if renewedServed {
		time.Sleep(3 * time.Second)
		if got := r.runs("lease-held", F2, F2); len(got) != 0 {
			t.Fatalf("a run for %s, which another holder served: %v", F2, got)
		}
	} else {
		testkit.WaitFor(t, 20*time.Second, "the catch-up of "+F2.Format(time.TimeOnly), func() bool { return len(r.runs("lease-held", F2, F2)) == 1 })
		time.Sleep(2 * time.Second)
		if got := r.runs("lease-held", F1.Add(time.Second), F3); len(got) != 1 {
			t.Fatalf("runs of the held pipe after the renewal: %v", got)
		}
	}
	testkit.WaitFor(t, 15*time.Second, "the renewal in a ManifestStatus", func() bool {
		return r.leaseReported("lease-held", renewed.LeaseUntil, false)
	})
	// Nothing was refused: the fence stopped the timer before any fire.
	for _, f := range r.srv.runsFinished() {
		if f.GetReason() == "lease_ended" {
			t.Fatalf("a refused run: %v", f)
		}
	}
}

// TestSystemdLeaseFencing: the lease scenario on a real user manager with
// the real runner, the server down while the lease ends; a renewal whose
// last_fire_served covers the gap runs nothing for it.
func TestSystemdLeaseFencing(t *testing.T) {
	// In parallel with the cron one only: both wait for the minute, and
	// two agents on one user manager would remove each other's units.
	t.Parallel()
	r := newAccountRig(t)
	r.useRunner()
	env := sdtest.Current()
	rig := &leaseRig{t: t, srv: r.srv, agentID: r.agentID,
		agent: func() *testAgent { return r.ta },
		restart: func() {
			r.stop()
			r.start()
			r.waitStream()
		},
		scheduled: func(pipe string) (bool, time.Time) {
			tm := units.TimerName(pipe)
			if sdtest.Show(t, tm, "ActiveState") != "active" {
				return false, time.Time{}
			}
			return true, sdtest.ListTimers(t)[tm].Next
		},
		disabled: func(pipe string) bool {
			_, err := os.Lstat(filepath.Join(env.UnitDir(), "timers.target.wants", units.TimerName(pipe)))
			return os.IsNotExist(err)
		},
	}
	runLeaseScenario(t, rig, true, true)
}

// TestCronLeaseFencing: the lease scenario on the cron backend with the
// real runner, the server answering 304 while the lease ends; a renewal
// whose last_fire_served is older than the gap catches the gap's fire time
// up.
func TestCronLeaseFencing(t *testing.T) {
	t.Parallel()
	srv := newFakeServer(t)
	cfg := testConfig(t, srv)
	cfg.HeartbeatInterval = time.Second
	exe, err := os.Executable()
	must(t, err)
	bin := filepath.Join(filepath.Dir(cfg.DataDir), "runner")
	must(t, os.WriteFile(bin, []byte(fmt.Sprintf("#!/bin/sh\n%s=1 exec %s \"$@\"\n", envTestRunner, exe)), 0o755))
	var backend *apply.Cron
	var ta *testAgent
	start := func() {
		b, err := apply.NewCron(apply.Config{DataDir: cfg.DataDir, Scope: units.ScopeUser, AgentPath: bin})
		must(t, err)
		b.SetOutput(testkit.LogWriter(t, "runner: "))
		backend = b
		t.Cleanup(func() { b.Close() })
		ta = startAgent(t, cfg, b)
	}
	must(t, os.WriteFile(cfg.TokenFile, []byte(srv.token(time.Hour)), 0o600))
	start()
	agentID := ta.enrolled(10 * time.Second).AgentID
	waitStream := func() {
		testkit.WaitFor(t, 15*time.Second, "the stream", func() bool {
			srv.mu.Lock()
			defer srv.mu.Unlock()
			return srv.streams[agentID] != nil
		})
	}
	waitStream()
	rig := &leaseRig{t: t, srv: srv, agentID: agentID,
		agent: func() *testAgent { return ta },
		restart: func() {
			ta.stop()
			backend.Close()
			start()
			waitStream()
		},
		scheduled: func(pipe string) (bool, time.Time) {
			st, err := backend.Status(context.Background())
			must(t, err)
			for _, s := range st {
				if s.Name == pipe {
					return s.Scheduled, s.Next
				}
			}
			return false, time.Time{}
		},
	}
	// Nothing of a cron entry outlives the agent's process.
	rig.disabled = func(pipe string) bool { on, _ := rig.scheduled(pipe); return !on }
	runLeaseScenario(t, rig, false, false)
}

// TestSystemdLeaseEndsAfterRestartWithExpiredManifest: the agent restarts
// while the server is away and the stored manifest has expired (so it is
// not applied again); the held pipe's timer still stops at the end of its
// lease, read from that manifest.
func TestSystemdLeaseEndsAfterRestartWithExpiredManifest(t *testing.T) {
	r := newAccountRig(t)
	r.srv.mu.Lock()
	r.srv.manifestLifetime = 6 * time.Second
	r.srv.mu.Unlock()
	until := time.Now().Add(20 * time.Second).UTC().Truncate(time.Second)
	p, b := heldPipe(t, "lease-frozen", manifest.CatchupOnce, until, time.Time{})
	p.Spec.Schedule = "17 3 * * *"
	r.srv.publish(r.agentID, []manifest.Pipe{p}, b)
	tm := units.TimerName("lease-frozen")
	testkit.WaitFor(t, 20*time.Second, "the timer", func() bool { return sdtest.Show(t, tm, "ActiveState") == "active" })
	r.srv.setIntercept(func(w http.ResponseWriter, req *http.Request, _ string) bool {
		writeErr(w, 503, "unavailable", "down for the test")
		return true
	})
	r.stop()
	time.Sleep(7 * time.Second) // the manifest expires
	r.start()
	testkit.WaitFor(t, 10*time.Second, "the stored manifest in force", func() bool { return r.ta.a.pipeVersion("lease-frozen") == 1 })
	if time.Now().Before(lease.End(&p)) && sdtest.Show(t, tm, "ActiveState") != "active" {
		t.Fatal("the timer stopped before the lease ended")
	}
	testkit.WaitFor(t, time.Until(until)+10*time.Second, "the fence", func() bool { return sdtest.Show(t, tm, "ActiveState") == "inactive" })
	if now := time.Now(); now.Before(lease.End(&p)) || now.After(until.Add(5*time.Second)) {
		t.Fatalf("stopped at %s, lease until %s", now.Format(time.StampMilli), until.Format(time.StampMilli))
	}
	st := r.ta.a.Status(t.Context())
	if len(st.Pipes) != 1 || !st.Pipes[0].LeaseEnded || !st.ManifestExpired {
		t.Fatalf("status %+v", st)
	}
}

// TestSystemdRunnerRefusesAfterLeaseWhileAgentIsDown: the agent is down
// when a held pipe's lease ends (a crash, or a SIGSTOP), so systemd still
// fires the timer: the real runner refuses the run and records it skipped
// with reason lease_ended and its fire time (every start accounted for,
// exit 0: no failure); once the agent is back it stops the timer.
func TestSystemdRunnerRefusesAfterLeaseWhileAgentIsDown(t *testing.T) {
	r := newAccountRig(t)
	r.useRunner()
	now := time.Now().UTC()
	F1 := now.Truncate(time.Minute).Add(time.Minute)
	if F1.Sub(now) < 16*time.Second {
		F1 = F1.Add(time.Minute)
	}
	until := F1.Add(-5 * time.Second)
	p, b := heldPipe(t, "lease-down", manifest.CatchupOnce, until, time.Time{})
	r.srv.publish(r.agentID, []manifest.Pipe{p}, b)
	tm := units.TimerName("lease-down")
	testkit.WaitFor(t, 20*time.Second, "the timer", func() bool { return sdtest.Show(t, tm, "ActiveState") == "active" })
	r.stop() // before the lease ends: nothing stops the timer
	time.Sleep(time.Until(F1.Add(3 * time.Second)))
	svc := units.ServiceName("lease-down")
	if res := sdtest.Show(t, svc, "Result"); res != "success" {
		t.Fatalf("the refused start left the service %q", res)
	}
	r.start()
	r.waitStream()
	f := r.finishedOnce("the refused run", func(f *agentpb.RunFinished) bool {
		return f.GetPipe() == "lease-down" && f.GetScheduledAt().AsTime().Equal(F1)
	})
	if f.GetStatus() != agentpb.RunStatus_RUN_STATUS_SKIPPED || f.GetReason() != "lease_ended" ||
		f.GetWrittenBy() != "runner" || f.GetTrigger() != agentpb.Trigger_TRIGGER_SCHEDULE {
		t.Fatalf("refused run: %v", f)
	}
	testkit.WaitFor(t, 10*time.Second, "the fence", func() bool { return sdtest.Show(t, tm, "ActiveState") == "inactive" })
	// Fire times inside the lease ran (F1 may not be the first one).
	for _, f := range r.srv.finishedWhere(func(f *agentpb.RunFinished) bool { return f.GetPipe() == "lease-down" }) {
		if at := f.GetScheduledAt().AsTime(); at.Before(until) != (f.GetStatus() == agentpb.RunStatus_RUN_STATUS_SUCCEEDED) {
			t.Fatalf("run %v (lease until %s)", f, until)
		}
	}
}
