package sqlstore_test

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/drover/drover/api"
	"github.com/drover/drover/server/store"
	"github.com/drover/drover/server/store/postgres"
	"github.com/drover/drover/server/store/postgres/pgtest"
	"github.com/drover/drover/server/store/sqlite"
)

// The statements whose spelling the dialect chooses and that the store
// conformance suite does not reach run on both databases.
func TestDialects(t *testing.T) {
	t.Run("sqlite", func(t *testing.T) {
		st, err := sqlite.Open(t.Context(), filepath.Join(t.TempDir(), "server.db"), "normal")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })
		testDialect(t, st)
	})
	t.Run("postgres", func(t *testing.T) {
		c := pgtest.Start(t)
		st, err := postgres.Open(t.Context(), c.NewDatabase(t), postgres.Pool{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })
		testDialect(t, st)
	})
}

func testDialect(t *testing.T, st store.Store) {
	ctx := t.Context()
	t0 := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	var runs []*store.Run
	for i := range 3 {
		at := t0.Add(time.Duration(i) * time.Minute)
		runs = append(runs, &store.Run{ID: store.MissedRunID("agt-a", "job", at), AgentID: "agt-a", Pipe: "job", PipeVersion: 1,
			Trigger: api.TriggerSchedule, Status: api.StatusMissed, Reason: "agent offline", WrittenBy: "server", ScheduledAt: at, CreatedAt: at})
	}
	if stored, err := st.InsertMissed(ctx, runs); err != nil || len(stored) != 3 {
		t.Fatalf("InsertMissed: %v %v", stored, err)
	}
	// Retention by count alone (no run is older than the age limit) keeps
	// the newest run of the pipe: the rows after the first, OFFSET with no
	// LIMIT.
	if n, err := st.PruneRuns(ctx, t0.Add(-time.Hour), 1); err != nil || n != 2 {
		t.Fatalf("PruneRuns(per pipe 1): %d %v", n, err)
	}
	left, err := st.ListRuns(ctx, store.RunFilter{Limit: -1})
	if err != nil || len(left) != 1 || left[0].ID != runs[2].ID {
		t.Fatalf("runs left after pruning: %v %v", left, err)
	}
}
