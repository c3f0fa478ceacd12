package agent

import (
	"bytes"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/drover/drover/internal/testkit"
	"github.com/drover/drover/manifest"
	agentpb "github.com/drover/drover/proto"
	"github.com/drover/drover/signing"
)

// enrolledAgent starts an agent of srv and waits for its enrollment.
func enrolledAgent(t *testing.T, srv *fakeServer, mod ...func(*Config)) (*testAgent, string) {
	t.Helper()
	cfg := testConfig(t, srv)
	for _, m := range mod {
		m(&cfg)
	}
	ta := startAgent(t, cfg, nil, WithEnrollToken(srv.token(time.Hour)))
	id := ta.enrolled(10 * time.Second)
	testkit.WaitFor(t, 10*time.Second, "the stream", func() bool {
		srv.mu.Lock()
		defer srv.mu.Unlock()
		return ta.a.Status(t.Context()).StreamConnected && srv.streams[id.AgentID] != nil
	})
	return ta, id.AgentID
}

// TestSyncETag: an unchanged manifest costs a 304; a new one is pulled,
// verified, its payload fetched and checked, and applied.
func TestSyncETag(t *testing.T) {
	srv := newFakeServer(t)
	ta, agentID := enrolledAgent(t, srv)
	p, b := testPipe(t, "etag", "0 * * * *", "echo etag", 1)
	srv.setIntercept(nil)
	srv.publish(agentID, []manifest.Pipe{p}, b)
	testkit.WaitFor(t, 10*time.Second, "the first apply", func() bool { return ta.fake.applyCount() == 1 })
	if got := ta.fake.bundles["etag"]; !bytes.Equal(got, b) {
		t.Fatal("backend got other payload bytes")
	}
	payloadGets := srv.count("GET " + pathPayloads + p.Payload.Digest)
	for i := 0; i < 3; i++ {
		r := ta.syncNow()
		if r.Outcome != OutcomeUnchanged || !r.NotModified {
			t.Fatalf("sync %d: %+v", i, r)
		}
	}
	srv.mu.Lock()
	nm := srv.notModified
	srv.mu.Unlock()
	if nm < 3 {
		t.Fatalf("%d 304 responses, want 3", nm)
	}
	if ta.fake.applyCount() != 1 {
		t.Fatalf("%d applies for an unchanged manifest", ta.fake.applyCount())
	}
	if ta.fake.checks < 3 {
		t.Fatalf("an unchanged sync must still check for drift (%d checks)", ta.fake.checks)
	}
	// A new version with the same payload: no payload download.
	p.Version = 2
	p.Spec.Schedule = "5 * * * *"
	srv.publish(agentID, []manifest.Pipe{p})
	testkit.WaitFor(t, 10*time.Second, "the second apply", func() bool { return ta.fake.applyCount() == 2 })
	if n := srv.count("GET " + pathPayloads + p.Payload.Digest); n != payloadGets {
		t.Fatalf("payload downloaded again (%d -> %d)", payloadGets, n)
	}
	st := ta.a.Status(t.Context())
	if st.Serial != 2 || st.AppliedSerial != 2 || len(st.Pipes) != 1 || st.Pipes[0].Version != 2 || st.Pipes[0].NextRun.IsZero() {
		t.Fatalf("status %+v", st)
	}
}

// TestSyncNowPullsAtOnce: with a one-hour interval, a SyncNow on the
// stream makes the agent pull at once.
func TestSyncNowPullsAtOnce(t *testing.T) {
	srv := newFakeServer(t)
	ta, agentID := enrolledAgent(t, srv)
	before := srv.count("GET " + pathManifest)
	p, b := testPipe(t, "now", "@daily", "true", 1)
	start := time.Now()
	srv.publish(agentID, []manifest.Pipe{p}, b) // sends SyncNow
	testkit.WaitFor(t, 5*time.Second, "the apply", func() bool { return ta.fake.applyCount() == 1 })
	if d := time.Since(start); d > 3*time.Second {
		t.Fatalf("SyncNow took %s", d)
	}
	if srv.count("GET "+pathManifest) <= before {
		t.Fatal("no manifest request")
	}
}

// TestKeyRotation: a manifest signed by a new key of a newer key list makes
// the agent fetch the key list once, accept, and store the new list.
func TestKeyRotation(t *testing.T) {
	srv := newFakeServer(t)
	ta, agentID := enrolledAgent(t, srv)
	mk2, err := signing.GenerateKey(signing.ECDSAP256)
	must(t, err)
	srv.mu.Lock()
	srv.mkey = mk2
	srv.mu.Unlock()
	srv.setKeyList(2, mk2)
	p, b := testPipe(t, "rotated", "@daily", "true", 1)
	srv.publish(agentID, []manifest.Pipe{p}, b)
	testkit.WaitFor(t, 10*time.Second, "the apply", func() bool { return ta.fake.applyCount() == 1 })
	if n := srv.count("GET " + pathTrust); n != 1 {
		t.Fatalf("%d trust requests", n)
	}
	tr, err := ta.store.TrustRoot()
	must(t, err)
	kl, err := tr.CurrentKeyList(time.Now())
	must(t, err)
	if kl.Version != 2 || kl.Keys[0].ID != mk2.KeyID() {
		t.Fatalf("stored key list %+v", kl)
	}
}

// TestTamper: a man in the middle flips bytes of the manifest, replays an
// older one, serves another agent's, or serves a payload whose digest does
// not match. Each is refused and reported, and nothing changes on the host.
func TestTamper(t *testing.T) {
	srv := newFakeServer(t)
	ta, agentID := enrolledAgent(t, srv)
	p1, b1 := testPipe(t, "steady", "0 3 * * *", "echo one", 1)
	srv.publish(agentID, []manifest.Pipe{p1}, b1)
	testkit.WaitFor(t, 10*time.Second, "apply 1", func() bool { return ta.fake.applyCount() == 1 })
	p1.Version = 2
	srv.publish(agentID, []manifest.Pipe{p1}, b1)
	testkit.WaitFor(t, 10*time.Second, "apply 2", func() bool { return ta.fake.applyCount() == 2 })
	testkit.WaitFor(t, 10*time.Second, "two reports", func() bool { return len(srv.manifestStatuses()) == 2 })
	srv.mu.Lock()
	old := srv.agents[agentID].history[0]
	current := srv.agents[agentID].env
	srv.mu.Unlock()

	other, _ := srv.signManifest("agent-99", 50, []manifest.Pipe{p1})
	pEvil, bEvil := testPipe(t, "steady", "0 3 * * *", "echo two", 3)
	evilEnv, _ := srv.signManifest(agentID, 3, []manifest.Pipe{pEvil})
	wrongPayload := bytes.Repeat([]byte{'x'}, len(bEvil)) // same size, other bytes
	flipped := append([]byte(nil), current...)
	i := bytes.Index(flipped, []byte(`"payload":"`)) + len(`"payload":"`) + 40
	if flipped[i] == 'A' {
		flipped[i] = 'B'
	} else {
		flipped[i] = 'A'
	}

	serveManifest := func(env []byte) func(http.ResponseWriter, *http.Request, string) bool {
		return func(w http.ResponseWriter, r *http.Request, _ string) bool {
			if r.URL.Path == pathManifest {
				_, _ = w.Write(env)
				return true
			}
			return false
		}
	}
	cases := []struct {
		name      string
		intercept func(http.ResponseWriter, *http.Request, string) bool
		want      string
	}{
		{"flipped bytes", serveManifest(flipped), ""},
		{"replayed older manifest", serveManifest(old), signing.ErrRollback.Error()},
		{"another agent's manifest", serveManifest(other), signing.ErrWrongAgent.Error()},
		{"payload digest mismatch", func(w http.ResponseWriter, r *http.Request, id string) bool {
			if r.URL.Path == pathManifest {
				_, _ = w.Write(evilEnv)
				return true
			}
			if strings.HasPrefix(r.URL.Path, pathPayloads) {
				_, _ = w.Write(wrongPayload)
				return true
			}
			return false
		}, "digest mismatch"},
		{"payload larger than declared", func(w http.ResponseWriter, r *http.Request, id string) bool {
			if r.URL.Path == pathManifest {
				_, _ = w.Write(evilEnv)
				return true
			}
			if strings.HasPrefix(r.URL.Path, pathPayloads) {
				_, _ = w.Write(append(append([]byte(nil), bEvil...), 0))
				return true
			}
			return false
		}, "larger than its declared"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			before := len(srv.manifestStatuses())
			srv.setIntercept(c.intercept)
			defer srv.setIntercept(nil)
			r := ta.syncNow()
			if r.Outcome != OutcomeRejected || !strings.Contains(r.Error, c.want) {
				t.Fatalf("sync: %+v, want rejected with %q", r, c.want)
			}
			if n := ta.fake.applyCount(); n != 2 {
				t.Fatalf("the backend was called (%d applies)", n)
			}
			ms, err := ta.store.ManifestState()
			must(t, err)
			if ms.Serial != 2 || ms.AppliedSerial != 2 || !bytes.Equal(ms.Envelope, current) {
				t.Fatalf("stored state changed: serial %d applied %d", ms.Serial, ms.AppliedSerial)
			}
			testkit.WaitFor(t, 10*time.Second, "the rejection report", func() bool {
				st := srv.manifestStatuses()
				if len(st) <= before {
					return false
				}
				last := st[len(st)-1]
				return last.GetState() == agentpb.ManifestStatus_STATE_REJECTED && last.GetAppliedSerial() == 2 && strings.Contains(last.GetError(), c.want)
			})
			// The same bad manifest again is refused but not reported twice.
			if r := ta.syncNow(); r.Outcome != OutcomeRejected {
				t.Fatalf("second sync: %+v", r)
			}
			time.Sleep(200 * time.Millisecond)
			if n := len(srv.manifestStatuses()); n != before+1 {
				t.Fatalf("%d reports for one bad manifest", n-before)
			}
		})
	}
	// After the attack, the genuine manifest is in force and syncs work.
	if r := ta.syncNow(); r.Outcome == OutcomeRejected || r.Outcome == OutcomeError {
		t.Fatalf("sync after the attack: %+v", r)
	}
}

// TestSyncBackoff: server errors are retried with backoff, not at the
// sync interval and not in a tight loop.
func TestSyncBackoff(t *testing.T) {
	srv := newFakeServer(t)
	ta, agentID := enrolledAgent(t, srv, func(c *Config) { c.MaxBackoff = 5 * time.Minute })
	_ = ta
	srv.setIntercept(func(w http.ResponseWriter, r *http.Request, _ string) bool {
		if r.URL.Path == pathManifest {
			writeErr(w, 503, "unavailable", "try later")
			return true
		}
		return false
	})
	before := srv.count("GET " + pathManifest)
	srv.publish(agentID, nil)
	time.Sleep(3500 * time.Millisecond)
	// 1 s, 2 s, 4 s (each drawn from [d/2, d]): 2-4 attempts in 3.5 s.
	if n := srv.count("GET "+pathManifest) - before; n < 2 || n > 4 {
		t.Fatalf("%d manifest requests in 3.5 s with backoff", n)
	}
	srv.setIntercept(nil)
	testkit.WaitFor(t, 10*time.Second, "recovery", func() bool { return ta.fake.applyCount() == 1 })
}

// TestRestartOffline: an agent that restarts while the server is down
// applies its stored manifest from its own store and payload cache (so a
// crash in the middle of an apply is repaired without the server), and
// catches up when the server returns.
func TestRestartOffline(t *testing.T) {
	srv := newFakeServer(t)
	ta, agentID := enrolledAgent(t, srv)
	p, b := testPipe(t, "offline", "0 1 * * *", "echo offline", 1)
	srv.publish(agentID, []manifest.Pipe{p}, b)
	testkit.WaitFor(t, 10*time.Second, "apply", func() bool { return ta.fake.applyCount() == 1 })
	ta.stop()

	srv.setIntercept(func(w http.ResponseWriter, r *http.Request, _ string) bool {
		writeErr(w, 503, "unavailable", "down")
		return true
	})
	ta2 := startAgent(t, ta.cfg, nil)
	ta2.enrolled(10 * time.Second)
	testkit.WaitFor(t, 10*time.Second, "the stored manifest applied", func() bool { return ta2.fake.applyCount() == 1 })
	if got := ta2.fake.bundles["offline"]; !bytes.Equal(got, b) {
		t.Fatal("stored payload differs")
	}
	if r := ta2.syncNow(); r.Outcome != OutcomeError {
		t.Fatalf("sync while the server is down: %+v", r)
	}
	srv.setIntercept(nil)
	p.Version = 2
	srv.publish(agentID, []manifest.Pipe{p}, b)
	if r := ta2.syncNow(); r.Serial != 2 || r.Error != "" {
		t.Fatalf("sync after the server returned: %+v", r)
	}
}

// TestStaleTempsRemovedAtStart: temporary files a killed daemon left in the
// data dir and the payload cache are gone once it starts again; other
// files stay.
func TestStaleTempsRemovedAtStart(t *testing.T) {
	srv := newFakeServer(t)
	cfg := testConfig(t, srv)
	payloads := filepath.Join(cfg.DataDir, payloadDir)
	must(t, os.MkdirAll(payloads, 0o700))
	stale := []string{
		filepath.Join(payloads, ".sha256-0a91.tmp-3271791550"),
		filepath.Join(cfg.DataDir, ".identity.json.tmp-12"),
	}
	keep := filepath.Join(payloads, "sha256-0a91")
	for _, p := range append(stale, keep) {
		must(t, os.WriteFile(p, []byte("x"), 0o600))
	}
	ta := startAgent(t, cfg, nil)
	testkit.WaitFor(t, 10*time.Second, "the stale temporaries removed", func() bool {
		for _, p := range stale {
			if _, err := os.Stat(p); err == nil {
				return false
			}
		}
		return true
	})
	if _, err := os.Stat(keep); err != nil {
		t.Errorf("a cached payload was removed: %v", err)
	}
	ta.stop()
}
