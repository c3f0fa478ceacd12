package server

import (
	"fmt"
	"sync"
	"testing"
	"time"
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
	p := newSyncSpreader(func(id string, serial uint64) bool {
		mu.Lock()
		defer mu.Unlock()
		got[id] = serial
		if sends++; sends == 300 {
			close(done)
		}
		return true
	}, 5000, 100)
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
