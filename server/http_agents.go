package server

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/drover/drover/api"
	"github.com/drover/drover/server/errs"
	"github.com/drover/drover/server/store"
	"github.com/drover/drover/server/stream"
)

func optTime(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}

func (s *Server) agentJSON(a *store.Agent) api.Agent {
	pipes := a.Pipes
	if pipes == nil {
		pipes = []api.PipeStatus{}
	}
	out := api.Agent{
		ID: a.ID, Name: a.Name, Hostname: a.Hostname, OS: a.OS, Arch: a.Arch, AgentVersion: a.AgentVersion, Tags: a.Tags,
		CreatedAt: a.CreatedAt, CertExpiresAt: a.CertExpiresAt, Revoked: !a.RevokedAt.IsZero(), RevokedAt: optTime(a.RevokedAt),
		Online: s.isOnline(a), LastSeenAt: optTime(a.LastSeenAt), Backend: a.Backend, Scope: a.Scope, SystemdVersion: a.SystemdVersion,
		AcceptedSerial: a.AcceptedSerial, AppliedSerial: a.AppliedSerial, ManifestState: a.ManifestState, ManifestError: a.ManifestError,
		StatusAt: optTime(a.StatusAt), Pipes: pipes,
		ManifestExpired: a.ManifestExpired, ManifestExpiresAt: optTime(a.ManifestExpiresAt), MachineID: a.MachineID, ReportedHostname: a.ReportedHostname,
		IdentityConflicts: a.IdentityConflicts, IdentityConflictAt: optTime(a.IdentityConflictAt), IdentityConflictMachine: a.IdentityConflictMachine,
	}
	return out
}

// isOnline: the agent has a live stream and was heard from recently.
func (s *Server) isOnline(a *store.Agent) bool {
	return a.RevokedAt.IsZero() && s.hub.Online(a.ID) && s.clock.Now().Sub(a.LastSeenAt) < s.cfg.GRPC.OfflineAfter
}

func (s *Server) handleListAgents(w http.ResponseWriter, r *http.Request) error {
	pg, sel, err := pageAndTags(r)
	if err != nil {
		return err
	}
	status := r.URL.Query().Get("status")
	switch status {
	case "", "online", "offline", "revoked":
	default:
		return errs.New(errs.ErrInvalidRequest, "invalid status", api.Detail{Field: "status", Message: fmt.Sprintf("%q is not one of online, offline, revoked", status)})
	}
	as, err := s.store.ListAgents(r.Context())
	if err != nil {
		return err
	}
	kept := make([]api.Agent, 0, len(as))
	for _, a := range as {
		if !hasTags(a.Tags, sel) {
			continue
		}
		aj := s.agentJSON(a)
		if status != "" && aj.State() != status {
			continue
		}
		kept = append(kept, aj)
	}
	items, next := paginate(kept, func(a api.Agent) string { return timeKey(a.CreatedAt) + "/" + a.ID }, pg)
	return writeJSON(w, http.StatusOK, api.AgentList{Agents: items, NextCursor: next})
}

func (s *Server) getAgentJSON(ctx context.Context, id string) (*api.Agent, error) {
	a, err := s.store.GetAgent(ctx, id)
	if err != nil {
		return nil, err
	}
	out := s.agentJSON(a)
	if m, err := s.store.GetManifest(ctx, id); err == nil {
		out.Manifest = &api.ManifestInfo{Serial: m.Serial, Digest: m.Digest, IssuedAt: m.IssuedAt, ExpiresAt: m.ExpiresAt, KeyListVersion: m.KeyListVersion}
	} else if !errors.Is(err, errs.ErrNotFound) {
		return nil, err
	}
	return &out, nil
}

func (s *Server) handleGetAgent(w http.ResponseWriter, r *http.Request) error {
	_, out, err := fetchParam(r, agentIDParam, s.getAgentJSON)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, out)
}

func (s *Server) handlePutTags(w http.ResponseWriter, r *http.Request) error {
	id, req, err := paramBody[api.TagsRequest](w, r, agentIDParam, s.cfg.HTTP.MaxBodyBytes)
	if err != nil {
		return err
	}
	if d := checkTags("tags", req.Tags); len(d) > 0 {
		return errs.New(errs.ErrValidation, "invalid tags", d...)
	}
	if req.Tags == nil {
		req.Tags = map[string]string{}
	}
	before, err := s.getAgentJSON(r.Context(), id)
	if err != nil {
		return err
	}
	if err := s.store.SetAgentTags(r.Context(), id, req.Tags, s.clock.Now()); err != nil {
		return err
	}
	if _, err := s.compiler.Compile(r.Context(), []string{id}); err != nil {
		return err
	}
	after, err := s.getAgentJSON(r.Context(), id)
	if err != nil {
		return err
	}
	setAudit(r, "agent/"+id, before, after)
	return writeJSON(w, http.StatusOK, after)
}

func (s *Server) handleRevokeAgent(w http.ResponseWriter, r *http.Request) error {
	id, before, err := fetchParam(r, agentIDParam, s.getAgentJSON)
	if err != nil {
		return err
	}
	if err := s.store.RevokeAgent(r.Context(), id, s.clock.Now()); err != nil {
		return err
	}
	s.hub.Close(id, stream.ErrRevoked)
	s.log.Info("agent revoked", "agent", id)
	after, err := s.getAgentJSON(r.Context(), id)
	if err != nil {
		return err
	}
	setAudit(r, "agent/"+id, before, after)
	return writeJSON(w, http.StatusOK, after)
}

// errDeleted ends the streams of a deleted agent.
var errDeleted = errs.New(errs.ErrAgentRevoked, "the agent was deleted")

func (s *Server) handleDeleteAgent(w http.ResponseWriter, r *http.Request) error {
	id, before, err := fetchParam(r, agentIDParam, s.getAgentJSON)
	if err != nil {
		return err
	}
	if err := s.store.DeleteAgent(r.Context(), id); err != nil {
		return err
	}
	s.hub.Close(id, errDeleted)
	s.forgetAgent(id)
	s.log.Info("agent deleted", "agent", id)
	setAudit(r, "agent/"+id, before, nil)
	return noContent(w)
}
