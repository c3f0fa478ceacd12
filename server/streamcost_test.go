package server

import (
	"os"
	"runtime"
	rtmetrics "runtime/metrics"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// serverGoroutines counts the goroutines that gRPC's server and the stream
// service started; the test's clients live in the same process, so
// counting them all would mix both sides.
func serverGoroutines() int {
	buf := make([]byte, 64<<20)
	buf = buf[:runtime.Stack(buf, true)]
	n := 0
	for _, g := range strings.Split(string(buf), "\n\n") {
		for _, by := range []string{"created by google.golang.org/grpc.(*Server)", "created by google.golang.org/grpc/internal/transport.NewServerTransport",
			"created by github.com/drover/drover/server/stream."} {
			if strings.Contains(g, by) {
				n++
				break
			}
		}
	}
	return n
}

// runtimeFigures reads the heap and stack figures of the Go runtime.
func runtimeFigures() map[string]uint64 {
	names := []string{"/memory/classes/heap/objects:bytes", "/gc/heap/goal:bytes", "/memory/classes/heap/stacks:bytes",
		"/memory/classes/heap/released:bytes", "/memory/classes/total:bytes", "/gc/heap/live:bytes"}
	samples := make([]rtmetrics.Sample, len(names))
	for i, n := range names {
		samples[i].Name = n
	}
	rtmetrics.Read(samples)
	out := map[string]uint64{}
	for _, s := range samples {
		if s.Value.Kind() == rtmetrics.KindUint64 {
			out[s.Name] = s.Value.Uint64()
		}
	}
	return out
}

// TestIdleStreamGoroutines holds real idle streams against the in-process
// server and counts the server's goroutines per stream. With
// DROVER_STREAM_COST_N it opens that many and logs the runtime's heap and
// stack figures (and, with DROVER_STREAM_COST_HEAP, writes a heap profile):
// the breakdown of what an idle agent costs the server.
func TestIdleStreamGoroutines(t *testing.T) {
	n := 20
	if v := os.Getenv("DROVER_STREAM_COST_N"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil {
			t.Fatal(err)
		}
	}
	heapProfile := os.Getenv("DROVER_STREAM_COST_HEAP")
	if heapProfile != "" {
		runtime.MemProfileRate = 4096
	}
	ts := startServer(t, func(c *Config) { c.Enrollment.Burst = n + 10 })
	agents := make([]*testAgent, n)
	for i := range agents {
		agents[i] = ts.enrollAgent(map[string]string{"role": "idle"})
	}
	settle := func(want int) {
		deadline := time.Now().Add(30 * time.Second)
		for ts.s.fleet.hub.Count() != want {
			if time.Now().After(deadline) {
				t.Fatalf("%d streams open, want %d", ts.s.fleet.hub.Count(), want)
			}
			time.Sleep(10 * time.Millisecond)
		}
		time.Sleep(200 * time.Millisecond) // the last Hellos' records commit
	}
	settle(0)
	runtime.GC()
	g0, m0 := serverGoroutines(), runtimeFigures()

	streams := make([]*testStream, n)
	var wg sync.WaitGroup
	sem := make(chan struct{}, 16)
	for i, a := range agents {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			st, err := a.openStream("")
			if err != nil {
				t.Error(err)
				return
			}
			streams[i] = st
		}()
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	defer func() {
		for _, st := range streams {
			st.close()
		}
	}()
	settle(n)
	runtime.GC()
	runtime.GC()
	g1, m1 := serverGoroutines(), runtimeFigures()
	perStream := float64(g1-g0) / float64(n)
	t.Logf("%d idle streams: %d server goroutines before, %d after: %.2f per stream", n, g0, g1, perStream)
	for _, k := range []string{"/gc/heap/live:bytes", "/memory/classes/heap/objects:bytes", "/gc/heap/goal:bytes", "/memory/classes/heap/stacks:bytes", "/memory/classes/total:bytes"} {
		t.Logf("%-40s %8.1f KiB per stream (both sides: the clients run in this process)", k, float64(int64(m1[k])-int64(m0[k]))/float64(n)/1024)
	}
	if heapProfile != "" {
		f, err := os.Create(heapProfile)
		if err != nil {
			t.Fatal(err)
		}
		if err := pprof.Lookup("heap").WriteTo(f, 0); err != nil {
			t.Fatal(err)
		}
		f.Close()
		buf := make([]byte, 64<<20)
		os.WriteFile(heapProfile+".goroutines", buf[:runtime.Stack(buf, true)], 0o644)
	}
	// gRPC's three per connection (its reader, its writer, its keepalive
	// timer) and the stream service's two: the handler, which waits for
	// what is to be sent and for the stream's end, and the receiver.
	if want := 5.0; perStream > want {
		t.Errorf("%.2f server goroutines per idle stream, want at most %v", perStream, want)
	}
}
