package server

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"path"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/drover/drover/manifest"
	agentpb "github.com/drover/drover/proto"
)

// ---- enrollment tokens

// TokenRequest is the body of POST /api/v1/enrollment-tokens.
type TokenRequest struct {
	TTL  string            `json:"ttl"`
	Name string            `json:"name"`
	Tags map[string]string `json:"tags"`
}

// TokenResponse shows a new token, once.
type TokenResponse struct {
	ID        string    `json:"id"`
	Token     string    `json:"token"`
	ExpiresAt time.Time `json:"expires_at"`
}

func (s *Server) handleCreateToken(w http.ResponseWriter, r *http.Request) error {
	var req TokenRequest
	if err := decodeJSON(w, r, s.cfg.HTTP.MaxBodyBytes, &req); err != nil {
		return err
	}
	resp, err := createToken(r.Context(), s.store, s.cfg.Enrollment, s.ca.pin, s.clock.Now(), req)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusCreated, resp)
}

var agentNameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$`)

// createToken validates req and stores a new enrollment token.
func createToken(ctx context.Context, store tokenStore, cfg EnrollmentConfig, pin string, now time.Time, req TokenRequest) (*TokenResponse, error) {
	var details []Detail
	ttl := cfg.DefaultTTL
	if req.TTL != "" {
		d, err := time.ParseDuration(req.TTL)
		switch {
		case err != nil:
			details = append(details, Detail{Field: "ttl", Message: fmt.Sprintf("%q is not a duration (e.g. 1h, 30m)", req.TTL)})
		case d < time.Minute || d > cfg.MaxTTL:
			details = append(details, Detail{Field: "ttl", Message: fmt.Sprintf("must be between 1m and %s", cfg.MaxTTL)})
		default:
			ttl = d
		}
	}
	if req.Name != "" && !agentNameRE.MatchString(req.Name) {
		details = append(details, Detail{Field: "name", Message: "use 1-63 letters, digits, '.', '_' and '-', starting with a letter or digit"})
	}
	details = append(details, checkTags("tags", req.Tags)...)
	if len(details) > 0 {
		return nil, newError(ErrValidation, "the token request has invalid fields", details...)
	}
	token, rec := newToken(pin, req.Name, req.Tags, now, ttl)
	if err := store.CreateToken(ctx, rec); err != nil {
		return nil, err
	}
	return &TokenResponse{ID: rec.ID, Token: token, ExpiresAt: rec.ExpiresAt}, nil
}

func checkTags(field string, tags map[string]string) []Detail {
	var details []Detail
	if len(tags) > manifest.MaxTags {
		details = append(details, Detail{Field: field, Message: fmt.Sprintf("%d tags, at most %d", len(tags), manifest.MaxTags)})
	}
	for k, v := range tags {
		if !manifest.ValidTagKey(k) {
			details = append(details, Detail{Field: field, Message: fmt.Sprintf("%q is not a valid tag key", k)})
		} else if !manifest.ValidTagValue(v) {
			details = append(details, Detail{Field: field + "." + k, Message: "use at most 63 letters, digits, '.', '_' and '-'"})
		}
	}
	return details
}

// ---- pipes

// PutPipeRequest is the body of PUT /api/v1/pipes/{name}.
type PutPipeRequest struct {
	Spec   json.RawMessage `json:"spec"`
	Bundle *string         `json:"bundle,omitempty"` // base64 (standard) of a bundle
}

// PutPipeResponse reports the version in force after a PUT.
type PutPipeResponse struct {
	Name    string `json:"name"`
	Version uint64 `json:"version"`
	Digest  string `json:"digest"`
	Created bool   `json:"created"`
}

// PipeJSON is a pipe as the API shows it.
type PipeJSON struct {
	Name      string           `json:"name"`
	Version   uint64           `json:"version"`
	Spec      manifest.Spec    `json:"spec"`
	Payload   manifest.Payload `json:"payload"`
	CreatedAt time.Time        `json:"created_at"`
	UpdatedAt time.Time        `json:"updated_at"`
	Versions  []PipeVersionRef `json:"versions,omitempty"`
}

// PipeVersionRef is one entry of a pipe's history.
type PipeVersionRef struct {
	Version   uint64    `json:"version"`
	Digest    string    `json:"digest"`
	CreatedAt time.Time `json:"created_at"`
}

func pipeJSON(p *Pipe) PipeJSON {
	return PipeJSON{Name: p.Name, Version: p.Version, Spec: p.Spec, Payload: manifest.Payload{Digest: p.PayloadDigest, Size: p.PayloadSize},
		CreatedAt: p.CreatedAt, UpdatedAt: p.UpdatedAt}
}

func (s *Server) handlePutPipe(w http.ResponseWriter, r *http.Request) error {
	name := r.PathValue("name")
	if !manifest.ValidName(name) {
		return newError(ErrInvalidRequest, "invalid pipe name in the path", Detail{Field: "name", Message: "use 1-63 lowercase letters, digits and '-'"})
	}
	limit := s.cfg.HTTP.MaxBodyBytes + s.cfg.Signing.MaxPayloadBytes*4/3 + 4096
	var req PutPipeRequest
	if err := decodeJSON(w, r, limit, &req); err != nil {
		return err
	}
	if len(req.Spec) == 0 {
		return newError(ErrValidation, "spec is required", Detail{Field: "spec", Message: "required"})
	}
	var spec manifest.Spec
	if err := decodeStrict(req.Spec, &spec, "spec"); err != nil {
		return err
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
			return err
		}
		for _, p := range ve.Problems {
			p.Field = joinField("spec", p.Field)
			problems = append(problems, p)
		}
	}
	var bundle []byte
	switch {
	case spec.Script != "" && req.Bundle != nil:
		problems = append(problems, manifest.FieldError{Field: "bundle", Message: "not used with script: the script becomes the bundle"})
	case len(spec.Command) > 0 && req.Bundle == nil:
		problems = append(problems, manifest.FieldError{Field: "bundle", Message: "required with command"})
	case req.Bundle != nil:
		b, err := base64.StdEncoding.DecodeString(*req.Bundle)
		if err != nil {
			problems = append(problems, manifest.FieldError{Field: "bundle", Message: "not valid base64"})
			break
		}
		if int64(len(b)) > s.cfg.Signing.MaxPayloadBytes {
			return newError(ErrTooLarge, "the bundle is too large", Detail{Field: "bundle", Message: fmt.Sprintf("%d bytes, at most %d", len(b), s.cfg.Signing.MaxPayloadBytes)})
		}
		if msg := checkBundle(b, spec.Command); msg != "" {
			problems = append(problems, manifest.FieldError{Field: "bundle", Message: msg})
		}
		bundle = b
	}
	if len(problems) > 0 {
		return &manifest.ValidationError{Problems: problems}
	}
	if spec.Script != "" {
		b, err := manifest.ScriptBundle(spec.Script)
		if err != nil {
			return fmt.Errorf("script bundle: %w", err)
		}
		bundle = b
	}
	sj, err := specJSON(&spec)
	if err != nil {
		return err
	}
	pv := &PipeVersion{Name: name, Spec: spec, SpecJSON: sj, PayloadDigest: manifest.Digest(bundle), PayloadSize: int64(len(bundle))}
	version, created, err := s.store.PutPipe(r.Context(), pv, bundle, s.clock.Now())
	if err != nil {
		return err
	}
	if created {
		s.log.Info("pipe version created", "pipe", name, "version", version)
		if _, err := s.compiler.compile(r.Context(), nil); err != nil {
			return err
		}
	}
	code := http.StatusOK
	if created {
		code = http.StatusCreated
	}
	return writeJSON(w, code, PutPipeResponse{Name: name, Version: version, Digest: pv.PayloadDigest, Created: created})
}

// Bundle limits checked on upload; the agent unpacks with the same defaults.
const (
	maxBundleEntries = 10000
	maxBundleBytes   = 256 << 20
)

// checkBundle reads a bundle's tar headers the way manifest.UnpackBundle
// will, without writing anything, and checks that a relative command[0]
// names an executable file in it. It returns a problem or "".
func checkBundle(b []byte, command []string) string {
	gz, err := gzip.NewReader(bytes.NewReader(b))
	if err != nil {
		return "not a gzip-compressed tar archive"
	}
	tr := tar.NewReader(gz)
	files := map[string]int64{}
	var total int64
	for n := 0; ; n++ {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return "not a valid tar archive"
		}
		if n >= maxBundleEntries {
			return fmt.Sprintf("more than %d entries", maxBundleEntries)
		}
		name := strings.TrimSuffix(hdr.Name, "/")
		if name == "" || path.IsAbs(name) || path.Clean(name) != name || name == ".." || strings.HasPrefix(name, "../") {
			return fmt.Sprintf("entry %q is not a clean relative path", hdr.Name)
		}
		if _, dup := files[name]; dup {
			return fmt.Sprintf("entry %q appears twice", name)
		}
		switch hdr.Typeflag {
		case tar.TypeDir:
			files[name] = -1
		case tar.TypeReg:
			total += hdr.Size
			if total > maxBundleBytes {
				return fmt.Sprintf("more than %d bytes uncompressed", maxBundleBytes)
			}
			if _, err := io.Copy(io.Discard, tr); err != nil {
				return "not a valid tar archive"
			}
			files[name] = hdr.Mode
		default:
			return fmt.Sprintf("entry %q is not a regular file or directory", name)
		}
	}
	if len(command) > 0 && strings.Contains(command[0], "/") && !path.IsAbs(command[0]) {
		prog := path.Clean(command[0])
		mode, ok := files[prog]
		switch {
		case !ok || mode < 0:
			return fmt.Sprintf("command[0] %q is not a file in the bundle", command[0])
		case mode&0o111 == 0:
			return fmt.Sprintf("command[0] %q is not executable in the bundle", command[0])
		}
	}
	return ""
}

func (s *Server) handleListPipes(w http.ResponseWriter, r *http.Request) error {
	ps, err := s.store.ListPipes(r.Context())
	if err != nil {
		return err
	}
	out := make([]PipeJSON, 0, len(ps))
	for _, p := range ps {
		out = append(out, pipeJSON(p))
	}
	return writeJSON(w, http.StatusOK, map[string]any{"pipes": out})
}

func (s *Server) handleGetPipe(w http.ResponseWriter, r *http.Request) error {
	p, err := s.store.GetPipe(r.Context(), r.PathValue("name"))
	if err != nil {
		return err
	}
	vs, err := s.store.ListPipeVersions(r.Context(), p.Name)
	if err != nil {
		return err
	}
	out := pipeJSON(p)
	for _, v := range vs {
		out.Versions = append(out.Versions, PipeVersionRef{Version: v.Version, Digest: v.PayloadDigest, CreatedAt: v.CreatedAt})
	}
	return writeJSON(w, http.StatusOK, out)
}

func (s *Server) handleDeletePipe(w http.ResponseWriter, r *http.Request) error {
	name := r.PathValue("name")
	if err := s.store.DeletePipe(r.Context(), name, s.clock.Now()); err != nil {
		return err
	}
	s.log.Info("pipe deleted", "pipe", name)
	if _, err := s.compiler.compile(r.Context(), nil); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// RunPipeRequest is the body of POST /api/v1/pipes/{name}/run.
type RunPipeRequest struct {
	Agent string `json:"agent,omitempty"`
}

// RunPipeResponse lists where RunNow was sent.
type RunPipeResponse struct {
	RequestID string   `json:"request_id"`
	Sent      []string `json:"sent"`
	Offline   []string `json:"offline"`
}

func (s *Server) handleRunPipe(w http.ResponseWriter, r *http.Request) error {
	var req RunPipeRequest
	if r.ContentLength != 0 {
		if err := decodeJSON(w, r, s.cfg.HTTP.MaxBodyBytes, &req); err != nil {
			return err
		}
	}
	p, err := s.store.GetPipe(r.Context(), r.PathValue("name"))
	if err != nil {
		return err
	}
	agents, err := s.store.ListAgents(r.Context())
	if err != nil {
		return err
	}
	resp := RunPipeResponse{RequestID: "req-" + strings.ToLower(b32.EncodeToString(randomBytes(10))), Sent: []string{}, Offline: []string{}}
	msg := &agentpb.ServerMessage{Body: &agentpb.ServerMessage_RunNow{RunNow: &agentpb.RunNow{Pipe: p.Name, RequestId: resp.RequestID}}}
	found := false
	for _, a := range agents {
		if !a.RevokedAt.IsZero() || (req.Agent != "" && a.ID != req.Agent) || !targets(p.Spec.Targets, a) {
			continue
		}
		found = true
		if s.hub.send(a.ID, msg) {
			resp.Sent = append(resp.Sent, a.ID)
		} else {
			resp.Offline = append(resp.Offline, a.ID)
		}
	}
	if req.Agent != "" && !found {
		return newError(ErrNotFound, fmt.Sprintf("pipe %s does not run on agent %s", p.Name, req.Agent))
	}
	return writeJSON(w, http.StatusAccepted, resp)
}

// targets reports whether a pipe's targets select an agent.
func targets(t *manifest.Targets, a *Agent) bool {
	if t == nil {
		return false
	}
	for _, id := range t.Agents {
		if id == a.ID {
			return true
		}
	}
	return matchesTags(t.Tags, a.Tags)
}

// ---- agents

// AgentJSON is an agent as the API shows it.
type AgentJSON struct {
	ID             string            `json:"id"`
	Name           string            `json:"name"`
	Hostname       string            `json:"hostname"`
	OS             string            `json:"os"`
	Arch           string            `json:"arch"`
	AgentVersion   string            `json:"agent_version"`
	Tags           map[string]string `json:"tags"`
	CreatedAt      time.Time         `json:"created_at"`
	CertExpiresAt  time.Time         `json:"cert_expires_at"`
	Revoked        bool              `json:"revoked"`
	RevokedAt      *time.Time        `json:"revoked_at,omitempty"`
	Online         bool              `json:"online"`
	LastSeenAt     *time.Time        `json:"last_seen_at,omitempty"`
	Backend        string            `json:"backend,omitempty"`
	Scope          string            `json:"scope,omitempty"`
	SystemdVersion string            `json:"systemd_version,omitempty"`
	Manifest       *ManifestInfo     `json:"manifest,omitempty"`
	AcceptedSerial uint64            `json:"accepted_serial"`
	AppliedSerial  uint64            `json:"applied_serial"`
	ManifestState  string            `json:"manifest_state,omitempty"`
	ManifestError  string            `json:"manifest_error,omitempty"`
	StatusAt       *time.Time        `json:"status_at,omitempty"`
	Pipes          []PipeStatus      `json:"pipes"`
}

// ManifestInfo describes the manifest published to an agent.
type ManifestInfo struct {
	Serial         uint64    `json:"serial"`
	Digest         string    `json:"digest"`
	IssuedAt       time.Time `json:"issued_at"`
	ExpiresAt      time.Time `json:"expires_at"`
	KeyListVersion uint64    `json:"key_list_version"`
}

func optTime(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}

func (s *Server) agentJSON(a *Agent) AgentJSON {
	pipes := a.Pipes
	if pipes == nil {
		pipes = []PipeStatus{}
	}
	return AgentJSON{
		ID: a.ID, Name: a.Name, Hostname: a.Hostname, OS: a.OS, Arch: a.Arch, AgentVersion: a.AgentVersion, Tags: a.Tags,
		CreatedAt: a.CreatedAt, CertExpiresAt: a.CertExpiresAt, Revoked: !a.RevokedAt.IsZero(), RevokedAt: optTime(a.RevokedAt),
		Online: s.hub.online(a.ID) && s.clock.Now().Sub(a.LastSeenAt) < s.cfg.GRPC.OfflineAfter, LastSeenAt: optTime(a.LastSeenAt), Backend: a.Backend, Scope: a.Scope, SystemdVersion: a.SystemdVersion,
		AcceptedSerial: a.AcceptedSerial, AppliedSerial: a.AppliedSerial, ManifestState: a.ManifestState, ManifestError: a.ManifestError,
		StatusAt: optTime(a.StatusAt), Pipes: pipes,
	}
}

func (s *Server) handleListAgents(w http.ResponseWriter, r *http.Request) error {
	as, err := s.store.ListAgents(r.Context())
	if err != nil {
		return err
	}
	out := make([]AgentJSON, 0, len(as))
	for _, a := range as {
		out = append(out, s.agentJSON(a))
	}
	return writeJSON(w, http.StatusOK, map[string]any{"agents": out})
}

func (s *Server) getAgentJSON(r *http.Request, id string) (*AgentJSON, error) {
	a, err := s.store.GetAgent(r.Context(), id)
	if err != nil {
		return nil, err
	}
	out := s.agentJSON(a)
	if m, err := s.store.GetManifest(r.Context(), id); err == nil {
		out.Manifest = &ManifestInfo{Serial: m.Serial, Digest: m.Digest, IssuedAt: m.IssuedAt, ExpiresAt: m.ExpiresAt, KeyListVersion: m.KeyListVersion}
	} else if !errors.Is(err, ErrNotFound) {
		return nil, err
	}
	return &out, nil
}

func (s *Server) handleGetAgent(w http.ResponseWriter, r *http.Request) error {
	out, err := s.getAgentJSON(r, r.PathValue("id"))
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, out)
}

// TagsRequest is the body of PUT /api/v1/agents/{id}/tags.
type TagsRequest struct {
	Tags map[string]string `json:"tags"`
}

func (s *Server) handlePutTags(w http.ResponseWriter, r *http.Request) error {
	id := r.PathValue("id")
	var req TagsRequest
	if err := decodeJSON(w, r, s.cfg.HTTP.MaxBodyBytes, &req); err != nil {
		return err
	}
	if d := checkTags("tags", req.Tags); len(d) > 0 {
		return newError(ErrValidation, "invalid tags", d...)
	}
	if req.Tags == nil {
		req.Tags = map[string]string{}
	}
	if err := s.store.SetAgentTags(r.Context(), id, req.Tags, s.clock.Now()); err != nil {
		return err
	}
	if _, err := s.compiler.compile(r.Context(), []string{id}); err != nil {
		return err
	}
	return s.handleGetAgent(w, r)
}

func (s *Server) handleRevokeAgent(w http.ResponseWriter, r *http.Request) error {
	id := r.PathValue("id")
	if err := s.store.RevokeAgent(r.Context(), id, s.clock.Now()); err != nil {
		return err
	}
	s.hub.close(id, errRevoked)
	s.log.Info("agent revoked", "agent", id)
	return s.handleGetAgent(w, r)
}

// ---- runs

// RunJSON is a run as the API shows it.
type RunJSON struct {
	ID           string     `json:"id"`
	AgentID      string     `json:"agent_id"`
	Pipe         string     `json:"pipe"`
	PipeVersion  uint64     `json:"pipe_version"`
	Trigger      string     `json:"trigger"`
	Status       string     `json:"status"`
	ExitCode     int        `json:"exit_code"`
	Signal       string     `json:"signal,omitempty"`
	Error        string     `json:"error,omitempty"`
	RequestID    string     `json:"request_id,omitempty"`
	ScheduledAt  *time.Time `json:"scheduled_at,omitempty"`
	StartedAt    *time.Time `json:"started_at,omitempty"`
	FinishedAt   *time.Time `json:"finished_at,omitempty"`
	DurationMS   int64      `json:"duration_ms"`
	LogChunks    uint64     `json:"log_chunks"`
	LogBytes     int64      `json:"log_bytes"`
	LogTruncated bool       `json:"log_truncated"`
	CreatedAt    time.Time  `json:"created_at"`
	UpdatedAt    time.Time  `json:"updated_at"`
}

func runJSON(r *Run) RunJSON {
	return RunJSON{ID: r.ID, AgentID: r.AgentID, Pipe: r.Pipe, PipeVersion: r.PipeVersion, Trigger: r.Trigger, Status: r.Status,
		ExitCode: r.ExitCode, Signal: r.Signal, Error: r.Error, RequestID: r.RequestID, ScheduledAt: optTime(r.ScheduledAt),
		StartedAt: optTime(r.StartedAt), FinishedAt: optTime(r.FinishedAt), DurationMS: r.DurationMS, LogChunks: r.LogChunks,
		LogBytes: r.LogBytes, LogTruncated: r.LogTruncated, CreatedAt: r.CreatedAt, UpdatedAt: r.UpdatedAt}
}

func (s *Server) handleListRuns(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	f := RunFilter{Pipe: q.Get("pipe"), Agent: q.Get("agent"), Status: q.Get("status"), Limit: 100}
	if l := q.Get("limit"); l != "" {
		n, err := strconv.Atoi(l)
		if err != nil || n < 1 || n > 1000 {
			return newError(ErrInvalidRequest, "invalid limit", Detail{Field: "limit", Message: "must be 1-1000"})
		}
		f.Limit = n
	}
	switch f.Status {
	case "", StatusPending, StatusRunning, StatusSucceeded, StatusFailed, StatusTimedOut, StatusCanceled, StatusSkipped:
	default:
		return newError(ErrInvalidRequest, "invalid status", Detail{Field: "status", Message: "not a run status"})
	}
	runs, err := s.store.ListRuns(r.Context(), f)
	if err != nil {
		return err
	}
	out := make([]RunJSON, 0, len(runs))
	for _, x := range runs {
		out = append(out, runJSON(x))
	}
	return writeJSON(w, http.StatusOK, map[string]any{"runs": out})
}

func (s *Server) handleGetRun(w http.ResponseWriter, r *http.Request) error {
	run, err := s.store.GetRun(r.Context(), r.PathValue("id"))
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, runJSON(run))
}

// LogChunkJSON is one chunk in the JSON form of a run's log.
type LogChunkJSON struct {
	Seq    uint64    `json:"seq"`
	Stream string    `json:"stream"`
	At     time.Time `json:"at"`
	Data   []byte    `json:"data"` // base64
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
	if r.Header.Get("Accept") == "application/json" {
		out := make([]LogChunkJSON, 0, len(chunks))
		for _, c := range chunks {
			out = append(out, LogChunkJSON{Seq: c.Seq, Stream: c.Stream, At: c.At, Data: c.Data})
		}
		return writeJSON(w, http.StatusOK, map[string]any{"run_id": run.ID, "truncated": run.LogTruncated, "chunks": out})
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

// SecretRequest is the body of PUT /api/v1/secrets/{name}.
type SecretRequest struct {
	Value *string `json:"value"`
}

func (s *Server) handlePutSecret(w http.ResponseWriter, r *http.Request) error {
	name := r.PathValue("name")
	if !secretNameRE.MatchString(name) || strings.HasPrefix(name, "DROVER_") {
		return newError(ErrValidation, "invalid secret name", Detail{Field: "name", Message: "use letters, digits and '_', not starting with a digit or DROVER_"})
	}
	var req SecretRequest
	if err := decodeJSON(w, r, maxSecretBytes*2+1024, &req); err != nil {
		return err
	}
	switch {
	case req.Value == nil:
		return newError(ErrValidation, "value is required", Detail{Field: "value", Message: "required"})
	case len(*req.Value) > maxSecretBytes:
		return newError(ErrValidation, "value is too long", Detail{Field: "value", Message: fmt.Sprintf("at most %d bytes", maxSecretBytes)})
	}
	if err := s.store.PutSecret(r.Context(), name, s.sealer.seal(name, []byte(*req.Value)), s.clock.Now()); err != nil {
		return err
	}
	s.log.Info("secret set", "secret", name)
	if err := s.compiler.secretChanged(r.Context(), name); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (s *Server) handleListSecrets(w http.ResponseWriter, r *http.Request) error {
	list, err := s.store.ListSecrets(r.Context())
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, map[string]any{"secrets": list})
}

func (s *Server) handleDeleteSecret(w http.ResponseWriter, r *http.Request) error {
	name := r.PathValue("name")
	if err := s.store.DeleteSecret(r.Context(), name); err != nil {
		return err
	}
	s.log.Info("secret deleted", "secret", name)
	if err := s.compiler.secretChanged(r.Context(), name); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// ---- keys

// RotateResponse reports the key now signing manifests.
type RotateResponse struct {
	KeyID          string `json:"key_id"`
	KeyListVersion uint64 `json:"key_list_version"`
}

func (s *Server) handleRotateKeys(w http.ResponseWriter, r *http.Request) error {
	resp, err := s.RotateKeys(r.Context())
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, resp)
}
