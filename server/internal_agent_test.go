package server

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// TestInternalAgent runs the real drover-agent binary as the server's
// internal agent (cron backend, so no systemd is needed) and waits until it
// enrolled through a token and came online on the stream.
func TestInternalAgent(t *testing.T) {
	if testing.Short() {
		t.Skip("builds drover-agent")
	}
	base := t.TempDir()
	// A root server runs a cron-backend internal agent as nobody, which
	// must reach the binary and its data dir.
	for _, d := range []string{filepath.Dir(base), base} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	bin := filepath.Join(base, "drover-agent")
	if out, err := exec.Command("go", "build", "-o", bin, "../cmd/drover-agent").CombinedOutput(); err != nil {
		t.Fatalf("build drover-agent: %v\n%s", err, out)
	}
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
