package server

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/drover/drover/api"
	"github.com/drover/drover/server/errs"
	"github.com/drover/drover/server/pki"
	"github.com/drover/drover/server/store"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/drover/drover/manifest"
	agentpb "github.com/drover/drover/proto"
)

// Causes with which the server ends a stream.
var (
	errDraining = errs.New(errs.ErrUnavailable, "the server is shutting down")
	errRevoked  = errs.New(errs.ErrAgentRevoked, "the agent was revoked")
	errReplaced = errs.New(errs.ErrUnavailable, "a newer stream of this agent replaced this one")
	errRetired  = errs.New(errs.ErrCertRefused, "the certificate was superseded by a renewal")
)

// drainWait bounds how long a draining stream waits for its records in
// flight to commit before the server gives up on acknowledging them.
const drainWait = 5 * time.Second

// ingestItem is one record on its way to the database. A nil rec is a
// record that was refused as invalid: it is acknowledged in order with the
// others so that the agent does not resend it forever.
type ingestItem struct {
	rec  *store.Record
	conn *streamConn
	seq  uint64 // 0: nothing to acknowledge
}

// ingester commits records from every stream in batched transactions: while
// one transaction commits, the next batch gathers, so the commit rate adapts
// to the load. Acks are sent only after the commit, in seq order per stream.
type ingester struct {
	store store.IngestStore
	in    chan ingestItem
	batch int
	lim   store.IngestLimits
	log   *slog.Logger
	quit  chan struct{}
	done  chan struct{}
	// onCommit, if set, is called with every committed batch.
	onCommit func([]*store.Record)
}

func newIngester(store store.IngestStore, batch int, lim store.IngestLimits, log *slog.Logger) *ingester {
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
	recs := make([]*store.Record, 0, len(items))
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
			it.conn.cancel(errs.New(errs.ErrUnavailable, "the server could not store records; reconnect and resend"))
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
// verified client certificate; no message field can change that. The first
// message must be a Hello, within the hello timeout: its machine id must be
// the one bound to the identity (identity_conflict otherwise), and the
// stream then replaces the agent's live one.
func (g *streamService) AgentStream(stream agentpb.Agent_AgentStreamServer) error {
	s := g.s
	if s.stopping.Load() {
		return errs.GRPC(errDraining)
	}
	ctx := stream.Context()
	agentID, serial, err := s.authPeer(ctx)
	if err != nil {
		return errs.GRPC(err)
	}
	if n := g.streams.Add(1); n > int64(s.cfg.GRPC.MaxStreams) {
		g.streams.Add(-1)
		return status.Error(codes.ResourceExhausted, "too many streams")
	}
	defer g.streams.Add(-1)
	ast := s.agentMem(agentID)
	ast.mu.Lock()
	if ast.pending >= s.cfg.Agents.PendingStreams {
		ast.mu.Unlock()
		s.refused(agentID, "pending_streams", "", nil)
		return status.Error(codes.ResourceExhausted, "too many streams of this agent are opening at once")
	}
	ast.pending++
	ast.mu.Unlock()
	first, err := recvHello(stream, s.cfg.Agents.HelloTimeout)
	ast.mu.Lock()
	ast.pending--
	ast.mu.Unlock()
	if err != nil {
		return err
	}
	log := s.log.With("agent", agentID)
	// The certificate may have been revoked or retired while the Hello
	// was on its way.
	if _, err := s.checkAgentCertSerial(ctx, agentID, serial); err != nil {
		return errs.GRPC(err)
	}
	if err := s.checkMachine(ctx, agentID, first.GetHello().GetMachineId(), peerAddr(ctx)); err != nil {
		log.Warn("stream refused", "err", err)
		return errs.GRPC(err)
	}

	cctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	conn := &streamConn{agentID: agentID, serial: serial, ctx: cctx, cancel: cancel, out: make(chan *agentpb.ServerMessage, 16), kick: make(chan struct{}, 1)}
	s.hub.add(conn)
	defer s.hub.remove(conn)
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
func (g *streamService) ended(cctx context.Context, finish func(error) error) error {
	cause := context.Cause(cctx)
	switch {
	case errors.Is(cause, errDraining), errors.Is(cause, errReplaced):
		return finish(errs.GRPC(cause))
	case errors.Is(cause, context.Canceled), errors.Is(cause, context.DeadlineExceeded):
		return nil
	}
	return errs.GRPC(cause)
}

// recvLoop hands the Hello and then every message the agent sends to the
// ingester, after validating it and waiting for the agent's quotas. It
// returns io.EOF when the agent closes its side.
func (g *streamService) recvLoop(conn *streamConn, stream agentpb.Agent_AgentStreamServer, first *agentpb.AgentMessage, log *slog.Logger) error {
	s := g.s
	var lastSeq uint64
	ast := s.agentMem(conn.agentID)
	msg := first
	for {
		if msg == nil {
			var err error
			if msg, err = stream.Recv(); err != nil {
				return err
			}
		}
		now := s.clock.Now()
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
		rules := recordRules{maxChunk: s.cfg.Runs.MaxChunkBytes, maxRunning: s.cfg.Agents.MaxRunningIDs, pipeKnown: s.pipeSet(conn.ctx, conn.agentID)}
		rec, reason, verr := toRecord(conn.agentID, msg, now, rules)
		if verr != nil {
			// Acknowledged and dropped, so that the agent's outbox does not
			// resend it for ever; counted and audited.
			s.refused(conn.agentID, reason, peerAddr(conn.ctx), verr)
			rec = nil
		} else if err := s.throttle(conn.ctx, ast, rec); err != nil {
			return err
		}
		if rec != nil && rec.Settle != nil && !s.hub.current(conn) {
			rec.Settle = nil // a replaced stream speaks for nothing
		}
		conn.inflight.Add(1)
		if conn.draining.Load() {
			conn.inflight.Add(-1)
			msg = nil
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
		msg = nil
	}
}

// throttle waits until the agent's quotas allow rec: run records per agent
// and per pipe, log bytes per agent. Waiting holds the stream (the agent's
// sends back up); nothing is dropped.
func (s *Server) throttle(ctx context.Context, ast *agentMem, rec *store.Record) error {
	var d time.Duration
	var reason string
	take := func(b *tokenBucket, n float64, why string) {
		if w := b.reserve(n); w > d {
			d, reason = w, why
		}
	}
	run := func(id, pipe string) {
		ast.noteRun(id)
		take(ast.runs, 1, "run_records")
		if pipe != "" {
			take(ast.pipeBucket(pipe, s.cfg.Agents), 1, "pipe_run_records")
		}
	}
	switch {
	case rec.RunStarted != nil:
		run(rec.RunStarted.ID, rec.RunStarted.Pipe)
	case rec.RunFinished != nil:
		run(rec.RunFinished.ID, rec.RunFinished.Pipe)
	case rec.Chunk != nil:
		if ast.noteRun(rec.Chunk.RunID) {
			take(ast.runs, 1, "run_records") // a chunk of an unknown run makes a run row
		}
		take(ast.logBytes, float64(len(rec.Chunk.Data)), "log_bytes")
	default:
		return nil
	}
	if d > 0 {
		s.metrics.throttled.WithLabelValues(reason).Inc()
	}
	return wait(ctx, d)
}

// refused counts (and at most once a minute per agent and reason, audits)
// a record or stream refused from an agent.
func (s *Server) refused(agentID, reason, source string, err error) {
	s.metrics.refused.WithLabelValues(reason).Inc()
	now := s.clock.Now()
	if !s.agentMem(agentID).shouldAudit(reason, now, time.Minute) {
		s.log.Debug("refused an agent record", "agent", agentID, "reason", reason, "err", err)
		return
	}
	s.log.Warn("refused an agent record (logged and audited at most once a minute per reason)", "agent", agentID, "reason", reason, "err", err)
	e := &store.AuditEntry{At: now, ActorID: "agent/" + agentID, ActorName: agentID, Role: roleAgent.String(),
		Action: "agent.record_refused", Target: "agent/" + agentID + "#" + reason, Source: source}
	if reason == "pending_streams" {
		e.Action = "agent.stream_refused"
	}
	s.audit(e)
}

// audit writes an entry outside an HTTP request.
func (s *Server) audit(e *store.AuditEntry) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := s.store.AddAudit(ctx, e); err != nil {
		s.log.Error("writing the audit log failed", "action", e.Action, "target", e.Target, "err", err)
		s.metrics.auditFailures.Inc()
	}
}

// checkMachine binds machineID to the agent on first use (when enrollment
// did not) and refuses a stream from another machine: identity_conflict,
// counted on the agent and in metrics, audited.
func (s *Server) checkMachine(ctx context.Context, agentID, machineID, source string) error {
	if machineID != "" && !validMachineID(machineID) {
		return errs.New(errs.ErrInvalidRequest, "hello.machine_id must be 32 hex digits")
	}
	machineID = strings.ToLower(machineID)
	bound, err := s.boundMachine(ctx, agentID)
	if err != nil {
		return err
	}
	if bound == "" {
		if machineID == "" {
			return nil // nothing to bind yet
		}
		if bound, err = s.store.BindMachine(ctx, agentID, machineID, s.clock.Now()); err != nil {
			return err
		}
		am := s.agentMem(agentID)
		am.mu.Lock()
		am.machineID = bound
		am.mu.Unlock()
		if bound == machineID {
			s.log.Info("agent bound to its machine", "agent", agentID, "machine_id", machineID)
			return nil
		}
	}
	if bound == machineID {
		return nil
	}
	return s.identityConflict(ctx, agentID, machineID, source)
}

// boundMachine returns the machine id bound to the agent ("" for none yet),
// from memory once known.
func (s *Server) boundMachine(ctx context.Context, agentID string) (string, error) {
	am := s.agentMem(agentID)
	am.mu.Lock()
	bound := am.machineID
	am.mu.Unlock()
	if bound != "" {
		return bound, nil
	}
	a, err := s.store.GetAgent(ctx, agentID)
	if err != nil {
		return "", err
	}
	am.mu.Lock()
	am.machineID = a.MachineID
	am.mu.Unlock()
	return a.MachineID, nil
}

// identityConflict counts, records and audits a refusal of another machine
// presenting the agent's certificate, and returns the error to answer.
func (s *Server) identityConflict(ctx context.Context, agentID, machineID, source string) error {
	now := s.clock.Now()
	s.metrics.identityConflicts.Inc()
	shown := machineID
	if shown == "" {
		shown = "(none)"
	}
	if err := s.store.NoteIdentityConflict(ctx, agentID, shown, now); err != nil {
		s.log.Error("recording an identity conflict", "agent", agentID, "err", err)
	}
	if s.agentMem(agentID).shouldAudit("identity_conflict", now, 10*time.Second) {
		s.monitor.identityConflict(agentID, shown, now)
		s.audit(&store.AuditEntry{At: now, ActorID: "agent/" + agentID, ActorName: "machine " + shown, Role: roleAgent.String(),
			Action: "agent.identity_conflict", Target: "agent/" + agentID, Source: source})
	}
	return errs.New(errs.ErrIdentityConflict, fmt.Sprintf("identity_conflict: agent %s is bound to another machine; machine %s presented its certificate", agentID, shown))
}

// validMachineID: 32 hex digits, as /etc/machine-id holds.
func validMachineID(s string) bool {
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

func peerAddr(ctx context.Context) string {
	if p, ok := peer.FromContext(ctx); ok && p.Addr != nil {
		if host, _, err := net.SplitHostPort(p.Addr.String()); err == nil {
			return host
		}
		return p.Addr.String()
	}
	return ""
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
// certificate, and returns the certificate's serial.
func (s *Server) authPeer(ctx context.Context) (string, string, error) {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return "", "", errs.New(errs.ErrUnauthenticated, "no peer")
	}
	ti, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok || len(ti.State.VerifiedChains) == 0 || len(ti.State.PeerCertificates) == 0 {
		return "", "", errs.New(errs.ErrUnauthenticated, "a client certificate is required")
	}
	cert := ti.State.PeerCertificates[0]
	id, err := s.checkAgentCert(ctx, cert)
	if err != nil {
		return "", "", err
	}
	return id, pki.SerialHex(cert.SerialNumber), nil
}

// checkAgentCertSerial re-checks, without promoting anything, that serial
// is still the agent's current certificate and the agent not revoked.
func (s *Server) checkAgentCertSerial(ctx context.Context, id, serial string) (string, error) {
	ac, err := s.store.AgentCert(ctx, id)
	if errors.Is(err, errs.ErrNotFound) {
		return "", errs.New(errs.ErrCertRefused, "the certificate names an unknown agent")
	}
	if err != nil {
		return "", err
	}
	switch {
	case ac.Revoked:
		return "", errRevoked
	case serial == ac.Serial, serial == ac.NextSerial:
		return id, nil
	}
	return "", errRetired
}

// Limits on strings in records.
const (
	maxIDLen     = 128
	maxTextLen   = 4096
	maxReasonLen = 256
	maxPipeInfo  = 64
	maxPipeError = 1024
	maxFireTimes = 16
	maxDropIns   = 32
)

// cleanText makes agent text safe to store and show: valid UTF-8, at most n
// bytes, and every control character (C0 but newline and tab when
// multiline, DEL, C1), bidirectional override and line separator written as
// a visible \xNN or \uNNNN escape, so that no NUL, ANSI escape sequence or
// forged line reaches the database, a terminal or a page raw.
func cleanText(s string, n int, multiline bool) string {
	clean := true
	for _, r := range s {
		if r == utf8.RuneError || unsafeRune(r, multiline) {
			clean = false
			break
		}
	}
	if !clean {
		var b strings.Builder
		for _, r := range s { // invalid bytes arrive as U+FFFD
			switch {
			case !unsafeRune(r, multiline):
				b.WriteRune(r)
			case r < 0x100:
				fmt.Fprintf(&b, "\\x%02x", r)
			default:
				fmt.Fprintf(&b, "\\u%04x", r)
			}
			if b.Len() > n {
				break
			}
		}
		s = b.String()
	}
	if len(s) > n {
		s = s[:n]
		for !utf8.ValidString(s) {
			s = s[:len(s)-1]
		}
	}
	return s
}

func unsafeRune(r rune, multiline bool) bool {
	switch {
	case r == '\n' || r == '\t':
		return !multiline
	case r < 0x20, r == 0x7f, r >= 0x80 && r < 0xa0:
		return true
	case r >= 0x202a && r <= 0x202e, r >= 0x2066 && r <= 0x2069, r == 0x2028, r == 0x2029, r == 0x200e, r == 0x200f:
		return true
	}
	return false
}

// validRunID: 1-128 of letters, digits and . _ : - (UUIDs, systemd
// invocation ids, request ids).
func validRunID(id string) error {
	if !validToken(id, maxIDLen) {
		return fmt.Errorf("run_id must be 1-%d letters, digits, '.', '_', ':' or '-'", maxIDLen)
	}
	return nil
}

func validToken(id string, n int) bool {
	if id == "" || len(id) > n {
		return false
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '.' || c == '_' || c == ':' || c == '-') {
			return false
		}
	}
	return true
}

// cleanSignal keeps a signal name such as SIGKILL (or a number); anything
// else is stored as "invalid".
func cleanSignal(sig string) string {
	if sig == "" {
		return ""
	}
	if len(sig) > 16 {
		return "invalid"
	}
	for i := 0; i < len(sig); i++ {
		c := sig[i]
		if !('A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '+' || c == '-') {
			return "invalid"
		}
	}
	return sig
}

func cleanRequestID(id string) string {
	if validToken(id, maxIDLen) {
		return id
	}
	return ""
}

func cleanWrittenBy(w string) string {
	switch w {
	case "runner", "daemon":
		return w
	}
	return ""
}

func cleanDigest(d string) string {
	if manifest.ValidDigest(d) {
		return d
	}
	return ""
}

func ts(t *timestamppb.Timestamp) time.Time {
	if t == nil || (t.GetSeconds() == 0 && t.GetNanos() == 0) {
		return time.Time{}
	}
	return t.AsTime().UTC()
}

// recordRules are what toRecord checks a message against.
type recordRules struct {
	maxChunk   int
	maxRunning int
	// pipeKnown reports whether the agent's manifest names a pipe.
	pipeKnown func(string) bool
}

// Reasons for which an agent record is refused (the reason label of
// drover_agent_records_refused_total).
const (
	refusedInvalid     = "invalid"
	refusedUnknownPipe = "unknown_pipe"
	refusedTooLarge    = "too_large"
)

// toRecord converts and checks one agent message. Identifiers (run ids,
// pipe names) must be valid, and pipes named by the agent's manifest, or
// the record is refused with a reason; text is bounded and escaped
// (cleanText); enumerations outside their sets are refused or dropped.
func toRecord(agentID string, msg *agentpb.AgentMessage, now time.Time, rules recordRules) (*store.Record, string, error) {
	r := &store.Record{AgentID: agentID, Received: now, Seq: msg.GetSeq()}
	pipe := func(name string) error {
		if !manifest.ValidName(name) {
			return fmt.Errorf("pipe %q is not a valid pipe name", cleanText(name, maxPipeInfo, false))
		}
		if rules.pipeKnown == nil || !rules.pipeKnown(name) {
			return fmt.Errorf("pipe %s is not in this agent's manifest", name)
		}
		return nil
	}
	switch b := msg.GetBody().(type) {
	case *agentpb.AgentMessage_Hello:
		h := b.Hello
		r.Hello = &store.HelloRecord{
			AgentVersion: cleanText(h.GetAgentVersion(), maxPipeInfo, false), OS: cleanText(h.GetOs(), maxPipeInfo, false), Arch: cleanText(h.GetArch(), maxPipeInfo, false),
			Hostname: cleanText(h.GetHostname(), 253, false), Backend: cleanText(h.GetBackend(), maxPipeInfo, false), Scope: cleanText(h.GetScope(), maxPipeInfo, false),
			SystemdVersion: cleanText(h.GetSystemdVersion(), maxPipeInfo, false), ManifestSerial: h.GetManifestSerial(), ManifestDigest: cleanDigest(h.GetManifestDigest()),
			MachineID: strings.ToLower(h.GetMachineId()),
		}
	case *agentpb.AgentMessage_Heartbeat:
		hb := b.Heartbeat
		ids := hb.GetRunningRunIds()
		if len(ids) > rules.maxRunning {
			return nil, refusedTooLarge, fmt.Errorf("heartbeat lists %d running runs, at most %d", len(ids), rules.maxRunning)
		}
		if hb.GetOutboxRecords() == 0 {
			// Every record the agent had is acknowledged, so committed:
			// its running list is the whole truth.
			st := &store.SettleRecord{Running: make(map[string]bool, len(ids)), SentAt: ts(hb.GetSentAt())}
			for _, id := range ids {
				if err := validRunID(id); err != nil {
					return nil, refusedInvalid, fmt.Errorf("running_run_ids: %w", err)
				}
				st.Running[id] = true
			}
			r.Settle = st
		}
	case *agentpb.AgentMessage_ManifestStatus:
		m := b.ManifestStatus
		if len(m.GetPipes()) > maxManifestPipes {
			return nil, refusedTooLarge, fmt.Errorf("ManifestStatus lists %d pipes, at most %d", len(m.GetPipes()), maxManifestPipes)
		}
		st := &store.StatusRecord{State: api.ManifestStateName(m.GetState()), Error: cleanText(m.GetError(), maxTextLen, true), AppliedSerial: m.GetAppliedSerial(),
			At: ts(m.GetAt()), Expired: m.GetManifestExpired(), ExpiresAt: ts(m.GetExpiresAt())}
		if st.State == "" {
			return nil, refusedInvalid, fmt.Errorf("ManifestStatus with state %v", m.GetState())
		}
		for _, p := range m.GetPipes() {
			if pipe(p.GetName()) != nil {
				continue // only the manifest's pipes are shown: bounded by it
			}
			ps := api.PipeStatus{Name: p.GetName(), Version: p.GetVersion(), ApplyError: cleanText(p.GetApplyError(), maxPipeError, true), DriftRestored: p.GetDriftRestored(),
				ElapseMismatch: cleanText(p.GetElapseMismatch(), maxReasonLen, false)}
			for i, t := range p.GetNextFireTimes() {
				if i == maxFireTimes {
					break
				}
				ps.NextFireTimes = append(ps.NextFireTimes, ts(t))
			}
			for i, d := range p.GetDropInsRemoved() {
				if i == maxDropIns {
					break
				}
				ps.DropInsRemoved = append(ps.DropInsRemoved, cleanText(d, maxReasonLen, false))
			}
			st.Pipes = append(st.Pipes, ps)
		}
		r.Status = st
	case *agentpb.AgentMessage_RunStarted:
		x := b.RunStarted
		if err := validRunID(x.GetRunId()); err != nil {
			return nil, refusedInvalid, err
		}
		if err := pipe(x.GetPipe()); err != nil {
			return nil, refusedUnknownPipe, err
		}
		r.RunStarted = &store.Run{ID: x.GetRunId(), Pipe: x.GetPipe(), PipeVersion: x.GetPipeVersion(), Trigger: api.TriggerName(x.GetTrigger()),
			StartedAt: ts(x.GetStartedAt()), ScheduledAt: ts(x.GetScheduledAt()), RequestID: cleanRequestID(x.GetRequestId()), Attempts: x.GetAttempt()}
	case *agentpb.AgentMessage_RunFinished:
		x := b.RunFinished
		if err := validRunID(x.GetRunId()); err != nil {
			return nil, refusedInvalid, err
		}
		if err := pipe(x.GetPipe()); err != nil {
			return nil, refusedUnknownPipe, err
		}
		st, ok := api.RunStatusName(x.GetStatus())
		if !ok {
			return nil, refusedInvalid, fmt.Errorf("RunFinished with status %v", x.GetStatus())
		}
		r.RunFinished = &store.Run{ID: x.GetRunId(), Pipe: x.GetPipe(), PipeVersion: x.GetPipeVersion(), Trigger: api.TriggerName(x.GetTrigger()),
			Status: st, ExitCode: int(x.GetExitCode()), Signal: cleanSignal(x.GetSignal()), StartedAt: ts(x.GetStartedAt()), FinishedAt: ts(x.GetFinishedAt()),
			DurationMS: max(0, x.GetDurationMs()), Error: cleanText(x.GetError(), maxTextLen, true), LogChunks: x.GetLogChunks(), ScheduledAt: ts(x.GetScheduledAt()),
			RequestID: cleanRequestID(x.GetRequestId()), Reason: cleanText(x.GetReason(), maxReasonLen, false), Attempts: x.GetAttempts(),
			WrittenBy: cleanWrittenBy(x.GetWrittenBy())}
	case *agentpb.AgentMessage_LogChunk:
		x := b.LogChunk
		if err := validRunID(x.GetRunId()); err != nil {
			return nil, refusedInvalid, err
		}
		if len(x.GetData()) > rules.maxChunk {
			return nil, refusedTooLarge, fmt.Errorf("log chunk of %d bytes, at most %d", len(x.GetData()), rules.maxChunk)
		}
		stream := api.LogStreamName(x.GetStream())
		if stream == "" {
			stream = "stdout"
		}
		r.Chunk = &store.LogChunk{RunID: x.GetRunId(), Seq: x.GetChunkSeq(), Stream: stream, Data: x.GetData(), At: ts(x.GetAt())}
	default:
		return nil, refusedInvalid, errors.New("unknown message")
	}
	return r, "", nil
}
