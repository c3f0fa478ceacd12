package server

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/drover/drover/api"
	"github.com/drover/drover/internal/testkit"
)

// buildInternalAgent builds drover-agent into a fresh temporary directory
// and returns the directory and the binary. A root server runs a
// cron-backend internal agent as nobody, which must reach the binary and
// the agent's files (not the server's), so the directory and its parent
// are made world-searchable.
func buildInternalAgent(t *testing.T) (base, bin string) {
	t.Helper()
	base = t.TempDir()
	for _, d := range []string{filepath.Dir(base), base} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	bin = filepath.Join(base, "drover-agent")
	if out, err := exec.Command("go", "build", "-o", bin, "../cmd/drover-agent").CombinedOutput(); err != nil {
		t.Fatalf("build drover-agent: %v\n%s", err, out)
	}
	return base, bin
}

// TestInternalAgent runs the real drover-agent binary as the server's
// internal agent (cron backend, so no systemd is needed) and waits until it
// enrolled through a token and came online on the stream.
func TestInternalAgent(t *testing.T) {
	if testing.Short() {
		t.Skip("builds drover-agent")
	}
	base, bin := buildInternalAgent(t)
	agentDir := filepath.Join(base, "agent")
	ts := startServer(t, func(c *Config) {
		c.InternalAgent = InternalAgentConfig{Enabled: true, AgentPath: bin, DataDir: agentDir, Backend: "cron", Scope: "user"}
	})
	deadline := time.Now().Add(60 * time.Second)
	for {
		var out struct {
			Agents []struct {
				ID     string            `json:"id"`
				Online bool              `json:"online"`
				Tags   map[string]string `json:"tags"`
			} `json:"agents"`
		}
		ts.adminOK("GET", "/api/v1/agents", nil, &out)
		if len(out.Agents) == 1 && out.Agents[0].Online {
			if out.Agents[0].Tags[internalAgentTag] != "true" {
				t.Fatalf("internal agent lacks its tag: %+v", out.Agents[0])
			}
			break
		}
		if len(out.Agents) > 1 {
			t.Fatalf("more than one agent: %+v", out.Agents)
		}
		if time.Now().After(deadline) {
			t.Fatalf("the internal agent did not come online: %+v", out.Agents)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if !fileExecutable(bin) {
		t.Fatal("binary vanished")
	}
}

// TestInternalAgentJobsCannotReadDataDir is the proof for the escalation
// through the internal agent: on a root server whose internal agent uses
// the cron backend (no systemd here), the agent and its jobs run as nobody,
// so even an admin's pipe that runs `cat <data_dir>/admin.token` on it gets
// "Permission denied" and the token stays unread.
func TestInternalAgentJobsCannotReadDataDir(t *testing.T) {
	if testing.Short() {
		t.Skip("builds drover-agent")
	}
	testkit.RequireRoot(t, "to drop to nobody")
	base, bin := buildInternalAgent(t)
	serverDir := filepath.Join(base, "server")
	ts := startServer(t, func(c *Config) {
		c.DataDir = serverDir
		c.InternalAgent = InternalAgentConfig{Enabled: true, AgentPath: bin, Backend: "cron"}
	})
	if _, dir := ts.s.internalAgentPaths(); dir != serverDir+"-internal-agent" {
		t.Fatalf("internal agent data dir %s, want it beside the server's", dir)
	}
	var agentID string
	testkit.WaitFor(t, 60*time.Second, "the internal agent to come online", func() bool {
		var out api.AgentList
		ts.adminOK("GET", "/api/v1/agents", nil, &out)
		if len(out.Agents) == 1 && out.Agents[0].Online {
			agentID = out.Agents[0].ID
			return true
		}
		return false
	})
	admin, err := os.ReadFile(filepath.Join(serverDir, "admin.token"))
	if err != nil {
		t.Fatal(err)
	}
	ts.adminOK("PUT", "/api/v1/pipes/steal", map[string]any{"spec": map[string]any{"schedule": "@yearly",
		"script":  "id -u\ncat " + filepath.Join(serverDir, "admin.token") + "\ncat " + filepath.Join(serverDir, "ca.key") + "\n",
		"targets": map[string]any{"tags": map[string]string{internalAgentTag: "true"}}}}, nil)
	var run api.Run
	testkit.WaitFor(t, 90*time.Second, "a finished run of the pipe", func() bool {
		var list api.RunList
		ts.adminOK("GET", "/api/v1/runs?pipe=steal&agent="+agentID, nil, &list)
		for _, r := range list.Runs {
			if terminalStatus(r.Status) {
				run = r
				return true
			}
		}
		if len(list.Runs) == 0 {
			// The agent may not have applied the pipe yet; ask again.
			ts.do("POST", "/api/v1/pipes/steal/run", ts.admin, api.RunPipeRequest{})
			time.Sleep(500 * time.Millisecond)
		}
		return false
	})
	r := ts.do("GET", "/api/v1/runs/"+run.ID+"/logs", ts.admin, nil)
	log := string(r.body)
	t.Logf("run %s: %s, log:\n%s", run.ID, run.Status, log)
	if strings.Contains(log, strings.TrimSpace(string(admin))) || strings.Contains(log, "PRIVATE KEY") {
		t.Fatal("the internal agent's job read the server's secrets")
	}
	if run.Status != api.StatusFailed || !strings.Contains(log, "Permission denied") {
		t.Fatalf("run %s, want failed with Permission denied", run.Status)
	}
	if first := strings.SplitN(strings.TrimSpace(log), "\n", 2)[0]; first == "0" {
		t.Fatalf("the job ran as uid 0")
	}
}
