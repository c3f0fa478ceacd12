package e2e

import (
	"github.com/drover/drover/api"
	"net/url"
	"testing"
	"time"

	"github.com/drover/drover/internal/testkit"
)

// Missed-run detection against real agents: scheduled runs of an
// every-minute pipe on a systemd agent and a cron agent carry the fire time
// they serve, so the server expects nothing more of them (no false missed
// run); the cron agent's host then goes silent (its daemon, which is also
// its scheduler, stopped, as a powered-off host) and the server writes a
// missed run for that agent; when the host comes back, its catch-up run for
// that fire time replaces the missed one, never sits beside it.
func TestMissedRunsWithRealAgents(t *testing.T) {
	mgr, srv, tags := userScenario(t, "missed")
	sys, crn, sysID, cronID := systemdAndCronAgents(t, srv, &mgr, tags)
	srv.putPipe("m-tick", pipeSpec{Schedule: "* * * * *", Script: "echo tick\n", Grace: "1m", Targets: byTags(tags)})
	sys.waitPipes(60*time.Second, "m-tick")
	crn.waitPipes(60*time.Second, "m-tick")

	scheduled := func(id string) map[time.Time]api.Run {
		out := map[time.Time]api.Run{}
		for _, r := range srv.runs("m-tick", id) {
			if r.ScheduledAt != nil {
				out[r.ScheduledAt.UTC()] = r
			}
		}
		return out
	}
	// A fire time both agents served whose deadline (fire + grace) passed
	// long enough ago for a detection pass (every 30 s) to have judged it.
	var judged time.Time
	t.Cleanup(func() {
		if t.Failed() {
			for _, id := range []string{sysID, cronID} {
				for _, r := range srv.runs("m-tick", id) {
					t.Logf("agent %s run %s %s trigger %s scheduled %v started %v reason %q", id, r.ID, r.Status, r.Trigger, r.ScheduledAt, r.StartedAt, r.Reason)
				}
			}
		}
	})
	testkit.WaitFor(t, 240*time.Second, "a fire time both agents ran, judged by the server", func() bool {
		s, c := scheduled(sysID), scheduled(cronID)
		for at, r := range c {
			if sr, ok := s[at]; ok && r.Status == "succeeded" && sr.Status == "succeeded" && time.Since(at) > time.Minute+45*time.Second {
				judged = at
				return true
			}
		}
		return false
	})
	for _, id := range []string{sysID, cronID} {
		for at, r := range scheduled(id) {
			if r.Status == "missed" {
				t.Fatalf("agent %s: a missed run for %s beside real runs: %+v", id, at, r)
			}
		}
	}
	t.Logf("fire time %s ran on both agents and nothing was counted missed", judged.Format(time.RFC3339))

	// The cron host goes silent just before a fire time.
	for time.Until(time.Now().Truncate(time.Minute).Add(time.Minute)) < 15*time.Second {
		time.Sleep(time.Second)
	}
	crn.stop()
	fire := time.Now().Truncate(time.Minute).Add(time.Minute).UTC()
	var missed api.Run
	testkit.WaitFor(t, 180*time.Second, "a missed run of the silent agent for "+fire.Format(time.RFC3339), func() bool {
		r, ok := scheduled(cronID)[fire]
		missed = r
		return ok && r.Status == "missed"
	})
	if missed.Trigger != "schedule" || missed.WrittenBy != "server" || (missed.Reason != "agent offline" && missed.Reason != "not reported") {
		t.Fatalf("missed run: %+v", missed)
	}
	var fl api.FireList
	q := url.Values{"since": {fire.Add(-time.Second).Format(time.RFC3339)}, "until": {fire.Add(time.Second).Format(time.RFC3339)}}
	srv.api("GET", "/api/v1/pipes/m-tick/fires?"+q.Encode(), nil, &fl)
	if len(fl.Fires) != 1 || fl.Fires[0].Expected != 2 || fl.Fires[0].Counts["succeeded"] != 1 || fl.Fires[0].Counts["missed"] != 1 {
		t.Fatalf("fire view of %s: %+v", fire, fl.Fires)
	}

	// The host comes back: catch-up (once) serves the latest missed fire
	// time; its record replaces the missed run of that fire time.
	crn.start()
	testkit.WaitFor(t, 120*time.Second, "the returning agent's run for the fire times it missed", func() bool {
		for at, r := range scheduled(cronID) {
			if r.Status == "succeeded" && r.Trigger == "catchup" && !at.Before(fire) {
				return true
			}
		}
		return false
	})
	byFire := map[time.Time]int{}
	for _, r := range srv.runs("m-tick", cronID) {
		if r.ScheduledAt != nil {
			byFire[r.ScheduledAt.UTC()]++
		}
	}
	for at, n := range byFire {
		if n != 1 {
			t.Fatalf("%d runs of the cron agent for fire time %s", n, at)
		}
	}
	var events api.EventList
	srv.api("GET", "/api/v1/events?kind=run.missed&pipe=m-tick", nil, &events)
	found := false
	for _, e := range events.Events {
		found = found || e.Agent == cronID
	}
	if !found {
		t.Fatalf("no run.missed event for the silent agent: %+v", events.Events)
	}
}
