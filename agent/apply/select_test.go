package apply

import (
	"context"
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
