package agent

import (
	"bytes"
	"context"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/drover/drover/agent/apply"
	"github.com/drover/drover/agent/internal/sdtest"
	"github.com/drover/drover/internal/testkit"
	"github.com/drover/drover/manifest"
	agentpb "github.com/drover/drover/proto"
	"github.com/drover/drover/units"
)

// TestSystemdEndToEnd: on a real systemd user manager, an agent enrolled
// from a token file installs its pipe as a timer that list-timers shows;
// tampered manifests and payloads leave the units exactly as they were; a
// deleted unit is restored at the next sync and reported; removing the
// pipe removes both units.
func TestSystemdEndToEnd(t *testing.T) {
	env := sdtest.Require(t)
	srv := newFakeServer(t)
	cfg := testConfig(t, srv)
	cfg.Backend = BackendSystemd
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	backend, err := apply.Select(ctx, apply.BackendSystemd, apply.Config{
		DataDir: cfg.DataDir, Scope: units.ScopeUser, AgentPath: "/bin/true",
	})
	must(t, err)
	t.Cleanup(func() { backend.Close() })
	must(t, os.WriteFile(cfg.TokenFile, []byte(srv.token(time.Hour)), 0o600))
	ta := startAgent(t, cfg, backend)
	agentID := ta.enrolled(10 * time.Second).AgentID
	// publish's SyncNow travels on the stream: wait until the server has it.
	testkit.WaitFor(t, 10*time.Second, "the stream", func() bool {
		srv.mu.Lock()
		defer srv.mu.Unlock()
		return ta.a.Status(t.Context()).StreamConnected && srv.streams[agentID] != nil
	})

	p, b := testPipe(t, "e2e", "17 3 * * *", "echo e2e", 1)
	srv.publish(agentID, []manifest.Pipe{p}, b)
	timer := units.TimerName("e2e")
	testkit.WaitFor(t, 20*time.Second, "the timer", func() bool {
		_, ok := sdtest.ListTimers(t)[timer]
		return ok
	})
	tm := sdtest.ListTimers(t)[timer]
	sched, err := manifest.ParseSchedule(p.Spec.Schedule)
	must(t, err)
	if want := sched.Next(time.Now(), time.UTC); !tm.Next.Equal(want) {
		t.Fatalf("timer next %s, evaluator %s", tm.Next, want)
	}
	unitPath := filepath.Join(env.UnitDir(), timer)
	before, err := os.ReadFile(unitPath)
	must(t, err)
	fiBefore, err := os.Stat(unitPath)
	must(t, err)

	// Tampering changes nothing.
	evil, bEvil := testPipe(t, "e2e", "* * * * *", "echo pwned", 2)
	evilEnv, _ := srv.signManifest(agentID, 2, []manifest.Pipe{evil})
	srv.setIntercept(func(w http.ResponseWriter, r *http.Request, _ string) bool {
		switch {
		case r.URL.Path == pathManifest:
			_, _ = w.Write(evilEnv)
		case strings.HasPrefix(r.URL.Path, pathPayloads):
			_, _ = w.Write(bytes.Repeat([]byte{'!'}, len(bEvil)))
		default:
			return false
		}
		return true
	})
	if r := ta.syncNow(); r.Outcome != OutcomeRejected {
		t.Fatalf("tampered sync: %+v", r)
	}
	srv.setIntercept(nil)
	after, err := os.ReadFile(unitPath)
	must(t, err)
	fiAfter, err := os.Stat(unitPath)
	must(t, err)
	if !bytes.Equal(before, after) || !fiAfter.ModTime().Equal(fiBefore.ModTime()) {
		t.Fatal("a rejected manifest touched the unit")
	}
	if got := sdtest.ListTimers(t)[timer]; !got.Next.Equal(tm.Next) {
		t.Fatalf("timer changed: %s -> %s", tm.Next, got.Next)
	}

	// Drift: a unit deleted by hand is restored at the next sync.
	must(t, os.Remove(unitPath))
	if r := ta.syncNow(); r.Outcome != OutcomeUnchanged {
		t.Fatalf("sync: %+v", r)
	}
	if got, err := os.ReadFile(unitPath); err != nil || !bytes.Equal(got, before) {
		t.Fatalf("unit not restored: %v", err)
	}
	testkit.WaitFor(t, 10*time.Second, "the drift report", func() bool {
		for _, ms := range srv.manifestStatuses() {
			for _, ps := range ms.GetPipes() {
				if ps.GetDriftRestored() && ms.GetState() == agentpb.ManifestStatus_STATE_APPLIED {
					return true
				}
			}
		}
		return false
	})

	// Status over the socket shows the pipe with its next run.
	st, err := QueryStatus(ctx, cfg.SocketPath())
	must(t, err)
	if st.Backend != "systemd" || len(st.Pipes) != 1 || !st.Pipes[0].NextRun.Equal(tm.Next) {
		t.Fatalf("status %+v", st)
	}

	// Removing the pipe removes both units.
	srv.publish(agentID, nil)
	testkit.WaitFor(t, 20*time.Second, "the units to go", func() bool {
		_, err1 := os.Stat(unitPath)
		_, err2 := os.Stat(filepath.Join(env.UnitDir(), units.ServiceName("e2e")))
		return os.IsNotExist(err1) && os.IsNotExist(err2)
	})
}
