package server

import (
	"context"
	"fmt"
	"net/http"
	"regexp"
	"strings"
	"time"
	"unicode"

	"github.com/drover/drover/api"
	"github.com/drover/drover/manifest"
	"github.com/drover/drover/server/errs"
	"github.com/drover/drover/server/store"
)

func (s *Server) handleCreateToken(w http.ResponseWriter, r *http.Request) error {
	var req api.EnrollmentTokenRequest
	if err := decodeJSON(w, r, s.cfg.HTTP.MaxBodyBytes, &req); err != nil {
		return err
	}
	resp, err := createToken(r.Context(), s.store, s.cfg.Enrollment, s.ca.Pin(), s.clock.Now(), req)
	if err != nil {
		return err
	}
	if t, err := s.store.GetToken(r.Context(), resp.ID); err == nil {
		setAudit(r, "enrollment-token/"+resp.ID, nil, tokenJSON(t, s.clock.Now()))
	}
	return writeJSON(w, http.StatusCreated, resp)
}

var agentNameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$`)

// createToken validates req and stores a new enrollment token.
func createToken(ctx context.Context, st store.TokenStore, cfg EnrollmentConfig, pin string, now time.Time, req api.EnrollmentTokenRequest) (*api.EnrollmentTokenCreated, error) {
	var details []api.Detail
	ttl := cfg.DefaultTTL
	if req.TTL != "" {
		d, err := time.ParseDuration(req.TTL)
		switch {
		case err != nil:
			details = append(details, api.Detail{Field: "ttl", Message: fmt.Sprintf("%q is not a duration (e.g. 1h, 30m)", req.TTL)})
		case d < time.Minute || d > cfg.MaxTTL:
			details = append(details, api.Detail{Field: "ttl", Message: fmt.Sprintf("must be between 1m and %s", cfg.MaxTTL)})
		default:
			ttl = d
		}
	}
	if req.Name != "" && !agentNameRE.MatchString(req.Name) {
		details = append(details, api.Detail{Field: "name", Message: "use 1-63 letters, digits, '.', '_' and '-', starting with a letter or digit"})
	}
	details = append(details, checkTags("tags", req.Tags)...)
	if len(details) > 0 {
		return nil, errs.New(errs.ErrValidation, "the token request has invalid fields", details...)
	}
	token, rec := newToken(pin, req.Name, req.Tags, now, ttl)
	if err := st.CreateToken(ctx, rec); err != nil {
		return nil, err
	}
	return &api.EnrollmentTokenCreated{ID: rec.ID, Token: token, ExpiresAt: rec.ExpiresAt, Name: rec.Name, Tags: rec.Tags}, nil
}

func checkTags(field string, tags map[string]string) []api.Detail {
	var details []api.Detail
	if len(tags) > manifest.MaxTags {
		details = append(details, api.Detail{Field: field, Message: fmt.Sprintf("%d tags, at most %d", len(tags), manifest.MaxTags)})
	}
	for k, v := range tags {
		if !manifest.ValidTagKey(k) {
			details = append(details, api.Detail{Field: field, Message: fmt.Sprintf("%q is not a valid tag key", k)})
		} else if !manifest.ValidTagValue(v) {
			details = append(details, api.Detail{Field: field + "." + k, Message: "use at most 63 letters, digits, '.', '_' and '-'"})
		}
	}
	return details
}

func tokenJSON(t *store.EnrollmentToken, now time.Time) api.EnrollmentToken {
	out := api.EnrollmentToken{ID: t.ID, Name: t.Name, Tags: t.Tags, CreatedAt: t.CreatedAt, ExpiresAt: t.ExpiresAt, UsedAt: optTime(t.UsedAt), AgentID: t.AgentID, State: "valid"}
	if out.Tags == nil {
		out.Tags = map[string]string{}
	}
	switch {
	case !t.UsedAt.IsZero():
		out.State = "used"
	case !now.Before(t.ExpiresAt):
		out.State = "expired"
	}
	return out
}

func (s *Server) handleListTokens(w http.ResponseWriter, r *http.Request) error {
	items, next, err := listPage(r, s.store.ListTokens, func(t *store.EnrollmentToken) string { return newestFirstKey(t.CreatedAt) + "/" + t.ID })
	if err != nil {
		return err
	}
	tokens := mapList(items, func(t *store.EnrollmentToken) api.EnrollmentToken { return tokenJSON(t, s.clock.Now()) })
	return writeJSON(w, http.StatusOK, api.EnrollmentTokenList{Tokens: tokens, NextCursor: next})
}

func (s *Server) handleDeleteToken(w http.ResponseWriter, r *http.Request) error {
	id, t, err := fetchParam(r, enrollmentTokenID, s.store.GetToken)
	if err != nil {
		return err
	}
	if err := s.store.DeleteToken(r.Context(), id); err != nil {
		return err
	}
	setAudit(r, "enrollment-token/"+id, tokenJSON(t, s.clock.Now()), nil)
	return noContent(w)
}

func apiTokenJSON(t *store.APIToken) api.APIToken {
	out := api.APIToken{ID: t.ID, Name: t.Name, Role: t.Role, CreatedAt: t.CreatedAt, CreatedBy: t.CreatedBy,
		ExpiresAt: optTime(t.ExpiresAt), LastUsedAt: optTime(t.LastUsedAt), RevokedAt: optTime(t.RevokedAt)}
	return out
}

// maxAPITokenTTL bounds an API token's lifetime when one is asked for.
const maxAPITokenTTL = 10 * 365 * 24 * time.Hour

// checkAPITokenRequest validates a token request: every problem at once.
func checkAPITokenRequest(req api.APITokenRequest) (role, time.Duration, error) {
	var details []api.Detail
	switch {
	case req.Name == "":
		details = append(details, api.Detail{Field: "name", Message: "required"})
	case len(req.Name) > 128 || strings.ContainsFunc(req.Name, func(c rune) bool { return !unicode.IsPrint(c) }):
		details = append(details, api.Detail{Field: "name", Message: "at most 128 printable characters"})
	}
	rl, ok := parseRole(req.Role)
	if !ok {
		details = append(details, api.Detail{Field: "role", Message: fmt.Sprintf("%s is not one of viewer, operator, admin", quoteName(req.Role))})
	}
	var ttl time.Duration
	if req.TTL != "" {
		d, err := time.ParseDuration(req.TTL)
		switch {
		case err != nil:
			details = append(details, api.Detail{Field: "ttl", Message: fmt.Sprintf("%s is not a duration (e.g. 720h)", quoteName(req.TTL))})
		case d < time.Minute || d > maxAPITokenTTL:
			details = append(details, api.Detail{Field: "ttl", Message: "must be between 1m and 87600h"})
		default:
			ttl = d
		}
	}
	if len(details) > 0 {
		return 0, 0, errs.New(errs.ErrValidation, "the token request has invalid fields", details...)
	}
	return rl, ttl, nil
}

func (s *Server) handleCreateAPIToken(w http.ResponseWriter, r *http.Request) error {
	var req api.APITokenRequest
	if err := decodeJSON(w, r, s.cfg.HTTP.MaxBodyBytes, &req); err != nil {
		return err
	}
	rl, ttl, err := checkAPITokenRequest(req)
	if err != nil {
		return err
	}
	p := principalOf(r)
	token, t := newAPIToken(req.Name, rl, p.ID, s.clock.Now(), ttl)
	if err := s.store.CreateAPIToken(r.Context(), t); err != nil {
		return err
	}
	s.log.Info("api token created", "token_id", t.ID, "role", t.Role, "by", p.ID)
	out := api.APITokenCreated{APIToken: apiTokenJSON(t), Token: token}
	setAudit(r, "api-token/"+t.ID, nil, out.APIToken)
	return writeJSON(w, http.StatusCreated, out)
}

func (s *Server) handleListAPITokens(w http.ResponseWriter, r *http.Request) error {
	items, next, err := listPage(r, s.store.ListAPITokens, func(t *store.APIToken) string { return timeKey(t.CreatedAt) + "/" + t.ID })
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, api.APITokenList{Tokens: mapList(items, apiTokenJSON), NextCursor: next})
}

func (s *Server) handleRevokeAPIToken(w http.ResponseWriter, r *http.Request) error {
	id, before, err := fetchParam(r, apiTokenID, s.store.GetAPIToken)
	if err != nil {
		return err
	}
	if err := s.store.RevokeAPIToken(r.Context(), id, s.clock.Now()); err != nil {
		return err
	}
	// Its console sessions would be refused anyway; they are deleted too.
	if err := s.store.DeleteTokenSessions(r.Context(), id); err != nil {
		s.log.Warn("deleting the console sessions of a revoked token", "token_id", id, "err", err)
	}
	after, err := s.store.GetAPIToken(r.Context(), id)
	if err != nil {
		return err
	}
	s.log.Info("api token revoked", "token_id", id, "by", principalOf(r).ID)
	setAudit(r, "api-token/"+id, apiTokenJSON(before), apiTokenJSON(after))
	return noContent(w)
}
