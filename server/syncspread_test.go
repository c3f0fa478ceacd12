package server

import (
	"fmt"
	"net"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/drover/drover/internal/testkit"
)

// The pacing itself, on a clock the test moves: a burst at once, then the
// rate; a newer serial for a queued agent replaces the older in its place.
func TestSyncSpreaderPaces(t *testing.T) {
	now := time.Unix(1000, 0)
	p := &syncSpreader{rate: 100, burst: 10, tokens: 10, now: func() time.Time { return now }, serials: map[string]uint64{}}
	p.running = true // no drainer: the test takes by hand
	for i := range 50 {
		p.add(fmt.Sprintf("a%02d", i), 1)
	}
	p.add("a03", 2) // queued already: the serial rises, the place stays
	if got := p.take(); len(got) != 10 || got[3] != (pendingSync{"a03", 2}) {
		t.Fatalf("burst: %v", got)
	}
	if got := p.take(); len(got) != 0 {
		t.Fatalf("no time passed, yet %d sent", len(got))
	}
	now = now.Add(100 * time.Millisecond) // 10 tokens at 100/s
	if got := p.take(); len(got) != 10 || got[0].agentID != "a10" {
		t.Fatalf("after 100 ms: %v", got)
	}
	now = now.Add(time.Hour) // the bucket holds at most the burst
	if got := p.take(); len(got) != 10 {
		t.Fatalf("after an hour: %d sent, want the burst of 10", len(got))
	}
	if p.pending() != 20 {
		t.Fatalf("%d pending, want 20", p.pending())
	}
}

// With the real drainer every queued agent is told once, with its latest
// serial, and the drainer stops when the queue is empty.
func TestSyncSpreaderDeliversAll(t *testing.T) {
	var mu sync.Mutex
	got := map[string]uint64{}
	sends := 0
	done := make(chan struct{})
	p := newSyncSpreader(func(id string, serial uint64) {
		mu.Lock()
		defer mu.Unlock()
		got[id] = serial
		if sends++; sends == 300 {
			close(done)
		}
	}, nil, nil)
	for i := range 300 {
		p.add(fmt.Sprintf("a%d", i), 7)
	}
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatalf("only %d of 300 SyncNows sent", sends)
	}
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		p.mu.Lock()
		running := p.running
		p.mu.Unlock()
		if !running {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the drainer did not stop on an empty queue")
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(got) != 300 || sends != 300 || got["a299"] != 7 {
		t.Fatalf("%d agents, %d sends", len(got), sends)
	}
}

// The rate follows the fleet: the connected agents over syncWindow, within
// syncMinRate and syncMaxRate — a change to 19,500 agents is announced in
// about 2 s instead of the ~4.9 s of a fixed 4,000/s.
func TestSyncRateSizedToFleet(t *testing.T) {
	for _, c := range []struct {
		agents int
		rate   float64
	}{{0, syncMinRate}, {5000, syncMinRate}, {8000, 4000}, {19500, 9750}, {100000, syncMaxRate}} {
		if got := syncRate(c.agents); got != c.rate {
			t.Errorf("%d agents: %.0f/s, want %.0f/s", c.agents, got, c.rate)
		}
	}
	window := func(n int) time.Duration {
		return time.Duration(float64(n-syncBurst) / syncRate(n) * float64(time.Second))
	}
	if w := window(19500); w > 2*time.Second || w < 1900*time.Millisecond {
		t.Errorf("19,500 agents announced over %s", w)
	}
}

// While more than half the agents' request slots are in use, or more than
// syncHandshakeHold connections are in their TLS handshake, nothing is
// sent (the tokens still accrue, up to the burst); when they free up the
// queue moves at the fleet's rate.
func TestSyncSpreaderHoldsWhileSlotsBusy(t *testing.T) {
	now := time.Unix(1000, 0)
	inUse := 0
	var handshaking int64
	fleet := 19500
	p := &syncSpreader{burst: 100, tokens: 100, now: func() time.Time { return now }, serials: map[string]uint64{},
		fleet: func() int { return fleet }, busy: func() bool { return agentsBusy(inUse, 512, handshaking) }}
	p.running = true
	for i := range 2000 {
		p.add(fmt.Sprintf("a%04d", i), 1)
	}
	if got := p.take(); len(got) != 100 {
		t.Fatalf("burst: %d", len(got))
	}
	inUse = 300 // more than half of 512
	now = now.Add(10 * time.Millisecond)
	if got := p.take(); got == nil || len(got) != 0 || p.held != 1 {
		t.Fatalf("slots busy: %d sent (nil %v), held %d", len(got), got == nil, p.held)
	}
	inUse = 256 // half: not more
	now = now.Add(10 * time.Millisecond)
	// 20 ms at 9,750/s: 195 tokens, capped at the burst of 100.
	if got := p.take(); len(got) != 100 || got[0].agentID != "a0100" {
		t.Fatalf("slots free again: %d sent", len(got))
	}
	now = now.Add(10 * time.Millisecond)
	if got := p.take(); len(got) != 97 {
		t.Fatalf("10 ms at the rate of 19,500 agents: %d sent, want 97", len(got))
	}
	fleet = 100
	now = now.Add(10 * time.Millisecond)
	if got := p.take(); len(got) != 40 {
		t.Fatalf("10 ms at the minimum rate: %d sent, want 40", len(got))
	}
	handshaking = syncHandshakeHold + 1 // connections the agents told opened, still in their handshake
	now = now.Add(10 * time.Millisecond)
	if got := p.take(); len(got) != 0 || p.held != 2 {
		t.Fatalf("handshakes pending: %d sent, held %d", len(got), p.held)
	}
	handshaking = syncHandshakeHold
	now = now.Add(10 * time.Millisecond)
	if got := p.take(); len(got) != 80 {
		t.Fatalf("handshakes done: %d sent, want 80 (20 ms at 4,000/s)", len(got))
	}
}

// The server counts the HTTPS connections still in their TLS handshake
// (which hold the announcements back): a connection that has sent nothing
// counts until it is closed; one that made a request does not.
func TestConnsInHandshakeCounted(t *testing.T) {
	ts := startServer(t)
	u, err := url.Parse(ts.base)
	if err != nil {
		t.Fatal(err)
	}
	ts.do("GET", "/healthz", "", nil) // a request made: not in a handshake
	base := ts.s.handshakes.n.Load()
	c, err := net.Dial("tcp", u.Host)
	if err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(t, 5*time.Second, "the silent connection counted", func() bool { return ts.s.handshakes.n.Load() == base+1 })
	c.Close()
	testkit.WaitFor(t, 5*time.Second, "the closed connection uncounted", func() bool { return ts.s.handshakes.n.Load() == base })
}

// While the fleet's recompile is still saving, nothing is sent — for at
// most syncHoldMax after the first SyncNow was queued — and once it has
// saved the queue moves at once with the burst the wait gathered.
func TestSyncSpreaderHoldsWhileFleetCompiles(t *testing.T) {
	now := time.Unix(1000, 0)
	bulk := &bulkWrites{}
	p := &syncSpreader{rate: 1000, burst: 100, tokens: 100, now: func() time.Time { return now }, serials: map[string]uint64{},
		hold: func() bool { return bulk.UnderWay() != nil }}
	p.running = true
	end := bulk.begin()
	for i := range 500 {
		p.add(fmt.Sprintf("a%03d", i), 1)
	}
	for range 5 {
		now = now.Add(500 * time.Millisecond)
		if got := p.take(); got == nil || len(got) != 0 {
			t.Fatalf("recompile saving: %d sent", len(got))
		}
	}
	end()
	if got := p.take(); len(got) != 100 || got[0].agentID != "a000" {
		t.Fatalf("recompile saved: %d sent, want the burst of 100 from the first", len(got))
	}
	// A recompile that saves for longer than syncHoldMax is announced
	// while it goes on; the hold counts from when the queue last became
	// non-empty.
	p.queue, p.serials = nil, map[string]uint64{}
	end = bulk.begin()
	defer end()
	for i := range 500 {
		p.add(fmt.Sprintf("b%03d", i), 2)
	}
	now = now.Add(syncHoldMax - 10*time.Millisecond)
	if got := p.take(); len(got) != 0 {
		t.Fatalf("within syncHoldMax of the first queued: %d sent", len(got))
	}
	now = now.Add(10 * time.Millisecond)
	if got := p.take(); len(got) != 100 || got[0] != (pendingSync{"b000", 2}) {
		t.Fatalf("past syncHoldMax: %d sent, want the burst", len(got))
	}
}

// bulkWrites: nil when none is under way; the channel closes when the last
// one ends.
func TestBulkWritesUnderWay(t *testing.T) {
	var b bulkWrites
	if b.UnderWay() != nil {
		t.Fatal("under way before any began")
	}
	end1 := b.begin()
	ch := b.UnderWay()
	end2 := b.begin()
	if ch == nil || b.UnderWay() != ch {
		t.Fatal("a second bulk write gets another channel")
	}
	end1()
	select {
	case <-ch:
		t.Fatal("closed while one is still under way")
	default:
	}
	end2()
	select {
	case <-ch:
	default:
		t.Fatal("not closed when the last ended")
	}
	if b.UnderWay() != nil {
		t.Fatal("still under way")
	}
}

// The fleet's SyncNows wait for its recompile's save only when they do not
// carry manifests (each then sets off a poll); carried, each chunk is
// announced as soon as it is committed.
func TestSyncNowsHeldForTheSaveOnlyWithoutManifests(t *testing.T) {
	if ts := startServer(t); ts.s.syncs.hold != nil {
		t.Fatal("manifests carried on the stream (the default), yet the SyncNows wait for the save")
	}
	ts := startServer(t, func(c *Config) { c.GRPC.CarryManifestBytes = 0 })
	if ts.s.syncs.hold == nil {
		t.Fatal("grpc.carry_manifest_bytes 0: the SyncNows do not wait for the save")
	}
	end := ts.s.bulk.begin()
	if !ts.s.syncs.hold() {
		t.Fatal("a bulk save under way, yet hold says no")
	}
	end()
	if ts.s.syncs.hold() {
		t.Fatal("no bulk save under way, yet hold says yes")
	}
}
