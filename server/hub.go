package server

import (
	"context"
	"sync"
	"sync/atomic"

	agentpb "github.com/drover/drover/proto"
)

// hub tracks the live telemetry streams, at most one per agent, so that the
// server can push SyncNow and RunNow, and close an agent's stream when it
// is revoked, deleted, or its certificate retired. A new stream of the same
// identity (and machine) replaces the old one, which is closed.
type hub struct {
	mu    sync.Mutex
	conns map[string]*streamConn
}

// streamConn is one live AgentStream.
type streamConn struct {
	agentID string
	serial  string // of the client certificate the stream was opened with
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

func newHub() *hub { return &hub{conns: map[string]*streamConn{}} }

// add makes c the agent's live stream and closes the one it replaces.
func (h *hub) add(c *streamConn) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if old := h.conns[c.agentID]; old != nil && old != c {
		old.cancel(errReplaced)
	}
	h.conns[c.agentID] = c
}

// remove forgets c unless a newer stream replaced it.
func (h *hub) remove(c *streamConn) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.conns[c.agentID] == c {
		delete(h.conns, c.agentID)
	}
}

// current reports whether c is its agent's live stream.
func (h *hub) current(c *streamConn) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.conns[c.agentID] == c
}

// online reports whether the agent has a live stream.
func (h *hub) online(agentID string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.conns[agentID] != nil
}

// count is the number of live streams (one per agent).
func (h *hub) count() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.conns)
}

// send queues msg on the agent's live stream and reports whether there was
// one with room for it.
func (h *hub) send(agentID string, msg *agentpb.ServerMessage) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	c := h.conns[agentID]
	if c == nil {
		return false
	}
	select {
	case c.out <- msg:
		return true
	default:
		return false
	}
}

// close ends the agent's live stream with cause.
func (h *hub) close(agentID string, cause error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if c := h.conns[agentID]; c != nil {
		c.cancel(cause)
	}
}

// retire ends the agent's live stream unless it was opened with the
// certificate serial now current (a renewal was promoted).
func (h *hub) retire(agentID, serial string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if c := h.conns[agentID]; c != nil && c.serial != serial {
		c.cancel(errRetired)
	}
}

// closeAll ends every live stream (shutdown).
func (h *hub) closeAll(cause error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, c := range h.conns {
		c.cancel(cause)
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
