package server

import (
	"flag"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/drover/drover/api"
	agentpb "github.com/drover/drover/proto"
	"github.com/drover/drover/server/store/postgres/pgtest"
)

// BenchmarkReplicas measures the manifest poll answered 304 (agents bound
// to their machine ids, as on hosts with /etc/machine-id) and stream
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
	// The final rounds' figures per set-up and measure; the x-sqlite ratio
	// is against the mean of SQLite's (with -count, each measure runs its
	// rounds one after another, SQLite's first).
	figures := map[string][]float64{}
	setups := []struct {
		name string
		n    int
	}{{"sqlite", 1}, {"pg1", 1}, {"pg3", 3}}
	b.Cleanup(func() {
		for _, m := range []string{"poll304", "ingest"} {
			line := m + ":"
			for _, su := range setups {
				v := mean(figures[su.name+"/"+m])
				line += fmt.Sprintf(" %s %.0f/s", su.name, v)
				if su.name != "sqlite" {
					line += fmt.Sprintf(" (%.2fx)", v/mean(figures["sqlite/"+m]))
				}
			}
			b.Log(line)
		}
	})
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
				if !finalRound(b) {
					return
				}
				k := su.name + "/" + measure
				figures[k] = append(figures[k], rate)
				if base := mean(figures["sqlite/"+measure]); su.name != "sqlite" && base > 0 {
					b.ReportMetric(rate/base, "x-sqlite")
				}
			}
			pollers := newPollers(b, reps, 3)
			b.Run("poll304", func(b *testing.B) {
				report(b, "poll304", benchPolls(b, pollers), "polls/s")
			})
			streams := newIngestStreams(b, reps, 8)
			b.Run("ingest", func(b *testing.B) {
				report(b, "ingest", benchIngest(b, streams), "records/s")
			})
		})
	}
}

// finalRound reports whether b is a measured round rather than one of the
// shorter rounds that size b.N: it ran at least -benchtime (or -benchtime
// is a count).
func finalRound(b *testing.B) bool {
	f := flag.Lookup("test.benchtime")
	if f == nil || strings.HasSuffix(f.Value.String(), "x") {
		return true
	}
	d, err := time.ParseDuration(f.Value.String())
	return err != nil || b.Elapsed() >= d
}

func mean(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	var sum float64
	for _, x := range v {
		sum += x
	}
	return sum / float64(len(v))
}

// poller is an agent polling its manifest with the ETag it holds, from
// its machine.
type poller struct {
	a         *testAgent
	etag      string
	machineID string
}

// newPollers enrolls n agents, agent i on replica i mod len(reps), each
// bound to a machine id of its own (as agents on hosts with
// /etc/machine-id are) and holding its manifest's ETag.
func newPollers(b *testing.B, reps []*testServer, n int) []poller {
	tags := map[string]string{"role": "web"}
	reps[0].putScriptPipe("job", "echo hello", tags)
	var ps []poller
	defer func() { enrollMachineID = "" }()
	for i := range n {
		mid := fmt.Sprintf("%x", randomBytes(16))
		enrollMachineID = mid
		a := reps[i%len(reps)].enrollAgent(tags)
		res, err := a.get("/api/v1/agents/self/manifest", api.MachineIDHeader, mid)
		if err != nil || res.code != 200 {
			b.Fatalf("%v %v", res, err)
		}
		ps = append(ps, poller{a, res.header.Get("ETag"), mid})
	}
	return ps
}

// benchPolls: b.N conditional manifest GETs (304) by the pollers over 16
// keep-alive connections.
func benchPolls(b *testing.B, ps []poller) float64 {
	var next atomic.Int64
	b.SetParallelism(8)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		p := ps[int(next.Add(1))%len(ps)]
		for pb.Next() {
			req, _ := http.NewRequest("GET", p.a.base+"/api/v1/agents/self/manifest", nil)
			req.Header.Set("If-None-Match", p.etag)
			req.Header.Set(api.MachineIDHeader, p.machineID)
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

// ingestStream is an agent's open stream and the last seq it sent (the
// rounds go on where the previous one stopped).
type ingestStream struct {
	st  *testStream
	seq uint64
}

// newIngestStreams opens n agent streams, stream i on replica i mod
// len(reps); they are closed when b ends.
func newIngestStreams(b *testing.B, reps []*testServer, n int) []*ingestStream {
	var out []*ingestStream
	for i := range n {
		r := reps[i%len(reps)]
		st, err := r.enrollAgent(nil).openStream(r.s.GRPCAddr())
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(st.close)
		out = append(out, &ingestStream{st: st})
	}
	return out
}

// benchIngest: b.N log records of 120 bytes over the streams, timed until
// every stream's last record is acknowledged (after its commit).
func benchIngest(b *testing.B, streams []*ingestStream) float64 {
	data := make([]byte, 120)
	for i := range data {
		data[i] = 'a' + byte(i%26)
	}
	per := uint64(b.N/len(streams) + 1)
	b.ResetTimer()
	var wg sync.WaitGroup
	for i, is := range streams {
		wg.Add(1)
		go func() {
			defer wg.Done()
			from := is.seq + 1
			is.seq += per
			for seq := from; seq <= is.seq; seq++ {
				m := &agentpb.AgentMessage{Seq: seq, Body: &agentpb.AgentMessage_LogChunk{LogChunk: &agentpb.LogChunk{
					RunId: fmt.Sprintf("bench-%d-%d", i, seq/1000), ChunkSeq: seq % 1000, Data: data}}}
				if err := is.st.stream.Send(m); err != nil {
					b.Error(err)
					return
				}
			}
			if err := is.st.waitAck(is.seq, 2*time.Minute); err != nil {
				b.Error(err)
			}
		}()
	}
	wg.Wait()
	b.StopTimer()
	return float64(per*uint64(len(streams))) / b.Elapsed().Seconds()
}
