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
// records are stored once, and every manifest serial is saved exactly
// once (a save compiled over a serial that is no longer stored is refused).
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
	const runs, chunks, writers, saves = 5, 4, 8, 5
	var mu sync.Mutex
	won := map[uint64][]string{} // serial -> the manifests saved with it
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
			// Each writer saves manifests compiled over what it
			// read, as a replica's compiler does, and compiles again when
			// another writer got there first.
			for done := 0; done < saves; {
				prev := uint64(0)
				if m, err := st.GetManifest(ctx, "agt"); err == nil {
					prev = m.Serial
				}
				body := fmt.Sprintf("writer %d serial %d", w, prev+1)
				stale, err := st.SaveManifests(ctx, []*store.StoredManifest{{AgentID: "agt", PrevSerial: prev, Serial: prev + 1, ContentHash: body, Digest: body,
					Envelope: []byte(body), IssuedAt: t0, ExpiresAt: t0.Add(time.Hour), KeyListVersion: 1}})
				if err != nil {
					errc <- err
					return
				}
				if len(stale) == 0 {
					mu.Lock()
					won[prev+1] = append(won[prev+1], body)
					mu.Unlock()
					done++
				}
			}
			errc <- nil
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
	if err != nil || m.Serial != writers*saves || string(m.Envelope) != won[m.Serial][0] {
		t.Fatalf("manifest after racing saves: %+v %v", m, err)
	}
	for serial := uint64(1); serial <= writers*saves; serial++ {
		if len(won[serial]) != 1 {
			t.Fatalf("serial %d saved %d times: %q", serial, len(won[serial]), won[serial])
		}
	}
}
