package e2e

import (
	"bytes"
	"fmt"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/drover/drover/agent"
	"github.com/drover/drover/agent/lease"
	"github.com/drover/drover/api"
	"github.com/drover/drover/internal/testkit"
	"github.com/drover/drover/manifest"
	"github.com/drover/drover/server/compile"
)

// The leases of the placement proof: short, so that hand-overs happen
// within a minute or so, and the silent-holder detection quick
// (offline_after, and the server's keepalive that ends the stream of a
// process that no longer answers).
const (
	plLease    = 40 * time.Second
	plMargin   = 10 * time.Second
	plOffline  = 10 * time.Second
	plKATime   = 5 * time.Second
	plKAWait   = 5 * time.Second
	plLoopPass = plLease / 10 // the leases loop's period (server.leasesInterval)
	plInterval = time.Minute  // the pipe's schedule
	// plProof is how long the whole proof runs at least (the issue asks for
	// 10 minutes of real time); the phases take about that much anyway.
	plProof = 10 * time.Minute
)

// plHandover is docs/placement.md's bound on the hand-over from a holder
// that fell silent: it is unhealthy after grpc.offline_after without a
// message (and once the server's keepalive has ended its stream), then
// its lease plus the skew margin pass, plus one pass of the leases loop.
var plHandover = max(plOffline, plKATime+plKAWait) + plLease + plMargin + plLoopPass

// TestPlacementOneAcrossFaults is the end-to-end proof of placement: one
// with a real drover-server, three cron-backend agents and one agent on a
// systemd user manager, all targeted by one every-minute pipe:
//
//   - it runs on one agent; `droverctl pipes move --to` hands it to another
//     at once (the old holder confirms a manifest without it), and describe
//     pipe shows the new holder;
//   - the holder (a cron agent) is SIGSTOPped 20 s before a fire time (a
//     partition: the process lives but is silent): another agent gains
//     the pipe only after the stopped one's lease plus the skew margin,
//     within the documented bound, and its catch-up serves the fire time
//     nobody ran; SIGCONT: the old holder applies a manifest without the
//     pipe and never runs it again;
//   - the same with the systemd agent holding: its daemon is stopped but
//     systemd's timer goes on firing; after the lease the runner refuses
//     (skipped, lease_ended) while the next holder runs those fire times;
//   - the server is stopped for 85 s: the holder runs the fire time inside
//     its lease, stops at the lease's end, the run arrives after the
//     restart and the renewal's catch-up serves the fire time it skipped;
//   - across the whole test (about 10 minutes) no fire time has two runs
//     that ran, and consecutive served fire times are at most one interval
//     plus the hand-over bound apart.
//
// Clock skew is judged from the observed hand-overs: see skewTolerance.
func TestPlacementOneAcrossFaults(t *testing.T) {
	mgr, srv, tags := userScenario(t, "placement",
		"DROVER_PLACEMENT_LEASE="+plLease.String(), "DROVER_PLACEMENT_SKEW_MARGIN="+plMargin.String(),
		"DROVER_GRPC_OFFLINE_AFTER="+plOffline.String(),
		"DROVER_GRPC_KEEPALIVE_TIME="+plKATime.String(), "DROVER_GRPC_KEEPALIVE_TIMEOUT="+plKAWait.String())
	began := time.Now()

	sys := newAgent(t, srv, agentOpts{name: "agent-systemd", backend: "systemd", mgr: &mgr, tags: tags})
	agents := []*agentProc{sys}
	for i := range 3 {
		agents = append(agents, newAgent(t, srv, agentOpts{name: fmt.Sprintf("agent-cron-%d", i+1), backend: "cron", tags: tags}))
	}
	for _, a := range agents {
		a.start()
	}
	byID := map[string]*agentProc{}
	var ids []string
	for _, a := range agents {
		id := a.waitEnrolled()
		byID[id] = a
		ids = append(ids, id)
	}
	name := func(id string) string {
		if a := byID[id]; a != nil {
			return a.opts.name
		}
		return fmt.Sprintf("%q", id)
	}
	sysID := ids[0]

	const pipe = "pl-one"
	srv.putPipe(pipe, pipeSpec{Schedule: "* * * * *", Placement: "one", Script: "echo served\n", Targets: byTags(tags)})
	pl := &plWatch{t: t, srv: srv, pipe: pipe}
	t.Cleanup(func() {
		if t.Failed() {
			for _, r := range srv.runs(pipe, "") {
				t.Logf("run %s agent %s %s trigger %s scheduled %v started %v reason %q", r.ID, name(r.AgentID), r.Status, r.Trigger, r.ScheduledAt, r.StartedAt, r.Reason)
			}
		}
	})

	// ---- one holder, and a move with droverctl
	h0 := pl.waitHolder(60*time.Second, "a first holder", func(p api.Placement) bool { return p.Holder != "" })
	t.Logf("%s holds %s (lease until %s)", name(h0.Holder), pipe, h0.LeaseUntil.Format(time.RFC3339))
	waitServed(t, srv, pipe, h0.Holder, began, 2*plInterval+30*time.Second, "")

	var to string // a cron agent other than the holder
	for _, id := range ids[1:] {
		if id != h0.Holder {
			to = id
			break
		}
	}
	moved := time.Now()
	out := srv.droverctl("pipes", "move", pipe, "--to", to)
	t.Logf("droverctl pipes move: %s", strings.TrimSpace(out))
	h1 := pl.waitHolder(30*time.Second, "the move to "+name(to), func(p api.Placement) bool { return p.Holder == to })
	took := h1.Since.Sub(moved.Truncate(time.Second)) // the server's instants are whole seconds
	t.Logf("moved from %s to %s within %s (the old holder confirmed)", name(h0.Holder), name(to), took+time.Second)
	if took > 20*time.Second {
		t.Errorf("the move took %s: the confirmation should hand the pipe over at once, not after the lease", took)
	}
	desc := srv.droverctl("describe", "pipe", pipe)
	if !regexpLine(desc, "Holder", to) {
		t.Errorf("describe pipe after the move does not show holder %s:\n%s", to, desc)
	}
	waitReleased(t, byID[h0.Holder], pipe)
	waitServed(t, srv, pipe, to, moved, plInterval+30*time.Second, "")

	// ---- the cron holder silent (SIGSTOP) 20 s before a fire time
	c1 := byID[to]
	waitSecondOfMinute(40)
	stop1 := pause(t, c1)
	upper1 := pl.get().LeaseUntil // at least the lease c1 knows
	h2 := pl.waitHolder(plHandover+30*time.Second, "another agent to take over from the stopped "+name(to),
		func(p api.Placement) bool { return p.Holder != "" && p.Holder != to })
	checkHandover(t, name(to), name(h2.Holder), stop1, upper1, h2)
	checkCatchupFloor(t, srv, pipe, stop1, upper1, h2, name)
	resume(t, c1)
	waitReleased(t, c1, pipe)
	t.Logf("%s resumed and applied a manifest without %s", name(to), pipe)

	// ---- the systemd agent holding, its daemon silent, its timer not:
	// stopped 8 s before a fire time inside its lease, which systemd's
	// timer then fires (a run the server learns of only after SIGCONT)
	if prev := h2.Holder; prev != sysID {
		srv.droverctl("pipes", "move", pipe, "--to", sysID)
		h2 = pl.waitHolder(30*time.Second, "the move to the systemd agent", func(p api.Placement) bool { return p.Holder == sysID })
		waitReleased(t, byID[prev], pipe)
	}
	var inSilence time.Time
	testkit.WaitFor(t, 2*plInterval, "a fire time inside the systemd agent's lease, 8 s ahead", func() bool {
		pi := pipeInfo(sys.status(), pipe)
		if pi == nil || pi.LeaseEnded {
			return false
		}
		f := nextFire(t, "* * * * *", "", time.Now())
		if d := time.Until(f); d > 8*time.Second || d < 6*time.Second || !f.Before(pi.LeaseUntil.Add(-lease.Lead-2*time.Second)) {
			return false
		}
		inSilence = f
		return true
	})
	sysLease := pipeInfo(sys.status(), pipe).LeaseUntil // its lease is at least this
	stop2 := pause(t, sys)
	upper2 := pl.get().LeaseUntil
	h3 := pl.waitHolder(plHandover+30*time.Second, "another agent to take over from the stopped systemd agent",
		func(p api.Placement) bool { return p.Holder != "" && p.Holder != sysID })
	checkHandover(t, name(sysID), name(h3.Holder), stop2, upper2, h3)
	checkCatchupFloor(t, srv, pipe, stop2, upper2, h3, name)
	// A fire time after the hand-over: the new holder runs it, and the
	// stopped agent's timer fires it too; its runner refuses.
	after := nextFire(t, "* * * * *", "", h3.Since)
	waitServed(t, srv, pipe, h3.Holder, after.Add(-time.Second), plInterval+30*time.Second, "")
	sleepUntil(after.Add(5 * time.Second)) // systemd fires the timer within a second or so
	resume(t, sys)
	waitReleased(t, sys, pipe)
	silent := waitServed(t, srv, pipe, sysID, inSilence.Add(-time.Second), 60*time.Second, "")
	if !silent.ScheduledAt.Equal(inSilence) || !silent.StartedAt.Before(h3.Since) {
		t.Errorf("the stopped systemd agent's run inside its lease: %+v, want %s before the hand-over", silent, inSilence)
	}
	var refused []api.Run
	testkit.WaitFor(t, 60*time.Second, "the systemd agent's refused start of "+after.Format(time.RFC3339), func() bool {
		refused = refused[:0]
		for _, r := range srv.runs(pipe, sysID) {
			if r.Status == "skipped" && r.Reason == api.ReasonLeaseEnded {
				refused = append(refused, r)
			}
		}
		return slices.ContainsFunc(refused, func(r api.Run) bool { return r.ScheduledAt != nil && r.ScheduledAt.Equal(after) })
	})
	for _, r := range refused {
		if r.ScheduledAt.Before(sysLease.Add(-lease.Lead)) {
			t.Errorf("the systemd agent refused %s, inside its lease (until at least %s)", r.ScheduledAt, sysLease)
		}
	}
	t.Logf("the stopped systemd agent's timer fired %d times after its lease; each start refused (skipped, %s)", len(refused), api.ReasonLeaseEnded)

	// ---- the server down for longer than a fire interval and the lease
	holder := byID[h3.Holder]
	waitSecondOfMinute(44)
	inLease := time.Now().Truncate(time.Minute).Add(time.Minute) // ~16 s after the stop: inside the lease
	outLease := inLease.Add(plInterval)                          // after it
	testkit.WaitFor(t, 10*time.Second, "the holder to have the server's lease", func() bool {
		pi := pipeInfo(holder.status(), pipe)
		return pi != nil && pi.LeaseUntil.Equal(pl.get().LeaseUntil)
	})
	srvLease := pl.get().LeaseUntil
	down := time.Now()
	srv.stop()
	t.Logf("server stopped at %s; %s holds until at most %s", down.Format(time.RFC3339), holder.opts.name, srvLease.Format(time.RFC3339))
	var endedAt time.Time
	testkit.WaitFor(t, plLease+10*time.Second, "the holder to end its lease with the server down", func() bool {
		st := holder.status()
		if pi := pipeInfo(st, pipe); pi != nil && pi.LeaseEnded {
			endedAt = time.Now()
			if endedAt.Before(pi.LeaseUntil.Add(-lease.Lead)) {
				t.Errorf("lease ended at %s, before %s", endedAt, pi.LeaseUntil.Add(-lease.Lead))
			}
			return true
		}
		return false
	})
	t.Logf("with the server down the holder ended its lease at %s", endedAt.Format(time.RFC3339))
	sleepUntil(outLease.Add(10 * time.Second))
	srv.start(srv.https, srv.grpc)
	up := time.Now()
	t.Logf("server restarted at %s (down %s)", up.Format(time.RFC3339), up.Sub(down).Round(time.Second))
	var r api.Run
	testkit.WaitFor(t, 60*time.Second, "the run of "+inLease.Format(time.RFC3339)+", inside the lease with the server down", func() bool {
		for _, x := range srv.runs(pipe, h3.Holder) {
			if ranStatus(x.Status) && x.ScheduledAt != nil && x.ScheduledAt.Equal(inLease) {
				r = x
				return true
			}
		}
		return false
	})
	if r.Trigger != "schedule" || !r.StartedAt.Before(up) {
		t.Errorf("the run of the fire time inside the lease: %+v (server back at %s)", r, up)
	}
	var late api.Run
	testkit.WaitFor(t, 90*time.Second, "a run for "+outLease.Format(time.RFC3339)+", the fire time after the lease", func() bool {
		for _, r := range srv.runs(pipe, "") {
			if ranStatus(r.Status) && r.ScheduledAt != nil && r.ScheduledAt.Equal(outLease) {
				late = r
				return true
			}
		}
		return false
	})
	if late.StartedAt.Before(up) {
		t.Errorf("%s ran %s at %s, with the server down and its lease ended", name(late.AgentID), outLease, late.StartedAt)
	}
	t.Logf("after the restart %s served %s (%s)", name(late.AgentID), outLease.Format(time.RFC3339), late.Trigger)

	// ---- until the proof has run its time, then the whole record
	waitServed(t, srv, pipe, "", up, plInterval+45*time.Second, "")
	sleepUntil(began.Add(plProof))
	time.Sleep(3 * time.Second) // the last run's record
	silences := [][2]time.Time{{stop1, stop1.Add(plHandover)}, {stop2, stop2.Add(plHandover)}, {down, up.Add(plOffline + plLoopPass)}}
	checkOnePerFire(t, srv.runs(pipe, ""), silences, name)
	t.Logf("the proof ran %s", time.Since(began).Round(time.Second))
}

// checkHandover checks one hand-over from a silent holder that stopped at
// stop, whose lease the server had at most until upper: the next holder
// gained the pipe no sooner than upper plus the skew margin and within
// the documented bound.
func checkHandover(t *testing.T, from, to string, stop, upper time.Time, next api.Placement) {
	t.Helper()
	took := next.Since.Sub(stop)
	t.Logf("%s silent at %s (lease until at most %s); %s gained the pipe at %s: %s later (bound %s); %s between the old holder's stop and the gain (%s)",
		from, stop.Format(time.RFC3339), upper.Format(time.RFC3339), to, next.Since.Format(time.RFC3339), took.Round(time.Second), plHandover,
		next.Since.Sub(upper.Add(-lease.Lead)), skewTolerance(upper, next.Since))
	if next.Since.Before(upper.Add(plMargin)) {
		t.Errorf("%s gained the pipe at %s, before %s's lease (%s) plus the skew margin", to, next.Since, from, upper)
	}
	if took > plHandover {
		t.Errorf("the hand-over took %s, more than the documented %s", took, plHandover)
	}
}

// checkCatchupFloor checks the catch-up of the agent that gained the pipe
// (next) from a holder silent since stop, whose lease the server had until
// at least upper: the holder before may have run every fire time of its
// lease without being heard, so the new holder's catch-up starts after
// the last of them (last_fire_served is at least the lease's stop), and
// it serves the latest fire time between that and its gain, if any.
func checkCatchupFloor(t *testing.T, srv *serverProc, pipe string, stop, upper time.Time, next api.Placement, name func(string) string) {
	t.Helper()
	floor := upper.Add(-lease.Lead - time.Nanosecond).Truncate(time.Second)
	if next.LastFireServed.Before(floor) {
		t.Errorf("%s gained the pipe with last_fire_served %s: its catch-up would cover fire times of the silent holder's lease (until at least %s)",
			name(next.Holder), next.LastFireServed, upper)
	}
	var due time.Time // the latest fire time after the floor, up to the gain
	for f := nextFire(t, "* * * * *", "", next.LastFireServed); !f.After(next.Since); f = nextFire(t, "* * * * *", "", f) {
		due = f
	}
	if due.IsZero() {
		t.Logf("no fire time between the catch-up floor %s and the gain: nothing to catch up", next.LastFireServed.Format(time.RFC3339))
		return
	}
	r := waitServed(t, srv, pipe, next.Holder, due.Add(-time.Second), 60*time.Second, "")
	if !r.ScheduledAt.Equal(due) || r.Trigger != "catchup" {
		t.Errorf("%s's first run after the gain: %s %s, want the catch-up of %s", name(next.Holder), r.Trigger, r.ScheduledAt, due)
	}
	t.Logf("%s caught up %s, the fire time after the silent holder's lease", name(next.Holder), due.Format(time.RFC3339))
}

// skewTolerance says how far the holders' clocks may be off without the
// two running at once, from a hand-over the test saw. The clocks of these
// processes cannot be moved one by one (they share the host's), so the
// skew is reasoned from the rule every part of the agent follows
// (agent/lease): an old holder whose clock is d ahead stops at its
// lease_until - Lead by its clock, d earlier in real time; the new holder
// gains the pipe at a real instant (the server's), and a clock d ahead
// only makes it run its fire times d earlier, after that instant. So
// overlap needs an old holder behind by more than the gap between its stop
// and the gain; a clock 30 s ahead can never overlap.
func skewTolerance(oldLease, gained time.Time) string {
	gap := gained.Sub(oldLease.Add(-lease.Lead))
	return fmt.Sprintf("an old holder's clock could be at least %s behind, or any amount ahead (30 s ahead: it stops 30 s sooner)", gap)
}

// checkOnePerFire checks the whole run record of the pipe: no fire time
// has two runs that ran (skipped and missed records are not runs), and
// every fire time nobody ran fell in one of the silences: from an
// instant a holder fell silent (or the server stopped) to the documented
// bound after it.
func checkOnePerFire(t *testing.T, runs []api.Run, silences [][2]time.Time, name func(string) string) {
	t.Helper()
	served := map[time.Time]api.Run{}
	counts := map[string]int{}
	for _, r := range runs {
		counts[r.Status+"/"+r.Trigger]++
		if !ranStatus(r.Status) {
			continue
		}
		if r.ScheduledAt == nil {
			t.Errorf("run %s (%s) has no fire time", r.ID, r.Trigger)
			continue
		}
		at := r.ScheduledAt.UTC()
		if o, dup := served[at]; dup {
			t.Errorf("fire time %s ran twice: on %s (run %s) and on %s (run %s)", at, name(o.AgentID), o.ID, name(r.AgentID), r.ID)
			continue
		}
		served[at] = r
	}
	fires := make([]time.Time, 0, len(served))
	for at := range served {
		fires = append(fires, at)
	}
	sort.Slice(fires, func(i, j int) bool { return fires[i].Before(fires[j]) })
	var line, unserved []string
	for i, at := range fires {
		r := served[at]
		line = append(line, at.Format("15:04")+" "+name(r.AgentID)+" "+r.Trigger)
		if i == 0 {
			continue
		}
		// The fire times between two served ones were missed: each must
		// fall while no holder was live, within the documented bound after
		// a holder fell silent (or the server was down).
		for f := fires[i-1].Add(plInterval); f.Before(at); f = f.Add(plInterval) {
			unserved = append(unserved, f.Format("15:04"))
			if !slices.ContainsFunc(silences, func(w [2]time.Time) bool { return !f.Before(w[0]) && !f.After(w[1]) }) {
				t.Errorf("fire time %s was not run, and it fell while a holder was live (silences %v)", f, silences)
			}
		}
	}
	t.Logf("%d fire times served, each once: %s; not run (no live holder): %v", len(fires), strings.Join(line, ", "), unserved)
	t.Logf("records by status/trigger: %v", counts)
	if len(fires) < 8 {
		t.Errorf("only %d fire times served in the proof", len(fires))
	}
}

func ranStatus(s string) bool {
	switch s {
	case "succeeded", "failed", "timed_out", "running":
		return true
	}
	return false
}

// waitServed waits for a run of pipe that ran, by agent id ("" any), for
// a fire time after after, with trigger ("" any), and returns it.
func waitServed(t *testing.T, srv *serverProc, pipe, id string, after time.Time, timeout time.Duration, trigger string) api.Run {
	t.Helper()
	var got api.Run
	what := fmt.Sprintf("a run of %s after %s", pipe, after.Format(time.RFC3339))
	if id != "" {
		what += " on " + id
	}
	testkit.WaitFor(t, timeout, what, func() bool {
		for _, r := range srv.runs(pipe, id) {
			if (r.Status == "succeeded" || r.Status == "failed" || r.Status == "timed_out") && r.ScheduledAt != nil && r.ScheduledAt.After(after) && (trigger == "" || r.Trigger == trigger) {
				got = r
				return true
			}
		}
		return false
	})
	return got
}

// waitReleased waits until the agent applied a manifest without pipe (it no
// longer holds it).
func waitReleased(t *testing.T, a *agentProc, pipe string) {
	t.Helper()
	testkit.WaitFor(t, 60*time.Second, a.opts.name+" to apply a manifest without "+pipe, func() bool {
		st := a.status()
		return st != nil && st.Serial != 0 && st.AppliedSerial == st.Serial && pipeInfo(st, pipe) == nil
	})
}

// pipeInfo is the agent's status of pipe while its manifest has it.
func pipeInfo(st *agent.Status, pipe string) *agent.PipeInfo {
	if st == nil {
		return nil
	}
	for i := range st.Pipes {
		if p := &st.Pipes[i]; p.Name == pipe && p.Version != 0 {
			return p
		}
	}
	return nil
}

// pause SIGSTOPs the agent (it lives but says nothing) and returns when.
func pause(t *testing.T, a *agentProc) time.Time {
	t.Helper()
	pid := a.pid()
	at := time.Now()
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	// A stopped process would sit on its SIGTERM at cleanup.
	t.Cleanup(func() { syscall.Kill(pid, syscall.SIGCONT) })
	t.Logf("%s (pid %d) stopped", a.opts.name, pid)
	return at
}

func resume(t *testing.T, a *agentProc) {
	t.Helper()
	if err := syscall.Kill(a.pid(), syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	t.Logf("%s continued", a.opts.name)
}

// waitSecondOfMinute sleeps until the wall clock's second sec of a minute.
func waitSecondOfMinute(sec int) {
	now := time.Now()
	at := now.Truncate(time.Minute).Add(time.Duration(sec) * time.Second)
	if !at.After(now) {
		at = at.Add(time.Minute)
	}
	sleepUntil(at)
}

// regexpLine reports whether a "KEY: ... value ..." line of describe's
// output holds value.
func regexpLine(out, key, value string) bool {
	for _, l := range strings.Split(out, "\n") {
		k, v, ok := strings.Cut(l, ":")
		if ok && strings.TrimSpace(k) == key && strings.Contains(v, value) {
			return true
		}
	}
	return false
}

// plWatch reads the placement of one pipe from the server.
type plWatch struct {
	t    *testing.T
	srv  *serverProc
	pipe string
}

func (w *plWatch) get() api.Placement {
	w.t.Helper()
	var out struct {
		Placement *api.Placement `json:"placement"`
	}
	w.srv.api("GET", "/api/v1/pipes/"+w.pipe, nil, &out)
	if out.Placement == nil {
		w.t.Fatalf("GET pipe %s has no placement", w.pipe)
	}
	return *out.Placement
}

func (w *plWatch) waitHolder(timeout time.Duration, what string, ok func(api.Placement) bool) api.Placement {
	w.t.Helper()
	var p api.Placement
	testkit.WaitFor(w.t, timeout, what, func() bool { p = w.get(); return ok(p) })
	return p
}

// droverctl runs droverctl against the server as admin and returns its
// stdout; it fails the test on a non-zero exit.
func (s *serverProc) droverctl(args ...string) string {
	s.t.Helper()
	home := s.t.TempDir()
	cmd := exec.Command(ctlBin(), args...)
	cmd.Env = childEnv("HOME="+home, "XDG_CONFIG_HOME="+home, "DROVER_SERVER="+s.base,
		"DROVER_TOKEN="+s.admin, "DROVER_CA="+filepath.Join(s.dataDir, "ca.crt"))
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		s.t.Fatalf("droverctl %s: %v\n%s%s", strings.Join(args, " "), err, stdout.String(), stderr.String())
	}
	return stdout.String()
}

// TestPlacementClockSkewRule: an old holder whose clock is off, and a new
// holder whose clock is 30 s ahead, never run the same fire time nor at
// the same real instant. The clocks are fake here, because the test's
// processes share the host's clock and a real one cannot be moved per
// process: the hand-over is planned by the server's own rule
// (compile.Place, a pass every 4 s) and each holder's runs are decided by
// the agent's (agent/lease), each on its own clock. The old holder is
// partitioned 5 s in (it keeps the last lease it got and runs on); a fire
// time T of a holder's clock runs at the real instant T - skew. Every
// second of a minute is tried as the start, so that lease ends fall on
// every phase of the schedule.
func TestPlacementClockSkewRule(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		old, next time.Duration // clock skews (clock - real)
		outside   bool          // beyond the guarantee: overlaps must occur
	}{
		{30 * time.Second, 30 * time.Second, false},
		{30 * time.Second, 0, false},
		{0, 30 * time.Second, false},
		{0, -plMargin, false},
		{-plMargin, 30 * time.Second, false}, // behind by the margin: still inside the guarantee
		{-plMargin - lease.Lead - 20*time.Second, 0, true},
	} {
		name := fmt.Sprintf("old %+v next %+v", c.old, c.next)
		overlaps, ran := 0, 0
		minGap := time.Duration(1 << 62)
		base := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
		for off := range 60 {
			overlap, gap, oldRan := skewHandover(t, base.Add(time.Duration(off)*time.Second), c.old, c.next)
			if overlap {
				overlaps++
				if !c.outside {
					t.Errorf("%s, start +%ds: the two holders overlap", name, off)
				}
			}
			if oldRan {
				ran++
			}
			minGap = min(minGap, gap)
		}
		t.Logf("%s: %d of 60 starts overlap; the old holder ran a fire time of its last lease in %d; the new holder gained at least %s after the old one stopped", name, overlaps, ran, minGap)
		if ran == 0 {
			t.Errorf("%s: the old holder never ran near its lease's end: the case proves nothing", name)
		}
		if c.outside && overlaps == 0 {
			t.Errorf("%s: no overlap beyond the margin: the case does not show what the margin is for", name)
		}
	}
}

// skewHandover plays one hand-over from t0 (see TestPlacementClockSkewRule)
// and reports whether the holders overlap (a fire time run by both, or
// the new one gaining the pipe before the old one stopped, in real time),
// the real time from the old one's stop to the gain, and whether the old
// holder ran a fire time of the lease it kept.
func skewHandover(t *testing.T, t0 time.Time, oldSkew, nextSkew time.Duration) (overlap bool, gap time.Duration, oldRan bool) {
	t.Helper()
	sched, err := manifest.ParseSchedule("* * * * *")
	if err != nil {
		t.Fatal(err)
	}
	spec := manifest.Spec{Name: "p", Schedule: "* * * * *", Placement: manifest.PlacementOne, Catchup: manifest.CatchupAll,
		Targets: &manifest.Targets{Tags: map[string]string{"role": "db"}}}
	l := compile.Leases{Lease: plLease, SkewMargin: plMargin}
	agents := []compile.Agent{{ID: "agt-a", Tags: spec.Targets.Tags, Healthy: true}, {ID: "agt-b", Tags: spec.Targets.Tags, Healthy: true}}
	var holders []compile.Holder
	var oldID string
	var oldLease time.Time // the last lease the old holder received
	var gain compile.Placement
	var gainAt time.Time
	for now := t0; now.Before(t0.Add(3 * time.Minute)); now = now.Add(plLoopPass) {
		for i := range agents { // partitioned at t0+5 s, unhealthy offline_after later
			agents[i].Healthy = agents[i].ID != oldID || now.Before(t0.Add(5*time.Second+plOffline))
		}
		// The server knows of the fire times up to t0 as served; what the
		// old holder runs after that it cannot report.
		served := map[string]time.Time{"p": t0.Truncate(time.Minute)}
		plans, _ := compile.Place([]compile.Pipe{{Name: "p", Version: 1, Spec: spec}}, agents, holders, served, now, l)
		pl := plans[0]
		holders = []compile.Holder{pl.State}
		if oldID == "" {
			oldID = pl.Holder
		}
		if pl.Holder == oldID && now.Before(t0.Add(5*time.Second)) {
			oldLease = pl.LeaseUntil
		}
		if pl.Gain != "" && pl.Gain != oldID {
			gain, gainAt = pl, now
			break
		}
	}
	if gainAt.IsZero() {
		t.Fatalf("start %s: no hand-over", t0)
	}
	// The old holder: every fire time of its clock inside its lease.
	oldPipe := &manifest.Pipe{Name: "p", Spec: spec, LeaseUntil: oldLease}
	oldRuns := map[time.Time]bool{}
	for f := sched.Next(t0.Add(oldSkew), time.UTC); lease.Active(oldPipe, f); f = sched.Next(f, time.UTC) {
		oldRuns[f], oldRan = true, true
	}
	// The new holder: its catch-up when it gets the manifest (at gainAt,
	// its clock reading gainAt + skew), then every fire time of its clock
	// (its lease renewed while it is healthy).
	newPipe := &manifest.Pipe{Name: "p", Spec: spec, LeaseUntil: gainAt.Add(3 * time.Minute), LastFireServed: gain.LastFireServed}
	clock := gainAt.Add(nextSkew)
	if from := lease.CatchupFrom(newPipe, clock); !from.IsZero() {
		for f := sched.Next(from, time.UTC); !f.After(clock); f = sched.Next(f, time.UTC) {
			overlap = overlap || oldRuns[f]
		}
	}
	for f := sched.Next(clock, time.UTC); lease.Active(newPipe, f); f = sched.Next(f, time.UTC) {
		overlap = overlap || oldRuns[f]
	}
	// Holding in real time: the old holder until its lease's stop by its
	// clock, the new one from the gain.
	gap = gainAt.Sub(lease.End(oldPipe).Add(-oldSkew))
	overlap = overlap || gap <= 0
	return overlap, gap, oldRan
}
