package server

import (
	"sync"
	"time"
)

// A recompile that changes the manifests of a whole fleet commits them in
// chunks of saveChunk; telling every agent of a chunk at once sets off
// thousands of manifest polls and payload fetches in the same millisecond
// (a thundering herd that fills the agents' request pool). syncSpreader
// queues the SyncNows instead and sends them at syncRate per second after
// a first syncBurst, so a change to n agents is announced over about
// n/syncRate seconds: the window grows with the fleet, and the agents'
// fetches arrive at a pace the server serves without queueing. A small
// change (one agent's enrollment, a few agents' tags) goes out at once.
const (
	syncRate  = 4000
	syncBurst = 500
	// syncTick is how often the queue is drained while it is not empty.
	syncTick = 10 * time.Millisecond
)

// syncSpreader paces SyncNow messages; send is the hub's SyncNow.
type syncSpreader struct {
	send        func(agentID string, serial uint64) bool
	rate, burst float64
	now         func() time.Time

	mu      sync.Mutex
	queue   []string          // agents in announcement order
	serials map[string]uint64 // the latest serial queued per agent
	tokens  float64
	last    time.Time
	running bool
}

func newSyncSpreader(send func(string, uint64) bool, rate, burst int) *syncSpreader {
	return &syncSpreader{send: send, rate: float64(rate), burst: float64(burst), tokens: float64(burst),
		now: time.Now, serials: map[string]uint64{}}
}

// add queues a SyncNow of serial for the agent; a queued one for an older
// serial is replaced in its place.
func (p *syncSpreader) add(agentID string, serial uint64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if old, ok := p.serials[agentID]; ok {
		p.serials[agentID] = max(old, serial)
		return
	}
	p.serials[agentID] = serial
	p.queue = append(p.queue, agentID)
	if !p.running {
		p.running = true
		go p.drain()
	}
}

// drain sends what the bucket allows, every syncTick, until the queue is
// empty.
func (p *syncSpreader) drain() {
	for {
		batch := p.take()
		for _, s := range batch {
			p.send(s.agentID, s.serial)
		}
		if batch == nil {
			return
		}
		time.Sleep(syncTick)
	}
}

type pendingSync struct {
	agentID string
	serial  uint64
}

// take removes from the queue what may be sent now; nil (and the drainer
// stops) when the queue is empty.
func (p *syncSpreader) take() []pendingSync {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.queue) == 0 {
		p.running = false
		p.queue = nil
		return nil
	}
	now := p.now()
	if !p.last.IsZero() {
		p.tokens = min(p.burst, p.tokens+now.Sub(p.last).Seconds()*p.rate)
	}
	p.last = now
	n := min(len(p.queue), int(p.tokens))
	out := make([]pendingSync, n)
	for i, id := range p.queue[:n] {
		out[i] = pendingSync{id, p.serials[id]}
		delete(p.serials, id)
	}
	p.queue = p.queue[n:]
	p.tokens -= float64(n)
	return out
}

// pending is how many SyncNows are queued.
func (p *syncSpreader) pending() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.queue)
}
