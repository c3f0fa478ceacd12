package server

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	agentpb "github.com/drover/drover/proto"
)

// Causes with which the server ends a stream.
var (
	errDraining = newError(ErrUnavailable, "the server is shutting down")
	errRevoked  = newError(ErrAgentRevoked, "the agent was revoked")
)

// drainWait bounds how long a draining stream waits for its records in
// flight to commit before the server gives up on acknowledging them.
const drainWait = 5 * time.Second

// ingestItem is one record on its way to the database. A nil rec is a
// record that was refused as invalid: it is acknowledged in order with the
// others so that the agent does not resend it forever.
type ingestItem struct {
	rec  *Record
	conn *streamConn
	seq  uint64 // 0: nothing to acknowledge
}

// ingester commits records from every stream in batched transactions: while
// one transaction commits, the next batch gathers, so the commit rate adapts
// to the load. Acks are sent only after the commit, in seq order per stream.
type ingester struct {
	store ingestStore
	in    chan ingestItem
	batch int
	lim   IngestLimits
	log   *slog.Logger
	quit  chan struct{}
	done  chan struct{}
	// onCommit, if set, is called with every committed batch.
	onCommit func([]*Record)
}

func newIngester(store ingestStore, batch int, lim IngestLimits, log *slog.Logger) *ingester {
	return &ingester{store: store, in: make(chan ingestItem, 4*batch), batch: batch, lim: lim, log: log,
		quit: make(chan struct{}), done: make(chan struct{})}
}

// run commits batches until stop is called, then commits what is queued.
func (g *ingester) run() {
	defer close(g.done)
	items := make([]ingestItem, 0, g.batch)
	for {
		select {
		case it := <-g.in:
			g.commit(g.gather(append(items[:0], it)))
		case <-g.quit:
			for {
				batch := g.gather(items[:0])
				if len(batch) == 0 {
					return
				}
				g.commit(batch)
			}
		}
	}
}

// stop ends run after the queued records are committed.
func (g *ingester) stop() {
	close(g.quit)
	<-g.done
}

// gather adds whatever is queued, up to a batch, without waiting.
func (g *ingester) gather(items []ingestItem) []ingestItem {
	for len(items) < g.batch {
		select {
		case it := <-g.in:
			items = append(items, it)
		default:
			return items
		}
	}
	return items
}

func (g *ingester) commit(items []ingestItem) {
	recs := make([]*Record, 0, len(items))
	for _, it := range items {
		if it.rec != nil {
			recs = append(recs, it.rec)
		}
	}
	err := g.store.ApplyRecords(context.Background(), recs, g.lim)
	if err != nil {
		// Nothing of the batch is acknowledged; the streams are closed so
		// that their agents reconnect and replay.
		g.log.Error("committing agent records failed", "records", len(recs), "err", err)
	} else if g.onCommit != nil {
		g.onCommit(recs)
	}
	for _, it := range items {
		if err != nil {
			it.conn.cancel(newError(ErrUnavailable, "the server could not store records; reconnect and resend"))
		} else if it.seq > 0 {
			it.conn.acked(it.seq)
		}
		it.conn.inflight.Add(-1)
	}
}

// streamService implements agentpb.AgentServer.
type streamService struct {
	agentpb.UnimplementedAgentServer
	s       *Server
	streams atomic.Int64
}

// AgentStream serves one agent's stream. The agent is the one named by the
// verified client certificate; no message field can change that.
func (g *streamService) AgentStream(stream agentpb.Agent_AgentStreamServer) error {
	s := g.s
	if s.stopping.Load() {
		return grpcError(errDraining)
	}
	ctx := stream.Context()
	agentID, err := s.authPeer(ctx)
	if err != nil {
		return grpcError(err)
	}
	if n := g.streams.Add(1); n > int64(s.cfg.GRPC.MaxStreams) {
		g.streams.Add(-1)
		return status.Error(codes.ResourceExhausted, "too many streams")
	}
	defer g.streams.Add(-1)

	cctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	conn := &streamConn{agentID: agentID, ctx: cctx, cancel: cancel, out: make(chan *agentpb.ServerMessage, 16), kick: make(chan struct{}, 1)}
	s.hub.add(conn)
	defer s.hub.remove(conn)
	log := s.log.With("agent", agentID)
	log.Debug("stream opened")

	recvDone := make(chan error, 1)
	go func() { recvDone <- g.recvLoop(conn, stream, log) }()

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

// ended returns how a stream whose context was cancelled ends: drained on
// shutdown, with the cause's code on revocation or a store failure, quietly
// when the agent went away.
func (g *streamService) ended(cctx context.Context, finish func(error) error) error {
	cause := context.Cause(cctx)
	switch {
	case errors.Is(cause, errDraining):
		return finish(grpcError(cause))
	case errors.Is(cause, context.Canceled), errors.Is(cause, context.DeadlineExceeded):
		return nil
	}
	return grpcError(cause)
}

// recvLoop reads the agent's messages and hands records to the ingester.
// It returns io.EOF when the agent closes its side.
func (g *streamService) recvLoop(conn *streamConn, stream agentpb.Agent_AgentStreamServer, log *slog.Logger) error {
	s := g.s
	var lastSeq uint64
	first := true
	for {
		msg, err := stream.Recv()
		if err != nil {
			return err
		}
		now := s.clock.Now()
		if first {
			if msg.GetHello() == nil {
				return status.Error(codes.InvalidArgument, "the first message must be Hello")
			}
			first = false
		}
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
		rec, verr := s.toRecord(conn.agentID, msg, now)
		if verr != nil {
			log.Warn("refused an invalid record", "seq", seq, "err", verr)
			s.metrics.records.WithLabelValues("invalid").Inc()
			rec = nil
		}
		conn.inflight.Add(1)
		if conn.draining.Load() {
			conn.inflight.Add(-1)
			continue // not acknowledged: the agent resends it
		}
		select {
		case s.ingest.in <- ingestItem{rec: rec, conn: conn, seq: seq}:
		case <-conn.ctx.Done():
			conn.inflight.Add(-1)
			return conn.ctx.Err()
		}
		if h := msg.GetHello(); h != nil {
			s.syncIfBehind(conn, h.GetManifestSerial())
		}
	}
}

// syncIfBehind sends SyncNow when the agent's last accepted manifest is
// older than the one published for it.
func (s *Server) syncIfBehind(conn *streamConn, accepted uint64) {
	m, err := s.store.GetManifest(conn.ctx, conn.agentID)
	if err != nil || m.Serial <= accepted {
		return
	}
	select {
	case conn.out <- &agentpb.ServerMessage{Body: &agentpb.ServerMessage_SyncNow{SyncNow: &agentpb.SyncNow{Serial: m.Serial}}}:
	default:
	}
}

// authPeer identifies the agent behind a gRPC stream by its verified client
// certificate.
func (s *Server) authPeer(ctx context.Context) (string, error) {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return "", newError(ErrUnauthenticated, "no peer")
	}
	ti, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok || len(ti.State.VerifiedChains) == 0 || len(ti.State.PeerCertificates) == 0 {
		return "", newError(ErrUnauthenticated, "a client certificate is required")
	}
	return s.checkAgentCert(ctx, ti.State.PeerCertificates[0])
}

// Limits on strings in records.
const (
	maxIDLen    = 128
	maxTextLen  = 4096
	maxPipeInfo = 64
)

func cleanText(s string, n int) string {
	if !utf8.ValidString(s) {
		s = string([]rune(s)) // replaces invalid bytes with U+FFFD
	}
	if len(s) > n {
		s = s[:n]
		for !utf8.ValidString(s) {
			s = s[:len(s)-1]
		}
	}
	return s
}

func validRunID(id string) error {
	if id == "" || len(id) > maxIDLen || !utf8.ValidString(id) {
		return fmt.Errorf("run_id must be 1-%d bytes of UTF-8", maxIDLen)
	}
	return nil
}

func ts(t *timestamppb.Timestamp) time.Time {
	if t == nil || (t.GetSeconds() == 0 && t.GetNanos() == 0) {
		return time.Time{}
	}
	return t.AsTime().UTC()
}

var runStatuses = map[agentpb.RunStatus]string{
	agentpb.RunStatus_RUN_STATUS_PENDING:   StatusPending,
	agentpb.RunStatus_RUN_STATUS_RUNNING:   StatusRunning,
	agentpb.RunStatus_RUN_STATUS_SUCCEEDED: StatusSucceeded,
	agentpb.RunStatus_RUN_STATUS_FAILED:    StatusFailed,
	agentpb.RunStatus_RUN_STATUS_TIMED_OUT: StatusTimedOut,
	agentpb.RunStatus_RUN_STATUS_CANCELED:  StatusCanceled,
	agentpb.RunStatus_RUN_STATUS_SKIPPED:   StatusSkipped,
}

var triggers = map[agentpb.Trigger]string{
	agentpb.Trigger_TRIGGER_SCHEDULE: "schedule",
	agentpb.Trigger_TRIGGER_CATCHUP:  "catchup",
	agentpb.Trigger_TRIGGER_MANUAL:   "manual",
	agentpb.Trigger_TRIGGER_API:      "api",
}

var logStreams = map[agentpb.LogStream]string{
	agentpb.LogStream_LOG_STREAM_STDOUT: "stdout",
	agentpb.LogStream_LOG_STREAM_STDERR: "stderr",
	agentpb.LogStream_LOG_STREAM_SYSTEM: "system",
}

var manifestStates = map[agentpb.ManifestStatus_State]string{
	agentpb.ManifestStatus_STATE_APPLIED:      "applied",
	agentpb.ManifestStatus_STATE_REJECTED:     "rejected",
	agentpb.ManifestStatus_STATE_APPLY_FAILED: "apply_failed",
}

// toRecord converts and checks one agent message.
func (s *Server) toRecord(agentID string, msg *agentpb.AgentMessage, now time.Time) (*Record, error) {
	r := &Record{AgentID: agentID, Received: now, Seq: msg.GetSeq()}
	switch b := msg.GetBody().(type) {
	case *agentpb.AgentMessage_Hello:
		h := b.Hello
		r.Hello = &HelloRecord{
			AgentVersion: cleanText(h.GetAgentVersion(), maxPipeInfo), OS: cleanText(h.GetOs(), maxPipeInfo), Arch: cleanText(h.GetArch(), maxPipeInfo),
			Hostname: cleanText(h.GetHostname(), 255), Backend: cleanText(h.GetBackend(), maxPipeInfo), Scope: cleanText(h.GetScope(), maxPipeInfo),
			SystemdVersion: cleanText(h.GetSystemdVersion(), maxPipeInfo), ManifestSerial: h.GetManifestSerial(), ManifestDigest: cleanText(h.GetManifestDigest(), 128),
		}
	case *agentpb.AgentMessage_Heartbeat:
		// a sign of life: only last_seen changes
	case *agentpb.AgentMessage_ManifestStatus:
		m := b.ManifestStatus
		st := &StatusRecord{State: manifestStates[m.GetState()],
			Error: cleanText(m.GetError(), maxTextLen), AppliedSerial: m.GetAppliedSerial(), At: ts(m.GetAt())}
		if len(m.GetPipes()) > 10000 {
			return nil, errors.New("too many pipes in ManifestStatus")
		}
		for _, p := range m.GetPipes() {
			ps := PipeStatus{Name: cleanText(p.GetName(), maxPipeInfo), Version: p.GetVersion(), ApplyError: cleanText(p.GetApplyError(), maxTextLen), DriftRestored: p.GetDriftRestored()}
			for i, t := range p.GetNextFireTimes() {
				if i == 16 {
					break
				}
				ps.NextFireTimes = append(ps.NextFireTimes, ts(t))
			}
			st.Pipes = append(st.Pipes, ps)
		}
		r.Status = st
	case *agentpb.AgentMessage_RunStarted:
		x := b.RunStarted
		if err := validRunID(x.GetRunId()); err != nil {
			return nil, err
		}
		r.RunStarted = &Run{ID: x.GetRunId(), Pipe: cleanText(x.GetPipe(), maxPipeInfo), PipeVersion: x.GetPipeVersion(), Trigger: triggers[x.GetTrigger()],
			StartedAt: ts(x.GetStartedAt()), ScheduledAt: ts(x.GetScheduledAt()), RequestID: cleanText(x.GetRequestId(), maxIDLen)}
	case *agentpb.AgentMessage_RunFinished:
		x := b.RunFinished
		if err := validRunID(x.GetRunId()); err != nil {
			return nil, err
		}
		st, ok := runStatuses[x.GetStatus()]
		if !ok {
			return nil, fmt.Errorf("RunFinished with status %v", x.GetStatus())
		}
		r.RunFinished = &Run{ID: x.GetRunId(), Pipe: cleanText(x.GetPipe(), maxPipeInfo), PipeVersion: x.GetPipeVersion(), Trigger: triggers[x.GetTrigger()],
			Status: st, ExitCode: int(x.GetExitCode()), Signal: cleanText(x.GetSignal(), 32), StartedAt: ts(x.GetStartedAt()), FinishedAt: ts(x.GetFinishedAt()),
			DurationMS: x.GetDurationMs(), Error: cleanText(x.GetError(), maxTextLen), LogChunks: x.GetLogChunks(), ScheduledAt: ts(x.GetScheduledAt()),
			RequestID: cleanText(x.GetRequestId(), maxIDLen)}
	case *agentpb.AgentMessage_LogChunk:
		x := b.LogChunk
		if err := validRunID(x.GetRunId()); err != nil {
			return nil, err
		}
		if len(x.GetData()) > s.cfg.Runs.MaxChunkBytes {
			return nil, fmt.Errorf("log chunk of %d bytes, at most %d", len(x.GetData()), s.cfg.Runs.MaxChunkBytes)
		}
		stream := logStreams[x.GetStream()]
		if stream == "" {
			stream = "stdout"
		}
		r.Chunk = &LogChunk{RunID: x.GetRunId(), Seq: x.GetChunkSeq(), Stream: stream, Data: x.GetData(), At: ts(x.GetAt())}
	}
	return r, nil
}
