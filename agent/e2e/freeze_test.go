package e2e

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/drover/drover/internal/testkit"
	"github.com/drover/drover/units"
)

// TestTamperingProxyFreeze: the tampering proxy answers 304 to every
// manifest request, for ever, past the manifest's expiry (the server signs
// manifests for 2 minutes here). The agent keeps its pipes running and
// reports manifest_expired (`drover-agent status`); a payload edited on
// disk is refused at its next run (failed on the server; reason
// payload_mismatch in the agent's record) and restored by the next sync; a
// drop-in added beside the pipe's service is removed by the next sync and
// reported. The proxy stands in the manifest's only path: the server
// carries no manifest on the stream (grpc.carry_manifest_bytes 0), else
// its re-signed manifests would reach the agent around the proxy.
func TestTamperingProxyFreeze(t *testing.T) {
	mgr, srv, tags := userScenario(t, "freeze", "DROVER_SIGNING_MANIFEST_LIFETIME=2m", "DROVER_SIGNING_KEY_LIST_LIFETIME=24h",
		"DROVER_GRPC_CARRY_MANIFEST_BYTES=0")
	ag, id := enrolledAgent(t, srv, agentOpts{name: "agent-freeze", backend: "systemd", mgr: &mgr, tags: tags})
	ag.stop()
	proxy := newTamperProxy(t, srv, ag.dataDir)
	ag.writeConfig(proxy.URL())
	ag.start()
	ag.waitOnline()

	const script = "echo frozen-ok\n"
	srv.putPipe("fz", pipeSpec{Schedule: far, Script: script, Targets: byTags(tags)})
	ag.waitPipes(60*time.Second, "fz")
	st := ag.status()
	if st.ManifestExpired || st.ManifestExpiresAt.IsZero() {
		t.Fatalf("fresh manifest: expired %v, expires %s", st.ManifestExpired, st.ManifestExpiresAt)
	}
	expires := st.ManifestExpiresAt

	proxy.setMode(notModified)
	ag.syncCLI()
	if proxy.served(notModified) == 0 {
		t.Fatal("the proxy never answered 304")
	}
	sleepUntil(expires.Add(time.Second))
	ag.syncCLI()
	testkit.WaitFor(t, 60*time.Second, "the agent to report the manifest expired", func() bool {
		st := ag.status()
		return st != nil && st.ManifestExpired && st.ManifestExpiresAt.Equal(expires)
	})
	if out := ag.cli("status"); !strings.Contains(out, "EXPIRED") {
		t.Fatalf("drover-agent status does not say the manifest expired:\n%s", out)
	}
	// Retried hard: more pulls come without being asked.
	n := proxy.served(notModified)
	testkit.WaitFor(t, 40*time.Second, "the agent to pull again by itself", func() bool { return proxy.served(notModified) > n })

	// The pipe keeps running under the expired manifest.
	ok := srv.runOfRequest(srv.runNow("fz", id).RequestID, 60*time.Second, "succeeded", "failed")
	if ok.Status != "succeeded" {
		t.Fatalf("run under the expired manifest: %+v", ok)
	}

	// A payload edited on disk is refused at its next run, then restored.
	payload := filepath.Join(ag.dataDir, "pipes", "fz", "payload", "script")
	if err := os.WriteFile(payload, []byte("echo tampered\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	bad := srv.runOfRequest(srv.runNow("fz", id).RequestID, 60*time.Second, "succeeded", "failed")
	if bad.Status != "failed" || strings.Contains(srv.logText(bad.ID), "tampered") {
		t.Fatalf("tampered run: %+v, log %q", bad, srv.logText(bad.ID))
	}
	waitReason(t, ag, "fz", bad.ID, "payload_mismatch")
	ag.syncCLI()
	if b, err := os.ReadFile(payload); err != nil || string(b) != script {
		t.Fatalf("payload after the sync: %q %v", b, err)
	}
	again := srv.runOfRequest(srv.runNow("fz", id).RequestID, 60*time.Second, "succeeded", "failed")
	if again.Status != "succeeded" || !strings.Contains(srv.logText(again.ID), "frozen-ok") {
		t.Fatalf("run after the restore: %+v", again)
	}

	// A drop-in beside the service is drift: removed at the next sync.
	dir := filepath.Join(mgr.UnitDir(), units.ServiceName("fz")+".d")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "override.conf"), []byte("[Service]\nEnvironment=EVIL=1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	ag.syncCLI()
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Fatalf("the drop-in is still there: %v", err)
	}
	var removed []string
	for _, p := range ag.status().Pipes {
		if p.Name == "fz" {
			removed = p.DropInsRemoved
		}
	}
	if !slices.Contains(removed, units.ServiceName("fz")+".d/override.conf") {
		t.Fatalf("status reports drop-ins removed %v", removed)
	}
	if st := ag.status(); !st.ManifestExpired {
		t.Fatal("the manifest stopped being reported expired")
	}
}
