package apply

import (
	"context"
	"strings"
	"testing"

	"github.com/drover/drover/agent/internal/sdtest"
)

func TestSelect(t *testing.T) {
	ctx := context.Background()
	cfg := userConfig(t, t.TempDir())
	if _, err := Select(ctx, "launchd", cfg); err == nil {
		t.Error("unknown backend accepted")
	}
	// No manager at that address: auto falls back to cron, systemd fails.
	gone := cfg
	gone.BusAddress = "unix:path=" + t.TempDir() + "/no-bus"
	if gone.RuntimeDir == "" {
		gone.RuntimeDir = t.TempDir()
	}
	b, err := Select(ctx, BackendAuto, gone)
	if err != nil || b.Name() != "cron" {
		t.Fatalf("auto without a manager: %v %v", b, err)
	}
	b.Close()
	if _, err := Select(ctx, BackendSystemd, gone); err == nil {
		t.Error("systemd without a manager: no error")
	}

	sdtest.Require(t)
	b, err = Select(ctx, "", cfg)
	if err != nil || b.Name() != "systemd" {
		t.Fatalf("auto with the test manager: %v %v", b, err)
	}
	b.Close()
}

// TestCronNeedsNoUserSession: the cron backend in user scope starts without
// $XDG_RUNTIME_DIR (it talks to no service manager).
func TestCronNeedsNoUserSession(t *testing.T) {
	t.Setenv("XDG_RUNTIME_DIR", "")
	dir := t.TempDir()
	b, err := Select(t.Context(), BackendCron, Config{DataDir: dir, Scope: "user", AgentPath: "/bin/true"})
	if err != nil {
		t.Fatalf("cron backend without XDG_RUNTIME_DIR: %v", err)
	}
	b.Close()
	if _, err := Select(t.Context(), BackendSystemd, Config{DataDir: dir, Scope: "user", AgentPath: "/bin/true"}); err == nil || !strings.Contains(err.Error(), "XDG_RUNTIME_DIR") {
		t.Fatalf("systemd backend without XDG_RUNTIME_DIR: %v", err)
	}
}
