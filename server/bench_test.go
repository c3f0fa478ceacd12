package server

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	crand "crypto/rand"
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/drover/drover/api"

	agentpb "github.com/drover/drover/proto"
	"github.com/drover/drover/server/store"
	"github.com/drover/drover/server/store/sqlite"
)

// Benchmarks of the server's three scale targets (figures in the README):
//
//	go test ./server -run '^$' -bench . -benchtime 3s
func benchManifestGET(b *testing.B, conditional bool) {
	ts := startServer(b)
	a := ts.enrollAgent(map[string]string{"role": "web"})
	ts.putScriptPipe("job", "echo hello", map[string]string{"role": "web"})
	r, err := a.get("/api/v1/agents/self/manifest")
	if err != nil || r.code != 200 {
		b.Fatalf("%v %v", r, err)
	}
	etag := r.header.Get("ETag")
	want := 200
	if conditional {
		want = 304
	}
	b.SetParallelism(8) // 16 concurrent keep-alive connections on 2 cores
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			req, _ := http.NewRequest("GET", a.base+"/api/v1/agents/self/manifest", nil)
			if conditional {
				req.Header.Set("If-None-Match", etag)
			}
			resp, err := a.client.Do(req)
			if err != nil {
				b.Error(err)
				return
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != want {
				b.Errorf("status %d, want %d", resp.StatusCode, want)
				return
			}
		}
	})
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "req/s")
}

func BenchmarkManifestGET304(b *testing.B) { benchManifestGET(b, true) }
func BenchmarkManifestGET200(b *testing.B) { benchManifestGET(b, false) }

// BenchmarkStreamIngest measures log records ingested with durable acks
// (synchronous=full): b.N records over the given number of agent streams,
// timed until the last record of every stream is acknowledged.
func BenchmarkStreamIngest(b *testing.B) {
	for _, streams := range []int{1, 8} {
		b.Run(fmt.Sprintf("streams=%d", streams), func(b *testing.B) {
			ts := startServer(b, func(c *Config) { c.Store.Synchronous = "full" })
			sts := make([]*testStream, streams)
			for i := range sts {
				a := ts.enrollAgent(nil)
				st, err := a.openStream("")
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
							RunId: fmt.Sprintf("bench-%d-%d", i, seq/1000), ChunkSeq: seq % 1000, Data: data}}}
						if err := st.stream.Send(m); err != nil {
							b.Error(err)
							return
						}
					}
					if err := st.waitAck(uint64(per), time.Minute); err != nil {
						b.Error(err)
					}
				}()
			}
			wg.Wait()
			b.ReportMetric(float64(per*streams)/b.Elapsed().Seconds(), "records/s")
		})
	}
}

// seedAgents inserts n agents tagged role=web straight into the store.
func seedAgents(b testing.TB, db *sqlite.DB, n int) {
	now := time.Now().UnixNano()
	err := db.InTx(context.Background(), func(tx *sql.Tx) error {
		st, err := tx.Prepare(`INSERT INTO agents(id, name, tags, created_at, updated_at, cert_serial) VALUES(?,?,?,?,?,?)`)
		if err != nil {
			return err
		}
		defer st.Close()
		for i := range n {
			id := fmt.Sprintf("agt-bench-%05d", i)
			if _, err := st.Exec(id, id, `{"role":"web","env":"prod"}`, now, now, fmt.Sprint(i)); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		b.Fatal(err)
	}
}

// BenchmarkRecompile10kAgents: one change to a pipe's target tags adds it
// to (or removes it from) the manifests of 10,000 agents; each op is the
// admin PUT that recompiles, signs and stores all 10,000 manifests.
func BenchmarkRecompile10kAgents(b *testing.B) {
	ts := startServer(b)
	db := ts.db()
	seedAgents(b, db, 10000)
	ts.putScriptPipe("base", "echo base", map[string]string{"role": "web"})
	ts.putScriptPipe("extra", "echo extra", map[string]string{"tier": "gold"})
	for i := range 3 {
		ts.putScriptPipe(fmt.Sprintf("other-%d", i), "echo other", map[string]string{"env": "prod"})
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		tags := map[string]string{"role": "web"}
		if i%2 == 1 {
			tags = map[string]string{"tier": "gold"}
		}
		start := time.Now()
		ts.putScriptPipe("extra", "echo extra", tags)
		b.ReportMetric(time.Since(start).Seconds(), "s/10k-manifests")
	}
	b.StopTimer()
	var changed int
	db.Reader().QueryRow(`SELECT COUNT(*) FROM manifests WHERE serial >= 2`).Scan(&changed)
	if changed < 10000 {
		b.Fatalf("only %d manifests were re-signed", changed)
	}
}

// BenchmarkPlacementPass10kAgents: 10,000 agents (store seeded directly),
// 1,000 placement: one pipes targeting all of them, every pipe held; the
// holder of one pipe goes silent past its lease plus the margin. Each op is
// one pass of the leases loop as the leader runs it: read the fleet and the
// holders, plan (compile.Place), store the hand-over, compile the holders
// and sign the two manifests that change.
func BenchmarkPlacementPass10kAgents(b *testing.B) {
	ts := startServer(b)
	ctx := context.Background()
	seedAgents(b, ts.db(), 10000)
	for i := range 1000 {
		name := fmt.Sprintf("p-%04d", i)
		spec := `{"schedule": "@hourly", "script": "true", "placement": "one", "targets": {"tags": {"role": "web"}}}`
		pv, payload, err := ts.s.preparePipe(name, []byte(spec), nil)
		if err != nil {
			b.Fatal(err)
		}
		if _, _, err := ts.s.store.PutPipe(ctx, pv, payload, ts.clock.Now()); err != nil {
			b.Fatal(err)
		}
	}
	c := ts.s.compiler.(compilerSeam).c
	c.healthy = func(string, time.Time, time.Time) bool { return true }
	if _, err := c.compile(ctx, nil); err != nil {
		b.Fatal(err)
	}
	hs, err := ts.s.store.Holders(ctx)
	if err != nil || len(hs) != 1000 {
		b.Fatalf("%d holders, %v", len(hs), err)
	}
	silent := hs[0].Agent
	c.healthy = func(id string, _, _ time.Time) bool { return id != silent }
	c.holdUntil = time.Time{} // no grace after the start: the agents "reconnected"
	b.ResetTimer()
	for b.Loop() {
		b.StopTimer()
		ts.clock.Advance(time.Second) // a fresh lease each time (leases are to the second)
		h := *hs[0]
		h.LeaseUntil = ts.clock.Now().Add(-10 * time.Minute) // its lease and the margin are over
		if err := ts.s.store.SaveHolders(ctx, []*store.Holder{&h}, nil); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		n, err := ts.s.compiler.Place(ctx)
		if err != nil || n == 0 {
			after, _ := ts.s.store.Holders(ctx)
			b.Fatalf("pass: %d changed, %v; before %+v after %+v", n, err, h, after[0])
		}
	}
	b.StopTimer()
	if now, _ := ts.s.store.Holders(ctx); now[0].Agent == silent {
		b.Fatalf("the silent holder kept the pipe")
	}
}

// BenchmarkEnroll measures enrollments per second over HTTPS with 16 in
// flight (a fresh TLS handshake each, as a new agent makes), tokens created
// and agent keys and CSRs generated before the timer:
//
//	go test ./server -run '^$' -bench Enroll -benchtime 2000x
func BenchmarkEnroll(b *testing.B) {
	ts := startServer(b, func(c *Config) { c.Enrollment.RatePerMinute, c.Enrollment.Burst = 1e6, 1e6 })
	for i := range 5 {
		ts.putScriptPipe(fmt.Sprintf("p%d", i), "echo hi", map[string]string{"role": "web"})
	}
	type job struct{ token, csr string }
	jobs := make(chan job, b.N)
	for range b.N {
		key, err := ecdsa.GenerateKey(elliptic.P256(), crand.Reader)
		if err != nil {
			b.Fatal(err)
		}
		jobs <- job{ts.token(map[string]string{"role": "web"}), newCSR(key)}
	}
	close(jobs)
	b.ResetTimer()
	var wg sync.WaitGroup
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range jobs {
				client := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: pinnedTLS(strings.Split(j.token, ".")[3])}}
				body, _ := json.Marshal(api.EnrollRequest{Token: j.token, Hostname: "bench", OS: "linux", Arch: "amd64", AgentVersion: "test", CSR: j.csr})
				resp, err := client.Post(ts.base+"/api/v1/agents/enroll", "application/json", bytes.NewReader(body))
				if err != nil {
					b.Error(err)
					return
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				client.CloseIdleConnections()
				if resp.StatusCode != 200 {
					b.Errorf("enroll: status %d", resp.StatusCode)
					return
				}
			}
		}()
	}
	wg.Wait()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "enrollments/s")
}
