package server

import (
	"strings"
	"testing"
	"time"

	"github.com/drover/drover/api"
	"github.com/drover/drover/internal/testkit"

	agentpb "github.com/drover/drover/proto"
)

// scrape returns the metrics text.
func (ts *testServer) scrape(token string) string {
	ts.t.Helper()
	r := ts.do("GET", "/metrics", token, nil)
	if r.code != 200 || !strings.HasPrefix(r.header.Get("Content-Type"), "text/plain") {
		ts.t.Fatalf("GET /metrics: %d %s", r.code, r.body)
	}
	return string(r.body)
}

func TestMetrics(t *testing.T) {
	ts := startServer(t)
	viewer, _ := ts.apiToken("prometheus", "viewer", "")
	if r := ts.do("GET", "/metrics", "", nil); r.code != 401 {
		t.Fatalf("metrics without a token: %d", r.code)
	}
	ts.putScriptPipe("job", "echo", map[string]string{"role": "web"})
	a := ts.enrollAgent(map[string]string{"role": "web"})
	ts.enrollAgent(map[string]string{"role": "db"}) // offline
	r, err := a.get("/api/v1/agents/self/manifest")
	if err != nil || r.code != 200 {
		t.Fatal(r, err)
	}
	if r, err = a.get("/api/v1/agents/self/manifest", "If-None-Match", r.header.Get("ETag")); err != nil || r.code != 304 {
		t.Fatal(r, err)
	}
	st := a.mustStream(t)
	finished := &agentpb.AgentMessage{Body: &agentpb.AgentMessage_RunFinished{RunFinished: &agentpb.RunFinished{RunId: "m1", Pipe: "job",
		Status: agentpb.RunStatus_RUN_STATUS_FAILED, DurationMs: 2500, LogChunks: 1}}}
	seq := sendAll(t, st, 1,
		&agentpb.AgentMessage{Body: &agentpb.AgentMessage_ManifestStatus{ManifestStatus: &agentpb.ManifestStatus{State: agentpb.ManifestStatus_STATE_APPLY_FAILED,
			Pipes: []*agentpb.PipeStatus{{Name: "job", Version: 1, ApplyError: "unit failed"}}}}},
		&agentpb.AgentMessage{Body: &agentpb.AgentMessage_RunStarted{RunStarted: &agentpb.RunStarted{RunId: "m1", Pipe: "job"}}},
		&agentpb.AgentMessage{Body: &agentpb.AgentMessage_LogChunk{LogChunk: &agentpb.LogChunk{RunId: "m1", Data: []byte("x")}}},
		finished,
		&agentpb.AgentMessage{Body: &agentpb.AgentMessage_RunStarted{RunStarted: &agentpb.RunStarted{RunId: "m2", Pipe: "job"}}},
	)
	// A replay of the RunFinished (a lost ack) is not counted again.
	finished.Seq = seq
	sendAll(t, st, seq, finished)
	ts.as(viewer, 200, "GET", "/api/v1/whoami", nil, nil)
	testkit.WaitFor(t, 5*time.Second, "online", func() bool { return strings.Contains(ts.scrape(viewer), `drover_agents{state="online"} 1`) })

	var ag api.Agent
	ts.as(viewer, 200, "GET", "/api/v1/agents/"+a.id, nil, &ag)
	if len(ag.Pipes) != 1 || ag.Pipes[0].ApplyError != "unit failed" {
		t.Fatalf("apply errors of the agent: %+v", ag)
	}
	text := ts.scrape(viewer)
	for _, want := range []string{
		`drover_agents{state="online"} 1`,
		`drover_agents{state="offline"} 1`,
		`drover_agents{state="revoked"} 0`,
		`drover_agent_apply_errors{kind="pipe"} 1`,
		`drover_manifest_requests_total{code="200"} 1`,
		`drover_manifest_requests_total{code="304"} 1`,
		`drover_stream_records_total{type="log_chunk"} 1`,
		`drover_stream_records_total{type="run_finished"} 2`,
		`drover_stream_records_total{type="hello"} 1`,
		`drover_stream_ack_latency_seconds_count 7`,
		`drover_stream_connections 1`,
		`drover_runs{status="failed"} 1`,
		`drover_runs{status="running"} 1`,
		`drover_runs_finished_total{status="failed"} 1`,
		`drover_run_duration_seconds_count{pipe="job"} 1`,
		`drover_run_duration_seconds_sum{pipe="job"} 2.5`,
		`drover_api_requests_total{code="200",route="GET /api/v1/whoami"} 1`,
		`drover_api_request_duration_seconds_count{route="GET /api/v1/whoami"} 1`,
		`drover_audit_write_failures_total 0`,
		`go_goroutines `,
		`process_open_fds `,
	} {
		if !strings.Contains(text, want) {
			t.Errorf("metrics lack %q", want)
		}
	}
	if t.Failed() {
		t.Log(text)
	}

	// metrics_public: no token needed.
	pub := startServer(t, func(c *Config) { c.MetricsPublic = true })
	if !strings.Contains(pub.scrape(""), "drover_agents") {
		t.Fatal("public metrics")
	}
}

// The bootstrap admin.token is an API token with id "bootstrap": listed,
// usable until revoked, and still revoked after a restart.
func TestBootstrapTokenRevocable(t *testing.T) {
	dir := t.TempDir()
	ts := startServer(t, func(c *Config) { c.DataDir = dir })
	var who api.WhoAmI
	ts.as(ts.admin, 200, "GET", "/api/v1/whoami", nil, &who)
	if who != (api.WhoAmI{ID: bootstrapTokenID, Name: bootstrapName, Role: "admin"}) {
		t.Fatalf("whoami: %+v", who)
	}
	admin2, id2 := ts.apiToken("second-admin", "admin", "")
	ts.as(admin2, 204, "DELETE", "/api/v1/api-tokens/"+bootstrapTokenID, nil, nil)
	if r := ts.do("GET", "/api/v1/whoami", ts.admin, nil); r.code != 401 || r.errorCode() != "token_revoked" {
		t.Fatalf("revoked admin.token: %d %s", r.code, r.body)
	}
	var e api.AuditList
	ts.as(admin2, 200, "GET", "/api/v1/audit?target=api-token/bootstrap", nil, &e)
	if len(e.Entries) != 1 || e.Entries[0].ActorID != id2 || e.Entries[0].Action != "api_tokens.revoke" {
		t.Fatalf("audit: %+v", e)
	}
	ts.stop()

	ts2 := startServer(t, func(c *Config) { c.DataDir = dir })
	if r := ts2.do("GET", "/api/v1/whoami", ts2.admin, nil); r.code != 401 || r.errorCode() != "token_revoked" {
		t.Fatalf("admin.token after a restart: %d %s", r.code, r.body)
	}
	ts2.as(admin2, 200, "GET", "/api/v1/whoami", nil, &who)
	if who.ID != id2 {
		t.Fatalf("whoami: %+v", who)
	}
}
