// Package stream is the agents' side of the gRPC telemetry stream
// (docs/design.md, "Telemetry stream"): the AgentStream service, the hub of
// live streams behind the Notifier interface through which the server
// pushes SyncNow, RunNow and CancelRun and closes streams, the validation
// of agent records, and the ingester that commits them in batches to a
// store.IngestStore and acknowledges them. The server's wiring creates it;
// handlers reach the hub through the server's fleet, which also signals
// the other replicas.
package stream

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	agentpb "github.com/drover/drover/proto"

	"github.com/drover/drover/server/errs"
	"github.com/drover/drover/server/store"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
)

// Causes with which the server ends a stream.
var (
	ErrDraining = errs.New(errs.ErrUnavailable, "the server is shutting down")
	ErrRevoked  = errs.New(errs.ErrAgentRevoked, "the agent was revoked")
	ErrReplaced = errs.New(errs.ErrUnavailable, "a newer stream of this agent replaced this one")
	ErrRetired  = errs.New(errs.ErrCertRefused, "the certificate was superseded by a renewal")
)

// Config bounds the streams.
type Config struct {
	MaxStreams     int           // live streams in all
	PendingStreams int           // streams of one agent waiting for their Hello
	HelloTimeout   time.Duration // for the first message
	MaxChunkBytes  int           // of one log chunk
	MaxRunningIDs  int           // run ids in one heartbeat
}

// Host is what a stream needs from the rest of the server: who the peer
// is, whether its certificate and machine still hold, the agent's quotas,
// and where refusals are counted and audited.
type Host interface {
	// Stopping reports whether the server is draining.
	Stopping() bool
	// AuthPeer identifies the agent behind a stream by its verified client
	// certificate, and returns the certificate's serial.
	AuthPeer(ctx context.Context) (agentID, serial string, err error)
	// CheckCertSerial re-checks that serial is still the agent's current
	// certificate and the agent not revoked.
	CheckCertSerial(ctx context.Context, agentID, serial string) error
	// CheckMachine binds or checks the machine id of a Hello.
	CheckMachine(ctx context.Context, agentID, machineID, source string) error
	// PipeSet returns a predicate for the pipes the agent may report.
	PipeSet(ctx context.Context, agentID string) func(string) bool
	// Throttle waits until the agent's quotas allow rec.
	Throttle(ctx context.Context, agentID string, rec *store.Record) error
	// Refused counts (and audits) a record or stream refused from an agent.
	Refused(agentID, reason, source string, err error)
	// PublishedSerial is the serial of the manifest published for the agent.
	PublishedSerial(ctx context.Context, agentID string) (uint64, error)
}

// Clock tells the time.
type Clock interface{ Now() time.Time }

// drainWait bounds how long a draining stream waits for its records in
// flight to commit before the server gives up on acknowledging them.
const drainWait = 5 * time.Second

// Service implements agentpb.AgentServer: the AgentStream of every agent.
type Service struct {
	agentpb.UnimplementedAgentServer
	cfg     Config
	host    Host
	hub     *Hub
	ingest  *Ingester
	clock   Clock
	log     *slog.Logger
	streams atomic.Int64
	nudges  atomic.Uint64 // SyncNows sent to agents their heartbeats showed behind

	pendingMu sync.Mutex
	pending   map[string]int // per agent: streams waiting for their Hello
}

// NewService returns the stream service over hub and ingester.
func NewService(cfg Config, host Host, hub *Hub, ingest *Ingester, clock Clock, log *slog.Logger) *Service {
	return &Service{cfg: cfg, host: host, hub: hub, ingest: ingest, clock: clock, log: log, pending: map[string]int{}}
}

// Streams is the number of streams being served.
func (g *Service) Streams() int64 { return g.streams.Load() }

// Nudges is the number of SyncNows sent because an agent's heartbeats
// showed it behind its published manifest (see nudge): announcements the
// stream lost, ever.
func (g *Service) Nudges() uint64 { return g.nudges.Load() }

// beginHello counts a stream of the agent waiting for its Hello, unless as
// many as allowed already wait.
func (g *Service) beginHello(agentID string) bool {
	g.pendingMu.Lock()
	defer g.pendingMu.Unlock()
	if g.pending[agentID] >= g.cfg.PendingStreams {
		return false
	}
	g.pending[agentID]++
	return true
}

func (g *Service) endHello(agentID string) {
	g.pendingMu.Lock()
	defer g.pendingMu.Unlock()
	if g.pending[agentID]--; g.pending[agentID] <= 0 {
		delete(g.pending, agentID)
	}
}

// AgentStream serves one agent's stream. The agent is the one named by the
// verified client certificate; no message field can change that. The first
// message must be a Hello, within the hello timeout: its machine id must be
// the one bound to the identity (identity_conflict otherwise), and the
// stream then replaces the agent's live one.
func (g *Service) AgentStream(stream agentpb.Agent_AgentStreamServer) error {
	if g.host.Stopping() {
		return errs.GRPC(ErrDraining)
	}
	ctx := stream.Context()
	agentID, serial, err := g.host.AuthPeer(ctx)
	if err != nil {
		return errs.GRPC(err)
	}
	if n := g.streams.Add(1); n > int64(g.cfg.MaxStreams) {
		g.streams.Add(-1)
		return status.Error(codes.ResourceExhausted, "too many streams")
	}
	defer g.streams.Add(-1)
	if !g.beginHello(agentID) {
		g.host.Refused(agentID, "pending_streams", "", nil)
		return status.Error(codes.ResourceExhausted, "too many streams of this agent are opening at once")
	}
	first, err := recvHello(stream, g.cfg.HelloTimeout)
	g.endHello(agentID)
	if err != nil {
		return err
	}
	log := g.log.With("agent", agentID)
	// The certificate may have been revoked or retired while the Hello
	// was on its way.
	if err := g.host.CheckCertSerial(ctx, agentID, serial); err != nil {
		return errs.GRPC(err)
	}
	if err := g.host.CheckMachine(ctx, agentID, first.GetHello().GetMachineId(), PeerAddr(ctx)); err != nil {
		log.Warn("stream refused", "err", err)
		return errs.GRPC(err)
	}

	cctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	conn := &streamConn{agentID: agentID, serial: serial, opened: g.clock.Now(), ctx: cctx, cancel: cancel, out: make(chan *agentpb.ServerMessage, 16), kick: make(chan struct{}, 1)}
	g.hub.add(conn)
	defer g.hub.remove(conn)
	log.Debug("stream opened")

	recvDone := make(chan error, 1)
	go func() { recvDone <- g.recvLoop(conn, stream, first, log) }()

	var lastAck uint64
	sendAck := func() error {
		if c := conn.committed.Load(); c > lastAck {
			if err := stream.Send(&agentpb.ServerMessage{Body: &agentpb.ServerMessage_Ack{Ack: &agentpb.Ack{Seq: c}}}); err != nil {
				return err
			}
			lastAck = c
		}
		return nil
	}
	// finish waits for the records in flight, sends the last Ack, and ends
	// the stream with err.
	finish := func(err error) error {
		conn.draining.Store(true)
		deadline := time.Now().Add(drainWait)
		for conn.inflight.Load() > 0 && time.Now().Before(deadline) {
			time.Sleep(2 * time.Millisecond)
		}
		if sendErr := sendAck(); sendErr != nil {
			return nil
		}
		return err
	}
	for {
		select {
		case <-conn.kick:
			if err := sendAck(); err != nil {
				return nil
			}
		case msg := <-conn.out:
			if err := stream.Send(msg); err != nil {
				return nil
			}
		case err := <-recvDone:
			if cctx.Err() != nil {
				return g.ended(cctx, finish)
			}
			switch {
			case errors.Is(err, io.EOF):
				return finish(nil) // the agent closed its side
			case status.Code(err) == codes.Canceled || errors.Is(err, context.Canceled):
				return nil
			case err != nil:
				log.Info("stream ended", "err", err)
				return finish(err)
			}
			return nil
		case <-cctx.Done():
			return g.ended(cctx, finish)
		}
	}
}

// recvHello reads the stream's first message, which must be a Hello sent
// within timeout.
func recvHello(stream agentpb.Agent_AgentStreamServer, timeout time.Duration) (*agentpb.AgentMessage, error) {
	type res struct {
		m   *agentpb.AgentMessage
		err error
	}
	ch := make(chan res, 1)
	go func() {
		m, err := stream.Recv()
		ch <- res{m, err}
	}()
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case r := <-ch:
		if r.err != nil {
			return nil, r.err
		}
		if r.m.GetHello() == nil {
			return nil, status.Error(codes.InvalidArgument, "the first message must be Hello")
		}
		return r.m, nil
	case <-t.C:
		// Returning ends the stream, which ends the Recv above.
		return nil, status.Errorf(codes.DeadlineExceeded, "no Hello within %s", timeout)
	}
}

// ended returns how a stream whose context was cancelled ends: drained on
// shutdown or replacement, with the cause's code on revocation, retirement
// or a store failure, quietly when the agent went away.
func (g *Service) ended(cctx context.Context, finish func(error) error) error {
	cause := context.Cause(cctx)
	switch {
	case errors.Is(cause, ErrDraining), errors.Is(cause, ErrReplaced):
		return finish(errs.GRPC(cause))
	case errors.Is(cause, context.Canceled), errors.Is(cause, context.DeadlineExceeded):
		return nil
	}
	return errs.GRPC(cause)
}

// recvLoop hands the Hello and then every message the agent sends to the
// ingester, after validating it and waiting for the agent's quotas. It
// returns io.EOF when the agent closes its side.
func (g *Service) recvLoop(conn *streamConn, stream agentpb.Agent_AgentStreamServer, first *agentpb.AgentMessage, log *slog.Logger) error {
	var lastSeq uint64
	var lag laggard
	msg := first
	for {
		if msg == nil {
			var err error
			if msg, err = stream.Recv(); err != nil {
				return err
			}
		}
		now := g.clock.Now()
		durable := false
		switch msg.GetBody().(type) {
		case *agentpb.AgentMessage_ManifestStatus, *agentpb.AgentMessage_RunStarted, *agentpb.AgentMessage_LogChunk, *agentpb.AgentMessage_RunFinished:
			durable = true
		case *agentpb.AgentMessage_Hello, *agentpb.AgentMessage_Heartbeat:
		default:
			return status.Error(codes.InvalidArgument, "unknown message")
		}
		seq := msg.GetSeq()
		if durable {
			if seq <= lastSeq {
				return status.Errorf(codes.InvalidArgument, "seq %d does not increase (last %d)", seq, lastSeq)
			}
			lastSeq = seq
		} else {
			seq = 0
		}
		rules := recordRules{maxChunk: g.cfg.MaxChunkBytes, maxRunning: g.cfg.MaxRunningIDs, pipeKnown: g.host.PipeSet(conn.ctx, conn.agentID)}
		rec, reason, verr := toRecord(conn.agentID, msg, now, rules)
		if verr != nil {
			// Acknowledged and dropped, so that the agent's outbox does not
			// resend it for ever; counted and audited.
			g.host.Refused(conn.agentID, reason, PeerAddr(conn.ctx), verr)
			rec = nil
		} else if err := g.host.Throttle(conn.ctx, conn.agentID, rec); err != nil {
			return err
		}
		if rec != nil && rec.Settle != nil && !g.hub.current(conn) {
			rec.Settle = nil // a replaced stream speaks for nothing
		}
		conn.inflight.Add(1)
		if conn.draining.Load() {
			conn.inflight.Add(-1)
			msg = nil
			continue // not acknowledged: the agent resends it
		}
		select {
		case g.ingest.in <- ingestItem{rec: rec, conn: conn, seq: seq}:
		case <-conn.ctx.Done():
			conn.inflight.Add(-1)
			return conn.ctx.Err()
		}
		if h := msg.GetHello(); h != nil {
			g.syncIfBehind(conn, h.GetManifestSerial())
		} else if hb := msg.GetHeartbeat(); hb != nil && verr == nil {
			g.nudge(conn, &lag, hb.GetManifestSerial())
		}
		msg = nil
	}
}

// ValidMachineID: 32 hex digits, as /etc/machine-id holds.
func ValidMachineID(s string) bool {
	if len(s) != 32 {
		return false
	}
	for _, c := range s {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F') {
			return false
		}
	}
	return true
}

// PeerAddr is the host of a stream's peer.
func PeerAddr(ctx context.Context) string {
	if p, ok := peer.FromContext(ctx); ok && p.Addr != nil {
		if host, _, err := net.SplitHostPort(p.Addr.String()); err == nil {
			return host
		}
		return p.Addr.String()
	}
	return ""
}

// syncIfBehind sends SyncNow (with the manifest, as the hub attaches it)
// when the agent's last accepted manifest is older than the one published
// for it.
func (g *Service) syncIfBehind(conn *streamConn, accepted uint64) {
	if serial := g.publishedAhead(conn, accepted); serial > 0 {
		g.offerSync(conn, serial)
	}
}

// publishedAhead is the serial published for the agent when it is newer
// than accepted, else 0.
func (g *Service) publishedAhead(conn *streamConn, accepted uint64) uint64 {
	serial, err := g.host.PublishedSerial(conn.ctx, conn.agentID)
	if err != nil || serial <= accepted {
		return 0
	}
	return serial
}

// offerSync queues a SyncNow for serial on the stream unless its queue is
// full, and says whether it did.
func (g *Service) offerSync(conn *streamConn, serial uint64) bool {
	select {
	case conn.out <- g.hub.syncNow(conn.ctx, conn.agentID, serial):
		return true
	default:
		return false
	}
}

// laggard is what one stream's heartbeats said about the agent's manifest.
type laggard struct {
	behind uint64    // the published serial the last heartbeat was behind (0: it was not)
	since  time.Time // when a heartbeat first showed it behind that serial
	nudged uint64    // the published serial a SyncNow was sent for
}

// NudgeAfter is how long heartbeats must show an agent behind the same
// serial before it is nudged: longer than the spread delays announcements
// (its window and its holds, seconds) and than an agent takes to fetch a
// change's payloads, shorter than drover-agent's 30 s heartbeat interval.
const NudgeAfter = 20 * time.Second

// nudge sends the agent a SyncNow when heartbeats in a row, at least
// NudgeAfter apart, show it behind the same published serial, once per
// serial. Every change is announced by a SyncNow, some seconds late by
// design (the spread), so one heartbeat behind is normal; two, a heartbeat
// interval apart, mean the announcement was lost (the stream's send queue
// was full). Heartbeats arrive spread over their interval, so nudges after
// a fleet-wide loss are spread too. An agent that rejects the manifest is
// nudged once; its polls retry. A heartbeat without a serial (no manifest
// accepted yet, or an agent that does not report it) is left to the Hello
// and the polls.
func (g *Service) nudge(conn *streamConn, lag *laggard, accepted uint64) {
	if accepted == 0 {
		lag.behind = 0
		return
	}
	serial := g.publishedAhead(conn, accepted)
	if serial == 0 {
		lag.behind = 0
		return
	}
	now := g.clock.Now()
	if lag.behind != serial {
		lag.behind, lag.since = serial, now
		return
	}
	if lag.nudged == serial || now.Sub(lag.since) < NudgeAfter {
		return
	}
	if g.offerSync(conn, serial) { // else the queue is full: the next heartbeat tries again
		lag.nudged = serial
		g.nudges.Add(1)
	}
}
