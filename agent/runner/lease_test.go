package runner

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/drover/drover/agent/lease"
	"github.com/drover/drover/manifest"
	agentpb "github.com/drover/drover/proto"
)

// hold rewrites the fixture's pipe.json as a held pipe's.
func (f *fixture) hold(until, served time.Time) {
	f.t.Helper()
	path := filepath.Join(f.pipeDir, "pipe.json")
	b, err := os.ReadFile(path)
	if err != nil {
		f.t.Fatal(err)
	}
	var p manifest.Pipe
	if err := json.Unmarshal(b, &p); err != nil {
		f.t.Fatal(err)
	}
	p.LeaseUntil, p.LastFireServed = until, served
	b, _ = json.Marshal(p)
	if err := os.WriteFile(path, b, 0o644); err != nil {
		f.t.Fatal(err)
	}
}

// TestLeaseEndedRefusesScheduledRuns: a timer that fires for a held pipe
// after its lease ended (clock fixed through Options.Now: the runner's
// clock is the only thing that decides) gets a skipped record with reason
// lease_ended and the fire time it would have served, the payload does not
// run, and the runner's state does not count it as run; a run asked for by
// hand or the API still runs; within the lease the run is normal.
func TestLeaseEndedRefusesScheduledRuns(t *testing.T) {
	marker := filepath.Join(t.TempDir(), "ran")
	fire := time.Now().Truncate(time.Minute).Add(-time.Hour)
	f := newPipe(t, manifest.Spec{Script: "touch " + marker})
	f.hold(fire.Add(lease.Lead), time.Time{}) // ends exactly at the elapse
	opts := f.opts(timerEnv(fire)...)
	opts.Schedule = everyMinute
	res := f.run(opts)
	r := only(t, f)
	if res.ExitCode != 0 || r.finished.Status != agentpb.RunStatus_RUN_STATUS_SKIPPED || r.finished.Reason != ReasonLeaseEnded ||
		!r.finished.ScheduledAt.AsTime().Equal(fire) || !strings.Contains(r.finished.Error, "lease") {
		t.Fatalf("refused run: exit %d %v", res.ExitCode, r.finished)
	}
	if _, err := os.Stat(marker); err == nil {
		t.Fatal("the payload ran after the lease ended")
	}
	if st := readState(f.spoolDir); !st.LastFire.IsZero() {
		t.Fatalf("a refused fire time counts as run: %+v", st)
	}

	// The cron backend's forced trigger is fenced the same way.
	opts = f.opts()
	opts.Trigger, opts.ScheduledAt, opts.Now = "catchup", fire, func() time.Time { return fire.Add(time.Second) }
	if res := f.run(opts); len(res.Runs) != 1 || res.Runs[0].Reason != ReasonLeaseEnded {
		t.Fatalf("forced catch-up: %+v", res.Runs)
	}
	only(t, f)

	// By hand: the operator chose this host.
	opts = f.opts()
	opts.Trigger, opts.Now = "manual", func() time.Time { return fire.Add(time.Hour) }
	if res := f.run(opts); len(res.Runs) != 1 || res.Runs[0].Status != agentpb.RunStatus_RUN_STATUS_SUCCEEDED {
		t.Fatalf("manual run: %+v", res.Runs)
	}
	only(t, f)

	// Inside the lease.
	f = newPipe(t, manifest.Spec{Script: "true"})
	f.hold(fire.Add(time.Minute), time.Time{})
	opts = f.opts(timerEnv(fire)...)
	opts.Schedule = everyMinute
	if res := f.run(opts); len(res.Runs) != 1 || res.Runs[0].Status != agentpb.RunStatus_RUN_STATUS_SUCCEEDED {
		t.Fatalf("run inside the lease: %+v", res.Runs)
	}
}

// TestLeaseCatchupFromLastFireServed: a held pipe's catch-up starts after
// the later of its own last fire time and the manifest's last fire time
// served, so that fire times another holder ran are not run again.
func TestLeaseCatchupFromLastFireServed(t *testing.T) {
	now := time.Now().Truncate(time.Minute)
	until := now.Add(time.Hour)
	// Another holder served up to now-3m; this host last ran long ago.
	f := newPipe(t, manifest.Spec{Script: "true", Catchup: manifest.CatchupAll})
	f.hold(until, now.Add(-3*time.Minute))
	writeStateFile(t, f, state{Schedule: "* * * * *", Timezone: "UTC", LastFire: now.Add(-3 * time.Hour)})
	opts := f.opts(timerEnv(now.Add(3 * time.Second))...)
	opts.Schedule = everyMinute
	res := f.run(opts)
	var got []string
	for _, rr := range res.Runs {
		got = append(got, rr.ScheduledAt.Sub(now).String())
	}
	if strings.Join(got, " ") != "-2m0s -1m0s 0s" {
		t.Fatalf("catch-up runs at %v", got)
	}

	// This host ran later than the server knows (its records not in yet).
	f = newPipe(t, manifest.Spec{Script: "true", Catchup: manifest.CatchupAll})
	f.hold(until, now.Add(-10*time.Minute))
	writeStateFile(t, f, state{Schedule: "* * * * *", Timezone: "UTC", LastFire: now.Add(-time.Minute)})
	res = f.run(opts)
	if len(res.Runs) != 1 || !res.Runs[0].ScheduledAt.Equal(now) {
		t.Fatalf("runs %+v", res.Runs)
	}

	// The fire time was served elsewhere: already ran.
	f = newPipe(t, manifest.Spec{Script: "true"})
	f.hold(until, now)
	res = f.run(opts)
	if len(res.Runs) != 1 || res.Runs[0].Status != agentpb.RunStatus_RUN_STATUS_SKIPPED || res.Runs[0].Reason != "already ran" {
		t.Fatalf("served elsewhere: %+v", res.Runs)
	}
}
