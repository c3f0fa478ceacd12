package stream

import (
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/drover/drover/server/store"
	"github.com/drover/drover/server/store/sqlite"
)

// BenchmarkIngesterAtRest offers the ingester the load of 19,500 agents at
// rest (a heartbeat from each every 30 s, a run from each every 5 minutes
// with 4 KiB of log) for 5 s of wall time per op, on a real SQLite store,
// and reports the process's CPU over that time as a share of one core,
// with commits spaced by commitGap and without (gap=0). Run it with
// -benchtime 3x.
func BenchmarkIngesterAtRest(b *testing.B) {
	const agents, heartbeatsPerSec, runsPerSec = 19500, 650, 65
	for _, gap := range []time.Duration{0, commitGap} {
		b.Run(fmt.Sprintf("gap=%s", gap), func(b *testing.B) {
			db, err := sqlite.Open(context.Background(), filepath.Join(b.TempDir(), "server.db"), "normal")
			if err != nil {
				b.Fatal(err)
			}
			defer db.Close()
			now := time.Now()
			err = db.InTx(context.Background(), func(tx *sql.Tx) error {
				for i := range agents {
					id := fmt.Sprintf("agt-bench-%05d", i)
					if _, err := tx.Exec(`INSERT INTO agents(id, name, tags, created_at, updated_at, cert_serial) VALUES(?,?,?,?,?,?)`,
						id, id, `{"role":"web"}`, now.UnixNano(), now.UnixNano(), fmt.Sprint(i)); err != nil {
						return err
					}
				}
				return nil
			})
			if err != nil {
				b.Fatal(err)
			}
			g := NewIngester(db, 2000, 20*time.Millisecond, store.IngestLimits{MaxLogBytes: 1 << 20}, slog.New(slog.DiscardHandler), nil)
			g.gap = gap
			go g.Run()
			defer g.Stop()
			c := testConn(b, "agt-bench-00000", 1, 1)
			log := make([]byte, 4096)
			var seq uint64
			send := func(r *store.Record) {
				seq++
				r.Received, r.Seq = time.Now(), seq
				c.inflight.Add(1)
				waited := seq
				if r.RunStarted == nil && r.RunFinished == nil && r.Chunk == nil {
					waited = 0 // a heartbeat: nobody waits
				}
				g.in <- ingestItem{rec: r, conn: c, seq: waited}
			}
			b.ResetTimer()
			var busy time.Duration
			for range b.N {
				before := cpuTime()
				start := time.Now()
				tick := time.NewTicker(10 * time.Millisecond) // 100 rounds a second
				hb, run := 0, 0
				for time.Since(start) < 5*time.Second {
					<-tick.C
					el := time.Since(start).Seconds()
					for ; float64(hb) < el*heartbeatsPerSec; hb++ {
						send(&store.Record{AgentID: fmt.Sprintf("agt-bench-%05d", hb%agents), Settle: &store.SettleRecord{Running: map[string]bool{}, SentAt: time.Now()}})
					}
					for ; float64(run) < el*runsPerSec; run++ {
						a := fmt.Sprintf("agt-bench-%05d", (run*7)%agents)
						id := fmt.Sprintf("run-%d-%d", b.N, seq)
						t := time.Now()
						send(&store.Record{AgentID: a, RunStarted: &store.Run{ID: id, AgentID: a, Pipe: "p", PipeVersion: 1, Trigger: "schedule", StartedAt: t}})
						send(&store.Record{AgentID: a, Chunk: &store.LogChunk{RunID: id, Seq: 1, Stream: "stdout", Data: log, At: t}})
						send(&store.Record{AgentID: a, RunFinished: &store.Run{ID: id, AgentID: a, Pipe: "p", PipeVersion: 1, Trigger: "schedule", Status: "succeeded",
							StartedAt: t, FinishedAt: t, LogChunks: 1}})
					}
				}
				tick.Stop()
				busy += cpuTime() - before
			}
			b.ReportMetric(float64(busy)/float64(time.Duration(b.N)*5*time.Second)*100, "%cpu")
		})
	}
}

// cpuTime is the process's user and system CPU time so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
