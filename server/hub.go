package server

import (
	"context"
	"sync"
	"sync/atomic"

	agentpb "github.com/drover/drover/proto"
)

// hub tracks the live telemetry streams, one or more per agent, so that the
// server can push SyncNow and RunNow, and close an agent's streams when it
// is revoked.
type hub struct {
	mu    sync.Mutex
	conns map[string]map[*streamConn]struct{}
}

// streamConn is one live AgentStream.
type streamConn struct {
	agentID string
	ctx     context.Context
	cancel  context.CancelCauseFunc
	// out carries commands to the stream's sender; when it is full a
	// command is dropped (SyncNow: the agent also polls).
	out chan *agentpb.ServerMessage
	// committed is the highest seq committed for this stream; kick wakes
	// the sender to send an Ack for it.
	committed atomic.Uint64
	kick      chan struct{}
	// inflight counts records handed to the ingester and not yet
	// committed; once draining is set no more are handed over.
	inflight atomic.Int64
	draining atomic.Bool
}

func newHub() *hub { return &hub{conns: map[string]map[*streamConn]struct{}{}} }

func (h *hub) add(c *streamConn) {
	h.mu.Lock()
	defer h.mu.Unlock()
	set := h.conns[c.agentID]
	if set == nil {
		set = map[*streamConn]struct{}{}
		h.conns[c.agentID] = set
	}
	set[c] = struct{}{}
}

func (h *hub) remove(c *streamConn) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if set := h.conns[c.agentID]; set != nil {
		delete(set, c)
		if len(set) == 0 {
			delete(h.conns, c.agentID)
		}
	}
}

// online reports whether the agent has a live stream.
func (h *hub) online(agentID string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.conns[agentID]) > 0
}

// send queues msg on every live stream of the agent and reports whether
// there was one.
func (h *hub) send(agentID string, msg *agentpb.ServerMessage) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	sent := false
	for c := range h.conns[agentID] {
		select {
		case c.out <- msg:
			sent = true
		default:
		}
	}
	return sent
}

// close ends every live stream of the agent with cause.
func (h *hub) close(agentID string, cause error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for c := range h.conns[agentID] {
		c.cancel(cause)
	}
}

// closeAll ends every live stream (shutdown).
func (h *hub) closeAll(cause error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, set := range h.conns {
		for c := range set {
			c.cancel(cause)
		}
	}
}

// acked records that every record up to seq on c is committed.
func (c *streamConn) acked(seq uint64) {
	for {
		cur := c.committed.Load()
		if seq <= cur || c.committed.CompareAndSwap(cur, seq) {
			break
		}
	}
	select {
	case c.kick <- struct{}{}:
	default:
	}
}
