package server

import (
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// A recompile that changes the manifests of a whole fleet commits them in
// chunks of saveChunk; telling every agent of a chunk at once sets off
// thousands of manifest polls and payload fetches in the same millisecond
// (a thundering herd that fills the agents' request pool). syncSpreader
// queues the SyncNows instead and sends them from a token bucket after a
// first syncBurst, at a rate sized to the fleet: the connected agents over
// syncWindow, so that a change to the whole fleet is announced in about
// syncWindow whatever its size, and never slower than syncMinRate (a
// small fleet is told at once) nor faster than syncMaxRate. What the
// server can serve bounds it too: while the agents' request slots
// (http.agent_max_concurrent) are more than syncBusyFraction in use, or
// more than syncHandshakeHold new HTTPS connections are still in their TLS
// handshake (agents that close their idle poll connection open one per
// change), no SyncNow goes out — the agents already told are still being
// served, and telling more would only queue them (or, past the server's
// header timeout, drop their connections). A small change (one agent's
// enrollment, a few agents' tags) goes out at once.
//
// When SyncNows do not carry manifests (grpc.carry_manifest_bytes 0),
// nothing goes out either while the fleet's recompile is still saving
// (hold), for up to syncHoldMax after the first SyncNow was queued: each
// announcement then sets off a manifest poll, whose handshakes and the
// agents' answers would take the two cores the recompile needs (at 10,000
// agents its goroutine waited 1.7 s of its 2.9 s for the Go scheduler);
// held, the recompile took 0.9 s and the last agent had the change 0.2-0.8
// s sooner. With the manifest on the stream a SyncNow costs a message on a
// stream already open, and announcing each chunk as soon as it is saved is
// the faster: at 19,500 agents the last agent had a change 5.4-5.7 s after
// the PUT's start instead of 5.4-10.2 s held, though the recompile took
// longer (4.2 s instead of 2.5-3.7 s).
const (
	syncHoldMax = 3 * time.Second
	syncWindow  = 2 * time.Second
	syncMinRate = 4000
	syncMaxRate = 20000
	syncBurst   = 500
	// syncBusyFraction of the agents' request slots in use holds the queue,
	// as do syncHandshakeHold connections in their handshake.
	syncBusyFraction  = 0.5
	syncHandshakeHold = 256
	// syncTick is how often the queue is drained while it is not empty.
	syncTick = 10 * time.Millisecond
)

// syncRate is the announcement rate for a fleet of n connected agents.
func syncRate(n int) float64 {
	return min(syncMaxRate, max(syncMinRate, float64(n)/syncWindow.Seconds()))
}

// syncSpreader paces SyncNow messages; send is the fleet's SyncNow.
type syncSpreader struct {
	send  func(agentID string, serial uint64)
	burst float64
	// rate is the current rate (per second); fleet, when set, sizes it
	// (syncRate of the connected agents) at each take.
	rate  float64
	fleet func() int
	// busy, when set, reports whether the server is still serving the
	// agents already told (agentsBusy); while it is, take holds.
	busy func() bool
	// hold, when set, reports the fleet's recompile still saving; take
	// holds while it does, up to syncHoldMax after since.
	hold func() bool
	now  func() time.Time
	log  *slog.Logger // nil: nothing logged

	mu      sync.Mutex
	queue   []string          // agents in announcement order
	serials map[string]uint64 // the latest serial queued per agent
	tokens  float64
	last    time.Time
	since   time.Time // when the queue last became non-empty
	running bool
	held    int // takes held because the slots were busy (for tests and the log)
}

// agentsBusy: more than syncBusyFraction of the agents' request slots in
// use, or more than syncHandshakeHold connections in their handshake.
func agentsBusy(inUse, slots int, handshaking int64) bool {
	return slots > 0 && float64(inUse) > syncBusyFraction*float64(slots) || handshaking > syncHandshakeHold
}

// newSyncSpreader paces send by the fleet's size (fleet) and what the
// server is still serving (busy); either may be nil (a fixed syncMinRate,
// no hold).
func newSyncSpreader(send func(string, uint64), fleet func() int, busy func() bool) *syncSpreader {
	return &syncSpreader{send: send, rate: syncMinRate, burst: syncBurst, tokens: syncBurst, fleet: fleet, busy: busy,
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
	if len(p.queue) == 0 {
		p.since = p.now()
	}
	p.queue = append(p.queue, agentID)
	if !p.running {
		p.running = true
		go p.drain()
	}
}

// drain sends what the bucket allows, every syncTick, until the queue is
// empty.
func (p *syncSpreader) drain() {
	start, sent, held := time.Now(), 0, p.heldCount()
	for {
		batch := p.take()
		for _, s := range batch {
			p.send(s.agentID, s.serial)
		}
		sent += len(batch)
		if batch == nil {
			if p.log != nil && sent > syncBurst {
				p.log.Debug("SyncNows sent", "agents", sent, "took", time.Since(start), "held_ticks", p.heldCount()-held)
			}
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
	if p.fleet != nil {
		p.rate = syncRate(p.fleet())
	}
	if !p.last.IsZero() {
		p.tokens = min(p.burst, p.tokens+now.Sub(p.last).Seconds()*p.rate)
	}
	p.last = now
	if p.busy != nil && p.busy() || p.hold != nil && now.Sub(p.since) < syncHoldMax && p.hold() {
		p.held++
		return []pendingSync{}
	}
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

func (p *syncSpreader) heldCount() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.held
}

// pending is how many SyncNows are queued.
func (p *syncSpreader) pending() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.queue)
}

// connsInHandshake counts the HTTPS connections accepted and not yet
// serving their first request — for TLS, those still in their handshake
// (http.Server.ConnState: StateNew until the first request's bytes).
type connsInHandshake struct {
	n   atomic.Int64
	new sync.Map // net.Conn -> struct{}, while StateNew
}

func (c *connsInHandshake) track(conn net.Conn, st http.ConnState) {
	if st == http.StateNew {
		c.new.Store(conn, struct{}{})
		c.n.Add(1)
		return
	}
	if _, ok := c.new.LoadAndDelete(conn); ok {
		c.n.Add(-1)
	}
}
