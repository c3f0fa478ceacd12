package stream

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"sync"
	"testing"
	"time"

	agentpb "github.com/drover/drover/proto"
	"github.com/drover/drover/server/store"
	"github.com/drover/drover/server/store/sqlite"
)

// batchCounter records the batch sizes committed to a real SQLite store.
type batchCounter struct {
	*sqlite.DB
	mu      sync.Mutex
	batches []int
}

func (b *batchCounter) ApplyRecords(ctx context.Context, recs []*store.Record, lim store.IngestLimits) error {
	err := b.DB.ApplyRecords(ctx, recs, lim)
	b.mu.Lock()
	b.batches = append(b.batches, len(recs))
	b.mu.Unlock()
	return err
}

// Records of many streams that arrive within the delay share one commit,
// and each stream is acknowledged only once it is committed.
func TestIngesterGroupCommit(t *testing.T) {
	db, err := sqlite.Open(context.Background(), filepath.Join(t.TempDir(), "server.db"), "normal")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	st := &batchCounter{DB: db}
	g := NewIngester(st, 100, 2*time.Second, store.IngestLimits{MaxLogBytes: 1 << 20}, slog.New(slog.DiscardHandler), nil)
	go g.Run()
	conns := make([]*streamConn, 10)
	start := time.Now()
	for i := range conns {
		c := testConn(t, fmt.Sprintf("agt-%d", i), 1, 1)
		conns[i] = c
		c.inflight.Add(1)
		g.in <- ingestItem{rec: &store.Record{AgentID: c.agentID, Received: time.Now(), Seq: uint64(i + 1)}, conn: c, seq: uint64(i + 1)}
	}
	for i, c := range conns {
		select {
		case <-c.kick:
		case <-time.After(10 * time.Second):
			t.Fatalf("stream %d never acknowledged", i)
		}
		if got := c.committed.Load(); got != uint64(i+1) {
			t.Fatalf("stream %d acknowledged seq %d, want %d", i, got, i+1)
		}
		// The ack is kicked just before the record leaves the in-flight
		// count (a stream's drain waits for that count, then sends the
		// last ack), so the count may lag the kick by a moment.
		for n := c.inflight.Load(); n != 0; n = c.inflight.Load() {
			if time.Since(start) > 10*time.Second {
				t.Fatalf("stream %d: %d records in flight after the ack", i, n)
			}
			time.Sleep(time.Millisecond)
		}
	}
	if d := time.Since(start); d < 1900*time.Millisecond {
		t.Fatalf("acknowledged after %v, before the batch's delay was over", d)
	}
	st.mu.Lock()
	batches := append([]int(nil), st.batches...)
	st.mu.Unlock()
	if len(batches) != 1 || batches[0] != 10 {
		t.Fatalf("batches %v, want one of 10", batches)
	}
	// Stop does not wait out a gathering batch: it commits it.
	c := conns[0]
	c.inflight.Add(1)
	g.in <- ingestItem{rec: &store.Record{AgentID: c.agentID, Received: time.Now(), Seq: 11}, conn: c, seq: 11}
	time.Sleep(20 * time.Millisecond)
	stopped := time.Now()
	g.Stop()
	if c.committed.Load() != 11 || time.Since(stopped) > 1500*time.Millisecond {
		t.Fatalf("after Stop: committed %d in %v", c.committed.Load(), time.Since(stopped))
	}
}

// timedIngester is an ingester on a real SQLite store (batches of 100, a
// 20 ms delay) that reports the time of each commit.
func timedIngester(t *testing.T) (*batchCounter, *Ingester, chan time.Time) {
	t.Helper()
	db, err := sqlite.Open(context.Background(), filepath.Join(t.TempDir(), "server.db"), "normal")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	st := &batchCounter{DB: db}
	committed := make(chan time.Time, 10)
	g := NewIngester(st, 100, 20*time.Millisecond, store.IngestLimits{MaxLogBytes: 1 << 20}, slog.New(slog.DiscardHandler),
		func([]*store.Record) { committed <- time.Now() })
	return st, g, committed
}

// testConn is a stream connection for the ingester to acknowledge to,
// canceled when the test ends, with out and kick buffered as given.
func testConn(t testing.TB, agentID string, out, kick int) *streamConn {
	ctx, cancel := context.WithCancelCause(context.Background())
	t.Cleanup(func() { cancel(nil) })
	return &streamConn{agentID: agentID, ctx: ctx, cancel: cancel, out: make(chan *agentpb.ServerMessage, out), kick: make(chan struct{}, kick)}
}

// A batch of heartbeats alone gathers for the heartbeat delay; the first
// record somebody waits for that joins it ends the wait after the delay.
func TestIngesterHeartbeatsGatherLonger(t *testing.T) {
	st, g, committed := timedIngester(t)
	g.hbDelay = 800 * time.Millisecond
	go g.Run()
	defer g.Stop()
	c := testConn(t, "agt-1", 1, 1)
	heartbeat := func() {
		c.inflight.Add(1)
		g.in <- ingestItem{rec: &store.Record{AgentID: c.agentID, Received: time.Now()}, conn: c}
	}

	start := time.Now()
	for range 3 {
		heartbeat()
	}
	at := <-committed
	if d := at.Sub(start); d < 750*time.Millisecond {
		t.Fatalf("heartbeats committed after %v, before the heartbeat delay", d)
	}

	start = time.Now()
	heartbeat()
	c.inflight.Add(1)
	g.in <- ingestItem{rec: &store.Record{AgentID: c.agentID, Received: time.Now(), Seq: 1}, conn: c, seq: 1}
	at = <-committed
	if d := at.Sub(start); d >= 700*time.Millisecond {
		t.Fatalf("a heartbeat and a record committed after %v: the record waited with the heartbeats", d)
	}
	select {
	case <-c.kick:
	case <-time.After(10 * time.Second):
		t.Fatal("the record was never acknowledged")
	}
	if got := c.committed.Load(); got != 1 {
		t.Fatalf("acknowledged seq %d, want 1", got)
	}
	st.mu.Lock()
	batches := append([]int(nil), st.batches...)
	st.mu.Unlock()
	if len(batches) != 2 || batches[0] != 3 || batches[1] != 2 {
		t.Fatalf("batches %v, want [3 2]", batches)
	}
}

// While records keep coming, commits begin at least the commit gap apart;
// a record after a quiet spell is committed after the delay alone.
func TestIngesterSpacesCommits(t *testing.T) {
	_, g, committed := timedIngester(t)
	g.gap = 600 * time.Millisecond
	go g.Run()
	defer g.Stop()
	c := testConn(t, "agt-1", 1, 16)
	var seq uint64
	record := func() {
		seq++
		c.inflight.Add(1)
		g.in <- ingestItem{rec: &store.Record{AgentID: c.agentID, Received: time.Now(), Seq: seq}, conn: c, seq: seq}
	}

	start := time.Now()
	record()
	first := <-committed
	if d := first.Sub(start); d >= 500*time.Millisecond {
		t.Fatalf("the first record was committed after %v, want about the delay (20 ms)", d)
	}
	record() // right after the first commit: waits for the gap
	second := <-committed
	if d := second.Sub(first); d < 500*time.Millisecond {
		t.Fatalf("a second commit %v after the first, inside the commit gap (600 ms)", d)
	}

	time.Sleep(700 * time.Millisecond) // a quiet spell longer than the gap
	start = time.Now()
	record()
	third := <-committed
	if d := third.Sub(start); d >= 500*time.Millisecond {
		t.Fatalf("a record after a quiet spell was committed after %v, want about the delay", d)
	}
	deadline := time.After(10 * time.Second)
	for c.committed.Load() != seq {
		select {
		case <-c.kick:
		case <-deadline:
			t.Fatalf("acknowledged seq %d, want %d", c.committed.Load(), seq)
		}
	}
}

// yieldGate is a bulk write the test begins and ends by hand.
type yieldGate struct {
	mu sync.Mutex
	ch chan struct{}
}

func (y *yieldGate) UnderWay() <-chan struct{} {
	y.mu.Lock()
	defer y.mu.Unlock()
	return y.ch
}

func (y *yieldGate) set(under bool) {
	y.mu.Lock()
	defer y.mu.Unlock()
	if under && y.ch == nil {
		y.ch = make(chan struct{})
	} else if !under && y.ch != nil {
		close(y.ch)
		y.ch = nil
	}
}

// While a bulk write is under way a batch is held (and grows) for up to
// maxGive after its first record; it is committed as soon as the bulk
// write ends, and at maxGive at the latest; with none under way the delay
// alone decides.
func TestIngesterGivesWayToBulkWrites(t *testing.T) {
	st, g, committed := timedIngester(t)
	g.maxGive = 800 * time.Millisecond
	y := &yieldGate{}
	g.GiveWayTo(y)
	go g.Run()
	defer g.Stop()
	c := testConn(t, "agt-1", 16, 1)
	seq := uint64(0)
	record := func() {
		seq++
		c.inflight.Add(1)
		g.in <- ingestItem{rec: &store.Record{AgentID: c.agentID, Received: time.Now(), Seq: seq}, conn: c, seq: seq}
	}
	wait := func(what string) time.Duration {
		t.Helper()
		start := time.Now()
		select {
		case at := <-committed:
			return at.Sub(start)
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: never committed", what)
			return 0
		}
	}

	// None under way: the delay.
	record()
	if d := wait("no bulk write"); d > 500*time.Millisecond {
		t.Fatalf("committed after %v with no bulk write under way", d)
	}

	// Under way and ended after 300 ms: held until then, with what came.
	y.set(true)
	start := time.Now()
	record()
	time.Sleep(100 * time.Millisecond)
	record()
	time.Sleep(200 * time.Millisecond)
	select {
	case <-committed:
		t.Fatalf("committed after %v while a bulk write was under way", time.Since(start))
	default:
	}
	y.set(false)
	if d := wait("bulk write ended"); d > 300*time.Millisecond {
		t.Fatalf("committed %v after the bulk write ended", d)
	}

	// Under way for longer than maxGive: committed at maxGive.
	y.set(true)
	start = time.Now()
	record()
	wait("bulk write going on")
	if d := time.Since(start); d < 750*time.Millisecond || d > 3*time.Second {
		t.Fatalf("committed after %v under a long bulk write, want about maxGive (800 ms)", d)
	}
	y.set(false)
	if g.gaveWay != 2 {
		t.Fatalf("gave way %d times, want 2", g.gaveWay)
	}
	st.mu.Lock()
	batches := append([]int(nil), st.batches...)
	st.mu.Unlock()
	if len(batches) != 3 || batches[0] != 1 || batches[1] != 2 || batches[2] != 1 {
		t.Fatalf("batches %v, want [1 2 1]", batches)
	}
	if got := c.committed.Load(); got != 4 {
		t.Fatalf("acknowledged seq %d, want 4", got)
	}
}
