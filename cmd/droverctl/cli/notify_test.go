package cli

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/drover/drover/internal/testkit"
	agentpb "github.com/drover/drover/proto"
)

// Channels and rules from a YAML file (the secret from the environment),
// listed without their secret; notify test reaches the receiver at once; a
// failing run notifies it through the rule; notify status counts it.
func TestNotifyApplyTestStatus(t *testing.T) {
	var mu sync.Mutex
	var got []map[string]any
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		var m map[string]any
		json.Unmarshal(b, &m)
		m["signature"] = r.Header.Get("X-Drover-Signature")
		mu.Lock()
		got = append(got, m)
		mu.Unlock()
	}))
	defer hook.Close()
	ts := startServer(t)
	tags := map[string]string{"role": "db"}
	a := ts.enroll("db-1", tags, true)
	if code, body := ts.api("PUT", "/api/v1/pipes/backup", map[string]any{"spec": map[string]any{
		"schedule": "@daily", "script": "true", "targets": map[string]any{"tags": tags}}}); code != 201 {
		t.Fatalf("put pipe: %d %s", code, body)
	}
	file := filepath.Join(t.TempDir(), "notify.yaml")
	doc := `kind: NotifyRule
name: backups
kinds: [run.failed]
pipes: [backup]
channels: [ops]
severity: critical
---
kind: Channel
name: ops
type: webhook
url: ` + hook.URL + `/drover
secret_env: OPS_SECRET
`
	if err := os.WriteFile(file, []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}
	secret := "a-very-long-webhook-secret"
	if r := runCtl(t.Context(), ts.env(), "", "notify", "apply", "-f", file); r.code == 0 {
		t.Fatalf("apply without the secret's variable:\n%s", r)
	}
	if r := runCtl(t.Context(), ts.env("OPS_SECRET", secret), "", "notify", "apply", "-f", file); r.code != 0 ||
		r.stdout != "channel ops applied\nrule backups applied\n" {
		t.Fatalf("notify apply (channels first):\n%s", r)
	}
	r := ts.ctlOK("get", "channels")
	if !strings.Contains(r.stdout, "ops") || !strings.Contains(r.stdout, "webhook") || !strings.Contains(r.stdout, "set") {
		t.Fatalf("get channels:\n%s", r)
	}
	if r := ts.ctlOK("get", "channel", "ops", "-o", "json"); strings.Contains(r.stdout, secret) || !strings.Contains(r.stdout, `"has_secret": true`) {
		t.Fatalf("get channel -o json:\n%s", r)
	}
	if r := ts.ctlOK("get", "rules"); !strings.Contains(r.stdout, "backups") || !strings.Contains(r.stdout, "critical") {
		t.Fatalf("get rules:\n%s", r)
	}
	if r := ts.ctlOK("notify", "test", "ops"); !strings.Contains(r.stdout, "delivered") {
		t.Fatalf("notify test:\n%s", r)
	}
	a.runFinished("r-1", "backup", 1, agentpb.RunStatus_RUN_STATUS_FAILED, 1, time.Now(), time.Second, 0)
	testkit.WaitFor(t, 20*time.Second, "the failure's notification", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(got) == 2
	})
	mu.Lock()
	if got[0]["test"] != true || got[1]["kind"] != "run.failed" || got[1]["state"] != "firing" || !strings.HasPrefix(got[1]["signature"].(string), "sha256=") {
		t.Errorf("received %v", got)
	}
	mu.Unlock()
	if r := ts.ctlOK("notify", "status"); !strings.Contains(r.stdout, "ops") || !strings.Contains(r.stdout, " 1 ") {
		t.Fatalf("notify status:\n%s", r)
	}
	if r := ts.ctl("notify", "delete", "channel", "ops"); r.code == 0 {
		t.Fatalf("deleting a channel in use:\n%s", r)
	}
	ts.ctlOK("notify", "delete", "rule", "backups")
	ts.ctlOK("notify", "delete", "channel", "ops")
	if r := ts.ctl("notify", "test", "ops"); r.code == 0 || !strings.Contains(r.stderr, "not found") {
		t.Fatalf("notify test of a deleted channel:\n%s", r)
	}
}
