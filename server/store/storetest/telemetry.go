package storetest

import (
	"reflect"
	"testing"
	"time"

	"github.com/drover/drover/api"
	"github.com/drover/drover/server/store"
)

// testRunTelemetry: a run's output, metrics and telemetry notes are stored
// with it, read back by GetRun and ListRuns, and replaced by a later
// RunFinished of the same run.
func testRunTelemetry(t *testing.T, st store.Store) {
	ctx := t.Context()
	enroll(t, st, "agt-a", nil)
	recv := t0.Add(time.Minute)
	metrics := []api.MetricSample{
		{Name: "rows_total", Type: "counter", Help: "Rows.", Value: 42, Labels: map[string]string{"table": "users", "odd": "a\"b\\c\x00"}},
		{Name: "size_bytes", Type: "gauge", Value: 1.5e9},
	}
	fin := &store.Run{ID: "rt", Pipe: "job", Status: api.StatusSucceeded, StartedAt: t0, FinishedAt: t0.Add(time.Second),
		Output: "dump=/srv/a.tar\nrows=42\n", Metrics: metrics, TelemetryNotes: []string{"metrics: 3 samples over the limit of 100 dropped"}}
	must(t, st.ApplyRecords(ctx, []*store.Record{
		{AgentID: "agt-a", Received: recv, Seq: 1, RunStarted: &store.Run{ID: "rt", Pipe: "job", StartedAt: t0}},
		{AgentID: "agt-a", Received: recv, Seq: 2, RunFinished: fin},
		{AgentID: "agt-a", Received: recv, Seq: 3, RunStarted: &store.Run{ID: "plain", Pipe: "job", StartedAt: t0}},
	}, store.IngestLimits{}))
	r, err := st.GetRun(ctx, "rt")
	if err != nil || r.Output != fin.Output || !reflect.DeepEqual(r.Metrics, metrics) || !reflect.DeepEqual(r.TelemetryNotes, fin.TelemetryNotes) {
		t.Fatalf("GetRun: %+v %v", r, err)
	}
	list, err := st.ListRuns(ctx, store.RunFilter{Pipe: "job", Limit: 10})
	if err != nil || len(list) != 2 {
		t.Fatalf("ListRuns: %v %v", list, err)
	}
	for _, l := range list {
		switch l.ID {
		case "rt":
			if l.Output != fin.Output || len(l.Metrics) != 2 {
				t.Errorf("listed %+v", l)
			}
		case "plain":
			if l.Output != "" || l.Metrics != nil || l.TelemetryNotes != nil {
				t.Errorf("a run without telemetry: %+v", l)
			}
		}
	}
	// A replayed RunFinished carrying other telemetry replaces it.
	again := *fin
	again.Output, again.Metrics, again.TelemetryNotes = "rows=1\n", nil, nil
	must(t, st.ApplyRecords(ctx, []*store.Record{{AgentID: "agt-a", Received: recv, Seq: 4, RunFinished: &again}}, store.IngestLimits{}))
	if r, err = st.GetRun(ctx, "rt"); err != nil || r.Output != "rows=1\n" || r.Metrics != nil || r.TelemetryNotes != nil {
		t.Fatalf("GetRun after the replay: %+v %v", r, err)
	}
}
