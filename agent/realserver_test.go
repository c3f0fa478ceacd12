package agent

import (
	"os"
	"strings"
	"testing"
	"time"

	"github.com/drover/drover/api"

	"github.com/drover/drover/agent/apply"
	"github.com/drover/drover/agent/internal/sdtest"
	"github.com/drover/drover/internal/testkit"
	"github.com/drover/drover/server/servertest"
	"github.com/drover/drover/units"
)

// realServer is drover-server running in-process on 127.0.0.1.
type realServer struct {
	t   *testing.T
	srv *servertest.Server
}

func startRealServer(t *testing.T) *realServer {
	t.Helper()
	ss := servertest.Start(t)
	return &realServer{t: t, srv: ss}
}

// api calls the admin API and decodes the JSON answer into out.
func (rs *realServer) api(method, path string, body, out any) {
	rs.t.Helper()
	rs.srv.Admin().JSON(rs.t, method, path, body, out)
}

// TestRealServer runs the agent against drover-server in-process: token
// file enrollment with the pin check, a pipe created on the server reaching
// the agent through SyncNow and a verified manifest (on the systemd user
// manager when one runs), ETag revalidation, and runs spooled on the host
// arriving at the server exactly once.
func TestRealServer(t *testing.T) {
	rs := startRealServer(t)
	var tok api.EnrollmentTokenCreated
	rs.api("POST", "/api/v1/enrollment-tokens", api.EnrollmentTokenRequest{Tags: map[string]string{"role": "agenttest"}}, &tok)

	cfg := testConfig(t, nil)
	cfg.Server = rs.srv.URL
	var backend apply.Backend
	if sdtest.Available() == nil {
		cfg.Backend = BackendSystemd
		b, err := apply.Select(t.Context(), apply.BackendSystemd, apply.Config{DataDir: cfg.DataDir, Scope: units.ScopeUser, AgentPath: "/bin/true"})
		must(t, err)
		t.Cleanup(func() { b.Close() })
		backend = b
	}
	must(t, os.WriteFile(cfg.TokenFile, []byte(tok.Token+"\n"), 0o600))
	ta := startAgent(t, cfg, backend)
	id := ta.enrolled(15 * time.Second)
	if _, err := os.Stat(cfg.TokenFile); !os.IsNotExist(err) {
		t.Fatal("token file not removed")
	}
	testkit.WaitFor(t, 15*time.Second, "the agent online on the server", func() bool {
		var ag api.Agent
		rs.api("GET", "/api/v1/agents/"+id.AgentID, nil, &ag)
		return ag.Online && ta.a.Status(t.Context()).StreamConnected
	})

	var put api.PutPipeResponse
	rs.api("PUT", "/api/v1/pipes/rs-hello", map[string]any{"spec": map[string]any{
		"schedule": "11 4 * * *", "script": "echo hello", "targets": map[string]any{"tags": map[string]string{"role": "agenttest"}},
	}}, &put)
	testkit.WaitFor(t, 20*time.Second, "the pipe on the agent", func() bool {
		st := ta.a.Status(t.Context())
		return st.AppliedSerial > 0 && len(st.Pipes) == 1 && st.Pipes[0].Name == "rs-hello" && !st.Pipes[0].NextRun.IsZero()
	})
	if r := ta.syncNow(); r.Outcome != OutcomeUnchanged || !r.NotModified {
		t.Fatalf("revalidation: %+v (want a 304)", r)
	}
	if sdtest.Available() == nil {
		if _, ok := sdtest.ListTimers(t)[units.TimerName("rs-hello")]; !ok {
			t.Fatal("list-timers does not show the pipe")
		}
	}

	runs := spoolRuns(t, cfg.DataDir, "rs-hello", 0, 20)
	testkit.WaitFor(t, 20*time.Second, "20 runs on the server", func() bool {
		var out struct {
			Runs []api.Run `json:"runs"`
		}
		rs.api("GET", "/api/v1/runs?pipe=rs-hello&agent="+id.AgentID, nil, &out)
		if len(out.Runs) != len(runs) {
			return false
		}
		for _, r := range out.Runs {
			if r.Status != "succeeded" || r.LogChunks != 1 {
				return false
			}
		}
		return true
	})
	testkit.WaitFor(t, 10*time.Second, "an empty outbox", func() bool {
		n, _, _ := ta.store.OutboxStats()
		return n == 0
	})
	var ag api.Agent
	rs.api("GET", "/api/v1/agents/"+id.AgentID, nil, &ag)
	if ag.AppliedSerial == 0 || ag.Backend != ta.backend.Name() || ag.Scope != "user" || ag.ManifestState != "applied" {
		t.Fatalf("the server's view of the agent: %+v", ag)
	}

	// Deleting the pipe on the server removes it from the host.
	rs.api("DELETE", "/api/v1/pipes/rs-hello", nil, nil)
	testkit.WaitFor(t, 20*time.Second, "the pipe to go", func() bool {
		st := ta.a.Status(t.Context())
		for _, p := range st.Pipes {
			if p.Version > 0 {
				return false
			}
		}
		return true
	})
}

// TestRealServerReenroll: an agent revoked on the server keeps its pipes,
// says in its status that its identity no longer works, refuses no token
// while it works, and enrolls again from a new token file: a new agent id
// whose first manifest (serial 1, below the old id's serials) is accepted
// and applied, with the runs recorded meanwhile delivered to the server
// under the new id. Real server, real bbolt store, real cron backend.
func TestRealServerReenroll(t *testing.T) {
	rs := startRealServer(t)
	tags := map[string]string{"role": "reenroll"}
	newToken := func() string {
		var tok api.EnrollmentTokenCreated
		rs.api("POST", "/api/v1/enrollment-tokens", api.EnrollmentTokenRequest{Tags: tags}, &tok)
		return tok.Token
	}
	cfg := testConfig(t, nil)
	cfg.Server = rs.srv.URL
	backend, err := apply.Select(t.Context(), apply.BackendCron, apply.Config{DataDir: cfg.DataDir, Scope: units.ScopeUser, AgentPath: "/bin/true"})
	must(t, err)
	t.Cleanup(func() { backend.Close() })
	must(t, os.WriteFile(cfg.TokenFile, []byte(newToken()+"\n"), 0o600))
	ta := startAgent(t, cfg, backend)
	old := ta.enrolled(15 * time.Second).AgentID

	// Three versions of the pipe: the old id's accepted serial is at least 3.
	for _, sched := range []string{"1 4 * * *", "2 4 * * *", "3 4 * * *"} {
		rs.api("PUT", "/api/v1/pipes/re-hello", map[string]any{"spec": map[string]any{
			"schedule": sched, "script": "echo hello", "targets": map[string]any{"tags": tags},
		}}, nil)
		testkit.WaitFor(t, 20*time.Second, "pipe version with "+sched, func() bool {
			st := ta.a.Status(t.Context())
			return len(st.Pipes) == 1 && st.AppliedSerial > 0 && st.Serial == st.AppliedSerial && ta.syncNow().Outcome == OutcomeUnchanged
		})
	}
	oldSerial := ta.a.Status(t.Context()).Serial
	if oldSerial < 3 {
		t.Fatalf("serial %d after three versions", oldSerial)
	}

	// A token while the identity works is not used.
	if err := EnrollVia(t.Context(), cfg.SocketPath(), newToken()); err == nil || !strings.Contains(err.Error(), "already enrolled") {
		t.Fatalf("enroll over the control socket while enrolled: %v", err)
	}

	rs.api("POST", "/api/v1/agents/"+old+"/revoke", nil, nil)
	testkit.WaitFor(t, 20*time.Second, "the agent to notice the revocation", func() bool {
		ta.a.RequestSync()
		return strings.Contains(ta.a.Status(t.Context()).IdentityError, "agent_revoked")
	})
	// Pipes keep running: runs recorded while revoked wait in the outbox.
	runs := spoolRuns(t, cfg.DataDir, "re-hello", 0, 3)
	testkit.WaitFor(t, 10*time.Second, "the runs in the outbox", func() bool {
		n, _, _ := ta.store.OutboxStats()
		return n >= 9
	})
	if st := ta.a.Status(t.Context()); len(st.Pipes) != 1 || st.Pipes[0].Name != "re-hello" {
		t.Fatalf("pipes while revoked: %+v", st.Pipes)
	}

	must(t, os.WriteFile(cfg.TokenFile, []byte(newToken()+"\n"), 0o600))
	var id string
	testkit.WaitFor(t, 30*time.Second, "re-enrollment", func() bool {
		if cur := ta.a.identity(); cur != nil && cur.AgentID != old {
			id = cur.AgentID
			return true
		}
		return false
	})
	if _, err := os.Stat(cfg.TokenFile); !os.IsNotExist(err) {
		t.Error("token file not removed after re-enrollment")
	}
	if got, err := loadIdentity(cfg.DataDir); err != nil || got.AgentID != id {
		t.Fatalf("stored identity: %v %v", got, err)
	}
	testkit.WaitFor(t, 30*time.Second, "the new agent's manifest applied", func() bool {
		st := ta.a.Status(t.Context())
		return st.IdentityError == "" && st.Serial > 0 && st.Serial < oldSerial && st.AppliedSerial == st.Serial &&
			len(st.Pipes) == 1 && st.Pipes[0].Name == "re-hello" && st.StreamConnected
	})
	testkit.WaitFor(t, 30*time.Second, "the runs on the server under the new id", func() bool {
		var out struct {
			Runs []api.Run `json:"runs"`
		}
		rs.api("GET", "/api/v1/runs?pipe=re-hello&agent="+id, nil, &out)
		return len(out.Runs) == len(runs)
	})
	var ag api.Agent
	testkit.WaitFor(t, 30*time.Second, "the new agent's applied manifest on the server", func() bool {
		rs.api("GET", "/api/v1/agents/"+id, nil, &ag)
		return ag.ManifestState == "applied"
	})
	if !ag.Online || ag.Tags["role"] != "reenroll" || ag.AppliedSerial == 0 || ag.AppliedSerial >= oldSerial {
		t.Fatalf("the new agent on the server: %+v", ag)
	}
	rs.api("GET", "/api/v1/agents/"+old, nil, &ag)
	if !ag.Revoked || ag.Online {
		t.Fatalf("the old agent on the server: %+v", ag)
	}
}
