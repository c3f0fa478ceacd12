package server

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"mime"
	"net/http"
	"path"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/drover/drover/api"
	"github.com/drover/drover/server/errs"
	"github.com/drover/drover/server/store"
	"github.com/drover/drover/server/stream"

	"github.com/drover/drover/manifest"
)

// ---- enrollment tokens

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

// ---- pipes

func pipeJSON(p *store.Pipe) api.Pipe {
	return api.Pipe{Name: p.Name, Version: p.Version, Spec: p.Spec, Payload: manifest.Payload{Digest: p.PayloadDigest, Size: p.PayloadSize},
		CreatedAt: p.CreatedAt, UpdatedAt: p.UpdatedAt}
}

func (s *Server) handlePutPipe(w http.ResponseWriter, r *http.Request) error {
	name, err := pipeName(r)
	if err != nil {
		return err
	}
	pv, bundle, err := s.readPipe(w, r, name)
	if err != nil {
		return err
	}
	if err := s.checkPrivileged(r.Context(), r, &pv.Spec); err != nil {
		return err
	}
	return s.storePipe(w, r, pv, bundle)
}

// storePipe stores a validated pipe version, recompiles the manifests and
// answers with the version in force (201 when it was created).
func (s *Server) storePipe(w http.ResponseWriter, r *http.Request, pv *store.PipeVersion, bundle []byte) error {
	var before any
	if p, err := s.store.GetPipe(r.Context(), pv.Name); err == nil {
		before = pipeJSON(p)
	} else if !errors.Is(err, errs.ErrNotFound) {
		return err
	}
	version, created, err := s.store.PutPipe(r.Context(), pv, bundle, s.clock.Now())
	if err != nil {
		return err
	}
	if created {
		s.log.Info("pipe version created", "pipe", pv.Name, "version", version)
		if _, err := s.compiler.compile(r.Context(), nil); err != nil {
			return err
		}
	}
	after, err := s.store.GetPipe(r.Context(), pv.Name)
	if err != nil {
		return err
	}
	setAudit(r, "pipe/"+pv.Name, before, pipeJSON(after))
	code := http.StatusOK
	if created {
		code = http.StatusCreated
	}
	return writeJSON(w, code, api.PutPipeResponse{Name: pv.Name, Version: version, Digest: pv.PayloadDigest, Created: created})
}

// YAML media types accepted by PUT /api/v1/pipes/{name}.
var yamlTypes = map[string]bool{"application/yaml": true, "application/x-yaml": true, "text/yaml": true, "text/x-yaml": true}

// readPipe reads the body of a pipe PUT: JSON {spec, bundle}, or one YAML
// spec document (then without a bundle: script pipes only).
func (s *Server) readPipe(w http.ResponseWriter, r *http.Request, name string) (*store.PipeVersion, []byte, error) {
	limit := s.pipeBodyLimit()
	if mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type")); err == nil && yamlTypes[mt] {
		body, err := readBody(w, r, limit)
		if err != nil {
			return nil, nil, err
		}
		specs, err := manifest.DecodeSpecs(body)
		var ve *manifest.ValidationError
		if errors.As(err, &ve) {
			var details []api.Detail
			syntax := false
			for _, p := range ve.Problems {
				if strings.HasPrefix(p.Field, "[") && !strings.HasPrefix(p.Field, "[0]") {
					return nil, nil, errs.New(errs.ErrInvalidRequest, "the YAML holds more than one pipe spec; PUT one per request")
				}
			}
			for i, p := range ve.Problems {
				syntax = syntax || p.Field == "[0]" || p.Field == ""
				ve.Problems[i].Field = joinField("spec", strings.TrimPrefix(strings.TrimPrefix(p.Field, "[0]"), "."))
				details = append(details, api.Detail{Field: ve.Problems[i].Field, Message: p.Message, Line: p.Line})
			}
			if syntax { // not YAML, or not one mapping: a 400, like malformed JSON
				return nil, nil, errs.New(errs.ErrInvalidRequest, "invalid YAML: "+details[0].Message, details...)
			}
			return nil, nil, ve
		}
		if err != nil {
			return nil, nil, errs.New(errs.ErrInvalidRequest, "invalid YAML: "+err.Error())
		}
		switch len(specs) {
		case 0:
			return nil, nil, errs.New(errs.ErrInvalidRequest, "the YAML holds no pipe spec")
		case 1:
		default:
			return nil, nil, errs.New(errs.ErrInvalidRequest, fmt.Sprintf("the YAML holds %d pipe specs; PUT one per request", len(specs)))
		}
		raw, err := json.Marshal(&specs[0])
		if err != nil {
			return nil, nil, err
		}
		return s.preparePipe(name, raw, nil)
	}
	var req api.PutPipeRequest
	if err := decodeJSON(w, r, limit, &req); err != nil {
		return nil, nil, err
	}
	return s.preparePipe(name, req.Spec, req.Bundle)
}

// pipeBodyLimit caps a pipe upload: the JSON body cap plus the base64 of a
// maximal bundle.
func (s *Server) pipeBodyLimit() int64 {
	return s.cfg.HTTP.MaxBodyBytes + s.cfg.Signing.MaxPayloadBytes*4/3 + 4096
}

// preparePipe validates a spec and bundle for the pipe name and returns the
// version to store with its bundle; every problem is reported at once.
func (s *Server) preparePipe(name string, rawSpec json.RawMessage, rawBundle *string) (*store.PipeVersion, []byte, error) {
	if len(rawSpec) == 0 || string(rawSpec) == "null" {
		return nil, nil, errs.New(errs.ErrValidation, "spec is required", api.Detail{Field: "spec", Message: "required"})
	}
	var spec manifest.Spec
	if err := decodeStrict(rawSpec, &spec, "spec"); err != nil {
		return nil, nil, err
	}
	var problems []manifest.FieldError
	if spec.Name == "" {
		spec.Name = name
	} else if spec.Name != name {
		problems = append(problems, manifest.FieldError{Field: "spec.name", Message: fmt.Sprintf("%q does not match the name in the path %q", spec.Name, name)})
	}
	spec.Normalize()
	if err := spec.Validate(); err != nil {
		var ve *manifest.ValidationError
		if !errors.As(err, &ve) {
			return nil, nil, err
		}
		for _, p := range ve.Problems {
			p.Field = joinField("spec", p.Field)
			problems = append(problems, p)
		}
	}
	var bundle []byte
	switch {
	case spec.Script != "" && rawBundle != nil:
		problems = append(problems, manifest.FieldError{Field: "bundle", Message: "not used with script: the script becomes the bundle"})
	case len(spec.Command) > 0 && rawBundle == nil:
		problems = append(problems, manifest.FieldError{Field: "bundle", Message: "required with command"})
	case rawBundle != nil:
		b, err := base64.StdEncoding.DecodeString(*rawBundle)
		if err != nil {
			problems = append(problems, manifest.FieldError{Field: "bundle", Message: "not valid base64"})
			break
		}
		if int64(len(b)) > s.cfg.Signing.MaxPayloadBytes {
			return nil, nil, errs.New(errs.ErrTooLarge, "the bundle is too large", api.Detail{Field: "bundle", Message: fmt.Sprintf("%d bytes, at most %d", len(b), s.cfg.Signing.MaxPayloadBytes)})
		}
		if msg := checkBundle(b, spec.Command); msg != "" {
			problems = append(problems, manifest.FieldError{Field: "bundle", Message: msg})
		}
		bundle = b
	}
	if len(problems) > 0 {
		return nil, nil, &manifest.ValidationError{Problems: problems}
	}
	if spec.Script != "" {
		b, err := manifest.ScriptBundle(spec.Script)
		if err != nil {
			return nil, nil, fmt.Errorf("script bundle: %w", err)
		}
		bundle = b
	}
	sj, err := store.SpecJSON(&spec)
	if err != nil {
		return nil, nil, err
	}
	return &store.PipeVersion{Name: name, Spec: spec, SpecJSON: sj, PayloadDigest: manifest.Digest(bundle), PayloadSize: int64(len(bundle))}, bundle, nil
}

// Bundle limits checked on upload; the agent unpacks with the same defaults.
const (
	maxBundleEntries = 10000
	maxBundleBytes   = 256 << 20
)

// checkBundle applies the bundle rule the agent applies before unpacking
// (manifest.ScanBundle: one rule on both sides) and checks that a relative
// command[0] names an executable file in the bundle. It returns a problem
// or "".
func checkBundle(b []byte, command []string) string {
	entries, err := manifest.ScanBundle(b, manifest.UnpackLimits{MaxFiles: maxBundleEntries, MaxBytes: maxBundleBytes})
	if err != nil {
		return strings.TrimPrefix(err.Error(), manifest.ErrUnsafeBundle.Error()+": ")
	}
	if len(command) > 0 && strings.Contains(command[0], "/") && !path.IsAbs(command[0]) {
		prog := path.Clean(command[0])
		i := slices.IndexFunc(entries, func(e manifest.BundleEntry) bool { return e.Name == prog })
		switch {
		case i < 0 || entries[i].Dir:
			return fmt.Sprintf("command[0] %q is not a file in the bundle", command[0])
		case !entries[i].Exec:
			return fmt.Sprintf("command[0] %q is not executable in the bundle", command[0])
		}
	}
	return ""
}

func (s *Server) handleListPipes(w http.ResponseWriter, r *http.Request) error {
	pg, err := parsePage(r)
	if err != nil {
		return err
	}
	sel, err := queryTags(r)
	if err != nil {
		return err
	}
	var agent *store.Agent
	if id := r.URL.Query().Get("agent"); id != "" {
		if agent, err = s.store.GetAgent(r.Context(), id); err != nil {
			return err
		}
	}
	ps, err := s.store.ListPipes(r.Context())
	if err != nil {
		return err
	}
	kept := ps[:0]
	for _, p := range ps {
		if len(sel) > 0 && (p.Spec.Targets == nil || !hasTags(p.Spec.Targets.Tags, sel)) {
			continue
		}
		if agent != nil && !p.Spec.Targets.Selects(agent.ID, agent.Tags) {
			continue
		}
		kept = append(kept, p)
	}
	items, next := paginate(kept, func(p *store.Pipe) string { return p.Name }, pg)
	out := api.PipeList{Pipes: make([]api.Pipe, 0, len(items)), NextCursor: next}
	for _, p := range items {
		out.Pipes = append(out.Pipes, pipeJSON(p))
	}
	return writeJSON(w, http.StatusOK, out)
}

func (s *Server) handleGetPipe(w http.ResponseWriter, r *http.Request) error {
	name, err := pipeName(r)
	if err != nil {
		return err
	}
	p, err := s.store.GetPipe(r.Context(), name)
	if err != nil {
		return err
	}
	vs, err := s.store.ListPipeVersions(r.Context(), p.Name)
	if err != nil {
		return err
	}
	out := pipeJSON(p)
	for _, v := range vs {
		out.Versions = append(out.Versions, api.PipeVersionRef{Version: v.Version, Digest: v.PayloadDigest, CreatedAt: v.CreatedAt})
	}
	return writeJSON(w, http.StatusOK, out)
}

func (s *Server) handleDeletePipe(w http.ResponseWriter, r *http.Request) error {
	name, err := pipeName(r)
	if err != nil {
		return err
	}
	p, err := s.store.GetPipe(r.Context(), name)
	if err != nil {
		return err
	}
	if err := s.store.DeletePipe(r.Context(), name, s.clock.Now()); err != nil {
		return err
	}
	s.log.Info("pipe deleted", "pipe", name)
	setAudit(r, "pipe/"+name, pipeJSON(p), nil)
	if _, err := s.compiler.compile(r.Context(), nil); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (s *Server) handleRunPipe(w http.ResponseWriter, r *http.Request) error {
	name, err := pipeName(r)
	if err != nil {
		return err
	}
	var req api.RunPipeRequest
	if err := decodeOptionalJSON(w, r, s.cfg.HTTP.MaxBodyBytes, &req); err != nil {
		return err
	}
	if req.Agent != "" && len(req.Tags) > 0 {
		return errs.New(errs.ErrInvalidRequest, "use agent or tags, not both", api.Detail{Field: "tags", Message: "not with agent"})
	}
	if d := checkTags("tags", req.Tags); len(d) > 0 {
		return errs.New(errs.ErrValidation, "invalid tags", d...)
	}
	p, err := s.store.GetPipe(r.Context(), name)
	if err != nil {
		return err
	}
	agents, err := s.store.ListAgents(r.Context())
	if err != nil {
		return err
	}
	resp := api.RunPipeResponse{RequestID: "req-" + strings.ToLower(b32.EncodeToString(randomBytes(10))), Sent: []string{}, Offline: []string{}}
	found := false
	for _, a := range agents {
		if !a.RevokedAt.IsZero() || (req.Agent != "" && a.ID != req.Agent) || !p.Spec.Targets.Selects(a.ID, a.Tags) || !hasTags(a.Tags, req.Tags) {
			continue
		}
		found = true
		if s.hub.RunNow(a.ID, p.Name, resp.RequestID) {
			resp.Sent = append(resp.Sent, a.ID)
		} else {
			resp.Offline = append(resp.Offline, a.ID)
		}
	}
	switch {
	case req.Agent != "" && !found:
		return errs.New(errs.ErrNotFound, fmt.Sprintf("pipe %s does not run on agent %s", p.Name, req.Agent))
	case len(req.Tags) > 0 && !found:
		return errs.New(errs.ErrNotFound, fmt.Sprintf("pipe %s runs on no agent with tags %s", p.Name, formatTags(req.Tags)))
	}
	setAudit(r, "pipe/"+p.Name, nil, resp)
	return writeJSON(w, http.StatusAccepted, resp)
}

// ---- agents

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
	pg, err := parsePage(r)
	if err != nil {
		return err
	}
	sel, err := queryTags(r)
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
		if status != "" && agentState(&aj) != status {
			continue
		}
		kept = append(kept, aj)
	}
	items, next := paginate(kept, func(a api.Agent) string { return timeKey(a.CreatedAt) + "/" + a.ID }, pg)
	return writeJSON(w, http.StatusOK, api.AgentList{Agents: items, NextCursor: next})
}

func agentState(a *api.Agent) string {
	switch {
	case a.Revoked:
		return "revoked"
	case a.Online:
		return "online"
	}
	return "offline"
}

func (s *Server) getAgentJSON(r *http.Request, id string) (*api.Agent, error) {
	a, err := s.store.GetAgent(r.Context(), id)
	if err != nil {
		return nil, err
	}
	out := s.agentJSON(a)
	if m, err := s.store.GetManifest(r.Context(), id); err == nil {
		out.Manifest = &api.ManifestInfo{Serial: m.Serial, Digest: m.Digest, IssuedAt: m.IssuedAt, ExpiresAt: m.ExpiresAt, KeyListVersion: m.KeyListVersion}
	} else if !errors.Is(err, errs.ErrNotFound) {
		return nil, err
	}
	return &out, nil
}

func (s *Server) handleGetAgent(w http.ResponseWriter, r *http.Request) error {
	id, err := agentIDParam(r)
	if err != nil {
		return err
	}
	out, err := s.getAgentJSON(r, id)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, out)
}

func (s *Server) handlePutTags(w http.ResponseWriter, r *http.Request) error {
	id, err := agentIDParam(r)
	if err != nil {
		return err
	}
	var req api.TagsRequest
	if err := decodeJSON(w, r, s.cfg.HTTP.MaxBodyBytes, &req); err != nil {
		return err
	}
	if d := checkTags("tags", req.Tags); len(d) > 0 {
		return errs.New(errs.ErrValidation, "invalid tags", d...)
	}
	if req.Tags == nil {
		req.Tags = map[string]string{}
	}
	before, err := s.getAgentJSON(r, id)
	if err != nil {
		return err
	}
	if err := s.store.SetAgentTags(r.Context(), id, req.Tags, s.clock.Now()); err != nil {
		return err
	}
	if _, err := s.compiler.compile(r.Context(), []string{id}); err != nil {
		return err
	}
	after, err := s.getAgentJSON(r, id)
	if err != nil {
		return err
	}
	setAudit(r, "agent/"+id, before, after)
	return writeJSON(w, http.StatusOK, after)
}

func (s *Server) handleRevokeAgent(w http.ResponseWriter, r *http.Request) error {
	id, err := agentIDParam(r)
	if err != nil {
		return err
	}
	before, err := s.getAgentJSON(r, id)
	if err != nil {
		return err
	}
	if err := s.store.RevokeAgent(r.Context(), id, s.clock.Now()); err != nil {
		return err
	}
	s.hub.Close(id, stream.ErrRevoked)
	s.log.Info("agent revoked", "agent", id)
	after, err := s.getAgentJSON(r, id)
	if err != nil {
		return err
	}
	setAudit(r, "agent/"+id, before, after)
	return writeJSON(w, http.StatusOK, after)
}

// errDeleted ends the streams of a deleted agent.
var errDeleted = errs.New(errs.ErrAgentRevoked, "the agent was deleted")

func (s *Server) handleDeleteAgent(w http.ResponseWriter, r *http.Request) error {
	id, err := agentIDParam(r)
	if err != nil {
		return err
	}
	before, err := s.getAgentJSON(r, id)
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
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// ---- runs

func runJSON(r *store.Run) api.Run {
	return api.Run{ID: r.ID, AgentID: r.AgentID, Pipe: r.Pipe, PipeVersion: r.PipeVersion, Trigger: r.Trigger, Status: r.Status,
		ExitCode: r.ExitCode, Signal: r.Signal, Error: r.Error, RequestID: r.RequestID, Reason: r.Reason, Attempts: r.Attempts, WrittenBy: r.WrittenBy,
		ScheduledAt: optTime(r.ScheduledAt),
		StartedAt:   optTime(r.StartedAt), FinishedAt: optTime(r.FinishedAt), DurationMS: r.DurationMS, LogChunks: r.LogChunks,
		LogBytes: r.LogBytes, LogTruncated: r.LogTruncated, CreatedAt: r.CreatedAt, UpdatedAt: r.UpdatedAt}
}

func (s *Server) handleListRuns(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	pg, err := parsePage(r)
	if err != nil {
		return err
	}
	f := store.RunFilter{Pipe: q.Get("pipe"), Agent: q.Get("agent"), Status: q.Get("status"), RequestID: q.Get("request_id"), Reason: q.Get("reason"), Limit: pg.limit + 1}
	if err := checkRunFilter(r, &f); err != nil {
		return err
	}
	if pg.cursor != "" {
		at, id, ok := strings.Cut(pg.cursor, "/")
		n, err := strconv.ParseInt(at, 10, 64)
		if !ok || err != nil || n <= 0 || id == "" {
			return errBadCursor
		}
		f.BeforeAt, f.BeforeID = time.Unix(0, n).UTC(), id
	}
	runs, err := s.store.ListRuns(r.Context(), f)
	if err != nil {
		return err
	}
	out := api.RunList{Runs: make([]api.Run, 0, len(runs))}
	for i, x := range runs {
		if i == pg.limit {
			last := runs[i-1]
			out.NextCursor = encodeCursor(timeKey(last.CreatedAt) + "/" + last.ID)
			break
		}
		out.Runs = append(out.Runs, runJSON(x))
	}
	return writeJSON(w, http.StatusOK, out)
}

func (s *Server) handleGetRun(w http.ResponseWriter, r *http.Request) error {
	run, err := s.store.GetRun(r.Context(), r.PathValue("id"))
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, runJSON(run))
}

func chunkJSON(c *store.LogChunk) api.LogChunk {
	return api.LogChunk{Seq: c.Seq, Stream: c.Stream, At: c.At, Data: c.Data}
}

// wantsJSON: the first media type the client accepts is application/json.
func wantsJSON(r *http.Request) bool {
	first, _, _ := strings.Cut(r.Header.Get("Accept"), ",")
	mt, _, err := mime.ParseMediaType(strings.TrimSpace(first))
	return err == nil && mt == "application/json"
}

// handleRunLogs returns the run's output as text/plain (chunks in order), or
// as JSON chunks when the client accepts only application/json.
func (s *Server) handleRunLogs(w http.ResponseWriter, r *http.Request) error {
	run, err := s.store.GetRun(r.Context(), r.PathValue("id"))
	if err != nil {
		return err
	}
	chunks, err := s.store.GetLogs(r.Context(), run.ID)
	if err != nil {
		return err
	}
	w.Header().Set("X-Drover-Log-Truncated", strconv.FormatBool(run.LogTruncated))
	w.Header().Set("Vary", "Accept")
	if wantsJSON(r) {
		out := api.Logs{RunID: run.ID, Truncated: run.LogTruncated, Chunks: make([]api.LogChunk, 0, len(chunks))}
		for _, c := range chunks {
			out.Chunks = append(out.Chunks, chunkJSON(c))
		}
		return writeJSON(w, http.StatusOK, out)
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(http.StatusOK)
	for _, c := range chunks {
		if _, err := w.Write(c.Data); err != nil {
			return nil
		}
	}
	return nil
}

// ---- secrets

var secretNameRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,127}$`)

// maxSecretBytes caps one secret value.
const maxSecretBytes = 64 << 10

func (s *Server) handlePutSecret(w http.ResponseWriter, r *http.Request) error {
	name, err := secretName(r)
	if err != nil {
		return err
	}
	var req api.SecretRequest
	if err := decodeJSON(w, r, maxSecretBytes*2+1024, &req); err != nil {
		return err
	}
	switch {
	case req.Value == nil:
		return errs.New(errs.ErrValidation, "value is required", api.Detail{Field: "value", Message: "required"})
	case len(*req.Value) > maxSecretBytes:
		return errs.New(errs.ErrValidation, "value is too long", api.Detail{Field: "value", Message: fmt.Sprintf("at most %d bytes", maxSecretBytes)})
	}
	before, err := s.secretInfo(r.Context(), name)
	if err != nil {
		return err
	}
	if err := s.store.PutSecret(r.Context(), name, s.sealer.Seal(name, []byte(*req.Value)), s.clock.Now()); err != nil {
		return err
	}
	s.log.Info("secret set", "secret", name)
	after, err := s.secretInfo(r.Context(), name)
	if err != nil {
		return err
	}
	setAudit(r, "secret/"+name, before, after)
	if err := s.compiler.secretChanged(r.Context(), name); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// secretInfo describes a secret (never its value); nil when there is none.
func (s *Server) secretInfo(ctx context.Context, name string) (*api.Secret, error) {
	list, err := s.store.ListSecrets(ctx)
	if err != nil {
		return nil, err
	}
	for i := range list {
		if list[i].Name == name {
			return &list[i], nil
		}
	}
	return nil, nil
}

func (s *Server) handleListSecrets(w http.ResponseWriter, r *http.Request) error {
	pg, err := parsePage(r)
	if err != nil {
		return err
	}
	list, err := s.store.ListSecrets(r.Context())
	if err != nil {
		return err
	}
	items, next := paginate(list, func(si api.Secret) string { return si.Name }, pg)
	return writeJSON(w, http.StatusOK, api.SecretList{Secrets: items, NextCursor: next})
}

func (s *Server) handleDeleteSecret(w http.ResponseWriter, r *http.Request) error {
	name, err := secretName(r)
	if err != nil {
		return err
	}
	before, err := s.secretInfo(r.Context(), name)
	if err != nil {
		return err
	}
	if err := s.store.DeleteSecret(r.Context(), name); err != nil {
		return err
	}
	s.log.Info("secret deleted", "secret", name)
	setAudit(r, "secret/"+name, before, nil)
	if err := s.compiler.secretChanged(r.Context(), name); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// ---- keys

func (s *Server) handleRotateKeys(w http.ResponseWriter, r *http.Request) error {
	signer, v := s.keys.Signer()
	before := api.RotateResponse{KeyID: signer.KeyID(), KeyListVersion: v}
	resp, err := s.RotateKeys(r.Context())
	if err != nil {
		return err
	}
	setAudit(r, "keys", before, resp)
	return writeJSON(w, http.StatusOK, resp)
}
