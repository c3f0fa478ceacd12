package e2e

import (
	"fmt"
	"github.com/drover/drover/api"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/drover/drover/agent"
	"github.com/drover/drover/internal/testkit"
)

// TestCronBackendSameFireTimes runs the same pipes on two agents of one
// server, one on the cron backend and one on systemd timers: every pipe's
// next fire time is the same on both (and the evaluator's), a minute's
// scheduled fire happens on both at the same instant, and the cron
// backend's runs (scheduled and RunNow) reach the server with their logs.
func TestCronBackendSameFireTimes(t *testing.T) {
	mgr, srv, tags := userScenario(t, "fire")
	sys, crn, sysID, cronID := systemdAndCronAgents(t, srv, &mgr, tags)

	specs := map[string]pipeSpec{
		"c-tick":    {Schedule: "* * * * *", Script: "echo cron-tick\n"},
		"c-berlin":  {Schedule: "30 2 * * *", Timezone: "Europe/Berlin", Script: "true\n"},
		"c-or":      {Schedule: "0 12 13 * 5", Script: "true\n"},
		"c-ny":      {Schedule: "15 10 * * 0", Timezone: "America/New_York", Script: "true\n"},
		"c-monthly": {Schedule: "@monthly", Timezone: "Asia/Tokyo", Script: "true\n"},
		"c-steps":   {Schedule: "5-55/10 */3 * * 1-5", Timezone: "Australia/Sydney", Script: "true\n"},
		// 02:30 does not exist on 2027-03-14 in New York: until then the next
		// fire time is 03:00 EDT, a correction instant of the timer.
		"c-gap": {Schedule: "30 2 14 3 *", Timezone: "America/New_York", Script: "true\n"},
		"c-api": {Schedule: far, Script: "echo \"cron-api $E2E_WORD\"\n", Env: map[string]string{"E2E_WORD": "hello-cron"}},
	}
	var names []string
	for name, sp := range specs {
		sp.Targets = byTags(tags)
		srv.putPipe(name, sp)
		names = append(names, name)
	}
	sort.Strings(names)
	sys.waitPipes(60*time.Second, names...)
	crn.waitPipes(60*time.Second, names...)

	// The next fire times, live: both agents' status (the cron agent's
	// through `drover-agent status --json`) read back to back, again if a
	// fire time passed in between; they must equal each other and the
	// evaluator's. Then as reported to the server after the apply
	// (ManifestStatus): the evaluator's at the time of the report.
	live := func(st agent.Status) map[string]time.Time {
		out := map[string]time.Time{}
		for _, p := range st.Pipes {
			out[p.Name] = p.NextRun
		}
		return out
	}
	for try := 0; ; try++ {
		t0 := time.Now()
		sysLive, cronLive := live(*sys.status()), live(crn.statusCLI())
		t1 := time.Now()
		var bad []string
		for _, name := range names {
			sp := specs[name]
			w0, w1 := nextFire(t, sp.Schedule, sp.Timezone, t0), nextFire(t, sp.Schedule, sp.Timezone, t1)
			s, c := sysLive[name], cronLive[name]
			if !s.Equal(c) || (!c.Equal(w0) && !c.Equal(w1)) {
				bad = append(bad, fmt.Sprintf("%s %q (%s): systemd next %s, cron next %s, evaluator %s",
					name, sp.Schedule, sp.Timezone, s.UTC(), c.UTC(), w0.UTC()))
			}
		}
		if len(bad) == 0 {
			for _, name := range names {
				sp := specs[name]
				t.Logf("%-9s %-22q %-17s next %s on both backends", name, sp.Schedule, sp.Timezone, cronLive[name].UTC().Format(time.RFC3339))
			}
			break
		}
		if try == 2 {
			t.Fatalf("the backends disagree:\n%s", strings.Join(bad, "\n"))
		}
	}
	// After the apply, each agent checked its scheduler against the
	// evaluator: no pipe has an elapse mismatch.
	for who, st := range map[string]agent.Status{"systemd": *sys.status(), "cron": crn.statusCLI()} {
		for _, p := range st.Pipes {
			if p.ElapseMismatch != "" {
				t.Errorf("%s agent: %s: %s", who, p.Name, p.ElapseMismatch)
			}
		}
	}
	for _, ag := range []struct{ who, id string }{{"systemd", sysID}, {"cron", cronID}} {
		// The agent's report reaches the server's view when the ingester
		// commits it, a moment after the agent's own status shows it.
		applied := sys.status().AppliedSerial
		if ag.who == "cron" {
			applied = crn.statusCLI().AppliedSerial
		}
		var v api.Agent
		testkit.WaitFor(t, 30*time.Second, "the server's view of the "+ag.who+" agent at its applied serial", func() bool {
			v = srv.agentView(ag.id)
			return v.AppliedSerial == applied
		})
		if v.StatusAt == nil || v.ManifestState != "applied" {
			t.Fatalf("the server's view of the %s agent: %+v", ag.who, v)
		}
		seen := 0
		for _, p := range v.Pipes {
			sp, ok := specs[p.Name]
			if !ok || len(p.NextFireTimes) == 0 {
				continue
			}
			seen++
			w0, w1 := nextFire(t, sp.Schedule, sp.Timezone, v.StatusAt.Add(-10*time.Second)), nextFire(t, sp.Schedule, sp.Timezone, *v.StatusAt)
			if got := p.NextFireTimes[0]; !got.Equal(w0) && !got.Equal(w1) {
				t.Errorf("%s agent reported %s's next fire %s, the evaluator says %s", ag.who, p.Name, got.UTC(), w1.UTC())
			}
		}
		if seen != len(specs) {
			t.Errorf("the %s agent reported next fire times of %d pipes, want %d", ag.who, seen, len(specs))
		}
	}
	if st := crn.statusCLI(); st.Backend != "cron" || st.AppliedSerial == 0 {
		t.Fatalf("cron agent status: backend %q, applied serial %d", st.Backend, st.AppliedSerial)
	}

	// RunNow on the cron backend.
	req := srv.runNow("c-api", cronID)
	r := srv.runOfRequest(req.RequestID, 60*time.Second, "succeeded", "failed")
	if r.Status != "succeeded" || r.Trigger != "api" || r.AgentID != cronID {
		t.Fatalf("cron backend RunNow: %+v", r)
	}
	if got := srv.logText(r.ID); !strings.Contains(got, "cron-api hello-cron") {
		t.Fatalf("cron backend RunNow log: %q", got)
	}

	// A scheduled fire at the same instant on both backends.
	var common time.Time
	var cronRun api.Run
	testkit.WaitFor(t, 150*time.Second, "a scheduled c-tick run at the same instant on both backends", func() bool {
		fired := map[time.Time]bool{}
		for _, r := range srv.runs("c-tick", sysID) {
			if r.Trigger == "schedule" && r.Status == "succeeded" && r.ScheduledAt != nil {
				fired[r.ScheduledAt.UTC()] = true
			}
		}
		for _, r := range srv.runs("c-tick", cronID) {
			if r.Trigger == "schedule" && r.Status == "succeeded" && r.ScheduledAt != nil && fired[r.ScheduledAt.UTC()] {
				common, cronRun = r.ScheduledAt.UTC(), r
				return true
			}
		}
		return false
	})
	if common.Second() != 0 || common.Nanosecond() != 0 {
		t.Fatalf("scheduled_at %s is not a whole minute", common)
	}
	if got := srv.logText(cronRun.ID); !strings.Contains(got, "cron-tick") {
		t.Fatalf("cron backend scheduled run's log: %q", got)
	}
	for _, id := range []string{sysID, cronID} {
		for _, r := range srv.runs("c-tick", id) {
			if r.Trigger != "schedule" {
				t.Fatalf("unplanned run of c-tick on %s: %+v", id, r)
			}
		}
	}
	t.Logf("c-tick fired at %s on both backends; cron run %s started %s after it", common.Format(time.RFC3339),
		cronRun.ID, cronRun.StartedAt.Sub(common).Round(time.Millisecond))
}
