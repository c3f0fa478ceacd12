package stream

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	agentpb "github.com/drover/drover/proto"
)

// Notifier is how the rest of the server reaches the live streams of this
// process: commands to push and streams to close. Hub implements it; the
// server's fleet (server/signals.go) wraps it to reach the streams other
// replicas hold, over the signal bus.
type Notifier interface {
	// SyncNow tells the agent that manifest serial is out.
	SyncNow(agentID string, serial uint64) bool
	// RunNow asks the agent to run a pipe now.
	RunNow(agentID, pipe, requestID string) bool
	// Cancel asks the agent to cancel a run.
	Cancel(agentID, runID string) bool
	// Online reports whether the agent has a live stream.
	Online(agentID string) bool
	// Close ends the agent's live stream with cause (revoked, deleted).
	Close(agentID string, cause error)
	// Retire ends the agent's live stream unless it was opened with the
	// certificate serial now current.
	Retire(agentID, serial string)
}

var _ Notifier = (*Hub)(nil)

// Hub tracks the live telemetry streams, at most one per agent, so that the
// server can push SyncNow and RunNow, and close an agent's stream when it
// is revoked, deleted, or its certificate retired. A new stream of the same
// identity (and machine) replaces the old one, which is closed.
type Hub struct {
	mu    sync.Mutex
	conns map[string]*streamConn
	// manifests, if set, gives the manifest a SyncNow carries.
	manifests  ManifestSource
	maxCarried int // the largest manifest carried (CarryManifests)
	carried    syncNowCounters
	// watch, if set, is told each time an agent's live stream opens
	// (open) or ends without a replacement, in order; it is called with
	// the hub's lock held and must not block.
	watch func(agentID string, open bool)
}

// Live is one live stream: the agent and the serial of the certificate it
// was opened with.
type Live struct {
	AgentID, Serial string
}

// streamConn is one live AgentStream.
type streamConn struct {
	agentID string
	serial  string // of the client certificate the stream was opened with
	opened  time.Time
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

// ManifestSource returns the manifest published for an agent as a SyncNow
// carries it: the exact envelope, ETag and serial the agent's manifest GET
// answers with. The server's is its manifest cache (read through to the
// store).
type ManifestSource func(ctx context.Context, agentID string) (*Published, error)

// Published is an agent's published manifest: Envelope is the stored
// signed bytes, never re-serialised.
type Published struct {
	Envelope []byte
	ETag     string
	Serial   uint64
}

// manifestLookupTimeout bounds one ManifestSource call (a store read when
// the cache does not hold the agent's manifest).
const manifestLookupTimeout = 2 * time.Second

// SyncNowCounts counts the SyncNows sent, by what they carried.
type SyncNowCounts struct {
	// Manifest: the manifest went with the announcement.
	Manifest uint64
	// TooLarge: the envelope was larger than MaxSyncNowManifestBytes.
	TooLarge uint64
	// Behind: the manifest at hand was older than the serial announced
	// (another replica's save not seen here yet).
	Behind uint64
	// Unavailable: no manifest source, or it failed.
	Unavailable uint64
}

type syncNowCounters struct{ manifest, tooLarge, behind, unavailable atomic.Uint64 }

// NewHub returns a hub with no streams.
func NewHub() *Hub { return &Hub{conns: map[string]*streamConn{}} }

// CarryManifests makes every SyncNow carry the agent's manifest from src
// when it is at most maxBytes (and agentpb.MaxSyncNowManifestBytes) and
// not older than the serial announced (before any stream is served).
func (h *Hub) CarryManifests(src ManifestSource, maxBytes int) {
	h.manifests, h.maxCarried = src, min(maxBytes, agentpb.MaxSyncNowManifestBytes)
}

// SyncNowCounts reports the SyncNows sent so far by what they carried.
func (h *Hub) SyncNowCounts() SyncNowCounts {
	return SyncNowCounts{Manifest: h.carried.manifest.Load(), TooLarge: h.carried.tooLarge.Load(),
		Behind: h.carried.behind.Load(), Unavailable: h.carried.unavailable.Load()}
}

// Watch sets the function told of streams opening and ending (before any
// stream is served).
func (h *Hub) Watch(fn func(agentID string, open bool)) { h.watch = fn }

// add makes c the agent's live stream and closes the one it replaces.
func (h *Hub) add(c *streamConn) {
	h.mu.Lock()
	if old := h.conns[c.agentID]; old != nil && old != c {
		old.cancel(ErrReplaced)
	}
	h.conns[c.agentID] = c
	if h.watch != nil {
		h.watch(c.agentID, true)
	}
	h.mu.Unlock()
}

// remove forgets c unless a newer stream replaced it.
func (h *Hub) remove(c *streamConn) {
	h.mu.Lock()
	if h.conns[c.agentID] == c {
		delete(h.conns, c.agentID)
		if h.watch != nil {
			h.watch(c.agentID, false)
		}
	}
	h.mu.Unlock()
}

// List returns the live streams.
func (h *Hub) List() []Live {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make([]Live, 0, len(h.conns))
	for id, c := range h.conns {
		out = append(out, Live{AgentID: id, Serial: c.serial})
	}
	return out
}

// current reports whether c is its agent's live stream.
func (h *Hub) current(c *streamConn) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.conns[c.agentID] == c
}

// Online reports whether the agent has a live stream.
func (h *Hub) Online(agentID string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.conns[agentID] != nil
}

// Count is the number of live streams (one per agent).
func (h *Hub) Count() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.conns)
}

// SyncNow queues a SyncNow for serial, carrying the agent's manifest when
// it can (CarryManifests); it reports whether the agent had a live stream
// with room for it. The manifest is looked up only for an agent whose
// stream is here.
func (h *Hub) SyncNow(agentID string, serial uint64) bool {
	if !h.Online(agentID) {
		return false
	}
	return h.send(agentID, h.syncNow(context.Background(), agentID, serial))
}

// RunNow queues a RunNow of pipe.
func (h *Hub) RunNow(agentID, pipe, requestID string) bool {
	return h.send(agentID, &agentpb.ServerMessage{Body: &agentpb.ServerMessage_RunNow{RunNow: &agentpb.RunNow{Pipe: pipe, RequestId: requestID}}})
}

// Cancel queues a CancelRun of runID.
func (h *Hub) Cancel(agentID, runID string) bool {
	return h.send(agentID, &agentpb.ServerMessage{Body: &agentpb.ServerMessage_CancelRun{CancelRun: &agentpb.CancelRun{RunId: runID}}})
}

// syncNow builds the SyncNow announcing serial: with the agent's
// published manifest when the source has one at least that new and no
// larger than the bound, else alone (the agent polls).
func (h *Hub) syncNow(ctx context.Context, agentID string, serial uint64) *agentpb.ServerMessage {
	sn := &agentpb.SyncNow{Serial: serial}
	msg := &agentpb.ServerMessage{Body: &agentpb.ServerMessage_SyncNow{SyncNow: sn}}
	if h.manifests == nil {
		h.carried.unavailable.Add(1)
		return msg
	}
	ctx, cancel := context.WithTimeout(ctx, manifestLookupTimeout)
	defer cancel()
	p, err := h.manifests(ctx, agentID)
	switch {
	case err != nil || p == nil || len(p.Envelope) == 0:
		h.carried.unavailable.Add(1)
	case p.Serial < serial:
		h.carried.behind.Add(1)
	case len(p.Envelope) > h.maxCarried || len(p.ETag) > agentpb.MaxSyncNowManifestETag:
		h.carried.tooLarge.Add(1)
	default:
		sn.Manifest, sn.ManifestEtag, sn.ManifestSerial = p.Envelope, p.ETag, p.Serial
		h.carried.manifest.Add(1)
	}
	return msg
}

// send queues msg on the agent's live stream and reports whether there was
// one with room for it.
func (h *Hub) send(agentID string, msg *agentpb.ServerMessage) bool {
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

// Close ends the agent's live stream with cause.
func (h *Hub) Close(agentID string, cause error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if c := h.conns[agentID]; c != nil {
		c.cancel(cause)
	}
}

// Retire ends the agent's live stream unless it was opened with the
// certificate serial now current (a renewal was promoted).
func (h *Hub) Retire(agentID, serial string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if c := h.conns[agentID]; c != nil && c.serial != serial {
		c.cancel(ErrRetired)
	}
}

// Replaced ends the agent's live stream if it was opened before t: the
// agent opened a newer one on another replica.
func (h *Hub) Replaced(agentID string, t time.Time) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if c := h.conns[agentID]; c != nil && c.opened.Before(t) {
		c.cancel(ErrReplaced)
		return true
	}
	return false
}

// CloseAll ends every live stream (shutdown).
func (h *Hub) CloseAll(cause error) {
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
