package cli

import (
	"context"
	"encoding/json"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/drover/drover/agent"
	"github.com/drover/drover/agent/apply"
	"github.com/drover/drover/internal/command"
	"github.com/drover/drover/internal/testkit"
)

// idleBackend is a backend with no pipes.
type idleBackend struct{}

func (idleBackend) Name() string { return "cron" }
func (idleBackend) Apply(context.Context, apply.Input) (*apply.Result, error) {
	return &apply.Result{}, nil
}
func (idleBackend) Check(context.Context) ([]apply.Step, error)       { return nil, nil }
func (idleBackend) Status(context.Context) ([]apply.PipeState, error) { return nil, nil }
func (idleBackend) RunNow(context.Context, string, string) error      { return nil }
func (idleBackend) Cancel(context.Context, string, string) error      { return nil }
func (idleBackend) Close() error                                      { return nil }

// startIdleAgent runs a daemon that is not enrolled, with its data in a
// short temporary directory, and returns that directory.
func startIdleAgent(t *testing.T) string {
	t.Helper()
	dir := testkit.ShortTempDir(t, "dcli")
	cfg := agent.DefaultConfig()
	cfg.DataDir = filepath.Join(dir, "d")
	cfg.TokenFile = filepath.Join(dir, "token")
	cfg.Scope = agent.ScopeUser
	if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
		t.Fatal(err)
	}
	st, err := agent.OpenStore(cfg.DataDir, cfg.OutboxMaxBytes, nil)
	if err != nil {
		t.Fatal(err)
	}
	a, err := agent.New(cfg, slog.New(slog.DiscardHandler), agent.WithStore(st), agent.WithBackend(idleBackend{}))
	if err != nil {
		t.Fatal(err)
	}
	stop := testkit.Go(t, "agent", time.Minute, a.Run)
	t.Cleanup(func() {
		stop()
		st.Close()
	})
	deadline := time.Now().Add(5 * time.Second)
	for {
		if _, err := os.Stat(cfg.SocketPath()); err == nil {
			return cfg.DataDir
		}
		if time.Now().After(deadline) {
			t.Fatal("no control socket")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestStatusCommand(t *testing.T) {
	data := startIdleAgent(t)
	code, out, errOut := runAgent(t, "status", "--data-dir", data)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	for _, want := range []string{"not enrolled", "Backend:", "cron, user scope", "Manifest:", "serial 0", "No pipes."} {
		if !strings.Contains(out, want) {
			t.Errorf("status output lacks %q:\n%s", want, out)
		}
	}
	code, out, errOut = runAgent(t, "status", "--json", "--data-dir", data)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var st agent.Status
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		t.Fatalf("json: %v\n%s", err, out)
	}
	if st.Enrolled || st.Backend != "cron" || st.Scope != "user" {
		t.Fatalf("status %+v", st)
	}
}

func TestSyncCommandNotEnrolled(t *testing.T) {
	data := startIdleAgent(t)
	code, _, errOut := runAgent(t, "sync", "--data-dir", data)
	if code != command.ExitError || !strings.Contains(errOut, "not enrolled") {
		t.Fatalf("exit %d: %s", code, errOut)
	}
}

func TestCommandsWithoutDaemon(t *testing.T) {
	data := filepath.Join(t.TempDir(), "d")
	for _, cmd := range []string{"status", "sync"} {
		code, _, errOut := runAgent(t, cmd, "--data-dir", data)
		if code != command.ExitError || !strings.Contains(errOut, "not running") {
			t.Errorf("%s: exit %d: %s", cmd, code, errOut)
		}
	}
}

func TestEnrollCommandUsage(t *testing.T) {
	if code, _, errOut := runAgent(t, "enroll"); code != command.ExitUsage || !strings.Contains(errOut, "--token") {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	if code, _, errOut := runAgent(t, "enroll", "--token", "nope"); code != command.ExitUsage || !strings.Contains(errOut, "malformed") {
		t.Fatalf("exit %d: %s", code, errOut)
	}
}

func TestDaemonBadConfig(t *testing.T) {
	cfgFile := filepath.Join(t.TempDir(), "agent.yaml")
	if err := os.WriteFile(cfgFile, []byte("scope: galaxy\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	code, _, errOut := runAgent(t, "--config", cfgFile)
	if code != command.ExitUsage || !strings.Contains(errOut, "scope") {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	code, _, errOut = runAgent(t, "--config", filepath.Join(t.TempDir(), "missing.yaml"))
	if code != command.ExitError || !strings.Contains(errOut, "missing.yaml") {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	code, _, errOut = runAgent(t, "bogus")
	if code != command.ExitUsage {
		t.Fatalf("exit %d: %s", code, errOut)
	}
}
