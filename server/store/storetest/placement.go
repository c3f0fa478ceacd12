package storetest

import (
	"reflect"
	"testing"
	"time"

	"github.com/drover/drover/api"
	"github.com/drover/drover/server/store"
)

// testHolders: holder states round-trip with every field, are replaced
// per pipe and removed by name; CompileInputs carries last_seen_at.
func testHolders(t *testing.T, st store.Store) {
	ctx := t.Context()
	if hs, err := st.Holders(ctx); err != nil || len(hs) != 0 {
		t.Fatalf("Holders on an empty store: %v %v", hs, err)
	}
	must(t, st.SaveHolders(ctx, nil, nil))
	full := &store.Holder{Pipe: "backup", Agent: "agt-b", LeaseUntil: t0.Add(5 * time.Minute), Since: t0, LastFireServed: t0.Add(-time.Hour),
		Prev: "agt-a", PrevSince: t0.Add(-24 * time.Hour), PrevLeaseUntil: t0.Add(-time.Minute), ReleasedAt: t0.Add(-2 * time.Minute),
		MoveTo: "agt-c", MoveRequestedAt: t0.Add(time.Second), UpdatedAt: t0.Add(2 * time.Second)}
	bare := &store.Holder{Pipe: "report", UpdatedAt: t0}
	must(t, st.SaveHolders(ctx, []*store.Holder{full, bare}, nil))
	hs, err := st.Holders(ctx)
	if err != nil || len(hs) != 2 || !reflect.DeepEqual(hs[0], full) || !reflect.DeepEqual(hs[1], bare) {
		t.Fatalf("Holders (by pipe, every field): %+v %v", hs, err)
	}
	// Replaced per pipe, removed by name, in one call; removing an unknown
	// pipe is not an error.
	next := &store.Holder{Pipe: "report", Agent: "agt-a", LeaseUntil: t0.Add(time.Hour), Since: t0.Add(time.Minute), UpdatedAt: t0.Add(time.Minute)}
	must(t, st.SaveHolders(ctx, []*store.Holder{next}, []string{"backup", "gone"}))
	if hs, err := st.Holders(ctx); err != nil || len(hs) != 1 || !reflect.DeepEqual(hs[0], next) {
		t.Fatalf("Holders after replace and remove: %+v %v", hs, err)
	}

	// The latest fire time served, per pipe, by any agent; missed runs do
	// not serve, runs without a fire time neither, nor a start an agent
	// refused because its lease had ended (the next holder owes that one).
	enroll(t, st, "agt-a", map[string]string{"role": "db"})
	enroll(t, st, "agt-b", nil)
	recv := t0.Add(time.Hour)
	f1, f2, f3 := t0.Add(10*time.Minute), t0.Add(20*time.Minute), t0.Add(30*time.Minute)
	must(t, st.ApplyRecords(ctx, []*store.Record{
		{AgentID: "agt-a", Received: recv, Seq: 1, RunFinished: &store.Run{ID: "s1", Pipe: "backup", Status: api.StatusSucceeded, ScheduledAt: f1, StartedAt: f1, FinishedAt: f1}},
		{AgentID: "agt-b", Received: recv, Seq: 1, RunFinished: &store.Run{ID: "s2", Pipe: "backup", Status: api.StatusFailed, ScheduledAt: f2, StartedAt: f2, FinishedAt: f2}},
		{AgentID: "agt-b", Received: recv, Seq: 2, RunStarted: &store.Run{ID: "s3", Pipe: "report", StartedAt: f3}},
		{AgentID: "agt-a", Received: recv, Seq: 2, RunFinished: &store.Run{ID: "s-fenced", Pipe: "backup", Status: api.StatusSkipped, Reason: "lease_ended", ScheduledAt: f3, StartedAt: f3, FinishedAt: f3}},
	}, store.IngestLimits{}))
	_, err = st.InsertMissed(ctx, []*store.Run{{ID: store.MissedRunID("agt-a", "backup", f3), AgentID: "agt-a", Pipe: "backup", PipeVersion: 1,
		Trigger: api.TriggerSchedule, Status: api.StatusMissed, Reason: "agent offline", WrittenBy: "server", ScheduledAt: f3, CreatedAt: recv}})
	must(t, err)
	served, err := st.LastFiresServed(ctx, []string{"backup", "report", "none"})
	if err != nil || len(served) != 1 || !served["backup"].Equal(f2) {
		t.Fatalf("LastFiresServed: %v %v", served, err)
	}
	if served, err := st.LastFiresServed(ctx, nil); err != nil || len(served) != 0 {
		t.Fatalf("LastFiresServed(nil): %v %v", served, err)
	}

	// A missed run recorded with no holder (agent "") is replaced by a real
	// record for that fire time from any agent.
	f4 := t0.Add(40 * time.Minute)
	_, err = st.InsertMissed(ctx, []*store.Run{{ID: store.MissedRunID("", "backup", f4), AgentID: "", Pipe: "backup", PipeVersion: 1,
		Trigger: api.TriggerSchedule, Status: api.StatusMissed, Reason: "no holder", WrittenBy: "server", ScheduledAt: f4, CreatedAt: recv}})
	must(t, err)
	must(t, st.ApplyRecords(ctx, []*store.Record{
		{AgentID: "agt-b", Received: recv, Seq: 3, RunStarted: &store.Run{ID: "s4", Pipe: "backup", Trigger: api.TriggerCatchup, ScheduledAt: f4, StartedAt: f4.Add(time.Minute)}},
	}, store.IngestLimits{}))
	if _, err := st.GetRun(ctx, store.MissedRunID("", "backup", f4)); err == nil {
		t.Fatalf("the no-holder missed run survived a real record for its fire time")
	}
	// ... but not by a start an agent refused because its lease had ended.
	f5 := t0.Add(50 * time.Minute)
	_, err = st.InsertMissed(ctx, []*store.Run{{ID: store.MissedRunID("", "backup", f5), AgentID: "", Pipe: "backup", PipeVersion: 1,
		Trigger: api.TriggerSchedule, Status: api.StatusMissed, Reason: "no holder", WrittenBy: "server", ScheduledAt: f5, CreatedAt: recv}})
	must(t, err)
	must(t, st.ApplyRecords(ctx, []*store.Record{
		{AgentID: "agt-a", Received: recv, Seq: 3, RunFinished: &store.Run{ID: "s-fenced-2", Pipe: "backup", Trigger: api.TriggerSchedule, Status: api.StatusSkipped,
			Reason: api.ReasonLeaseEnded, ScheduledAt: f5, StartedAt: f5, FinishedAt: f5}},
	}, store.IngestLimits{}))
	if _, err := st.GetRun(ctx, store.MissedRunID("", "backup", f5)); err != nil {
		t.Fatalf("a refused start (lease ended) replaced the no-holder missed run: %v", err)
	}

	_, agents, err := st.CompileInputs(ctx, nil)
	if err != nil || len(agents) != 2 || !agents[0].LastSeenAt.Equal(recv) {
		t.Fatalf("CompileInputs carries last_seen_at: %+v %v", agents, err)
	}
}
