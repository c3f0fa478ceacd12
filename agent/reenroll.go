package agent

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/drover/drover/api"
	agentpb "github.com/drover/drover/proto"
)

// Re-enrollment.
//
// An enrolled agent whose identity stops working — the server refuses its
// certificate (the agent was revoked or deleted, or its certificate is no
// longer one the server knows), the certificate expired (the host was off
// longer than its lifetime, so it could not renew), or the server now
// presents a certificate from another CA (it was reinstalled) — keeps its
// pipes running as last applied, says so in its log and status, and
// enrolls again as soon as it is given a token: the token file (watched, as
// for the first enrollment) or `drover-agent enroll --token`. The token's
// CA pin is checked as at first enrollment. The new identity has a new agent
// id, whose manifest serials start anew: the accepted-manifest state of the
// old id no longer judges them (see manifestState). Runs recorded meanwhile
// stay in the outbox and are delivered over the new identity; the old id's
// manifest statuses are dropped (switchIdentity).
//
// A token present while the identity works is left alone (and logged at
// start): a working identity is never replaced.

// authRefusal says why err shows that this agent's identity no longer
// works, or "" when it does not show that.
func authRefusal(err error) string {
	if err == nil {
		return ""
	}
	var ae *api.Error
	if errors.As(err, &ae) && (ae.Code == api.CodeCertificateRefused || ae.Code == api.CodeAgentRevoked) {
		return fmt.Sprintf("the server refuses this agent's certificate (%s: %s)", ae.Code, ae.Message)
	}
	var ua x509.UnknownAuthorityError
	if errors.As(err, &ua) {
		return "the server's certificate is not from the CA this agent enrolled with (was the server reinstalled?)"
	}
	if s, ok := status.FromError(err); ok && (s.Code() == codes.Unauthenticated || s.Code() == codes.PermissionDenied) {
		return fmt.Sprintf("the server refuses this agent's stream (%s: %s)", s.Code(), s.Message())
	}
	return ""
}

// noteAuth records the outcome of a call made with the agent's identity:
// a refusal marks the identity as lost, any other answer from the server
// as working.
func (a *Agent) noteAuth(err error) {
	reason := authRefusal(err)
	if reason == "" && err != nil {
		var ae *api.Error
		if !errors.As(err, &ae) {
			return // no answer from the server: says nothing either way
		}
	}
	a.mu.Lock()
	a.authLost = reason
	a.mu.Unlock()
}

// identityProblem says why the agent's identity no longer works, or "".
func (a *Agent) identityProblem() string {
	a.mu.Lock()
	id, lost := a.id, a.authLost
	a.mu.Unlock()
	if id == nil {
		return ""
	}
	if lost != "" {
		return lost
	}
	if now := time.Now(); !now.Before(id.NotAfter()) {
		return fmt.Sprintf("the agent's certificate expired at %s", id.NotAfter().UTC().Format(time.RFC3339))
	}
	return ""
}

// manifestState is the store's manifest state when it belongs to the
// current identity, else the empty state (a re-enrolled agent).
func (a *Agent) manifestState() (ManifestState, error) {
	ms, err := a.store.ManifestState()
	if err != nil {
		return ms, err
	}
	if id := a.identity(); id != nil && ms.AgentID != "" && ms.AgentID != id.AgentID {
		return ManifestState{}, nil
	}
	return ms, nil
}

// reenrollLoop watches for a lost identity and re-enrolls with a token
// from the token file or the control socket.
func (a *Agent) reenrollLoop(ctx context.Context) {
	tries := newTokenAttempts(a.cfg.MaxBackoff)
	var lastReason string
	poll := time.NewTicker(time.Second)
	defer poll.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case call := <-a.enrollCh:
			// The control socket hands a token over only while the identity
			// does not work (see serveControl).
			call.reply <- a.reenroll(ctx, call.token)
			continue
		case <-poll.C:
		}
		reason := a.identityProblem()
		if reason == "" {
			lastReason = ""
			continue
		}
		if reason != lastReason {
			a.log.Error("this agent's identity no longer works; its pipes keep running as last applied. "+
				"To enroll again, write a new enrollment token to the token file or run `drover-agent enroll --token TOKEN`",
				"reason", reason, "token_file", a.cfg.TokenFile)
			lastReason = reason
		}
		tok, ok := a.readTokenFile()
		if !ok || !tries.due(tok, true, time.Now()) {
			continue
		}
		if err := a.reenroll(ctx, tok); err != nil {
			if ctx.Err() != nil {
				return
			}
			d := tries.failed(tok, true, time.Now())
			a.log.Error("re-enrollment failed; retrying", "err", err, "retry_in", d.Round(time.Millisecond))
			continue
		}
		a.removeTokenFile()
		tries.succeeded()
		lastReason = ""
	}
}

// switchIdentity installs id. When it replaces an identity (replacing:
// re-enrollment) or the store's manifest state is another agent's (the
// daemon starts on an identity enrolled by `drover-agent enroll`, or on a
// new enrollment over an old state), the ManifestStatus records still
// waiting in the outbox describe the other agent's manifest: they are
// dropped in the same step, under statusMu, so none is delivered under the
// new id, and none for the old manifest is queued once the new id is in
// force (enqueueStatus). Run records stay and are delivered as the new
// agent's.
func (a *Agent) switchIdentity(id *Identity, replacing bool) {
	a.statusMu.Lock()
	defer a.statusMu.Unlock()
	if !replacing {
		ms, err := a.store.ManifestState()
		replacing = err == nil && ms.AgentID != "" && ms.AgentID != id.AgentID
	}
	if replacing {
		if n, err := a.store.DropStatuses(); err != nil {
			a.log.Error("drop the previous identity's manifest statuses from the outbox", "err", err)
		} else if n > 0 {
			a.log.Info("dropped the previous identity's manifest statuses from the outbox", "records", n)
		}
	}
	a.setIdentity(id)
}

// enqueueStatus queues st, the status of a manifest of agent agentID,
// unless the agent is no longer agentID (it enrolled again meanwhile).
func (a *Agent) enqueueStatus(agentID string, st *agentpb.ManifestStatus) {
	a.statusMu.Lock()
	defer a.statusMu.Unlock()
	if id := a.identity(); id == nil || id.AgentID != agentID {
		a.log.Debug("manifest status of a previous identity not sent", "agent_id", agentID, "serial", st.GetSerial())
		return
	}
	a.enqueue(&agentpb.AgentMessage{Body: &agentpb.AgentMessage_ManifestStatus{ManifestStatus: st}})
}

// reenroll enrolls with tok and switches the running daemon to the new
// identity: the sync loop pulls the new agent's manifest at once and the
// stream reconnects as the new agent.
func (a *Agent) reenroll(ctx context.Context, tok string) error {
	old := a.identity()
	id, err := a.tryEnroll(ctx, tok)
	if err != nil {
		return err
	}
	a.switchIdentity(id, true)
	a.mu.Lock()
	a.authLost = ""
	a.etag = ""
	a.lastReject = ""
	a.mu.Unlock()
	a.log.Info("enrolled again with a new identity", "agent_id", id.AgentID, "previous_agent_id", old.AgentID)
	a.sdNotify("STATUS=enrolled as " + id.AgentID)
	a.RequestSync()
	select {
	case a.reconnectCh <- struct{}{}:
	default:
	}
	a.kickOutbox()
	return nil
}
