package server

import (
	"context"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/drover/drover/api"
	"github.com/drover/drover/internal/testkit"
	"google.golang.org/protobuf/types/known/timestamppb"

	agentpb "github.com/drover/drover/proto"
)

// putMonPipe creates a pipe with a spec made of the given fields plus a
// script and the tag target.
func (ts *testServer) putMonPipe(name string, tags map[string]string, fields map[string]any) {
	ts.t.Helper()
	spec := map[string]any{"script": "true", "targets": map[string]any{"tags": tags}}
	for k, v := range fields {
		spec[k] = v
	}
	ts.adminOK("PUT", "/api/v1/pipes/"+name, map[string]any{"spec": spec}, nil)
}

// scheduledRun is a run of a scheduled fire time, started and finished.
func scheduledRun(id, pipe string, fire time.Time, st agentpb.RunStatus) []*agentpb.AgentMessage {
	s := started(id, pipe, fire.Add(time.Second))
	s.GetRunStarted().ScheduledAt = timestamppb.New(fire)
	f := finished(id, pipe, st, "")
	f.GetRunFinished().ScheduledAt = timestamppb.New(fire)
	return []*agentpb.AgentMessage{s, f}
}

// runsOf lists an agent's runs of a pipe.
func (ts *testServer) runsOf(agent, pipe string) []api.Run {
	ts.t.Helper()
	var list api.RunList
	ts.adminOK("GET", "/api/v1/runs?limit=1000&agent="+agent+"&pipe="+pipe, nil, &list)
	return list.Runs
}

func (ts *testServer) events(q string) []api.Event {
	ts.t.Helper()
	var list api.EventList
	ts.adminOK("GET", "/api/v1/events?limit=1000&"+q, nil, &list)
	return list.Events
}

// fireAt returns the fire-time view's entry for f.
func (ts *testServer) fireAt(pipe string, f time.Time) api.Fire {
	ts.t.Helper()
	var fl api.FireList
	q := "since=" + url.QueryEscape(f.Add(-time.Second).Format(time.RFC3339)) + "&until=" + url.QueryEscape(f.Add(time.Second).Format(time.RFC3339))
	ts.adminOK("GET", "/api/v1/pipes/"+pipe+"/fires?"+q, nil, &fl)
	for _, x := range fl.Fires {
		if x.At.Equal(f) {
			return x
		}
	}
	ts.t.Fatalf("fire time %s not in the view: %+v", f, fl)
	return api.Fire{}
}

// An every-minute pipe on three agents, one of which goes silent: the
// silent agent's fire times become missed runs (agent offline) once their
// grace has passed, the others' runs stand, the fire-time view counts
// 3 expected 2 succeeded 1 missed; when the agent comes back and replays
// the runs it made meanwhile, they replace the missed ones (no duplicate).
// A disabled pipe, a pipe created after the fire times and an agent
// enrolled after them expect nothing. Events record it all once.
func TestMissedRunsFireViewAndEvents(t *testing.T) {
	ts := startServer(t)
	ctx := context.Background()
	tags := map[string]string{"mon": "yes"}
	agents := []*testAgent{ts.enrollAgent(tags), ts.enrollAgent(tags), ts.enrollAgent(tags)}
	ts.putMonPipe("every-minute", tags, map[string]any{"schedule": "* * * * *", "grace": "1m"})
	ts.putMonPipe("disabled", tags, map[string]any{"schedule": "* * * * *", "grace": "1m", "enabled": false})
	streams := make([]*testStream, 3)
	for i, a := range agents {
		st, err := a.openStream("")
		if err != nil {
			t.Fatal(err)
		}
		defer st.close()
		streams[i] = st
		testkit.WaitFor(t, 10*time.Second, "the agent's hello", func() bool {
			ag, err := ts.s.store.GetAgent(ctx, a.id)
			return err == nil && !ag.LastSeenAt.IsZero()
		})
	}
	// The first pass sets the watermark and sees the three agents online.
	if _, err := ts.s.monitor.pass(ctx); err != nil {
		t.Fatal(err)
	}
	start := ts.clock.Now()

	silent := agents[2]
	streams[2].close()
	testkit.WaitFor(t, 10*time.Second, "the silent agent's stream to end", func() bool { return !ts.s.hub.Online(silent.id) })

	ts.clock.Advance(6 * time.Minute)
	ts.putMonPipe("late", tags, map[string]any{"schedule": "* * * * *", "grace": "1m"})
	late := ts.enrollAgent(tags)
	now := ts.clock.Now()
	// The fire times whose grace ended since the first pass.
	var fires []time.Time
	for f := start.Truncate(time.Minute).Add(-time.Minute); !f.After(now); f = f.Add(time.Minute) {
		if f.Add(time.Minute).After(start) && !f.Add(time.Minute).After(now) {
			fires = append(fires, f)
		}
	}
	// The two live agents ran them all (and the minutes around them).
	for i := range 2 {
		var msgs []*agentpb.AgentMessage
		for f := start.Truncate(time.Minute).Add(-2 * time.Minute); !f.After(now); f = f.Add(time.Minute) {
			msgs = append(msgs, scheduledRun(fmt.Sprintf("r%d-%d", i, f.Unix()), "every-minute", f, agentpb.RunStatus_RUN_STATUS_SUCCEEDED)...)
		}
		sendAll(t, streams[i], 1, msgs...)
	}
	stats, err := ts.s.monitor.pass(ctx)
	if err != nil {
		t.Fatal(err)
	}
	missed := ts.runsOf(silent.id, "every-minute")
	var missedAt []time.Time
	for _, r := range missed {
		if r.Status != api.StatusMissed || r.Reason != reasonOffline || r.Trigger != "schedule" || r.ScheduledAt == nil {
			t.Errorf("silent agent's run: %+v", r)
			continue
		}
		missedAt = append(missedAt, r.ScheduledAt.UTC())
	}
	slices.SortFunc(missedAt, func(a, b time.Time) int { return a.Compare(b) })
	// A fire time at the edge of the first pass may belong to either pass;
	// every fire time well inside the window must be missed.
	if len(missedAt) < 4 {
		t.Fatalf("missed runs of the silent agent: %v (pass %+v, fires %v)", missedAt, stats, fires)
	}
	for _, f := range fires[1:] {
		if !slices.ContainsFunc(missedAt, f.Equal) {
			t.Errorf("fire time %s not missed; missed %v", f, missedAt)
		}
	}
	if want := fmt.Sprintf(`drover_pipe_runs_missed_total{pipe="every-minute"} %d`+"\n", len(missedAt)); !strings.Contains(ts.scrape(ts.admin), want) {
		t.Errorf("metrics lack %q", want)
	}
	for i := range 2 {
		for _, r := range ts.runsOf(agents[i].id, "every-minute") {
			if r.Status != api.StatusSucceeded {
				t.Errorf("live agent %d run %s: %s", i, r.ID, r.Status)
			}
		}
	}
	for _, p := range []string{"disabled", "late"} {
		var list api.RunList
		ts.adminOK("GET", "/api/v1/runs?pipe="+p, nil, &list)
		if len(list.Runs) != 0 {
			t.Errorf("pipe %s expects nothing, got %+v", p, list.Runs)
		}
	}
	if got := ts.runsOf(late.id, "every-minute"); len(got) != 0 {
		t.Errorf("an agent enrolled after the fire times expects nothing: %+v", got)
	}
	// A second pass finds nothing new.
	if st, err := ts.s.monitor.pass(ctx); err != nil || st.Missed != 0 {
		t.Errorf("second pass: %+v %v", st, err)
	}
	f0 := missedAt[len(missedAt)-1]
	if fj := ts.fireAt("every-minute", f0); fj.Expected != 3 || fj.Counts[api.StatusSucceeded] != 2 || fj.Counts[api.StatusMissed] != 1 || fj.Unreported != 0 {
		t.Errorf("fire view at %s: %+v", f0, fj)
	}
	// Drill down: the runs of that fire time.
	var drill api.RunList
	ts.adminOK("GET", "/api/v1/runs?pipe=every-minute&scheduled_since="+url.QueryEscape(f0.Format(time.RFC3339))+
		"&scheduled_until="+url.QueryEscape(f0.Add(time.Second).Format(time.RFC3339)), nil, &drill)
	if len(drill.Runs) != 3 {
		t.Errorf("runs of fire time %s: %+v", f0, drill.Runs)
	}

	// Events: one run.missed per missed fire time, one agent.offline.
	if ev := ts.events("kind=run.missed&agent=" + silent.id); len(ev) != len(missedAt) {
		t.Errorf("run.missed events: %d, want %d", len(ev), len(missedAt))
	}
	if ev := ts.events("kind=agent.offline"); len(ev) != 1 || ev[0].Agent != silent.id {
		t.Errorf("agent.offline events: %+v", ev)
	}

	// The silent agent comes back and replays the runs it made offline.
	st := silent.mustStream(t)
	var msgs []*agentpb.AgentMessage
	for _, f := range missedAt {
		msgs = append(msgs, scheduledRun(fmt.Sprintf("r2-%d", f.Unix()), "every-minute", f, agentpb.RunStatus_RUN_STATUS_SUCCEEDED)...)
	}
	sendAll(t, st, 1, msgs...)
	got := ts.runsOf(silent.id, "every-minute")
	if len(got) != len(missedAt) {
		t.Errorf("after the replay %d runs, want %d: %+v", len(got), len(missedAt), got)
	}
	for _, r := range got {
		if r.Status != api.StatusSucceeded || r.WrittenBy != "runner" {
			t.Errorf("replayed run: %+v", r)
		}
	}
	if fj := ts.fireAt("every-minute", f0); fj.Expected != 3 || fj.Counts[api.StatusSucceeded] != 3 || fj.Counts[api.StatusMissed] != 0 {
		t.Errorf("fire view after the replay: %+v", fj)
	}
	if _, err := ts.s.monitor.pass(ctx); err != nil {
		t.Fatal(err)
	}
	if ev := ts.events("kind=agent.online"); len(ev) != 1 || ev[0].Agent != silent.id {
		t.Errorf("agent.online events: %+v", ev)
	}
	if ev := ts.events("kind=run.recovered&agent=" + silent.id); len(ev) != 1 {
		t.Errorf("run.recovered events: %+v", ev)
	}

	// A failed run is one run.failed; the next success one run.recovered;
	// the success after that none; a replayed failure no second event.
	next := now.Truncate(time.Minute).Add(time.Minute)
	fail := scheduledRun("fail-1", "every-minute", next, agentpb.RunStatus_RUN_STATUS_FAILED)
	seq := sendAll(t, streams[0], 100, fail...)
	seq = sendAll(t, streams[0], seq, scheduledRun("fail-1", "every-minute", next, agentpb.RunStatus_RUN_STATUS_FAILED)[1])
	seq = sendAll(t, streams[0], seq, scheduledRun("ok-1", "every-minute", next.Add(time.Minute), agentpb.RunStatus_RUN_STATUS_SUCCEEDED)...)
	sendAll(t, streams[0], seq, scheduledRun("ok-2", "every-minute", next.Add(2*time.Minute), agentpb.RunStatus_RUN_STATUS_SUCCEEDED)...)
	if ev := ts.events("kind=run.failed"); len(ev) != 1 || ev[0].RunID != "fail-1" || ev[0].Pipe != "every-minute" {
		t.Errorf("run.failed events: %+v", ev)
	}
	if ev := ts.events("kind=run.recovered&agent=" + agents[0].id); len(ev) != 1 || ev[0].RunID != "ok-1" {
		t.Errorf("run.recovered events: %+v", ev)
	}
	var page api.EventList
	ts.adminOK("GET", "/api/v1/events?pipe=every-minute&limit=2", nil, &page)
	if len(page.Events) != 2 || page.Events[0].ID < page.Events[1].ID || page.NextCursor == "" {
		t.Errorf("events newest first, paged: %+v", page)
	} else {
		var rest api.EventList
		ts.adminOK("GET", "/api/v1/events?pipe=every-minute&limit=1000&cursor="+page.NextCursor, nil, &rest)
		if len(rest.Events) == 0 || rest.Events[0].ID >= page.Events[1].ID {
			t.Errorf("next page: %+v", rest)
		}
	}
	for q, field := range map[string]string{"kind=weird": "kind", "since=yesterday": "since", "pipe=Bad_Name": "pipe", "limit=0": "limit"} {
		r := ts.do("GET", "/api/v1/events?"+q, ts.admin, nil)
		var eb api.ErrorBody
		r.decode(t, &eb)
		if r.code != 400 || len(eb.Error.Details) == 0 || eb.Error.Details[0].Field != field {
			t.Errorf("events?%s: %d %s", q, r.code, r.body)
		}
	}
	for q, field := range map[string]string{"since=2026-01-02T00:00:00Z&until=2026-01-01T00:00:00Z": "until",
		"since=2026-01-01T00:00:00Z&until=2026-03-01T00:00:00Z": "since", "until=soon": "until", "limit=5000": "limit"} {
		r := ts.do("GET", "/api/v1/pipes/every-minute/fires?"+q, ts.admin, nil)
		var eb api.ErrorBody
		r.decode(t, &eb)
		if r.code != 400 || len(eb.Error.Details) == 0 || eb.Error.Details[0].Field != field {
			t.Errorf("fires?%s: %d %s", q, r.code, r.body)
		}
	}
	if r := ts.do("GET", "/api/v1/pipes/nope/fires", ts.admin, nil); r.code != 404 {
		t.Errorf("fires of an unknown pipe: %d", r.code)
	}
}
