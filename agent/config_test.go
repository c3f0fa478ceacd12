package agent

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/drover/drover/manifest"
)

func TestConfigDefaults(t *testing.T) {
	c := DefaultConfig()
	if c.DataDir != "/var/lib/drover" || c.TokenFile != "/etc/drover/enroll.token" || c.Backend != "auto" || c.Scope != "system" ||
		c.SyncInterval != 30*time.Second || c.HeartbeatInterval != 30*time.Second || c.OutboxMaxBytes != 256<<20 || c.Server != "" {
		t.Fatalf("defaults %+v", c)
	}
	if err := c.Validate(); err != nil {
		t.Fatalf("defaults do not validate: %v", err)
	}
	if c.SocketPath() != "/var/lib/drover/control/agent.sock" {
		t.Fatal(c.SocketPath())
	}
}

func TestLoadConfig(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "agent.yaml")
	must(t, os.WriteFile(path, []byte("server: https://drover.example:8443\nsync_interval: 1m\nscope: user\nbackend: cron\n"), 0o644))
	c, err := LoadConfig(path, true, []string{"DROVER_SYNC_INTERVAL=45s", "DROVER_DATA_DIR=/srv/drover", "DROVER_UNRELATED=1", "PATH=/bin"})
	must(t, err)
	if c.Server != "https://drover.example:8443" || c.SyncInterval != 45*time.Second || c.DataDir != "/srv/drover" || c.Scope != "user" || c.Backend != "cron" {
		t.Fatalf("loaded %+v", c)
	}
	must(t, c.Validate())

	// A missing optional file is fine; a missing required one is not.
	if _, err := LoadConfig(filepath.Join(dir, "none.yaml"), false, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadConfig(filepath.Join(dir, "none.yaml"), true, nil); err == nil {
		t.Fatal("missing required file accepted")
	}
	// Unknown fields are refused.
	must(t, os.WriteFile(path, []byte("server: https://x\nsync_intervall: 1m\n"), 0o644))
	if _, err := LoadConfig(path, true, nil); err == nil || !strings.Contains(err.Error(), "sync_intervall") {
		t.Fatalf("unknown field: %v", err)
	}
	if _, err := LoadConfig("", false, []string{"DROVER_SYNC_INTERVAL=soon"}); err == nil || !strings.Contains(err.Error(), "DROVER_SYNC_INTERVAL") {
		t.Fatalf("bad env: %v", err)
	}
}

func TestConfigValidate(t *testing.T) {
	c := DefaultConfig()
	c.Server = "http://insecure"
	c.DataDir = "relative"
	c.Backend = "launchd"
	c.Scope = "global"
	c.SyncInterval = 0
	c.LogLevel = "loud"
	err := c.Validate()
	var ve *manifest.ValidationError
	if !errors.As(err, &ve) {
		t.Fatalf("want *manifest.ValidationError, got %v", err)
	}
	fields := map[string]bool{}
	for _, p := range ve.Problems {
		fields[p.Field] = true
	}
	for _, f := range []string{"server", "data_dir", "backend", "scope", "sync_interval", "log_level"} {
		if !fields[f] {
			t.Errorf("no problem for %s in %v", f, err)
		}
	}
}

// TestSyncIntervalStreaming: the poll interval while the stream is up is
// sync_interval_streaming, never shorter than sync_interval; out of bounds
// it is refused with its field name.
func TestSyncIntervalStreaming(t *testing.T) {
	c := DefaultConfig()
	if c.SyncIntervalStreaming != 30*time.Minute || c.pollInterval(true) != 30*time.Minute || c.pollInterval(false) != 30*time.Second {
		t.Fatalf("defaults: streaming %s, polls %s up and %s down", c.SyncIntervalStreaming, c.pollInterval(true), c.pollInterval(false))
	}
	c.SyncInterval = time.Hour
	if got := c.pollInterval(true); got != time.Hour {
		t.Errorf("streaming interval below sync_interval: polls every %s, want 1h", got)
	}
	for _, d := range []time.Duration{0, 500 * time.Millisecond, 2 * time.Hour} {
		c := DefaultConfig()
		c.SyncIntervalStreaming = d
		err := c.Validate()
		var ve *manifest.ValidationError
		if !errors.As(err, &ve) || len(ve.Problems) != 1 || ve.Problems[0].Field != "sync_interval_streaming" {
			t.Errorf("sync_interval_streaming %s: %v", d, err)
		}
	}
	path := filepath.Join(t.TempDir(), "agent.yaml")
	must(t, os.WriteFile(path, []byte("sync_interval_streaming: 10m\n"), 0o644))
	c, err := LoadConfig(path, true, []string{"DROVER_SYNC_INTERVAL=20s"})
	must(t, err)
	if c.SyncIntervalStreaming != 10*time.Minute || c.SyncInterval != 20*time.Second {
		t.Errorf("loaded: streaming %s, sync_interval %s", c.SyncIntervalStreaming, c.SyncInterval)
	}
}
