package server

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/drover/drover/api"
	"github.com/drover/drover/internal/testkit"
	"github.com/drover/drover/manifest"
	agentpb "github.com/drover/drover/proto"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// placementServer is a real server with short leases (20 s, margin 5 s)
// and protocol-level agents on live streams; the server's clock is moved
// by hand and the leases loop is run by the test (Place) where the order
// matters.
type placementFleet struct {
	ts      *testServer
	agents  map[string]*testAgent
	streams map[string]*testStream
}

func startPlacement(t *testing.T, n int) *placementFleet {
	t.Helper()
	ts := startServer(t, func(c *Config) {
		c.Placement.Lease = 20 * time.Second
		c.Placement.SkewMargin = 5 * time.Second
		c.GRPC.OfflineAfter = 3 * time.Second // silence counts after 3 s of the test clock
	})
	f := &placementFleet{ts: ts, agents: map[string]*testAgent{}, streams: map[string]*testStream{}}
	for range n {
		a := ts.enrollAgent(map[string]string{"role": "db"})
		f.agents[a.id] = a
		f.streams[a.id] = a.mustStream(t)
	}
	f.waitOnline()
	return f
}

// waitOnline waits until every agent's stream is live on the server: only
// healthy agents are chosen as holders.
func (f *placementFleet) waitOnline() {
	f.ts.t.Helper()
	testkit.WaitFor(f.ts.t, 10*time.Second, "the agents' streams", func() bool {
		for id := range f.agents {
			if !f.ts.s.hub.Online(id) {
				return false
			}
		}
		return true
	})
}

// putOne creates a placement: one pipe targeting role=db.
func (f *placementFleet) putOne(name string) {
	f.ts.t.Helper()
	spec := map[string]any{"schedule": "*/5 * * * *", "script": "true\n", "placement": "one", "targets": map[string]any{"tags": map[string]string{"role": "db"}}}
	f.ts.adminOK("PUT", "/api/v1/pipes/"+name, map[string]any{"spec": spec}, nil)
}

// manifestOf decodes the manifest stored for an agent (nil for none).
func (f *placementFleet) manifestOf(id string) *manifest.Manifest {
	f.ts.t.Helper()
	m, err := f.ts.s.store.GetManifest(f.ts.t.Context(), id)
	if err != nil {
		return nil
	}
	var env struct {
		Payload []byte `json:"payload"`
	}
	if err := json.Unmarshal(m.Envelope, &env); err != nil {
		f.ts.t.Fatal(err)
	}
	dec, err := manifest.DecodeManifest(env.Payload)
	if err != nil {
		f.ts.t.Fatal(err)
	}
	return dec
}

// holders lists the agents whose stored manifests carry pipe, with the
// entry of the last one.
func (f *placementFleet) holders(pipe string) ([]string, *manifest.Pipe) {
	var ids []string
	var entry *manifest.Pipe
	for id := range f.agents {
		if m := f.manifestOf(id); m != nil {
			for i := range m.Pipes {
				if m.Pipes[i].Name == pipe {
					ids = append(ids, id)
					entry = &m.Pipes[i]
				}
			}
		}
	}
	slices.Sort(ids)
	return ids, entry
}

func (f *placementFleet) placement(pipe string) *api.Placement {
	var p api.Pipe
	f.ts.adminOK("GET", "/api/v1/pipes/"+pipe, nil, &p)
	if p.Placement == nil {
		f.ts.t.Fatalf("GET pipe %s shows no placement", pipe)
	}
	return p.Placement
}

func (f *placementFleet) place() {
	f.ts.t.Helper()
	if _, err := f.ts.s.compiler.Place(f.ts.t.Context()); err != nil {
		f.ts.t.Fatal(err)
	}
}

// mustHolder wants exactly one agent's manifest to carry pipe, the one GET
// pipe names, with a lease in the future.
func (f *placementFleet) mustHolder(pipe string) (string, *manifest.Pipe) {
	t := f.ts.t
	t.Helper()
	ids, e := f.holders(pipe)
	if len(ids) != 1 {
		t.Fatalf("pipe %s is in the manifests of %v, want exactly one", pipe, ids)
	}
	pl := f.placement(pipe)
	if pl.Holder != ids[0] || !pl.LeaseUntil.Equal(e.LeaseUntil) || !e.LeaseUntil.After(f.ts.clock.Now()) {
		t.Fatalf("holder %s lease %s, GET pipe says %+v (now %s)", ids[0], e.LeaseUntil, pl, f.ts.clock.Now())
	}
	return ids[0], e
}

func (f *placementFleet) mustNobody(pipe string) {
	f.ts.t.Helper()
	if ids, _ := f.holders(pipe); len(ids) != 0 {
		f.ts.t.Fatalf("pipe %s is in the manifests of %v, want nobody's yet", pipe, ids)
	}
}

// other returns an agent id other than those given.
func (f *placementFleet) other(not ...string) string {
	var ids []string
	for id := range f.agents {
		if !slices.Contains(not, id) {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	return ids[0]
}

func TestPlacementOneLeases(t *testing.T) {
	f := startPlacement(t, 3)
	ts := f.ts
	f.putOne("backup")
	holder, e := f.mustHolder("backup")
	if e.Spec.Placement != "" || e.LeaseUntil.Sub(ts.clock.Now()) > 21*time.Second {
		t.Fatalf("entry %+v", e)
	}
	first := e.LeaseUntil

	// Recompiles and a new agent do not move it; a pass with more than two
	// thirds of the lease left renews nothing.
	late := ts.enrollAgent(map[string]string{"role": "db"})
	f.agents[late.id], f.streams[late.id] = late, late.mustStream(t)
	if _, err := ts.s.compiler.Compile(t.Context(), nil); err != nil {
		t.Fatal(err)
	}
	f.place()
	if h, e := f.mustHolder("backup"); h != holder || !e.LeaseUntil.Equal(first) {
		t.Fatalf("after a recompile: holder %s lease %s, want %s %s", h, e.LeaseUntil, holder, first)
	}

	// Renewal: with less than two thirds left the holder gets a fresh
	// manifest (and SyncNow) with a later lease.
	syncs := len(f.streams[holder].syncsSeen())
	ts.clock.Advance(8 * time.Second)
	f.place()
	h, e := f.mustHolder("backup")
	if h != holder || !e.LeaseUntil.After(first) {
		t.Fatalf("renewal: holder %s lease %s (was %s)", h, e.LeaseUntil, first)
	}
	testkit.WaitFor(t, 5*time.Second, "SyncNow for the renewal", func() bool { return len(f.streams[holder].syncsSeen()) > syncs })

	// The dry-run of a targets change shows who loses it and who gains it
	// after the lease plus the margin.
	f.ts.adminOK("PUT", "/api/v1/agents/"+late.id+"/tags", api.TagsRequest{Tags: map[string]string{"role": "web"}}, nil)
	var dr api.DryRunResponse
	spec := map[string]any{"schedule": "*/5 * * * *", "script": "true\n", "placement": "one", "targets": map[string]any{"tags": map[string]string{"role": "web"}}}
	ts.adminOK("POST", "/api/v1/pipes/backup/dry-run", map[string]any{"spec": spec}, &dr)
	var got []string
	for _, c := range dr.Agents {
		got = append(got, fmt.Sprintf("%s %s after=%v", c.ID, c.Action, !c.After.IsZero()))
		if c.Reason == "" {
			t.Errorf("dry-run change %+v without a reason", c)
		}
	}
	slices.Sort(got)
	want := []string{holder + " remove after=false", late.id + " add after=true"}
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Fatalf("dry-run: %v, want %v", got, want)
	}
}

func (s *testStream) syncsSeen() []uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.syncs)
}

// A silent holder keeps the pipe while its lease (plus the margin) lasts;
// then a healthy agent gains it, its catch-up starting after the silent
// holder's lease (the catch-up floor).
func TestPlacementOneSilentHolder(t *testing.T) {
	f := startPlacement(t, 3)
	ts := f.ts
	f.putOne("backup")
	holder, _ := f.mustHolder("backup")

	// The holder served a fire time, then goes silent (a partition: its
	// stream ends, nothing more is heard of it).
	fire := ts.clock.Now().Truncate(time.Minute).UTC()
	sendAll(t, f.streams[holder], 1, &agentpb.AgentMessage{Body: &agentpb.AgentMessage_RunFinished{RunFinished: &agentpb.RunFinished{
		RunId: "run-1", Pipe: "backup", PipeVersion: 1, Trigger: agentpb.Trigger_TRIGGER_SCHEDULE, Status: agentpb.RunStatus_RUN_STATUS_SUCCEEDED,
		ScheduledAt: timestamppb.New(fire), StartedAt: timestamppb.New(fire), FinishedAt: timestamppb.New(fire)}}})
	f.streams[holder].close()
	testkit.WaitFor(t, 5*time.Second, "the stream to close", func() bool { return !ts.s.hub.Online(holder) })

	// Past the offline grace it is not renewed, but within its lease plus
	// the margin it stays the holder.
	ts.clock.Advance(ts.cfg.GRPC.OfflineAfter + time.Second)
	f.place()
	if pl := f.placement("backup"); pl.Holder != holder {
		t.Fatalf("moved before its lease ended: %+v", pl)
	}
	ts.clock.Advance(10 * time.Second)
	f.place()
	if pl := f.placement("backup"); pl.Holder != holder {
		t.Fatalf("moved before its lease plus the margin: %+v", pl)
	}
	prevLease := f.placement("backup").LeaseUntil
	ts.clock.Advance(12 * time.Second)
	f.place()
	next, e := f.mustHolder("backup")
	// The catch-up starts after the last second of the silent holder's
	// lease, later than the fire time it reported: it may have run more,
	// unreported.
	floor := prevLease.Add(-manifest.LeaseLead - time.Nanosecond).Truncate(time.Second)
	if next == holder || !floor.After(fire) || !e.LastFireServed.Equal(floor) {
		t.Fatalf("after lease + margin: holder %s (was %s), last_fire_served %s, want %s (the floor, after the fire time served %s)", next, holder, e.LastFireServed, floor, fire)
	}
	if m := f.manifestOf(holder); m == nil || slices.ContainsFunc(m.Pipes, func(p manifest.Pipe) bool { return p.Name == "backup" }) {
		t.Fatalf("the silent holder's manifest still carries the pipe")
	}
	// The hand-over is in the event log: the first holder gained, lost, the
	// next one gained.
	var got []string
	for _, e := range ts.events("kind=pipe.moved&pipe=backup") {
		got = append(got, e.Agent+" "+strings.SplitN(e.Message, " ", 2)[0])
	}
	if want := []string{next + " holds", holder + " lost", holder + " holds"}; !slices.Equal(got, want) {
		t.Fatalf("pipe.moved events (newest first) %v, want %v", got, want)
	}
}

// Revoked, deleted or untagged: the holder loses the pipe at once, nobody
// gains it before the lease plus the margin.
func TestPlacementOneHolderGone(t *testing.T) {
	for _, how := range []string{"revoke", "delete", "untag"} {
		t.Run(how, func(t *testing.T) {
			f := startPlacement(t, 3)
			ts := f.ts
			f.putOne("backup")
			holder, _ := f.mustHolder("backup")
			switch how {
			case "revoke":
				ts.adminOK("POST", "/api/v1/agents/"+holder+"/revoke", nil, nil)
			case "delete":
				ts.adminOK("DELETE", "/api/v1/agents/"+holder, nil, nil)
			case "untag":
				ts.adminOK("PUT", "/api/v1/agents/"+holder+"/tags", api.TagsRequest{Tags: map[string]string{"role": "web"}}, nil)
			}
			delete(f.agents, holder) // its manifest is no longer the question
			f.place()
			f.mustNobody("backup")
			if pl := f.placement("backup"); pl.Previous != holder || pl.NextAfter.IsZero() {
				t.Fatalf("placement while handing over: %+v", pl)
			}
			ts.clock.Advance(26 * time.Second)
			f.place()
			if next, _ := f.mustHolder("backup"); next == holder {
				t.Fatalf("the %sd holder got it back", how)
			}
		})
	}
}

// A move request: the holder loses the pipe now; the target gains it at
// once when the holder confirms the manifest without it, else after the
// lease plus the margin.
func TestPlacementOneMove(t *testing.T) {
	f := startPlacement(t, 3)
	ts := f.ts
	f.putOne("backup")
	holder, _ := f.mustHolder("backup")
	to := f.other(holder)

	// Bad requests change nothing.
	if r := ts.do("POST", "/api/v1/pipes/backup/move", ts.admin, map[string]string{}); r.code != 422 {
		t.Fatalf("move without to: %d %s", r.code, r.body)
	}
	if r := ts.do("POST", "/api/v1/pipes/backup/move", ts.admin, map[string]string{"to": "agt-nope"}); r.code != 404 {
		t.Fatalf("move to an unknown agent: %d %s", r.code, r.body)
	}
	web := ts.enrollAgent(map[string]string{"role": "web"})
	if r := ts.do("POST", "/api/v1/pipes/backup/move", ts.admin, map[string]string{"to": web.id}); r.code != 409 || !strings.Contains(string(r.body), "does not target") {
		t.Fatalf("move to an untargeted agent: %d %s", r.code, r.body)
	}
	ts.putScriptPipe("all", "true\n", map[string]string{"role": "db"})
	if r := ts.do("POST", "/api/v1/pipes/all/move", ts.admin, map[string]string{"to": to}); r.code != 409 {
		t.Fatalf("move of a placement: all pipe: %d %s", r.code, r.body)
	}
	if h, _ := f.mustHolder("backup"); h != holder {
		t.Fatalf("a refused move moved the pipe to %s", h)
	}

	var pl api.Placement
	ts.adminOK("POST", "/api/v1/pipes/backup/move", map[string]string{"to": to}, &pl)
	if pl.Holder != "" || pl.Previous != holder || pl.MoveTo != to {
		t.Fatalf("after the move request: %+v", pl)
	}
	f.mustNobody("backup")

	// The old holder applies its new manifest and says so: the hand-over
	// happens at once, long before the lease ends.
	m := f.manifestOf(holder)
	sendAll(t, f.streams[holder], 1, &agentpb.AgentMessage{Body: &agentpb.AgentMessage_ManifestStatus{ManifestStatus: &agentpb.ManifestStatus{
		Serial: m.Serial, State: agentpb.ManifestStatus_STATE_APPLIED, AppliedSerial: m.Serial}}})
	testkit.WaitFor(t, 10*time.Second, "the target to gain the pipe", func() bool { ids, _ := f.holders("backup"); return slices.Equal(ids, []string{to}) })
	if h, _ := f.mustHolder("backup"); h != to {
		t.Fatalf("holder %s, want %s", h, to)
	}

	// Without a confirmation the move waits for the lease plus the margin.
	back := holder
	ts.adminOK("POST", "/api/v1/pipes/backup/move", map[string]string{"to": back}, nil)
	f.mustNobody("backup")
	ts.clock.Advance(10 * time.Second)
	f.place()
	f.mustNobody("backup")
	ts.clock.Advance(16 * time.Second)
	f.place()
	if h, _ := f.mustHolder("backup"); h != back {
		t.Fatalf("holder %s, want %s", h, back)
	}
}

// Missed-run detection of a placement: one pipe: a fire time is expected
// of its holder at that instant alone (the other targeted agents are never
// reported missing); one that fell while nobody held the pipe is missed
// with reason "no holder", and the next holder's catch-up run replaces it.
func TestPlacementOneMissedRuns(t *testing.T) {
	f := startPlacement(t, 3)
	ts := f.ts
	ctx := t.Context()
	ts.putMonPipe("backup", map[string]string{"role": "db"}, map[string]any{"schedule": "* * * * *", "grace": "1m", "placement": "one"})
	if _, err := ts.s.monitor.pass(ctx); err != nil {
		t.Fatal(err)
	}
	old, _ := f.mustHolder("backup")
	start := ts.clock.Now()
	// step moves the clock to at in steps of 5 s, the leases loop running
	// at each (as it would every 2 s).
	step := func(at time.Time) {
		for ts.clock.Now().Before(at) {
			ts.clock.Advance(min(5*time.Second, at.Sub(ts.clock.Now())+time.Millisecond))
			f.place()
		}
	}
	// serve sends a holder's runs of the fire times in (from, to].
	seq := map[string]uint64{}
	serve := func(id string, from, to time.Time) {
		var msgs []*agentpb.AgentMessage
		for x := from.Truncate(time.Minute); !x.After(to); x = x.Add(time.Minute) {
			if x.After(from) {
				msgs = append(msgs, scheduledRun(fmt.Sprintf("r-%s-%d", id, x.Unix()), "backup", x, agentpb.RunStatus_RUN_STATUS_SUCCEEDED)...)
			}
		}
		if len(msgs) > 0 {
			seq[id] = sendAll(t, f.streams[id], seq[id]+1, msgs...) - 1
		}
	}

	// Two minutes served by the holder, up to 2 s before a fire time b.
	b := start.Add(2 * time.Minute).Truncate(time.Minute)
	step(b.Add(-2 * time.Second))
	serve(old, start, ts.clock.Now())
	// A move at b-2s: the holder's lease (renewed within the last 7 s, so
	// past b) fences the hand-over, and b falls while nobody holds it.
	to := f.other(old)
	ts.adminOK("POST", "/api/v1/pipes/backup/move", map[string]string{"to": to}, nil)
	pl := f.placement("backup")
	if !pl.NextAfter.After(b) {
		t.Fatalf("the fence ends at %s, before the fire time %s", pl.NextAfter, b)
	}
	step(pl.NextAfter.Add(time.Second))
	if h, _ := f.mustHolder("backup"); h != to {
		t.Fatalf("holder %s, want %s", h, to)
	}
	since := f.placement("backup").Since
	// The new holder serves from its start; the grace of b+1m passes.
	step(b.Add(2*time.Minute + 5*time.Second))
	serve(to, since, ts.clock.Now())
	stats, err := ts.s.monitor.pass(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var missed []api.Run
	var list api.RunList
	ts.adminOK("GET", "/api/v1/runs?limit=1000&pipe=backup&status=missed", nil, &list)
	missed = list.Runs
	if len(missed) != 1 || missed[0].AgentID != "" || missed[0].Reason != reasonNoHolder || missed[0].ScheduledAt == nil || !missed[0].ScheduledAt.Equal(b) {
		t.Fatalf("missed runs %+v (stats %+v), want one at %s with no holder", missed, stats, b)
	}
	for id := range f.agents {
		for _, r := range ts.runsOf(id, "backup") {
			if r.Status == api.StatusMissed {
				t.Errorf("agent %s reported missing at %v", id, r.ScheduledAt)
			}
		}
	}
	// The new holder's catch-up run of b replaces the no-holder record.
	s := started("catchup-b", "backup", since)
	s.GetRunStarted().ScheduledAt, s.GetRunStarted().Trigger = timestamppb.New(b), agentpb.Trigger_TRIGGER_CATCHUP
	seq[to] = sendAll(t, f.streams[to], seq[to]+1, s) - 1
	ts.adminOK("GET", "/api/v1/runs?limit=1000&pipe=backup&status=missed", nil, &list)
	if len(list.Runs) != 0 {
		t.Fatalf("missed runs after the catch-up: %+v", list.Runs)
	}
}

// The leases loop itself (on the leader, every lease/10) renews a healthy
// holder's lease before it ends, with no pass run by the test.
func TestPlacementLeasesLoopRenews(t *testing.T) {
	ts := startServer(t, func(c *Config) {
		c.Placement.Lease = 10 * time.Second // the loop runs every second
		c.Placement.SkewMargin = time.Second
	})
	f := &placementFleet{ts: ts, agents: map[string]*testAgent{}, streams: map[string]*testStream{}}
	a := ts.enrollAgent(map[string]string{"role": "db"})
	f.agents[a.id], f.streams[a.id] = a, a.mustStream(t)
	f.waitOnline()
	f.putOne("backup")
	_, e := f.mustHolder("backup")
	first := e.LeaseUntil
	testkit.WaitFor(t, 15*time.Second, "the loop to renew the lease", func() bool {
		_, e := f.holders("backup")
		return e != nil && e.LeaseUntil.After(first)
	})
	if h, e := f.mustHolder("backup"); h != a.id || e.LeaseUntil.Sub(ts.clock.Now()) < 5*time.Second {
		t.Fatalf("after the renewal: holder %s lease %s", h, e.LeaseUntil)
	}
}

// The run records of a former holder count even when they arrive long
// after the pipe left its manifest (a partitioned or stopped holder
// reports the runs of its lease only when it is heard again): here after
// two hand-overs and another change of its manifest, so that neither of
// its last two manifests names the pipe. A pipe that is not placement:
// one, or does not target it, stays refused.
func TestPlacementOneLateRecordsOfFormerHolder(t *testing.T) {
	f := startPlacement(t, 3)
	ts := f.ts
	f.putOne("backup")
	first, _ := f.mustHolder("backup")
	st := f.streams[first]
	seq := uint64(1)
	applied := func() { // it applies its manifest; the server looks at its manifests again
		m := f.manifestOf(first)
		seq = sendAll(t, st, seq, &agentpb.AgentMessage{Body: &agentpb.AgentMessage_ManifestStatus{ManifestStatus: &agentpb.ManifestStatus{
			Serial: m.Serial, State: agentpb.ManifestStatus_STATE_APPLIED, AppliedSerial: m.Serial}}})
	}
	second := f.other(first)
	for _, to := range []string{second, f.other(first, second)} {
		ts.adminOK("POST", "/api/v1/pipes/backup/move", map[string]string{"to": to}, nil)
		ts.clock.Advance(26 * time.Second)
		f.place()
		if h, _ := f.mustHolder("backup"); h != to {
			t.Fatalf("holder %s, want %s", h, to)
		}
		applied()
	}
	ts.putScriptPipe("other", "true\n", map[string]string{"role": "db"})
	ts.putScriptPipe("web-only", "true\n", map[string]string{"role": "web"})
	testkit.WaitFor(t, 5*time.Second, "the first holder's manifest with the new pipe", func() bool {
		m := f.manifestOf(first)
		return m != nil && slices.ContainsFunc(m.Pipes, func(p manifest.Pipe) bool { return p.Name == "other" })
	})
	applied()

	fire := ts.clock.Now().Add(-2 * time.Minute).Truncate(time.Minute).UTC()
	late := func(id, pipe string) *agentpb.AgentMessage {
		return &agentpb.AgentMessage{Body: &agentpb.AgentMessage_RunFinished{RunFinished: &agentpb.RunFinished{
			RunId: id, Pipe: pipe, PipeVersion: 1, Trigger: agentpb.Trigger_TRIGGER_SCHEDULE, Status: agentpb.RunStatus_RUN_STATUS_SUCCEEDED,
			ScheduledAt: timestamppb.New(fire), StartedAt: timestamppb.New(fire), FinishedAt: timestamppb.New(fire)}}}
	}
	sendAll(t, st, seq, late("late-1", "backup"), late("late-2", "web-only"))
	var runs api.RunList
	ts.adminOK("GET", "/api/v1/runs?agent="+first, nil, &runs)
	var got []string
	for _, r := range runs.Runs {
		got = append(got, r.ID+" "+r.Pipe)
	}
	if !slices.Equal(got, []string{"late-1 backup"}) {
		t.Fatalf("runs of the former holder: %v, want the late run of backup alone", got)
	}
}
