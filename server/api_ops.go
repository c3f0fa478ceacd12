package server

import (
	"bytes"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"mime"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode"

	"github.com/drover/drover/api"
	"github.com/drover/drover/server/errs"
	"github.com/drover/drover/server/store"

	"github.com/drover/drover/manifest"
)

// The operator API added on top of the control plane's first admin API:
// path checks, tokens, pipe history, schedule preview, dry-run, cancel.

// ---- path and query parameters

// pipeName is the {name} of a pipe route, checked: a bad name is a 400
// naming the problem, never a lookup.
func pipeName(r *http.Request) (string, error) {
	name := r.PathValue("name")
	if !manifest.ValidName(name) {
		return "", errs.New(errs.ErrInvalidRequest, "invalid pipe name "+quoteName(name)+" in the path",
			api.Detail{Field: "name", Message: "use 1-63 lowercase letters, digits and '-', starting with a letter or digit"})
	}
	return name, nil
}

func secretName(r *http.Request) (string, error) {
	name := r.PathValue("name")
	if !secretNameRE.MatchString(name) || strings.HasPrefix(name, "DROVER_") {
		return "", errs.New(errs.ErrInvalidRequest, "invalid secret name "+quoteName(name)+" in the path",
			api.Detail{Field: "name", Message: "use 1-128 letters, digits and '_', not starting with a digit or DROVER_"})
	}
	return name, nil
}

// agentIDParam is the {id} of an agent route, checked.
func agentIDParam(r *http.Request) (string, error) {
	id := r.PathValue("id")
	if !manifest.ValidAgentID(id) {
		return "", errs.New(errs.ErrInvalidRequest, "invalid agent id "+quoteName(id)+" in the path",
			api.Detail{Field: "id", Message: "an agent id such as agt-..."})
	}
	return id, nil
}

// tokenIDParam is the {id} of an enrollment-token or API-token route.
func tokenIDParam(r *http.Request, apiToken bool) (string, error) {
	id := r.PathValue("id")
	if tokenIDRE.MatchString(id) || (apiToken && id == bootstrapTokenID) {
		return id, nil
	}
	return "", errs.New(errs.ErrInvalidRequest, "invalid token id "+quoteName(id)+" in the path",
		api.Detail{Field: "id", Message: "16 lowercase letters and digits 2-7, as listed"})
}

// decodeOptionalJSON decodes a JSON body like decodeJSON; an empty body
// leaves v as it is.
func decodeOptionalJSON(w http.ResponseWriter, r *http.Request, limit int64, v any) error {
	if r.ContentLength == 0 {
		return nil
	}
	body, err := readBody(w, r, limit)
	if err != nil || len(bytes.TrimSpace(body)) == 0 {
		return err
	}
	if ct := r.Header.Get("Content-Type"); ct != "" {
		if mt, _, err := mime.ParseMediaType(ct); err != nil || mt != "application/json" {
			return errs.New(errs.ErrUnsupportedMedia, "the body must be application/json")
		}
	}
	return decodeStrict(body, v, "")
}

// quoteName quotes a name from a request for a message: escaped, and cut
// at 80 bytes.
func quoteName(s string) string {
	if len(s) > 80 {
		s = s[:80] + "..."
	}
	return strconv.QuoteToASCII(s)
}

// queryTags parses repeated ?tag=key=value parameters.
func queryTags(r *http.Request) (map[string]string, error) {
	vals := r.URL.Query()["tag"]
	if len(vals) == 0 {
		return nil, nil
	}
	sel := map[string]string{}
	for _, kv := range vals {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || !manifest.ValidTagKey(k) || !manifest.ValidTagValue(v) {
			return nil, errs.New(errs.ErrInvalidRequest, "invalid tag filter", api.Detail{Field: "tag", Message: fmt.Sprintf("%s is not key=value with a valid key and value", quoteName(kv))})
		}
		sel[k] = v
	}
	return sel, nil
}

// hasTags reports whether have holds every tag of want (an empty want
// matches everything).
func hasTags(have, want map[string]string) bool {
	for k, v := range want {
		if got, ok := have[k]; !ok || got != v {
			return false
		}
	}
	return true
}

func formatTags(tags map[string]string) string {
	keys := make([]string, 0, len(tags))
	for k, v := range tags {
		keys = append(keys, k+"="+v)
	}
	sort.Strings(keys)
	return strings.Join(keys, ",")
}

// ---- health, whoami, OpenAPI

func (s *Server) handleHealth(w http.ResponseWriter, r *http.Request) error {
	return writeJSON(w, http.StatusOK, api.Health{Status: "ok"})
}

func (s *Server) handleWhoAmI(w http.ResponseWriter, r *http.Request) error {
	p := principalOf(r)
	return writeJSON(w, http.StatusOK, api.WhoAmI{ID: p.ID, Name: p.Name, Role: p.Role.String()})
}

// openAPIDoc is the API's OpenAPI document, generated from the route table
// (openapi_test.go keeps it current: DROVER_UPDATE_OPENAPI=1 go test -run TestOpenAPI ./server).
//
//go:embed openapi.json
var openAPIDoc []byte

func (s *Server) handleOpenAPI(w http.ResponseWriter, r *http.Request) error {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(openAPIDoc)
	return nil
}

// ---- enrollment tokens

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
	pg, err := parsePage(r)
	if err != nil {
		return err
	}
	list, err := s.store.ListTokens(r.Context())
	if err != nil {
		return err
	}
	items, next := paginate(list, func(t *store.EnrollmentToken) string { return newestFirstKey(t.CreatedAt) + "/" + t.ID }, pg)
	out := api.EnrollmentTokenList{Tokens: make([]api.EnrollmentToken, 0, len(items)), NextCursor: next}
	for _, t := range items {
		out.Tokens = append(out.Tokens, tokenJSON(t, s.clock.Now()))
	}
	return writeJSON(w, http.StatusOK, out)
}

func (s *Server) handleDeleteToken(w http.ResponseWriter, r *http.Request) error {
	id, err := tokenIDParam(r, false)
	if err != nil {
		return err
	}
	t, err := s.store.GetToken(r.Context(), id)
	if err != nil {
		return err
	}
	if err := s.store.DeleteToken(r.Context(), id); err != nil {
		return err
	}
	setAudit(r, "enrollment-token/"+id, tokenJSON(t, s.clock.Now()), nil)
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// ---- API tokens

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
	pg, err := parsePage(r)
	if err != nil {
		return err
	}
	list, err := s.store.ListAPITokens(r.Context())
	if err != nil {
		return err
	}
	items, next := paginate(list, func(t *store.APIToken) string { return timeKey(t.CreatedAt) + "/" + t.ID }, pg)
	out := api.APITokenList{Tokens: make([]api.APIToken, 0, len(items)), NextCursor: next}
	for _, t := range items {
		out.Tokens = append(out.Tokens, apiTokenJSON(t))
	}
	return writeJSON(w, http.StatusOK, out)
}

func (s *Server) handleRevokeAPIToken(w http.ResponseWriter, r *http.Request) error {
	id, err := tokenIDParam(r, true)
	if err != nil {
		return err
	}
	before, err := s.store.GetAPIToken(r.Context(), id)
	if err != nil {
		return err
	}
	if err := s.store.RevokeAPIToken(r.Context(), id, s.clock.Now()); err != nil {
		return err
	}
	after, err := s.store.GetAPIToken(r.Context(), id)
	if err != nil {
		return err
	}
	s.log.Info("api token revoked", "token_id", id, "by", principalOf(r).ID)
	setAudit(r, "api-token/"+id, apiTokenJSON(before), apiTokenJSON(after))
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// ---- pipe history

func pipeVersionJSON(v *store.PipeVersion, current uint64, deleted bool) api.PipeVersion {
	return api.PipeVersion{Name: v.Name, Version: v.Version, Spec: v.Spec, Payload: manifest.Payload{Digest: v.PayloadDigest, Size: v.PayloadSize},
		CreatedAt: v.CreatedAt, Current: !deleted && v.Version == current}
}

func (s *Server) handleListPipeVersions(w http.ResponseWriter, r *http.Request) error {
	name, err := pipeName(r)
	if err != nil {
		return err
	}
	pg, err := parsePage(r)
	if err != nil {
		return err
	}
	cur, deleted, err := s.store.PipeState(r.Context(), name)
	if err != nil {
		return err
	}
	vs, err := s.store.ListPipeVersions(r.Context(), name)
	if err != nil {
		return err
	}
	// Newest first: the key sorts descending versions ascending.
	items, next := paginate(vs, func(v *store.PipeVersion) string { return fmt.Sprintf("%020d", ^v.Version) }, pg)
	out := api.PipeVersionList{Name: name, Deleted: deleted, Versions: make([]api.PipeVersion, 0, len(items)), NextCursor: next}
	for _, v := range items {
		out.Versions = append(out.Versions, pipeVersionJSON(v, cur, deleted))
	}
	return writeJSON(w, http.StatusOK, out)
}

// pipeVersion reads the {name} and {version} of a route and the version.
func (s *Server) pipeVersion(r *http.Request) (*store.PipeVersion, uint64, bool, error) {
	name, err := pipeName(r)
	if err != nil {
		return nil, 0, false, err
	}
	n, err := strconv.ParseUint(r.PathValue("version"), 10, 64)
	if err != nil || n == 0 {
		return nil, 0, false, errs.New(errs.ErrInvalidRequest, "invalid version "+quoteName(r.PathValue("version"))+" in the path",
			api.Detail{Field: "version", Message: "a version number: 1, 2, ..."})
	}
	cur, deleted, err := s.store.PipeState(r.Context(), name)
	if err != nil {
		return nil, 0, false, err
	}
	v, err := s.store.GetPipeVersion(r.Context(), name, n)
	if err != nil {
		return nil, 0, false, err
	}
	return v, cur, deleted, nil
}

func (s *Server) handleGetPipeVersion(w http.ResponseWriter, r *http.Request) error {
	v, cur, deleted, err := s.pipeVersion(r)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, pipeVersionJSON(v, cur, deleted))
}

// handleRestorePipeVersion stores an old version's spec and payload as a
// new version (a deleted pipe comes back).
func (s *Server) handleRestorePipeVersion(w http.ResponseWriter, r *http.Request) error {
	v, _, _, err := s.pipeVersion(r)
	if err != nil {
		return err
	}
	bundle, err := s.store.GetPayload(r.Context(), v.PayloadDigest)
	if err != nil {
		return err
	}
	pv := &store.PipeVersion{Name: v.Name, Spec: v.Spec, SpecJSON: v.SpecJSON, PayloadDigest: v.PayloadDigest, PayloadSize: v.PayloadSize}
	if err := s.checkPrivileged(r.Context(), r, &pv.Spec); err != nil {
		return err // an admin's old version stays an admin's to restore
	}
	s.log.Info("pipe version restored", "pipe", v.Name, "from_version", v.Version)
	return s.storePipe(w, r, pv, bundle)
}

// ---- schedule preview

func (s *Server) handlePipeSchedule(w http.ResponseWriter, r *http.Request) error {
	name, err := pipeName(r)
	if err != nil {
		return err
	}
	count := 10
	if c := r.URL.Query().Get("count"); c != "" {
		n, err := strconv.Atoi(c)
		if err != nil || n < 1 || n > 100 {
			return errs.New(errs.ErrInvalidRequest, "invalid count", api.Detail{Field: "count", Message: "must be 1-100"})
		}
		count = n
	}
	after, err := queryTime(r, "after")
	if err != nil {
		return err
	}
	if after.IsZero() {
		after = s.clock.Now()
	}
	p, err := s.store.GetPipe(r.Context(), name)
	if err != nil {
		return err
	}
	sched, err := manifest.ParseSchedule(p.Spec.Schedule)
	if err != nil {
		return fmt.Errorf("stored schedule of %s: %w", name, err) // validated on PUT
	}
	tz := p.Spec.Timezone
	if tz == "" {
		tz = manifest.DefaultTimezone
	}
	loc, err := manifest.LoadLocation(tz)
	if err != nil {
		return fmt.Errorf("stored time zone of %s: %w", name, err)
	}
	out := api.SchedulePreview{Pipe: name, Schedule: p.Spec.Schedule, Timezone: tz, After: after.In(loc), Enabled: p.Spec.IsEnabled(), FireTimes: make([]time.Time, 0, count)}
	if every, ok := sched.Every(); ok {
		out.Every = manifest.Duration(every).String()
	}
	t := after
	for range count {
		t = sched.Next(t, loc)
		if t.IsZero() {
			break
		}
		out.FireTimes = append(out.FireTimes, t.In(loc))
	}
	return writeJSON(w, http.StatusOK, out)
}

// ---- dry-run

func (s *Server) handleDryRun(w http.ResponseWriter, r *http.Request) error {
	name, err := pipeName(r)
	if err != nil {
		return err
	}
	var req api.DryRunRequest
	if err := decodeJSON(w, r, s.pipeBodyLimit(), &req); err != nil {
		return err
	}
	var cur *store.Pipe
	if p, err := s.store.GetPipe(r.Context(), name); err == nil {
		cur = p
	} else if !errors.Is(err, errs.ErrNotFound) {
		return err
	}
	out := api.DryRunResponse{Name: name, Agents: []api.AgentChange{}}
	var next *store.PipeVersion
	switch {
	case req.Delete:
		if req.Spec != nil || req.Bundle != nil {
			return errs.New(errs.ErrInvalidRequest, "delete takes no spec or bundle", api.Detail{Field: "delete", Message: "not with spec or bundle"})
		}
		if cur == nil {
			return errs.New(errs.ErrNotFound, "pipe not found")
		}
		out.Action = "delete"
	default:
		pv, _, err := s.preparePipe(name, req.Spec, req.Bundle)
		if err != nil {
			return err
		}
		next = pv
		out.Digest = pv.PayloadDigest
		reasons, err := s.privileged(r.Context(), &pv.Spec)
		if err != nil {
			return err
		}
		out.Privileged = reasons
		p := principalOf(r)
		switch {
		case len(reasons) > 0 && !s.mayWritePrivileged(p):
			out.Refused = privilegedRefusal(p, reasons).Error()
		case p == nil || p.Role < roleOperator:
			out.Refused = "a PUT needs the operator role"
		}
		switch {
		case cur != nil && string(cur.SpecJSON) == string(pv.SpecJSON) && cur.PayloadDigest == pv.PayloadDigest:
			out.Action, out.Version = "unchanged", cur.Version
			return writeJSON(w, http.StatusOK, out)
		case cur != nil:
			out.Action, next.Version = "update", cur.Version+1
		default:
			out.Action, next.Version = "create", 1
			if v, _, err := s.store.PipeState(r.Context(), name); err == nil {
				next.Version = v + 1 // a deleted pipe's versions go on
			} else if !errors.Is(err, errs.ErrNotFound) {
				return err
			}
		}
		out.Version = next.Version
	}
	var oldEntry, newEntry []byte
	if cur != nil {
		e, err := newPipeEntry(&cur.PipeVersion)
		if err != nil {
			return err
		}
		oldEntry = e.json
	}
	if next != nil {
		e, err := newPipeEntry(next)
		if err != nil {
			return err
		}
		newEntry = e.json
	}
	agents, err := s.store.ListAgents(r.Context())
	if err != nil {
		return err
	}
	for _, a := range agents {
		if !a.RevokedAt.IsZero() {
			continue
		}
		was := cur != nil && cur.Spec.Targets.Selects(a.ID, a.Tags)
		will := next != nil && next.Spec.Targets.Selects(a.ID, a.Tags)
		c := api.AgentChange{ID: a.ID, Name: a.Name, Hostname: a.Hostname}
		switch {
		case was && !will:
			c.Action, c.Diff = "remove", entryDiff(oldEntry, nil)
		case !was && will:
			c.Action, c.Diff = "add", entryDiff(nil, newEntry)
		case was && will && !bytes.Equal(oldEntry, newEntry):
			c.Action, c.Diff = "update", entryDiff(oldEntry, newEntry)
		default:
			continue
		}
		out.Agents = append(out.Agents, c)
	}
	return writeJSON(w, http.StatusOK, out)
}

// entryDiff compares two manifest entries field by field (the spec's
// fields flattened to spec.<field>): "- field: old" and "+ field: new".
func entryDiff(old, new []byte) string {
	a, b := flattenEntry(old), flattenEntry(new)
	keys := make([]string, 0, len(a)+len(b))
	for k := range a {
		keys = append(keys, k)
	}
	for k := range b {
		if _, ok := a[k]; !ok {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	var sb strings.Builder
	for _, k := range keys {
		va, ina := a[k]
		vb, inb := b[k]
		if ina && inb && va == vb {
			continue
		}
		if ina {
			fmt.Fprintf(&sb, "- %s: %s\n", k, va)
		}
		if inb {
			fmt.Fprintf(&sb, "+ %s: %s\n", k, vb)
		}
	}
	return sb.String()
}

// flattenEntry maps a manifest entry's fields to their compact JSON, with
// spec and payload fields as spec.<field> and payload.<field>.
func flattenEntry(b []byte) map[string]string {
	out := map[string]string{}
	if b == nil {
		return out
	}
	var top map[string]json.RawMessage
	if json.Unmarshal(b, &top) != nil {
		return out
	}
	for k, v := range top {
		var sub map[string]json.RawMessage
		if (k == "spec" || k == "payload") && json.Unmarshal(v, &sub) == nil {
			for sk, sv := range sub {
				out[k+"."+sk] = string(sv)
			}
			continue
		}
		out[k] = string(v)
	}
	return out
}

// ---- cancel

func (s *Server) handleCancelRun(w http.ResponseWriter, r *http.Request) error {
	var none struct{}
	if err := decodeOptionalJSON(w, r, s.cfg.HTTP.MaxBodyBytes, &none); err != nil {
		return err
	}
	run, err := s.store.GetRun(r.Context(), r.PathValue("id"))
	if err != nil {
		return err
	}
	if run.Status != api.StatusPending && run.Status != api.StatusRunning {
		why := run.Status
		if run.Reason != "" {
			why += ", reason " + run.Reason
		}
		return errs.New(errs.ErrConflict, fmt.Sprintf("run %s has ended (%s): there is nothing to cancel", run.ID, why))
	}
	if !s.hub.Cancel(run.AgentID, run.ID) {
		return errs.New(errs.ErrConflict, fmt.Sprintf("agent %s, which runs %s, is not connected; retry when it is online", run.AgentID, run.ID))
	}
	s.log.Info("run cancel requested", "run", run.ID, "agent", run.AgentID)
	out := api.CancelResponse{RunID: run.ID, AgentID: run.AgentID, Sent: true}
	setAudit(r, "run/"+run.ID, runJSON(run), out)
	return writeJSON(w, http.StatusAccepted, out)
}
