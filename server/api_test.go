package server

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/drover/drover/api"
	"github.com/drover/drover/internal/testkit"
	"github.com/drover/drover/server/store"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/drover/drover/manifest"
	agentpb "github.com/drover/drover/proto"
)

// pagesOfOne lists path as token one item a page (limit=1), following the
// cursors, and fails unless page i holds want[i] alone and only the last
// page has no next cursor. keys gives a page's item keys and next cursor.
func pagesOfOne[L any](ts *testServer, token, path string, keys func(L) ([]string, string), want ...string) {
	ts.t.Helper()
	cursor := ""
	for i, w := range want {
		q := path + "?limit=1"
		if cursor != "" {
			q += "&cursor=" + cursor
		}
		var l L
		ts.as(token, 200, "GET", q, nil, &l)
		got, next := keys(l)
		if !slices.Equal(got, []string{w}) || (next == "") != (i == len(want)-1) {
			ts.t.Fatalf("GET %s: %v (next cursor %q), want [%s]", q, got, next, w)
		}
		cursor = next
	}
}

// as sends a JSON request with a token and fails unless the status is code.
func (ts *testServer) as(token string, code int, method, path string, body, out any) *apiResult {
	ts.t.Helper()
	r := ts.do(method, path, token, body)
	if r.code != code {
		ts.t.Fatalf("%s %s: %d %s, want %d", method, path, r.code, r.body, code)
	}
	if out != nil {
		reflect.ValueOf(out).Elem().SetZero() // no field left from an earlier answer
		r.decode(ts.t, out)
	}
	return r
}

func sha(b []byte) string {
	sum := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// auditCount is the number of audit entries of changes (the entries of
// refused requests, "refused.*", are not counted: TestRefusalsAudited).
func (ts *testServer) auditCount() int {
	ts.t.Helper()
	list, err := ts.db().ListAudit(ts.t.Context(), store.AuditFilter{Limit: 1 << 30})
	if err != nil {
		ts.t.Fatal(err)
	}
	n := 0
	for _, e := range list {
		if !strings.HasPrefix(e.Action, "refused.") {
			n++
		}
	}
	return n
}

// TestRoleMatrix calls every token-authenticated route of the route table
// (the one the router is built from) as every kind of caller: no token, an
// expired, a revoked, and a viewer, operator and admin token. A role below
// the route's gets 403 and a bad token 401, and neither changes anything
// (no audit entry); a role at or above it gets past authorization.
func TestRoleMatrix(t *testing.T) {
	ts := startServer(t)
	viewer, _ := ts.apiToken("matrix-viewer", "viewer", "")
	operator, _ := ts.apiToken("matrix-operator", "operator", "")
	admin, _ := ts.apiToken("matrix-admin", "admin", "")
	expired, _ := ts.apiToken("matrix-expired", "admin", "1m")
	revoked, revokedID := ts.apiToken("matrix-revoked", "admin", "")
	ts.adminOK("DELETE", "/api/v1/api-tokens/"+revokedID, nil, nil)
	ts.clock.Advance(2 * time.Minute)

	callers := []struct {
		name, token string
		role        role // 0: refused with kind
		kind        string
	}{
		{"no token", "", 0, "unauthenticated"},
		{"malformed token", "drvt1.nope", 0, "unauthenticated"},
		{"expired", expired, 0, "token_expired"},
		{"revoked", revoked, 0, "token_revoked"},
		{"viewer", viewer, roleViewer, ""},
		{"operator", operator, roleOperator, ""},
		{"admin", admin, roleAdmin, ""},
		{"bootstrap admin.token", ts.admin, roleAdmin, ""},
	}
	checked := 0
	for _, rt := range ts.s.routeTable() {
		if rt.role < roleViewer {
			continue // public and agent routes: TestOpenAPI and the enrollment tests
		}
		for _, c := range callers {
			before := ts.auditCount()
			var body any
			if rt.method != "GET" && rt.method != "DELETE" {
				body = []byte("{}")
			}
			r := ts.do(rt.method, fillPath(rt.path), c.token, body)
			what := rt.method + " " + rt.path + " as " + c.name
			switch {
			case c.role == 0:
				if r.code != 401 || r.errorCode() != c.kind || r.header.Get("WWW-Authenticate") == "" {
					t.Errorf("%s: %d %s, want 401 %s", what, r.code, r.body, c.kind)
				}
			case c.role < rt.role:
				if r.code != 403 || r.errorCode() != "permission_denied" || !strings.Contains(string(r.body), "needs the "+rt.role.String()+" role") {
					t.Errorf("%s: %d %s, want 403 permission_denied", what, r.code, r.body)
				}
			default:
				if r.code == 401 || r.code == 403 {
					t.Errorf("%s: %d %s, want it allowed", what, r.code, r.body)
				}
				// Every read answered 200 has an ETag, and If-None-Match gets 304.
				if rt.method == "GET" && !rt.raw && r.code == 200 {
					etag := r.header.Get("ETag")
					r2 := ts.doCT("GET", fillPath(rt.path), c.token, "", nil, "If-None-Match", etag)
					if etag == "" || r2.code != 304 || len(r2.body) != 0 || r2.header.Get("ETag") != etag {
						t.Errorf("%s: ETag %q, then %d %q", what, etag, r2.code, r2.body)
					}
				}
			}
			if c.role < rt.role {
				if n := ts.auditCount(); n != before {
					t.Errorf("%s: a refused call wrote %d audit entries", what, n-before)
				}
			}
			checked++
		}
	}

	// An agent's client certificate opens no token route, and no token
	// opens an agent route.
	a := ts.enrollAgent(nil)
	for _, rt := range ts.s.routeTable() {
		switch {
		case rt.role >= roleViewer:
			req, _ := http.NewRequest(rt.method, ts.base+fillPath(rt.path), nil)
			resp, err := a.client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != 401 {
				t.Errorf("%s %s with an agent certificate: %d, want 401", rt.method, rt.path, resp.StatusCode)
			}
		case rt.role == roleAgent:
			if r := ts.do(rt.method, fillPath(rt.path), ts.admin, nil); r.code != 401 || r.errorCode() != "unauthenticated" {
				t.Errorf("%s %s with the admin token: %d %s, want 401", rt.method, rt.path, r.code, r.body)
			}
		}
		checked++
	}
	t.Logf("%d route x caller combinations", checked)
}

func TestAPIEndpoints(t *testing.T) {
	ts := startServer(t)
	op, opID := ts.apiToken("deploy-bot", "operator", "")
	viewer, viewerID := ts.apiToken("dashboard", "viewer", "")

	covered := map[string]bool{}
	// audit checks the newest entry of an action on a target.
	audit := func(action, target, actorID string, before, after bool) api.AuditEntry {
		t.Helper()
		var list api.AuditList
		ts.adminOK("GET", "/api/v1/audit?limit=1&action="+url.QueryEscape(action)+"&target="+url.QueryEscape(target), nil, &list)
		if len(list.Entries) != 1 {
			t.Fatalf("no audit entry for %s on %s", action, target)
		}
		e := list.Entries[0]
		if (actorID != "" && e.ActorID != actorID) || e.Action != action || e.Target != target || time.Since(e.At) > time.Hour ||
			(e.BeforeDigest != "") != before || (e.AfterDigest != "") != after || e.Source != "127.0.0.1" {
			t.Fatalf("audit entry %+v, want %s on %s by %s (before %v, after %v)", e, action, target, actorID, before, after)
		}
		covered[action] = true
		return e
	}
	audit("api_tokens.create", "api-token/"+opID, bootstrapTokenID, false, true)

	// agents enroll; one is online
	web := ts.enrollAgent(map[string]string{"role": "web", "env": "prod"})
	db := ts.enrollAgent(map[string]string{"role": "db"})
	e := audit("agents.enroll", "agent/"+web.id, "", false, true)
	if !strings.HasPrefix(e.ActorID, "enrollment-token/") {
		t.Fatalf("enrollment audited as %+v", e)
	}
	covered["enrollment_tokens.create"] = false // checked below with a token of its own
	st := web.mustStream(t)
	testkit.WaitFor(t, 5*time.Second, "web online", func() bool {
		var ag api.Agent
		ts.adminOK("GET", "/api/v1/agents/"+web.id, nil, &ag)
		return ag.Online
	})

	// pipes: create (JSON), unchanged, update (YAML)
	spec := map[string]any{"schedule": "30 2 * * *", "timezone": "Europe/Berlin", "script": "echo backup\n", "targets": map[string]any{"tags": map[string]string{"role": "web"}}}
	var put api.PutPipeResponse
	ts.as(op, 201, "PUT", "/api/v1/pipes/backup", map[string]any{"spec": spec}, &put)
	if put.Version != 1 || !put.Created {
		t.Fatalf("PUT: %+v", put)
	}
	e1 := audit("pipes.write", "pipe/backup", opID, false, true)
	var list api.PipeList
	r := ts.as(viewer, 200, "GET", "/api/v1/pipes", nil, nil)
	var raw struct {
		Pipes []json.RawMessage `json:"pipes"`
	}
	r.decode(t, &raw)
	if len(raw.Pipes) != 1 || sha(raw.Pipes[0]) != e1.AfterDigest {
		t.Fatalf("after digest %s is not the sha256 of the pipe's JSON %s", e1.AfterDigest, raw.Pipes)
	}
	ts.as(op, 200, "PUT", "/api/v1/pipes/backup", map[string]any{"spec": spec}, &put)
	if put.Version != 1 || put.Created {
		t.Fatalf("unchanged PUT: %+v", put)
	}
	yaml := "name: backup\nschedule: \"0 3 * * *\"\ntimezone: Europe/Berlin\nscript: |\n  echo backup\ntargets:\n  tags: {role: web}\n"
	r = ts.doCT("PUT", "/api/v1/pipes/backup", op, "application/yaml", []byte(yaml))
	if r.code != 201 {
		t.Fatalf("YAML PUT: %d %s", r.code, r.body)
	}
	e2 := audit("pipes.write", "pipe/backup", opID, true, true)
	if e2.BeforeDigest != e1.AfterDigest || e2.AfterDigest == e2.BeforeDigest {
		t.Fatalf("digest chain: %+v then %+v", e1, e2)
	}
	ts.as(op, 201, "PUT", "/api/v1/pipes/alpha", map[string]any{"spec": map[string]any{"schedule": "@hourly", "script": "true", "targets": map[string]any{"agents": []string{db.id}}}}, nil)

	// filters and pages
	for q, want := range map[string][]string{
		"":                               {"alpha", "backup"},
		"?tag=role%3Dweb":                {"backup"},
		"?tag=role%3Ddb":                 {},
		"?agent=" + web.id:               {"backup"},
		"?agent=" + db.id:                {"alpha"},
		"?tag=role%3Dweb&agent=" + db.id: {},
	} {
		ts.as(viewer, 200, "GET", "/api/v1/pipes"+q, nil, &list)
		got := keysOf(list.Pipes, func(p api.Pipe) string { return p.Name })
		if !slices.Equal(got, want) && !(len(got) == 0 && len(want) == 0) {
			t.Errorf("GET /api/v1/pipes%s: %v, want %v", q, got, want)
		}
	}
	pagesOfOne(ts, viewer, "/api/v1/pipes", func(l api.PipeList) ([]string, string) {
		return keysOf(l.Pipes, func(p api.Pipe) string { return p.Name }), l.NextCursor
	}, "alpha", "backup")

	// ETags
	r = ts.as(viewer, 200, "GET", "/api/v1/pipes/backup", nil, nil)
	etag := r.header.Get("ETag")
	if !strings.HasPrefix(etag, `"sha256:`) || etag != `"`+sha(r.body)+`"` {
		t.Fatalf("ETag %q", etag)
	}
	r = ts.doCT("GET", "/api/v1/pipes/backup", viewer, "", nil, "If-None-Match", etag)
	if r.code != 304 || len(r.body) != 0 {
		t.Fatalf("If-None-Match: %d %s", r.code, r.body)
	}

	// versions: list, show, restore
	var vl api.PipeVersionList
	ts.as(viewer, 200, "GET", "/api/v1/pipes/backup/versions", nil, &vl)
	if len(vl.Versions) != 2 || vl.Versions[0].Version != 2 || !vl.Versions[0].Current || vl.Versions[1].Current {
		t.Fatalf("versions: %+v", vl)
	}
	pagesOfOne(ts, viewer, "/api/v1/pipes/backup/versions", func(l api.PipeVersionList) ([]string, string) {
		return keysOf(l.Versions, func(v api.PipeVersion) string { return strconv.FormatUint(v.Version, 10) }), l.NextCursor
	}, "2", "1")
	var pv api.PipeVersion
	ts.as(viewer, 200, "GET", "/api/v1/pipes/backup/versions/1", nil, &pv)
	if pv.Spec.Schedule != "30 2 * * *" || pv.Current {
		t.Fatalf("version 1: %+v", pv)
	}
	ts.as(viewer, 404, "GET", "/api/v1/pipes/backup/versions/9", nil, nil)
	ts.as(op, 201, "POST", "/api/v1/pipes/backup/versions/1/restore", nil, &put)
	if put.Version != 3 {
		t.Fatalf("restore: %+v", put)
	}
	audit("pipes.restore", "pipe/backup", opID, true, true)

	// schedule preview in the pipe's zone, across the spring DST gap: cron runs the
	// 02:30 that does not exist on 2026-03-29 at the end of the gap, 03:00
	var sp api.SchedulePreview
	// The fire-time view and the events (missed_test.go covers them).
	ts.as(viewer, 200, "GET", "/api/v1/pipes/backup/fires", nil, nil)
	ts.as(viewer, 200, "GET", "/api/v1/events?kind=run.failed", nil, nil)
	r = ts.as(viewer, 200, "GET", "/api/v1/pipes/backup/schedule?count=3&after=2026-03-28T00:00:00Z", nil, &sp)
	var times struct {
		FireTimes []string `json:"fire_times"`
	}
	r.decode(t, &times)
	want := []string{"2026-03-28T02:30:00+01:00", "2026-03-29T03:00:00+02:00", "2026-03-30T02:30:00+02:00"}
	if !slices.Equal(times.FireTimes, want) || sp.Timezone != "Europe/Berlin" || sp.Schedule != "30 2 * * *" {
		t.Fatalf("schedule preview: %s, want %v", r.body, want)
	}

	// dry-run: nothing is stored
	dry := func(body any) api.DryRunResponse {
		t.Helper()
		var out api.DryRunResponse
		ts.as(viewer, 200, "POST", "/api/v1/pipes/backup/dry-run", body, &out)
		return out
	}
	toDB := map[string]any{"schedule": "30 2 * * *", "timezone": "Europe/Berlin", "script": "echo backup\n", "targets": map[string]any{"tags": map[string]string{"role": "db"}}}
	d := dry(map[string]any{"spec": toDB})
	if d.Action != "update" || d.Version != 4 || len(d.Agents) != 2 {
		t.Fatalf("dry-run retarget: %+v", d)
	}
	for _, c := range d.Agents {
		switch {
		case c.ID == web.id && c.Action == "remove" && strings.Contains(c.Diff, "- spec.schedule: \"30 2 * * *\""):
		case c.ID == db.id && c.Action == "add" && strings.Contains(c.Diff, "+ version: 4"):
		default:
			t.Errorf("dry-run retarget: %+v", c)
		}
	}
	resched := map[string]any{"schedule": "45 2 * * *", "timezone": "Europe/Berlin", "script": "echo backup\n", "targets": map[string]any{"tags": map[string]string{"role": "web"}}}
	d = dry(map[string]any{"spec": resched})
	if len(d.Agents) != 1 || d.Agents[0].ID != web.id || d.Agents[0].Action != "update" ||
		d.Agents[0].Diff != "- spec.schedule: \"30 2 * * *\"\n+ spec.schedule: \"45 2 * * *\"\n- version: 3\n+ version: 4\n" {
		t.Fatalf("dry-run reschedule: %+v", d)
	}
	var cur api.Pipe
	ts.as(viewer, 200, "GET", "/api/v1/pipes/backup", nil, &cur)
	if d = dry(map[string]any{"spec": cur.Spec}); d.Action != "unchanged" || len(d.Agents) != 0 || d.Version != 3 {
		t.Fatalf("dry-run unchanged: %+v", d)
	}
	if d = dry(map[string]any{"delete": true}); d.Action != "delete" || len(d.Agents) != 1 || d.Agents[0].Action != "remove" {
		t.Fatalf("dry-run delete: %+v", d)
	}
	if d = dry(map[string]any{"spec": map[string]any{"schedule": "@daily", "script": "x"}}); d.Action != "update" || len(d.Agents) != 1 || d.Agents[0].Action != "remove" {
		t.Fatalf("dry-run untarget: %+v", d)
	}
	ts.as(viewer, 200, "GET", "/api/v1/pipes/backup", nil, &cur)
	if cur.Version != 3 || cur.Spec.Schedule != "30 2 * * *" {
		t.Fatalf("dry-run stored something: %+v", cur)
	}

	// run now: every targeted agent, one agent, by tag
	var rr api.RunPipeResponse
	ts.as(op, 202, "POST", "/api/v1/pipes/backup/run", map[string]any{}, &rr)
	if !slices.Equal(rr.Sent, []string{web.id}) || len(rr.Offline) != 0 || !strings.HasPrefix(rr.RequestID, "req-") {
		t.Fatalf("run: %+v", rr)
	}
	audit("pipes.run", "pipe/backup", opID, false, true)
	testkit.WaitFor(t, 5*time.Second, "RunNow", func() bool {
		st.mu.Lock()
		defer st.mu.Unlock()
		return len(st.runNows) == 1 && st.runNows[0].GetRequestId() == rr.RequestID && st.runNows[0].GetPipe() == "backup"
	})
	ts.as(op, 404, "POST", "/api/v1/pipes/backup/run", map[string]any{"agent": db.id}, nil)
	var byTag api.RunPipeResponse
	ts.as(op, 202, "POST", "/api/v1/pipes/backup/run", map[string]any{"tags": map[string]string{"env": "prod"}}, &byTag)
	if !slices.Equal(byTag.Sent, []string{web.id}) {
		t.Fatalf("run by tag: %+v", byTag)
	}
	ts.as(op, 404, "POST", "/api/v1/pipes/backup/run", map[string]any{"tags": map[string]string{"env": "dev"}}, nil)
	var offline api.RunPipeResponse
	ts.as(op, 202, "POST", "/api/v1/pipes/alpha/run", nil, &offline)
	if len(offline.Sent) != 0 || !slices.Equal(offline.Offline, []string{db.id}) {
		t.Fatalf("run on an offline agent: %+v", offline)
	}

	// runs: list and filter, get, logs, cancel
	now := time.Now()
	seq := sendAll(t, st, 1,
		&agentpb.AgentMessage{Body: &agentpb.AgentMessage_RunStarted{RunStarted: &agentpb.RunStarted{RunId: "r1", Pipe: "backup", PipeVersion: 3,
			Trigger: agentpb.Trigger_TRIGGER_API, RequestId: rr.RequestID, StartedAt: timestamppb.New(now)}}},
		&agentpb.AgentMessage{Body: &agentpb.AgentMessage_LogChunk{LogChunk: &agentpb.LogChunk{RunId: "r1", ChunkSeq: 0, Data: []byte("hello ")}}},
		&agentpb.AgentMessage{Body: &agentpb.AgentMessage_LogChunk{LogChunk: &agentpb.LogChunk{RunId: "r1", ChunkSeq: 1, Data: []byte("world\n"), Stream: agentpb.LogStream_LOG_STREAM_STDERR}}},
		&agentpb.AgentMessage{Body: &agentpb.AgentMessage_RunFinished{RunFinished: &agentpb.RunFinished{RunId: "r1", Pipe: "backup", PipeVersion: 3,
			Status: agentpb.RunStatus_RUN_STATUS_FAILED, ExitCode: 3, DurationMs: 1500, LogChunks: 2, RequestId: rr.RequestID, FinishedAt: timestamppb.New(now)}}},
	)
	time.Sleep(2 * time.Millisecond) // distinct created_at
	sendAll(t, st, seq, &agentpb.AgentMessage{Body: &agentpb.AgentMessage_RunStarted{RunStarted: &agentpb.RunStarted{RunId: "r2", Pipe: "backup", PipeVersion: 3,
		Trigger: agentpb.Trigger_TRIGGER_SCHEDULE, StartedAt: timestamppb.New(now)}}})
	var runs api.RunList
	runIDs := func(q string) []string {
		t.Helper()
		ts.as(viewer, 200, "GET", "/api/v1/runs"+q, nil, &runs)
		return keysOf(runs.Runs, func(x api.Run) string { return x.ID })
	}
	since := url.QueryEscape(now.Add(-time.Hour).UTC().Format(time.RFC3339Nano))
	future := url.QueryEscape(now.Add(time.Hour).UTC().Format(time.RFC3339Nano))
	for q, want := range map[string][]string{
		"":                                 {"r2", "r1"},
		"?request_id=" + rr.RequestID:      {"r1"},
		"?status=running":                  {"r2"},
		"?status=failed&agent=" + web.id:   {"r1"},
		"?pipe=backup&since=" + since:      {"r2", "r1"},
		"?since=" + future:                 nil,
		"?until=" + since:                  nil,
		"?until=" + future + "&pipe=alpha": nil,
	} {
		if got := runIDs(q); !slices.Equal(got, want) {
			t.Errorf("GET /api/v1/runs%s: %v, want %v", q, got, want)
		}
	}
	pagesOfOne(ts, viewer, "/api/v1/runs", func(l api.RunList) ([]string, string) {
		return keysOf(l.Runs, func(x api.Run) string { return x.ID }), l.NextCursor
	}, "r2", "r1")
	var run api.Run
	ts.as(viewer, 200, "GET", "/api/v1/runs/r1", nil, &run)
	if run.Status != "failed" || run.ExitCode != 3 || run.RequestID != rr.RequestID || run.LogChunks != 2 {
		t.Fatalf("run: %+v", run)
	}
	r = ts.doCT("GET", "/api/v1/runs/r1/logs", viewer, "", nil, "Accept", "text/plain")
	if r.code != 200 || string(r.body) != "hello world\n" || !strings.HasPrefix(r.header.Get("Content-Type"), "text/plain") {
		t.Fatalf("logs: %d %q", r.code, r.body)
	}
	var logs api.Logs
	r = ts.doCT("GET", "/api/v1/runs/r1/logs", viewer, "", nil, "Accept", "application/json")
	r.decode(t, &logs)
	if len(logs.Chunks) != 2 || logs.Chunks[1].Stream != "stderr" || string(logs.Chunks[1].Data) != "world\n" {
		t.Fatalf("JSON logs: %s", r.body)
	}
	var cr api.CancelResponse
	ts.as(op, 202, "POST", "/api/v1/runs/r2/cancel", map[string]any{}, &cr)
	if cr.AgentID != web.id || !cr.Sent {
		t.Fatalf("cancel: %+v", cr)
	}
	audit("runs.cancel", "run/r2", opID, true, true)
	testkit.WaitFor(t, 5*time.Second, "CancelRun", func() bool {
		st.mu.Lock()
		defer st.mu.Unlock()
		return slices.Equal(st.cancels, []string{"r2"})
	})
	if r := ts.as(op, 409, "POST", "/api/v1/runs/r1/cancel", nil, nil); !strings.Contains(string(r.body), "run r1 has ended (failed): there is nothing to cancel") {
		t.Fatalf("cancel of a finished run: %s", r.body)
	}
	ts.as(op, 404, "POST", "/api/v1/runs/nope/cancel", nil, nil)

	// agents: list and filter, get, tags, revoke, delete, renewal
	var al api.AgentList
	agentIDs := func(q string) []string {
		t.Helper()
		ts.as(viewer, 200, "GET", "/api/v1/agents"+q, nil, &al)
		return keysOf(al.Agents, func(a api.Agent) string { return a.ID })
	}
	for q, want := range map[string][]string{
		"":                               {web.id, db.id},
		"?status=online":                 {web.id},
		"?status=offline":                {db.id},
		"?status=revoked":                nil,
		"?tag=role%3Ddb":                 {db.id},
		"?tag=env%3Dprod&tag=role%3Dweb": {web.id},
	} {
		if got := agentIDs(q); !slices.Equal(got, want) {
			t.Errorf("GET /api/v1/agents%s: %v, want %v", q, got, want)
		}
	}
	pagesOfOne(ts, viewer, "/api/v1/agents", func(l api.AgentList) ([]string, string) {
		return keysOf(l.Agents, func(a api.Agent) string { return a.ID }), l.NextCursor
	}, web.id, db.id)
	var ag api.Agent
	ts.as(viewer, 200, "GET", "/api/v1/agents/"+web.id, nil, &ag)
	if !ag.Online || ag.Backend != "systemd" || ag.Manifest == nil || ag.LastSeenAt == nil || ag.ManifestError != "" {
		t.Fatalf("agent: %+v", ag)
	}
	ts.as(ts.admin, 200, "PUT", "/api/v1/agents/"+db.id+"/tags", api.TagsRequest{Tags: map[string]string{"role": "web"}}, &ag)
	if ag.Tags["role"] != "web" {
		t.Fatalf("tags: %+v", ag)
	}
	audit("agents.tags", "agent/"+db.id, bootstrapTokenID, true, true)
	if _, _, err := web.renew(); err != nil {
		t.Fatal(err)
	}
	audit("agents.renew", "agent/"+web.id, web.id, true, true)
	ts.as(ts.admin, 200, "POST", "/api/v1/agents/"+db.id+"/revoke", nil, &ag)
	if !ag.Revoked {
		t.Fatalf("revoke: %+v", ag)
	}
	audit("agents.revoke", "agent/"+db.id, bootstrapTokenID, true, true)
	if got := agentIDs("?status=revoked"); !slices.Equal(got, []string{db.id}) {
		t.Fatalf("revoked agents: %v", got)
	}
	ts.as(ts.admin, 204, "DELETE", "/api/v1/agents/"+db.id, nil, nil)
	audit("agents.delete", "agent/"+db.id, bootstrapTokenID, true, false)
	ts.as(viewer, 404, "GET", "/api/v1/agents/"+db.id, nil, nil)
	if r, err := db.get("/api/v1/agents/self/manifest"); err != nil || r.code != 401 || r.errorCode() != "certificate_refused" {
		t.Fatalf("a deleted agent's certificate: %v %v", r, err)
	}

	// enrollment tokens: create, list (no secrets), delete
	var tok api.EnrollmentTokenCreated
	ts.as(ts.admin, 201, "POST", "/api/v1/enrollment-tokens", api.EnrollmentTokenRequest{TTL: "30m", Name: "host1", Tags: map[string]string{"role": "web"}}, &tok)
	audit("enrollment_tokens.create", "enrollment-token/"+tok.ID, bootstrapTokenID, false, true)
	var tl api.EnrollmentTokenList
	r = ts.as(ts.admin, 200, "GET", "/api/v1/enrollment-tokens", nil, &tl)
	secret := strings.Split(tok.Token, ".")[2]
	if len(tl.Tokens) != 3 || tl.Tokens[0].ID != tok.ID || tl.Tokens[0].State != "valid" || tl.Tokens[0].Name != "host1" ||
		tl.Tokens[1].State != "used" || bytes.Contains(r.body, []byte(secret)) {
		t.Fatalf("enrollment tokens: %s", r.body)
	}
	ts.as(ts.admin, 204, "DELETE", "/api/v1/enrollment-tokens/"+tok.ID, nil, nil)
	audit("enrollment_tokens.delete", "enrollment-token/"+tok.ID, bootstrapTokenID, true, false)
	ts.as(ts.admin, 404, "DELETE", "/api/v1/enrollment-tokens/"+tok.ID, nil, nil)
	if _, err := enroll(ts.base, tok.Token, "late"); err == nil || err.(*httpError).errorCode() != "invalid_token" {
		t.Fatalf("a deleted token enrolled: %v", err)
	}

	// API tokens: list (no secrets), revoke
	var atl api.APITokenList
	r = ts.as(ts.admin, 200, "GET", "/api/v1/api-tokens", nil, &atl)
	names := keysOf(atl.Tokens, func(x api.APIToken) string { return x.Name + "/" + x.Role })
	if !slices.Equal(names, []string{"admin.token/admin", "deploy-bot/operator", "dashboard/viewer"}) ||
		bytes.Contains(r.body, []byte(strings.Split(op, ".")[2])) || atl.Tokens[1].LastUsedAt == nil {
		t.Fatalf("api tokens: %s", r.body)
	}
	ts.as(ts.admin, 204, "DELETE", "/api/v1/api-tokens/"+viewerID, nil, nil)
	audit("api_tokens.revoke", "api-token/"+viewerID, bootstrapTokenID, true, true)
	if r := ts.as(viewer, 401, "GET", "/api/v1/pipes", nil, nil); r.errorCode() != "token_revoked" {
		t.Fatalf("revoked token: %s", r.body)
	}

	// secrets: set, list, delete
	ts.as(op, 204, "PUT", "/api/v1/secrets/DB_PASSWORD", map[string]string{"value": "hunter2-s3cret"}, nil)
	audit("secrets.write", "secret/DB_PASSWORD", opID, false, true)
	ts.as(op, 204, "PUT", "/api/v1/secrets/DB_PASSWORD", map[string]string{"value": "hunter3-s3cret"}, nil)
	audit("secrets.write", "secret/DB_PASSWORD", opID, true, true)
	var sl api.SecretList
	r = ts.as(op, 200, "GET", "/api/v1/secrets", nil, &sl)
	if len(sl.Secrets) != 1 || sl.Secrets[0].Name != "DB_PASSWORD" || bytes.Contains(r.body, []byte("s3cret")) {
		t.Fatalf("secrets: %s", r.body)
	}
	ts.as(op, 204, "PUT", "/api/v1/secrets/API_KEY", map[string]string{"value": "k"}, nil)
	pagesOfOne(ts, op, "/api/v1/secrets", func(l api.SecretList) ([]string, string) {
		return keysOf(l.Secrets, func(s api.Secret) string { return s.Name }), l.NextCursor
	}, "API_KEY", "DB_PASSWORD")
	ts.as(op, 204, "DELETE", "/api/v1/secrets/API_KEY", nil, nil)
	ts.as(op, 204, "DELETE", "/api/v1/secrets/DB_PASSWORD", nil, nil)
	audit("secrets.delete", "secret/DB_PASSWORD", opID, true, false)
	ts.as(op, 404, "DELETE", "/api/v1/secrets/DB_PASSWORD", nil, nil)

	// keys, pipe deletion and undeletion
	ts.as(ts.admin, 200, "POST", "/api/v1/keys/rotate", nil, nil)
	audit("keys.rotate", "keys", bootstrapTokenID, true, true)
	ts.as(op, 204, "DELETE", "/api/v1/pipes/alpha", nil, nil)
	audit("pipes.delete", "pipe/alpha", opID, true, false)
	ts.as(op, 404, "GET", "/api/v1/pipes/alpha", nil, nil)
	ts.as(op, 200, "GET", "/api/v1/pipes/alpha/versions", nil, &vl)
	if !vl.Deleted || len(vl.Versions) != 1 || vl.Versions[0].Current {
		t.Fatalf("versions of a deleted pipe: %+v", vl)
	}
	ts.as(op, 201, "POST", "/api/v1/pipes/alpha/versions/1/restore", nil, &put)
	if put.Version != 2 {
		t.Fatalf("undelete: %+v", put)
	}

	// whoami, health
	var who api.WhoAmI
	ts.as(op, 200, "GET", "/api/v1/whoami", nil, &who)
	if who != (api.WhoAmI{ID: opID, Name: "deploy-bot", Role: "operator"}) {
		t.Fatalf("whoami: %+v", who)
	}
	var ver api.Version
	ts.as(op, 200, "GET", "/api/v1/version", nil, &ver)
	if ver.Server != buildVersion || ver.Server == "" {
		t.Fatalf("version: %+v, want %q", ver, buildVersion)
	}
	ts.as("", 200, "GET", "/healthz", nil, nil)
	ts.as("", 200, "GET", "/api/v1/openapi.json", nil, nil)

	// the audit log: filters and pages
	var al2 api.AuditList
	ts.as(op, 200, "GET", "/api/v1/audit?actor=deploy-bot", nil, &al2)
	byName := len(al2.Entries)
	ts.as(op, 200, "GET", "/api/v1/audit?actor="+opID, nil, &al2)
	if byName < 10 || len(al2.Entries) != byName {
		t.Fatalf("audit by actor: %d by name, %d by id", byName, len(al2.Entries))
	}
	ts.as(op, 200, "GET", "/api/v1/audit?since="+future, nil, &al2)
	if len(al2.Entries) != 0 {
		t.Fatalf("audit since the future: %+v", al2.Entries)
	}
	seen := map[string]bool{}
	cursor := ""
	for pages := 0; ; pages++ {
		ts.as(op, 200, "GET", "/api/v1/audit?limit=7&cursor="+cursor, nil, &al2)
		for _, e := range al2.Entries {
			if seen[e.ID] {
				t.Fatalf("audit entry %s on two pages", e.ID)
			}
			seen[e.ID] = true
		}
		if cursor = al2.NextCursor; cursor == "" {
			break
		}
	}
	if all, err := ts.db().ListAudit(t.Context(), store.AuditFilter{Limit: 1 << 30}); err != nil || len(seen) != len(all) {
		t.Fatalf("paged through %d audit entries of %d (%v)", len(seen), len(all), err)
	}
	r = ts.as(ts.admin, 200, "GET", "/api/v1/audit?limit=1000", nil, nil)
	if bytes.Contains(r.body, []byte("s3cret")) {
		t.Fatal("a secret value reached the audit log")
	}

	ts.notifyRoutes(t, audit) // notify_test.go
	// the agents' own routes
	for _, p := range []string{"/api/v1/agents/self/manifest", "/api/v1/agents/self/trust", "/api/v1/agents/self/secrets",
		"/api/v1/agents/self/payloads/" + cur.Payload.Digest} {
		if r, err := web.get(p); err != nil || r.code != 200 {
			t.Fatalf("GET %s: %v %v", p, r, err)
		}
	}
	// move a placement: one pipe: to the agent that holds it already
	ts.adminOK("PUT", "/api/v1/pipes/solo", map[string]any{"spec": map[string]any{"schedule": "@daily", "script": "true", "placement": "one",
		"targets": map[string]any{"tags": map[string]string{"role": "web"}}}}, nil)
	var pl api.Placement
	ts.as(op, 202, "POST", "/api/v1/pipes/solo/move", map[string]any{"to": web.id}, &pl)
	if pl.Holder != web.id || pl.MoveTo != "" || pl.LeaseUntil.IsZero() {
		t.Fatalf("move to the holder: %+v", pl)
	}
	audit("pipes.move", "pipe/solo", opID, true, true)
	ts.adminOK("DELETE", "/api/v1/pipes/solo", nil, nil)
	// the live log of a finished run: its chunks, then the end
	sse, events := ts.openSSE(t.Context(), op, "r1", "")
	var evs []string
	for ev := range events {
		evs = append(evs, ev.event+":"+ev.id)
	}
	sse.Body.Close()
	if strings.Join(evs, " ") != "chunk:0 chunk:1 end:" {
		t.Fatalf("live log of a finished run: %v", evs)
	}

	// Every route but the agents' streamed ones went through the router's
	// wrapper with a 2xx answer in this test (the metric counts them).
	ts.scrape(op)
	text := ts.scrape(op)
	for _, rt := range ts.s.routeTable() {
		if rt.role == roleAgent && rt.raw {
			continue // counted by drover_manifest_requests_total, or not at all; called above
		}
		if !strings.Contains(text, `code="`+strconv.Itoa(rt.status)+`",route="`+rt.method+" "+rt.path+`"}`) &&
			!(rt.status == 201 && strings.Contains(text, `code="200",route="`+rt.method+" "+rt.path+`"}`)) {
			t.Errorf("no successful call of %s %s in this test", rt.method, rt.path)
		}
	}

	// Every mutation of the route table was checked above.
	for _, rt := range ts.s.routeTable() {
		if rt.action != "" && !covered[rt.action] {
			t.Errorf("no audit entry checked for %s (%s %s)", rt.action, rt.method, rt.path)
		}
	}
}

// TestBadInputChangesNothing sends one bad request after another. Each is
// answered with its 4xx, its error code and a message naming the problem
// (and the field), and leaves the pipes, secrets, tokens, agents and the
// audit log exactly as they were.
func TestBadInputChangesNothing(t *testing.T) {
	ts := startServer(t, func(c *Config) { c.Signing.MaxPayloadBytes = 64 << 10 })
	op, _ := ts.apiToken("op", "operator", "")
	viewer, _ := ts.apiToken("viewer", "viewer", "")
	expired, _ := ts.apiToken("short", "operator", "1m")
	revoked, revokedID := ts.apiToken("gone", "operator", "")
	ts.adminOK("DELETE", "/api/v1/api-tokens/"+revokedID, nil, nil)
	a := ts.enrollAgent(map[string]string{"role": "web"})
	ts.putScriptPipe("good", "echo ok", map[string]string{"role": "web"})
	ts.adminOK("PUT", "/api/v1/secrets/GOOD", map[string]string{"value": "v"}, nil)
	ts.clock.Advance(2 * time.Minute)
	// Use each good token once now: last_used_at is written at most once a
	// minute, so the snapshots below do not see it move.
	ts.as(op, 200, "GET", "/api/v1/whoami", nil, nil)
	ts.as(viewer, 200, "GET", "/api/v1/whoami", nil, nil)

	snapshot := func() string {
		var b strings.Builder
		for _, p := range []string{"/api/v1/pipes", "/api/v1/pipes/good/versions", "/api/v1/secrets", "/api/v1/api-tokens", "/api/v1/enrollment-tokens", "/api/v1/agents/" + a.id, "/api/v1/runs"} {
			r := ts.adminOK("GET", p, nil, nil)
			b.Write(r.body)
		}
		fmt.Fprintf(&b, "audit %d", ts.auditCount())
		return b.String()
	}
	// agents' last_used and online state move with the clock: take the
	// snapshot after the clock moved.
	base := snapshot()

	spec := func(extra string) string {
		return `{"spec": {"schedule": "@daily", "script": "echo", "targets": {"tags": {"role": "web"}}` + extra + `}}`
	}
	big := make([]byte, 100<<10)
	rand.Read(big)
	bundleBody, _ := json.Marshal(map[string]any{"spec": map[string]any{"schedule": "@daily", "command": []string{"./run.sh"}}, "bundle": base64.StdEncoding.EncodeToString(big)})
	many := strings.Repeat("---\nname: good\nschedule: '@daily'\nscript: x\n", 10000)

	cases := []struct {
		name, method, path, token, ct, body string
		code                                int
		kind, field, msg                    string
	}{
		{"malformed JSON", "PUT", "/api/v1/pipes/good", op, "application/json", `{"spec": {"schedule": }}`, 400, "invalid_request", "", "malformed JSON at byte"},
		{"truncated JSON", "PUT", "/api/v1/pipes/good", op, "application/json", `{"spec": {"schedule": "@daily"`, 400, "invalid_request", "", "ends in the middle"},
		{"trailing data", "PUT", "/api/v1/secrets/GOOD", op, "application/json", `{"value": "x"} {}`, 400, "invalid_request", "", "trailing data"},
		{"wrong type", "PUT", "/api/v1/secrets/GOOD", op, "application/json", `{"value": 5}`, 400, "invalid_request", "value", "wrong type"},
		{"empty body", "PUT", "/api/v1/pipes/good", op, "application/json", ``, 400, "invalid_request", "", "the body is empty"},
		{"malformed YAML", "PUT", "/api/v1/pipes/good", op, "application/yaml", "name: good\nschedule: [\n", 400, "invalid_request", "spec", "invalid YAML"},
		{"YAML not a mapping", "PUT", "/api/v1/pipes/good", op, "application/yaml", "- a\n- b\n", 400, "invalid_request", "spec", "must be a mapping"},
		{"YAML with two specs", "PUT", "/api/v1/pipes/good", op, "application/yaml", "name: good\nschedule: '@daily'\nscript: x\n---\nname: other\nschedule: '@daily'\nscript: x\n", 400, "invalid_request", "", "holds 2 pipe specs"},
		{"YAML duplicate names", "PUT", "/api/v1/pipes/good", op, "application/yaml", "name: good\nschedule: '@daily'\nscript: x\n---\nname: good\nschedule: '@daily'\nscript: x\n", 400, "invalid_request", "", "more than one pipe spec"},
		{"YAML with 10,000 documents", "PUT", "/api/v1/pipes/good", op, "application/yaml", many, 400, "invalid_request", "spec", "more than 1000 documents"},
		{"unknown field", "PUT", "/api/v1/pipes/good", op, "application/json", spec(`, "bogus": 1`), 400, "invalid_request", "spec.bogus", "unknown field bogus"},
		{"unknown top-level field", "PUT", "/api/v1/pipes/good", op, "application/json", `{"spec": {}, "extra": 1}`, 400, "invalid_request", "extra", "unknown field extra"},
		{"unknown YAML field", "PUT", "/api/v1/pipes/good", op, "application/yaml", "name: good\nschedule: '@daily'\nscript: x\nbogus: 1\n", 422, "validation_failed", "spec.bogus", ""},
		{"bundle over the cap", "PUT", "/api/v1/pipes/good", op, "application/json", string(bundleBody), 413, "too_large", "bundle", "too large"},
		{"body over the cap", "PUT", "/api/v1/secrets/GOOD", op, "application/json", `{"value": "` + strings.Repeat("x", 200<<10) + `"}`, 413, "too_large", "", "larger than"},
		{"pipe body over the cap", "PUT", "/api/v1/pipes/good", op, "application/json", `{"spec": {"script": "` + strings.Repeat("x", 2<<20) + `"}}`, 413, "too_large", "", "larger than"},
		{"invalid cron", "PUT", "/api/v1/pipes/good", op, "application/json", `{"spec": {"schedule": "61 * * * *", "script": "x"}}`, 422, "validation_failed", "spec.schedule", "61"},
		{"Quartz extension", "PUT", "/api/v1/pipes/good", op, "application/json", `{"spec": {"schedule": "0 0 L * ?", "script": "x"}}`, 422, "validation_failed", "spec.schedule", ""},
		{"@reboot", "PUT", "/api/v1/pipes/good", op, "application/json", `{"spec": {"schedule": "@reboot", "script": "x"}}`, 422, "validation_failed", "spec.schedule", "@reboot"},
		{"unknown time zone", "PUT", "/api/v1/pipes/good", op, "application/json", `{"spec": {"schedule": "@daily", "timezone": "Mars/Olympus_Mons", "script": "x"}}`, 422, "validation_failed", "spec.timezone", "Mars/Olympus_Mons"},
		{"../ in the spec name", "PUT", "/api/v1/pipes/good", op, "application/json", `{"spec": {"name": "../etc", "schedule": "@daily", "script": "x"}}`, 422, "validation_failed", "spec.name", "does not match"},
		{"../ in the path", "PUT", "/api/v1/pipes/..%2Fetc%2Fpasswd", op, "application/json", spec(""), 400, "invalid_request", "name", `"../etc/passwd"`},
		{"newline in the path", "PUT", "/api/v1/pipes/a%0Ab", op, "application/json", spec(""), 400, "invalid_request", "name", `"a\nb"`},
		{"% in the path", "PUT", "/api/v1/pipes/a%25b", op, "application/json", spec(""), 400, "invalid_request", "name", `"a%b"`},
		{"newline in a secret name", "PUT", "/api/v1/secrets/A%0AB", op, "application/json", `{"value": "x"}`, 400, "invalid_request", "name", `"A\nB"`},
		{"../ in a secret name", "DELETE", "/api/v1/secrets/..%2FGOOD", op, "", "", 400, "invalid_request", "name", "invalid secret name"},
		{"% in a pipe to run", "POST", "/api/v1/pipes/g%25ood/run", op, "application/json", `{}`, 400, "invalid_request", "name", "invalid pipe name"},
		{"viewer applies", "PUT", "/api/v1/pipes/good", viewer, "application/json", spec(""), 403, "permission_denied", "", "needs the operator role"},
		{"viewer sets a secret", "PUT", "/api/v1/secrets/GOOD", viewer, "application/json", `{"value": "x"}`, 403, "permission_denied", "", "needs the operator role"},
		{"operator creates a token", "POST", "/api/v1/api-tokens", op, "application/json", `{"name": "x", "role": "admin"}`, 403, "permission_denied", "", "needs the admin role"},
		{"expired token", "DELETE", "/api/v1/pipes/good", expired, "", "", 401, "token_expired", "", "expired at"},
		{"revoked token", "DELETE", "/api/v1/pipes/good", revoked, "", "", 401, "token_revoked", "", "was revoked"},
		{"garbage token", "DELETE", "/api/v1/pipes/good", "drvt1.aaaaaaaaaaaaaaaa.nope", "", "", 401, "unauthenticated", "", "not valid"},
		{"wrong media type", "PUT", "/api/v1/secrets/GOOD", op, "text/plain", `{"value": "x"}`, 415, "unsupported_media_type", "", "application/json"},
		{"bad tag filter", "GET", "/api/v1/pipes?tag=role", op, "", "", 400, "invalid_request", "tag", `"role"`},
		{"bad cursor", "GET", "/api/v1/runs?cursor=bm9wZQ", op, "", "", 400, "invalid_request", "cursor", ""},
		{"bad limit", "GET", "/api/v1/audit?limit=5000", op, "", "", 400, "invalid_request", "limit", "1-1000"},
		{"bad since", "GET", "/api/v1/runs?since=yesterday", op, "", "", 400, "invalid_request", "since", `"yesterday"`},
		{"bad agent status", "GET", "/api/v1/agents?status=sleeping", op, "", "", 400, "invalid_request", "status", "sleeping"},
		{"bad run status", "GET", "/api/v1/runs?status=done", op, "", "", 400, "invalid_request", "status", ""},
		{"bad schedule count", "GET", "/api/v1/pipes/good/schedule?count=0", op, "", "", 400, "invalid_request", "count", "1-100"},
		{"bad version", "GET", "/api/v1/pipes/good/versions/abc", op, "", "", 400, "invalid_request", "version", `"abc"`},
		{"bad role", "POST", "/api/v1/api-tokens", ts.admin, "application/json", `{"name": "x", "role": "root"}`, 422, "validation_failed", "role", `"root"`},
		{"token without a name", "POST", "/api/v1/api-tokens", ts.admin, "application/json", `{"role": "viewer", "ttl": "forever"}`, 422, "validation_failed", "name", "required"},
		{"bad enrollment ttl", "POST", "/api/v1/enrollment-tokens", ts.admin, "application/json", `{"ttl": "1y"}`, 422, "validation_failed", "ttl", "not a duration"},
		{"bad tag key", "PUT", "/api/v1/agents/" + a.id + "/tags", ts.admin, "application/json", `{"tags": {"bad key": "x"}}`, 422, "validation_failed", "tags", "not a valid tag key"},
		{"run with agent and tags", "POST", "/api/v1/pipes/good/run", op, "application/json", `{"agent": "x", "tags": {"a": "b"}}`, 400, "invalid_request", "tags", "not both"},
		{"dry-run delete with a spec", "POST", "/api/v1/pipes/good/dry-run", op, "application/json", `{"delete": true, "spec": {}}`, 400, "invalid_request", "delete", "no spec"},
	}
	for _, c := range cases {
		r := ts.doCT(c.method, c.path, c.token, c.ct, []byte(c.body))
		var eb api.ErrorBody
		if err := json.Unmarshal(r.body, &eb); err != nil {
			t.Errorf("%s: %d %q is not a JSON error", c.name, r.code, r.body)
			continue
		}
		fields := map[string]bool{}
		all := eb.Error.Message
		for _, d := range eb.Error.Details {
			fields[d.Field] = true
			all += " | " + d.Field + ": " + d.Message
		}
		if r.code != c.code || eb.Error.Code != c.kind || (c.field != "" && !fields[c.field]) || !strings.Contains(all, c.msg) {
			t.Errorf("%s: %d %s, want %d %s field %q message with %q", c.name, r.code, r.body, c.code, c.kind, c.field, c.msg)
		}
		if now := snapshot(); now != base {
			t.Fatalf("%s changed something:\n%s\nwas\n%s", c.name, now, base)
		}
	}

	// Every problem at once, with YAML lines.
	r := ts.doCT("PUT", "/api/v1/pipes/good", op, "application/yaml", []byte("name: good\nschedule: '61 * * * *'\ntimezone: Nowhere/City\ncatchup: sometimes\nscript: x\n"))
	var ve struct {
		Error struct {
			Details []api.Detail `json:"details"`
		} `json:"error"`
	}
	_ = json.Unmarshal(r.body, &ve)
	lines := map[string]int{}
	for _, d := range ve.Error.Details {
		lines[d.Field] = d.Line
	}
	if r.code != 422 || lines["spec.schedule"] != 2 || lines["spec.timezone"] != 3 || lines["spec.catchup"] != 4 {
		t.Fatalf("all problems at once: %d %s", r.code, r.body)
	}
	if snapshot() != base {
		t.Fatal("the invalid YAML changed something")
	}
	if manifest.MaxSpecsPerFile >= 10000 {
		t.Fatal("the 10,000-document case no longer tests the document cap")
	}
}
