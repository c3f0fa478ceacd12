package server

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/drover/drover/api"
	"github.com/drover/drover/server/errs"
)

// route is one endpoint of the HTTPS API. The router, the role check, the
// audit log, the OpenAPI document (openapi_test.go generates openapi.json
// from this table) and the role-matrix test all read the same table, so
// they cannot drift apart.
type route struct {
	method, path string
	// role is the least role that may call the route: rolePublic (no
	// authentication), roleAgent (an agent's client certificate) or a
	// token role.
	role role
	// action is the audit action of a mutation; every route that changes
	// something has one, and a successful call writes one audit entry.
	action string
	// raw routes stream their answer: no buffering, so no ETag and no
	// audit entry ordering guarantee (raw routes are never mutations).
	raw bool

	summary string
	query   []param
	body    any    // request body type for the document; nil for none
	status  int    // success status
	resp    any    // response type for the document; nil for none
	media   string // response media type when not application/json

	h  apiHandler   // every role but roleAgent
	ah agentHandler // roleAgent
}

// param documents a query parameter.
type param struct {
	name, typ, desc string
	repeat          bool
}

// Query parameters shared by list routes.
var pageParams = []param{
	{name: "limit", typ: "integer", desc: "page size, 1-1000 (default 100)"},
	{name: "cursor", typ: "string", desc: "the next_cursor of the previous page"},
}

func withPage(ps ...param) []param { return append(ps, pageParams...) }

// routeTable is every route the HTTPS listener serves.
func (s *Server) routeTable() []route {
	metricsRole := roleViewer
	if s.cfg.MetricsPublic {
		metricsRole = rolePublic
	}
	tagParam := param{name: "tag", typ: "string", desc: "key=value; repeatable, every one must match", repeat: true}
	since := param{name: "since", typ: "string", desc: "RFC 3339 time: created at or after"}
	until := param{name: "until", typ: "string", desc: "RFC 3339 time: created before"}
	return []route{
		{method: "GET", path: "/healthz", role: rolePublic, summary: "Liveness", status: 200, resp: api.Health{}, h: s.handleHealth},
		{method: "GET", path: "/metrics", role: metricsRole, raw: true, summary: "Prometheus metrics (public when metrics_public is set)", status: 200,
			media: "text/plain; version=0.0.4", h: s.handleMetrics},
		{method: "GET", path: "/api/v1/openapi.json", role: rolePublic, summary: "This API's OpenAPI 3.1 document", status: 200, resp: map[string]any{}, h: s.handleOpenAPI},

		// Agents (see doc.go for their contract).
		{method: "POST", path: "/api/v1/agents/enroll", role: rolePublic, action: actionEnroll, summary: "Enroll an agent with a one-time token (rate-limited per source)",
			body: api.EnrollRequest{}, status: 200, resp: api.EnrollResponse{}, h: s.handleEnroll},
		{method: "POST", path: "/api/v1/agents/self/renew", role: roleAgent, action: "agents.renew", summary: "Renew the agent's certificate with a fresh key",
			body: api.RenewRequest{}, status: 200, resp: api.RenewResponse{}, ah: s.handleRenew},
		{method: "GET", path: "/api/v1/agents/self/manifest", role: roleAgent, raw: true, summary: "The agent's signed manifest (DSSE); ETag, If-None-Match -> 304",
			status: 200, media: ManifestMediaType, ah: s.handleSelfManifest},
		{method: "GET", path: "/api/v1/agents/self/trust", role: roleAgent, raw: true, summary: "The trust root: root keys and the current key list", status: 200, resp: map[string]any{}, ah: s.handleSelfTrust},
		{method: "GET", path: "/api/v1/agents/self/payloads/{digest}", role: roleAgent, raw: true, summary: "A payload bundle named by the agent's manifest",
			status: 200, media: BundleMediaType, ah: s.handleSelfPayload},
		{method: "GET", path: "/api/v1/agents/self/secrets", role: roleAgent, raw: true, summary: "The secrets the agent's pipes reference", status: 200, resp: api.SecretsResponse{}, ah: s.handleSelfSecrets},

		{method: "GET", path: "/api/v1/whoami", role: roleViewer, summary: "The calling token", status: 200, resp: api.WhoAmI{}, h: s.handleWhoAmI},
		{method: "GET", path: "/api/v1/version", role: roleViewer, summary: "The server's version", status: 200, resp: api.Version{}, h: s.handleVersion},

		// Pipes.
		{method: "GET", path: "/api/v1/pipes", role: roleViewer, summary: "List pipes",
			query: withPage(param{name: "tag", typ: "string", desc: "key=value the pipe's targets.tags must hold; repeatable", repeat: true},
				param{name: "agent", typ: "string", desc: "only pipes that run on this agent"}),
			status: 200, resp: api.PipeList{}, h: s.handleListPipes},
		{method: "GET", path: "/api/v1/pipes/{name}", role: roleViewer, summary: "Get a pipe with its version history", status: 200, resp: api.Pipe{}, h: s.handleGetPipe},
		{method: "PUT", path: "/api/v1/pipes/{name}", role: roleOperator, action: "pipes.write",
			summary: "Create or update a pipe (JSON {spec, bundle}, or one YAML spec document with Content-Type application/yaml); every problem is reported at once",
			body:    api.PutPipeRequest{}, status: 201, resp: api.PutPipeResponse{}, h: s.handlePutPipe},
		{method: "DELETE", path: "/api/v1/pipes/{name}", role: roleOperator, action: "pipes.delete", summary: "Delete a pipe (its versions stay and can be restored)", status: 204, h: s.handleDeletePipe},
		{method: "GET", path: "/api/v1/pipes/{name}/versions", role: roleViewer, summary: "List a pipe's versions, newest first (also of a deleted pipe)",
			query: withPage(), status: 200, resp: api.PipeVersionList{}, h: s.handleListPipeVersions},
		{method: "GET", path: "/api/v1/pipes/{name}/versions/{version}", role: roleViewer, summary: "Show one version of a pipe", status: 200, resp: api.PipeVersion{}, h: s.handleGetPipeVersion},
		{method: "POST", path: "/api/v1/pipes/{name}/versions/{version}/restore", role: roleOperator, action: "pipes.restore",
			summary: "Make an old version current again (as a new version)", status: 201, resp: api.PutPipeResponse{}, h: s.handleRestorePipeVersion},
		{method: "GET", path: "/api/v1/pipes/{name}/schedule", role: roleViewer, summary: "Next fire times of the pipe's schedule in its time zone",
			query:  []param{{name: "count", typ: "integer", desc: "how many, 1-100 (default 10)"}, {name: "after", typ: "string", desc: "RFC 3339 start (default now)"}},
			status: 200, resp: api.SchedulePreview{}, h: s.handlePipeSchedule},
		{method: "GET", path: "/api/v1/pipes/{name}/fires", role: roleViewer,
			summary: "Each fire time of the pipe with the agents expected and their runs counted by status (missed included); newest fire times kept",
			query: []param{{name: "since", typ: "string", desc: "RFC 3339 start (default until - 24h)"}, {name: "until", typ: "string", desc: "RFC 3339 end, exclusive (default now); the window spans at most 31 days"},
				{name: "limit", typ: "integer", desc: "fire times listed, 1-1000 (default 100), the newest"}},
			status: 200, resp: api.FireList{}, h: s.handlePipeFires},
		{method: "POST", path: "/api/v1/pipes/{name}/dry-run", role: roleViewer,
			summary: "Which agents a PUT (or, with delete, a DELETE) would reach and how their manifests would differ; stores nothing",
			body:    api.DryRunRequest{}, status: 200, resp: api.DryRunResponse{}, h: s.handleDryRun},
		{method: "POST", path: "/api/v1/pipes/{name}/run", role: roleOperator, action: "pipes.run",
			summary: "Run a pipe now: on every agent it targets, on one agent, or on the targeted agents carrying tags",
			body:    api.RunPipeRequest{}, status: 202, resp: api.RunPipeResponse{}, h: s.handleRunPipe},
		{method: "POST", path: "/api/v1/pipes/{name}/move", role: roleOperator, action: "pipes.move",
			summary: "Hand a placement: one pipe over to another targeted agent: the holder loses it now, the agent gains it once the holder's lease ended plus the skew margin (at once if the holder confirms)",
			body:    api.MovePipeRequest{}, status: 202, resp: api.Placement{}, h: s.handleMovePipe},

		// Agents, as the operator sees them.
		{method: "GET", path: "/api/v1/agents", role: roleViewer, summary: "List agents",
			query:  withPage(tagParam, param{name: "status", typ: "string", desc: "online, offline or revoked"}),
			status: 200, resp: api.AgentList{}, h: s.handleListAgents},
		{method: "GET", path: "/api/v1/agents/{id}", role: roleViewer, summary: "Get an agent with its manifest", status: 200, resp: api.Agent{}, h: s.handleGetAgent},
		{method: "PUT", path: "/api/v1/agents/{id}/tags", role: roleAdmin, action: "agents.tags", summary: "Replace an agent's tags (recompiles its manifest)",
			body: api.TagsRequest{}, status: 200, resp: api.Agent{}, h: s.handlePutTags},
		{method: "POST", path: "/api/v1/agents/{id}/revoke", role: roleAdmin, action: "agents.revoke", summary: "Revoke an agent: its certificate is refused, its streams close",
			status: 200, resp: api.Agent{}, h: s.handleRevokeAgent},
		{method: "DELETE", path: "/api/v1/agents/{id}", role: roleAdmin, action: "agents.delete", summary: "Delete an agent (its certificate is refused; its runs stay)",
			status: 204, h: s.handleDeleteAgent},

		// Enrollment tokens.
		{method: "GET", path: "/api/v1/enrollment-tokens", role: roleAdmin, summary: "List enrollment tokens (never their secrets)",
			query: withPage(), status: 200, resp: api.EnrollmentTokenList{}, h: s.handleListTokens},
		{method: "POST", path: "/api/v1/enrollment-tokens", role: roleAdmin, action: "enrollment_tokens.create",
			summary: "Create a one-time enrollment token; the token is in this answer only", body: api.EnrollmentTokenRequest{}, status: 201, resp: api.EnrollmentTokenCreated{}, h: s.handleCreateToken},
		{method: "DELETE", path: "/api/v1/enrollment-tokens/{id}", role: roleAdmin, action: "enrollment_tokens.delete", summary: "Delete an enrollment token",
			status: 204, h: s.handleDeleteToken},

		// API tokens.
		{method: "GET", path: "/api/v1/api-tokens", role: roleAdmin, summary: "List API tokens (never their secrets)",
			query: withPage(), status: 200, resp: api.APITokenList{}, h: s.handleListAPITokens},
		{method: "POST", path: "/api/v1/api-tokens", role: roleAdmin, action: "api_tokens.create",
			summary: "Create an API token with a role; the token is in this answer only", body: api.APITokenRequest{}, status: 201, resp: api.APITokenCreated{}, h: s.handleCreateAPIToken},
		{method: "DELETE", path: "/api/v1/api-tokens/{id}", role: roleAdmin, action: "api_tokens.revoke",
			summary: "Revoke an API token (\"bootstrap\" is admin.token)", status: 204, h: s.handleRevokeAPIToken},

		// Runs.
		{method: "GET", path: "/api/v1/runs", role: roleViewer, summary: "List runs, newest first",
			query: withPage(param{name: "pipe", typ: "string"}, param{name: "agent", typ: "string"},
				param{name: "status", typ: "string", desc: "pending, running, succeeded, failed, timed_out, canceled, skipped or missed"},
				param{name: "request_id", typ: "string", desc: "runs started by one run-now request"},
				param{name: "reason", typ: "string", desc: "why runs ended, exactly: e.g. lost, oom-kill, \"systemd: 203/EXEC\""}, since, until,
				param{name: "scheduled_since", typ: "string", desc: "RFC 3339: runs serving a fire time at or after it"},
				param{name: "scheduled_until", typ: "string", desc: "RFC 3339: runs serving a fire time before it"}),
			status: 200, resp: api.RunList{}, h: s.handleListRuns},
		{method: "GET", path: "/api/v1/runs/{id}", role: roleViewer, summary: "Get a run", status: 200, resp: api.Run{}, h: s.handleGetRun},
		{method: "GET", path: "/api/v1/runs/{id}/logs", role: roleViewer,
			summary: "A run's full log: text/plain (chunks in order), or with Accept: application/json the chunks", status: 200, resp: api.Logs{}, h: s.handleRunLogs},
		{method: "GET", path: "/api/v1/runs/{id}/logs/stream", role: roleViewer, raw: true,
			summary: "Live log as Server-Sent Events: 'chunk' events (id = chunk seq, data = a LogChunk as JSON), then one 'end' event (data = the run); resumes after Last-Event-ID",
			status:  200, media: "text/event-stream", h: s.handleRunLogStream},
		{method: "POST", path: "/api/v1/runs/{id}/cancel", role: roleOperator, action: "runs.cancel", summary: "Ask the agent running a run to cancel it",
			status: 202, resp: api.CancelResponse{}, h: s.handleCancelRun},

		// Secrets.
		{method: "GET", path: "/api/v1/secrets", role: roleViewer, summary: "List secret names (never values)", query: withPage(), status: 200, resp: api.SecretList{}, h: s.handleListSecrets},
		{method: "PUT", path: "/api/v1/secrets/{name}", role: roleOperator, action: "secrets.write", summary: "Set a secret (write-only)",
			body: api.SecretRequest{}, status: 204, h: s.handlePutSecret},
		{method: "DELETE", path: "/api/v1/secrets/{name}", role: roleOperator, action: "secrets.delete", summary: "Delete a secret", status: 204, h: s.handleDeleteSecret},

		{method: "GET", path: "/api/v1/audit", role: roleViewer, summary: "The audit log, newest first",
			query: withPage(param{name: "actor", typ: "string", desc: "token id or name"}, param{name: "action", typ: "string", desc: "e.g. pipes.write"},
				param{name: "target", typ: "string", desc: "e.g. pipe/backup-db"}, since, until),
			status: 200, resp: api.AuditList{}, h: s.handleListAudit},
		{method: "GET", path: "/api/v1/events", role: roleViewer, summary: "Fleet events (runs failed, missed, recovered; agents offline and online; manifests rejected or expired; identity conflicts), newest first",
			query: withPage(param{name: "kind", typ: "string", desc: "e.g. run.failed, run.missed, agent.offline"}, param{name: "pipe", typ: "string"}, param{name: "agent", typ: "string"},
				param{name: "since", typ: "string", desc: "RFC 3339 time: at or after"}),
			status: 200, resp: api.EventList{}, h: s.handleListEvents},
		{method: "GET", path: "/api/v1/notify/channels", role: roleViewer, summary: "List notification channels (never their secrets)", status: 200, resp: api.NotifyChannelList{}, h: s.handleListChannels},
		{method: "GET", path: "/api/v1/notify/channels/{name}", role: roleViewer, summary: "Get a notification channel (never its secret)", status: 200, resp: api.NotifyChannel{}, h: s.handleGetChannel},
		{method: "PUT", path: "/api/v1/notify/channels/{name}", role: roleAdmin, action: "notify.channels.write", summary: "Create or replace a notification channel (the secret is write-only)",
			body: api.NotifyChannel{}, status: 200, resp: api.NotifyChannel{}, h: s.handlePutChannel},
		{method: "DELETE", path: "/api/v1/notify/channels/{name}", role: roleAdmin, action: "notify.channels.delete", summary: "Delete a notification channel no rule uses", status: 204, h: s.handleDeleteChannel},
		{method: "POST", path: "/api/v1/notify/channels/{name}/test", role: roleAdmin, action: "notify.channels.test", summary: "Send a test notification to a channel now",
			status: 200, resp: api.NotifyTestResponse{}, h: s.handleTestChannel},
		{method: "GET", path: "/api/v1/notify/status", role: roleViewer, summary: "Delivery status per channel: queued, delivered, given up, the last error", status: 200, resp: api.ChannelStatusList{}, h: s.handleChannelStatus},
		{method: "GET", path: "/api/v1/notify/rules", role: roleViewer, summary: "List notification rules", status: 200, resp: api.NotifyRuleList{}, h: s.handleListRules},
		{method: "GET", path: "/api/v1/notify/rules/{name}", role: roleViewer, summary: "Get a notification rule", status: 200, resp: api.NotifyRule{}, h: s.handleGetRule},
		{method: "PUT", path: "/api/v1/notify/rules/{name}", role: roleAdmin, action: "notify.rules.write", summary: "Create or replace a notification rule",
			body: api.NotifyRule{}, status: 200, resp: api.NotifyRule{}, h: s.handlePutRule},
		{method: "DELETE", path: "/api/v1/notify/rules/{name}", role: roleAdmin, action: "notify.rules.delete", summary: "Delete a notification rule", status: 204, h: s.handleDeleteRule},
		{method: "POST", path: "/api/v1/keys/rotate", role: roleAdmin, action: "keys.rotate", summary: "Add a new manifest signing key and re-sign every manifest",
			status: 200, resp: api.RotateResponse{}, h: s.handleRotateKeys},
	}
}

func (s *Server) routes() http.Handler {
	mux := http.NewServeMux()
	for _, rt := range s.routeTable() {
		mux.Handle(rt.method+" "+rt.path, s.wrap(rt))
	}
	// The web console: its page and assets, login, session and logout.
	mux.Handle("/ui/", s.newConsole())
	mux.Handle("GET /ui/fleet", s.serve(s.handleConsoleFleet))
	mux.Handle("GET /ui", http.RedirectHandler("/ui/", http.StatusMovedPermanently))
	return s.classify(withErrorsAsJSON(mux))
}

// classify gives each class of caller its own concurrency pool and body
// budget, so that no class can starve another: agents (a client
// certificate that chains to this server's CA), callers with an API token,
// and unauthenticated callers. A body must arrive within the class's body
// timeout, counted from the start of the request and enforced on the
// connection itself, whatever the handler does; unauthenticated bodies are
// also capped in size before any handler reads them.
func (s *Server) classify(next http.Handler) http.Handler {
	hc := s.cfg.HTTP
	agents := s.agentSlots
	if agents == nil {
		agents = newPool(hc.AgentMaxConcurrent)
	}
	tokens := newPool(hc.MaxConcurrent)
	public := newPool(hc.PublicMaxConcurrent)
	perToken := newKeyedLimit(hc.MaxConcurrentPerToken)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		pool, budget := public, hc.PublicBodyTimeout
		auth := r.Header.Get("Authorization")
		if auth == "" {
			auth = consoleSessionKey(r) // a console session counts as its token
		}
		switch {
		case r.TLS != nil && len(r.TLS.VerifiedChains) > 0:
			pool, budget = agents, hc.BodyTimeout
		case auth != "":
			pool, budget = tokens, hc.BodyTimeout
		default:
			r.Body = http.MaxBytesReader(w, r.Body, hc.PublicMaxBodyBytes)
		}
		if pool != public && r.ContentLength > 0 {
			// A large upload on a slow link still fits: the budget grows
			// with the declared length at the slowest rate we accept.
			budget += time.Duration(r.ContentLength) * time.Second / minBodyRate
		}
		if r.ContentLength != 0 && r.Body != nil && r.Body != http.NoBody {
			rc := http.NewResponseController(w)
			if rc.SetReadDeadline(start.Add(budget)) == nil {
				r.Body = &deadlineBody{ReadCloser: r.Body, done: func() {
					// The body is in: back to the listener's own read timeout.
					_ = rc.SetReadDeadline(start.Add(hc.ReadTimeout))
				}}
			}
		}
		if pool == tokens {
			// A token that is not valid is refused before its body is
			// read; a valid one holds at most its share of the pool.
			release, ok := perToken.take(auth)
			if !ok {
				refuseBusy(w, "this token has too many requests in flight; retry shortly")
				return
			}
			defer release()
		}
		pool.serve(w, r, next)
	})
}

// refuseBusy answers 503 without reading the body; the connection closes
// after the answer (else the server would first wait to discard a body
// that a slow client is still trickling).
func refuseBusy(w http.ResponseWriter, msg string) {
	w.Header().Set("Retry-After", "1")
	w.Header().Set("Connection", "close")
	errs.Write(w, errs.New(errs.ErrUnavailable, msg))
}

// minBodyRate is the slowest upload (bytes per second) an authenticated
// caller's body deadline allows for beyond http.body_timeout.
const minBodyRate = 64 << 10

// deadlineBody calls done once, when the whole body is in. A body that
// fails (its deadline passed) keeps the deadline, so that the server's
// discard of the unread rest fails at once too and the connection closes.
type deadlineBody struct {
	io.ReadCloser
	done func()
	once sync.Once
}

func (b *deadlineBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err == io.EOF {
		b.once.Do(b.done)
	}
	return n, err
}

// wrap applies a route's authentication, role check, ETag and audit entry.
func (s *Server) wrap(rt route) http.Handler {
	pattern := rt.method + " " + rt.path
	if rt.role == roleAgent && rt.raw {
		return s.agentOnly(rt.ah) // the hot path: nothing more
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		sw := &statusWriter{ResponseWriter: w}
		var out http.ResponseWriter = sw
		var bw *bufferedWriter
		if !rt.raw {
			bw = &bufferedWriter{header: http.Header{}}
			out = bw
		}
		rec := &auditRec{}
		ctx := context.WithValue(r.Context(), auditKey{}, rec)
		if rt.action != "" {
			// A mutation runs to its end (recompiled manifests, the audit
			// entry) even when the client goes away half-way.
			ctx = context.WithoutCancel(ctx)
		}
		r = r.WithContext(ctx)
		err := s.call(rt, out, r, rec)
		if err != nil {
			s.auditRefusal(r, err, rec.actor)
			if k := errs.KindOf(err); k.Err == errs.ErrInternal || k.Err == errs.ErrUnavailable {
				s.log.Error("request failed", "method", r.Method, "path", r.URL.Path, "err", err)
			}
			errs.Write(out, err)
		} else if rt.action != "" && (bw == nil || bw.status() < 400) {
			s.writeAudit(r, rt.action, rec)
		}
		if bw != nil {
			bw.flush(sw, r)
		}
		s.metrics.observeAPI(pattern, sw.status(), time.Since(start))
	})
}

// call authenticates and runs the route's handler.
func (s *Server) call(rt route, w http.ResponseWriter, r *http.Request, rec *auditRec) error {
	switch rt.role {
	case rolePublic:
		return rt.h(w, r)
	case roleAgent:
		id, err := s.requestAgent(r)
		if err != nil {
			return err
		}
		rec.actor = &principal{ID: id, Name: "agent/" + id, Role: roleAgent}
		return rt.ah(w, r, id)
	}
	p, err := s.authorize(r, rt.role)
	if err != nil {
		rec.actor = p // nil unless the token is known but below the role
		if errs.KindOf(err).HTTP == http.StatusUnauthorized {
			w.Header().Set("WWW-Authenticate", `Bearer realm="drover"`)
		}
		return err
	}
	rec.actor = p
	return rt.h(w, r.WithContext(context.WithValue(r.Context(), principalKey{}, p)))
}

// statusWriter records the status written through it.
type statusWriter struct {
	http.ResponseWriter
	code int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.code == 0 {
		w.code = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.code == 0 {
		w.code = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func (w *statusWriter) status() int {
	if w.code == 0 {
		return http.StatusOK
	}
	return w.code
}

// bufferedWriter holds a whole answer, so that an audit entry is committed
// before the client sees the answer, and so that a 200 to a GET gets an
// ETag (the sha256 of the body) and If-None-Match can answer 304.
type bufferedWriter struct {
	header http.Header
	code   int
	buf    bytes.Buffer
}

func (b *bufferedWriter) Header() http.Header { return b.header }

func (b *bufferedWriter) WriteHeader(code int) {
	if b.code == 0 {
		b.code = code
	}
}

func (b *bufferedWriter) Write(p []byte) (int, error) {
	if b.code == 0 {
		b.code = http.StatusOK
	}
	return b.buf.Write(p)
}

func (b *bufferedWriter) status() int {
	if b.code == 0 {
		return http.StatusOK
	}
	return b.code
}

func (b *bufferedWriter) flush(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	for k, v := range b.header {
		h[k] = v
	}
	code := b.status()
	if (r.Method == http.MethodGet || r.Method == http.MethodHead) && code == http.StatusOK {
		etag := h.Get("ETag")
		if etag == "" {
			sum := sha256.Sum256(b.buf.Bytes())
			etag = `"sha256:` + hex.EncodeToString(sum[:]) + `"`
			h.Set("ETag", etag)
		}
		if h.Get("Cache-Control") == "" {
			h.Set("Cache-Control", "no-cache")
		}
		if etagMatch(r.Header.Get("If-None-Match"), etag) {
			h.Del("Content-Type")
			h.Del("Content-Length")
			w.WriteHeader(http.StatusNotModified)
			return
		}
	}
	if code != http.StatusNoContent && code != http.StatusNotModified {
		h.Set("Content-Length", strconv.Itoa(b.buf.Len()))
	}
	w.WriteHeader(code)
	if r.Method != http.MethodHead {
		_, _ = w.Write(b.buf.Bytes())
	}
}

// pathParams lists the {names} of a route path.
func pathParams(path string) []string {
	var out []string
	for _, seg := range strings.Split(path, "/") {
		if strings.HasPrefix(seg, "{") && strings.HasSuffix(seg, "}") {
			out = append(out, strings.TrimSuffix(strings.TrimPrefix(seg, "{"), "}"))
		}
	}
	return out
}
