package server

import (
	"fmt"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	agentpb "github.com/drover/drover/proto"
	"github.com/drover/drover/server/store/postgres/pgtest"
)

// BenchmarkReplicas measures the manifest poll answered 304 and stream
// ingest with durable acks on three set-ups in one run: SQLite alone
// (synchronous=full), PostgreSQL with one replica, and PostgreSQL with
// three replicas, the load spread over them (each poller and each stream on
// replica i mod 3). PostgreSQL runs with its durability defaults (fsync and
// synchronous_commit on: pgtest.StartDurable), so an ack means the record
// is on disk in every set-up. Each PostgreSQL figure is also reported as a
// ratio against the SQLite figure of the same run (x-sqlite). Everything
// (servers, PostgreSQL, clients) shares the machine's cores.
//
//	go test ./server -run '^$' -bench Replicas -benchtime 3s
func BenchmarkReplicas(b *testing.B) {
	pg := pgtest.StartDurable(b)
	base := map[string]float64{} // the SQLite figure per measure
	setups := []struct {
		name string
		n    int
	}{{"sqlite", 1}, {"pg1", 1}, {"pg3", 3}}
	for _, su := range setups {
		b.Run(su.name, func(b *testing.B) {
			var reps []*testServer
			if su.name == "sqlite" {
				reps = []*testServer{startServer(b, func(c *Config) { c.Store.Synchronous = "full" })}
			} else {
				dsn, kek := pg.NewDatabase(b), testKEKFile(b)
				for range su.n {
					reps = append(reps, startServer(b, func(c *Config) {
						c.Store.Driver, c.Store.DSN, c.KEKFile = "postgres", dsn, kek
					}))
				}
			}
			report := func(b *testing.B, measure string, rate float64, unit string) {
				b.ReportMetric(rate, unit)
				if su.name == "sqlite" {
					base[measure] = rate
				} else if base[measure] > 0 {
					b.ReportMetric(rate/base[measure], "x-sqlite")
				}
			}
			b.Run("poll304", func(b *testing.B) {
				report(b, "poll304", benchPolls(b, reps), "polls/s")
			})
			b.Run("ingest", func(b *testing.B) {
				report(b, "ingest", benchIngest(b, reps, 8), "records/s")
			})
		})
	}
}

// benchPolls: b.N conditional manifest GETs (304) by three agents, agent i
// polling replica i mod len(reps), over 16 keep-alive connections.
func benchPolls(b *testing.B, reps []*testServer) float64 {
	tags := map[string]string{"role": "web"}
	reps[0].putScriptPipe("job", "echo hello", tags)
	type poller struct {
		a    *testAgent
		etag string
	}
	var ps []poller
	for i := range 3 {
		r := reps[i%len(reps)]
		a := r.enrollAgent(tags)
		res, err := a.get("/api/v1/agents/self/manifest")
		if err != nil || res.code != 200 {
			b.Fatalf("%v %v", res, err)
		}
		ps = append(ps, poller{a, res.header.Get("ETag")})
	}
	var next atomic.Int64
	b.SetParallelism(8)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		p := ps[int(next.Add(1))%len(ps)]
		for pb.Next() {
			req, _ := http.NewRequest("GET", p.a.base+"/api/v1/agents/self/manifest", nil)
			req.Header.Set("If-None-Match", p.etag)
			resp, err := p.a.client.Do(req)
			if err != nil {
				b.Error(err)
				return
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 304 {
				b.Errorf("status %d, want 304", resp.StatusCode)
				return
			}
		}
	})
	return float64(b.N) / b.Elapsed().Seconds()
}

// benchRound makes the run ids of every round distinct.
var benchRound atomic.Int64

// benchIngest: b.N log records over streams agent streams, stream i on
// replica i mod len(reps), timed until every stream's last record is
// acknowledged (after its commit).
func benchIngest(b *testing.B, reps []*testServer, streams int) float64 {
	round := benchRound.Add(1)
	sts := make([]*testStream, streams)
	for i := range sts {
		r := reps[i%len(reps)]
		a := r.enrollAgent(nil)
		st, err := a.openStream(r.s.GRPCAddr())
		if err != nil {
			b.Fatal(err)
		}
		defer st.close()
		sts[i] = st
	}
	data := make([]byte, 120)
	for i := range data {
		data[i] = 'a' + byte(i%26)
	}
	per := b.N/streams + 1
	b.ResetTimer()
	var wg sync.WaitGroup
	for i, st := range sts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for seq := uint64(1); seq <= uint64(per); seq++ {
				m := &agentpb.AgentMessage{Seq: seq, Body: &agentpb.AgentMessage_LogChunk{LogChunk: &agentpb.LogChunk{
					RunId: fmt.Sprintf("bench-%d-%d-%d", round, i, seq/1000), ChunkSeq: seq % 1000, Data: data}}}
				if err := st.stream.Send(m); err != nil {
					b.Error(err)
					return
				}
			}
			if err := st.waitAck(uint64(per), 2*time.Minute); err != nil {
				b.Error(err)
			}
		}()
	}
	wg.Wait()
	b.StopTimer()
	return float64(per*streams) / b.Elapsed().Seconds()
}
