package server

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/drover/drover/server/errs"
	"github.com/drover/drover/server/pki"
	"github.com/drover/drover/server/store"
	"github.com/drover/drover/server/stream"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
)

// streamHost is the server as the stream service sees it (stream.Host).
type streamHost struct{ *Server }

var _ stream.Host = streamHost{}

// Stopping reports whether the server is draining.
func (s streamHost) Stopping() bool { return s.stopping.Load() }

// CheckMachine binds or checks the machine id of a Hello.
func (s streamHost) CheckMachine(ctx context.Context, agentID, machineID, source string) error {
	return s.checkMachine(ctx, agentID, machineID, source)
}

// PipeSet returns a predicate for the pipes the agent may report.
func (s streamHost) PipeSet(ctx context.Context, agentID string) func(string) bool {
	return s.pipeSet(ctx, agentID)
}

// Throttle waits until the agent's quotas allow rec.
func (s streamHost) Throttle(ctx context.Context, agentID string, rec *store.Record) error {
	return s.throttle(ctx, s.agentMem(agentID), rec)
}

// Refused counts (and audits) a record or stream refused from an agent.
func (s streamHost) Refused(agentID, reason, source string, err error) {
	s.refused(agentID, reason, source, err)
}

// PublishedSerial is the serial of the manifest published for the agent.
func (s streamHost) PublishedSerial(ctx context.Context, agentID string) (uint64, error) {
	m, err := s.store.GetManifest(ctx, agentID)
	if err != nil {
		return 0, err
	}
	return m.Serial, nil
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
	if machineID != "" && !stream.ValidMachineID(machineID) {
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
		s.rememberMachine(agentID, bound)
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
	s.rememberMachine(agentID, a.MachineID)
	return a.MachineID, nil
}

// rememberMachine keeps the machine id the store holds bound to the agent
// ("" for none yet), so that its streams and requests need not read it.
func (s *Server) rememberMachine(agentID, machineID string) {
	am := s.agentMem(agentID)
	am.mu.Lock()
	am.machineID = machineID
	am.mu.Unlock()
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

// authPeer identifies the agent behind a gRPC stream by its verified client
// certificate, and returns the certificate's serial.
func (s streamHost) AuthPeer(ctx context.Context) (string, string, error) {
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

// CheckCertSerial re-checks, without promoting anything, that serial is
// still the agent's current certificate and the agent not revoked.
func (s streamHost) CheckCertSerial(ctx context.Context, id, serial string) error {
	ac, err := s.store.AgentCert(ctx, id)
	if errors.Is(err, errs.ErrNotFound) {
		return errs.New(errs.ErrCertRefused, "the certificate names an unknown agent")
	}
	if err != nil {
		return err
	}
	switch {
	case ac.Revoked:
		return stream.ErrRevoked
	case serial == ac.Serial, serial == ac.NextSerial:
		return nil
	}
	return stream.ErrRetired
}
