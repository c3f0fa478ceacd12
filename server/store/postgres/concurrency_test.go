package postgres_test

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/drover/drover/api"
	"github.com/drover/drover/server/store"
	"github.com/drover/drover/server/store/postgres"
	"github.com/drover/drover/server/store/postgres/pgtest"
)

// Writers racing on the same rows (several connections, as several
// servers would) all succeed: serialization failures are retried, replayed
// records are stored once, and a manifest serial never goes back.
func TestConcurrentWritersSerialize(t *testing.T) {
	c := pgtest.Start(t)
	st, err := postgres.Open(t.Context(), c.NewDatabase(t), postgres.Pool{MaxConns: 8})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	ctx := t.Context()
	t0 := time.Date(2026, 6, 1, 12, 0, 0, 0, time.UTC)
	tok := &store.EnrollmentToken{ID: "tok", SecretHash: []byte("h"), CreatedAt: t0, ExpiresAt: t0.Add(time.Hour)}
	if err := st.CreateToken(ctx, tok); err != nil {
		t.Fatal(err)
	}
	if err := st.EnrollAgent(ctx, "tok", t0, &store.Agent{ID: "agt", CreatedAt: t0, CertSerial: "s"}); err != nil {
		t.Fatal(err)
	}
	const runs, chunks, writers = 5, 4, 8
	var recs []*store.Record
	for r := range runs {
		id := fmt.Sprintf("run-%d", r)
		recs = append(recs, &store.Record{AgentID: "agt", Received: t0, RunStarted: &store.Run{ID: id, Pipe: "job", Status: api.StatusRunning, StartedAt: t0}})
		for k := range chunks {
			recs = append(recs, &store.Record{AgentID: "agt", Received: t0, Chunk: &store.LogChunk{RunID: id, Seq: uint64(k), Stream: "stdout", Data: []byte("0123456789")}})
		}
		recs = append(recs, &store.Record{AgentID: "agt", Received: t0, RunFinished: &store.Run{ID: id, Pipe: "job", Status: api.StatusSucceeded, FinishedAt: t0, LogChunks: chunks}})
	}
	var wg sync.WaitGroup
	errc := make(chan error, 2*writers)
	for w := range writers {
		wg.Add(2)
		go func() {
			defer wg.Done()
			// Each writer replays the whole workload: the same records
			// applied by several servers at once.
			errc <- st.ApplyRecords(ctx, recs, store.IngestLimits{MaxLogBytes: 1 << 20, Marker: []byte("[truncated]")})
		}()
		go func() {
			defer wg.Done()
			errc <- st.SaveManifests(ctx, []*store.StoredManifest{{AgentID: "agt", Serial: uint64(w + 1), ContentHash: fmt.Sprint(w), Digest: fmt.Sprint(w),
				Envelope: []byte(fmt.Sprint(w)), IssuedAt: t0, ExpiresAt: t0.Add(time.Hour), KeyListVersion: 1}})
		}()
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		if err != nil {
			t.Fatal(err)
		}
	}
	for r := range runs {
		id := fmt.Sprintf("run-%d", r)
		run, err := st.GetRun(ctx, id)
		if err != nil || run.Status != api.StatusSucceeded || run.LogBytes != chunks*10 {
			t.Fatalf("%s: %+v %v", id, run, err)
		}
		if n, err := st.CountLogChunks(ctx, id); err != nil || n != chunks {
			t.Fatalf("%s: %d chunks, %v", id, n, err)
		}
	}
	m, err := st.GetManifest(ctx, "agt")
	if err != nil || m.Serial != writers || string(m.Envelope) != fmt.Sprint(writers-1) {
		t.Fatalf("manifest after racing saves: %+v %v", m, err)
	}
}
