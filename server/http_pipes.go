package server

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/drover/drover/server/compile"
	"mime"
	"net/http"
	"path"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/drover/drover/api"
	"github.com/drover/drover/manifest"
	"github.com/drover/drover/server/errs"
	"github.com/drover/drover/server/store"
)

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
	var published *api.PublishState
	if created {
		s.log.Info("pipe version created", "pipe", pv.Name, "version", version)
		if published, err = s.publishAll(r.Context(), publishWait); err != nil {
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
	return writeJSON(w, code, api.PutPipeResponse{Name: pv.Name, Version: version, Digest: pv.PayloadDigest, Created: created, Manifests: published})
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
	pg, sel, err := pageAndTags(r)
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
	return writeJSON(w, http.StatusOK, api.PipeList{Pipes: mapList(items, pipeJSON), NextCursor: next})
}

func (s *Server) handleGetPipe(w http.ResponseWriter, r *http.Request) error {
	_, p, err := fetchParam(r, pipeName, s.store.GetPipe)
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
	if out.Placement, err = s.pipePlacement(r.Context(), &p.PipeVersion); err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, out)
}

func (s *Server) handleDeletePipe(w http.ResponseWriter, r *http.Request) error {
	name, p, err := fetchParam(r, pipeName, s.store.GetPipe)
	if err != nil {
		return err
	}
	if err := s.store.DeletePipe(r.Context(), name, s.clock.Now()); err != nil {
		return err
	}
	s.log.Info("pipe deleted", "pipe", name)
	setAudit(r, "pipe/"+name, pipeJSON(p), nil)
	if _, err := s.compiler.Compile(r.Context(), nil); err != nil {
		return err
	}
	return noContent(w)
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
	// A placement: one pipe is in its holder's manifest alone: it runs
	// there (an agent named explicitly must be the holder).
	holder, one := "", p.Spec.Placement == manifest.PlacementOne
	if one {
		pl, err := s.pipePlacement(r.Context(), &p.PipeVersion)
		if err != nil {
			return err
		}
		holder = pl.Holder
		if holder == "" {
			return errs.New(errs.ErrConflict, fmt.Sprintf("pipe %s (placement: one) has no holder at the moment", p.Name))
		}
	}
	var targets []string
	for _, a := range agents {
		if !a.RevokedAt.IsZero() || (req.Agent != "" && a.ID != req.Agent) || !p.Spec.Targets.Selects(a.ID, a.Tags) || !hasTags(a.Tags, req.Tags) || (one && a.ID != holder) {
			continue
		}
		targets = append(targets, a.ID)
	}
	found := len(targets) > 0
	sent := s.hub.RunNow(r.Context(), targets, p.Name, resp.RequestID)
	for _, id := range targets {
		if sent[id] {
			resp.Sent = append(resp.Sent, id)
		} else {
			resp.Offline = append(resp.Offline, id)
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
	versions := mapList(items, func(v *store.PipeVersion) api.PipeVersion { return pipeVersionJSON(v, cur, deleted) })
	return writeJSON(w, http.StatusOK, api.PipeVersionList{Name: name, Deleted: deleted, Versions: versions, NextCursor: next})
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
	sched, tz, loc, err := storedSchedule(name, &p.Spec)
	if err != nil {
		return err
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

func (s *Server) handleDryRun(w http.ResponseWriter, r *http.Request) error {
	name, req, err := paramBody[api.DryRunRequest](w, r, pipeName, s.pipeBodyLimit())
	if err != nil {
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
	var was, will *compile.Pipe
	if cur != nil {
		p := compilePipe(&cur.PipeVersion)
		was = &p
	}
	if next != nil {
		p := compilePipe(next)
		will = &p
	}
	agents, err := s.store.ListAgents(r.Context())
	if err != nil {
		return err
	}
	now := s.clock.Now()
	in := make([]compile.Agent, len(agents))
	for i, a := range agents {
		in[i] = compile.Agent{ID: a.ID, Tags: a.Tags, Revoked: !a.RevokedAt.IsZero(), Healthy: s.agentHealthy(a.ID, a.LastSeenAt, now)}
	}
	placing, err := s.dryRunPlacing(r.Context(), name, now)
	if err != nil {
		return err
	}
	changes, err := compile.DryRunPlaced(in, was, will, placing)
	if err != nil {
		return err
	}
	byID := make(map[string]*store.Agent, len(agents))
	for _, a := range agents {
		byID[a.ID] = a
	}
	for _, c := range changes {
		a := byID[c.AgentID]
		out.Agents = append(out.Agents, api.AgentChange{ID: a.ID, Name: a.Name, Hostname: a.Hostname, Action: c.Action, Diff: c.Diff, Reason: c.Reason, After: c.After})
	}
	return writeJSON(w, http.StatusOK, out)
}

// storedSchedule parses a stored pipe's schedule and loads its time zone
// (the default one when unset); both were validated on PUT.
func storedSchedule(name string, spec *manifest.Spec) (*manifest.Schedule, string, *time.Location, error) {
	sched, err := manifest.ParseSchedule(spec.Schedule)
	if err != nil {
		return nil, "", nil, fmt.Errorf("stored schedule of %s: %w", name, err)
	}
	tz := spec.Timezone
	if tz == "" {
		tz = manifest.DefaultTimezone
	}
	loc, err := manifest.LoadLocation(tz)
	if err != nil {
		return nil, "", nil, fmt.Errorf("stored time zone of %s: %w", name, err)
	}
	return sched, tz, loc, nil
}
