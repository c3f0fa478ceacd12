package agent

import (
	"crypto/ecdsa"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/drover/drover/internal/testkit"
	"github.com/drover/drover/manifest"
)

func TestParseToken(t *testing.T) {
	pin := strings.Repeat("ab", 32)
	tok, err := ParseToken("  drv1.id1.sec-ret_." + strings.ToUpper(pin) + "\n")
	if err != nil {
		t.Fatal(err)
	}
	if tok.ID != "id1" || tok.Secret != "sec-ret_" || tok.Pin != pin {
		t.Fatalf("parsed %+v", tok)
	}
	if strings.Contains(tok.String(), "sec-ret_") {
		t.Fatalf("String shows the secret: %s", tok)
	}
	for _, bad := range []string{"", "drv2.a.b." + pin, "drv1.a.b", "drv1.a.b.c", "drv1..b." + pin, "drv1.a.b." + pin + "00", "drv1.a b.c." + pin} {
		if _, err := ParseToken(bad); !errors.Is(err, ErrBadToken) {
			t.Errorf("ParseToken(%q) = %v, want ErrBadToken", bad, err)
		}
	}
	if _, err := ParseToken("drv1.a.topsecret.zz"); err == nil || strings.Contains(err.Error(), "topsecret") {
		t.Errorf("error %v must not show the secret", err)
	}
}

// TestEnrollFromTokenFile: a token dropped in the token file while the
// agent runs is picked up; the agent enrolls, stores its key (0600),
// certificate, CA and trust root, removes the token file, and then pulls
// and applies its manifest.
func TestEnrollFromTokenFile(t *testing.T) {
	srv := newFakeServer(t)
	cfg := testConfig(t, srv)
	ta := startAgent(t, cfg, nil)
	time.Sleep(300 * time.Millisecond) // running, not enrolled, no token yet
	if n := srv.totalRequests(); n != 0 {
		t.Fatalf("%d requests before any token", n)
	}
	must(t, os.WriteFile(cfg.TokenFile, []byte(srv.token(time.Hour)+"\n"), 0o600))
	id := ta.enrolled(10 * time.Second)
	if id.AgentID != "agent-1" {
		t.Fatalf("agent id %q", id.AgentID)
	}
	if _, err := os.Stat(cfg.TokenFile); !os.IsNotExist(err) {
		t.Fatalf("token file not removed: %v", err)
	}
	st, err := os.Stat(cfg.DataDir)
	must(t, err)
	if st.Mode().Perm() != 0o700 {
		t.Errorf("data dir mode %v", st.Mode().Perm())
	}
	for _, f := range []string{credFile, caFile, identityFile} {
		st, err := os.Stat(filepath.Join(cfg.DataDir, f))
		must(t, err)
		if st.Mode().Perm() != 0o600 {
			t.Errorf("%s mode %v, want 0600", f, st.Mode().Perm())
		}
	}
	tr, err := ta.store.TrustRoot()
	must(t, err)
	if tr == nil || len(tr.RootKeys) != 1 || tr.RootKeys[0].ID != srv.root.KeyID() {
		t.Fatalf("trust root %+v", tr)
	}

	p, b := testPipe(t, "hello", "*/5 * * * *", "echo hello", 1)
	srv.publish(id.AgentID, []manifest.Pipe{p}, b) // also sends SyncNow on the stream
	if r := ta.syncNow(); r.Serial != 1 || (r.Outcome != OutcomeApplied && r.Outcome != OutcomeUnchanged) {
		t.Fatalf("sync: %+v", r)
	}
	in := ta.fake.lastApply()
	if in == nil || len(in.Manifest.Pipes) != 1 || in.Manifest.Pipes[0].Name != "hello" {
		t.Fatalf("apply: %+v", in)
	}
	testkit.WaitFor(t, 10*time.Second, "an applied ManifestStatus", func() bool {
		ms := srv.manifestStatuses()
		return len(ms) == 1 && ms[0].GetSerial() == 1 && ms[0].GetState().String() == "STATE_APPLIED"
	})
}

// TestEnrollPinMismatch: the token pins another CA; the agent sends nothing.
func TestEnrollPinMismatch(t *testing.T) {
	srv := newFakeServer(t)
	cfg := testConfig(t, srv)
	good := srv.token(time.Hour)
	bad := good[:strings.LastIndex(good, ".")+1] + strings.Repeat("0", 64)
	must(t, os.WriteFile(cfg.TokenFile, []byte(bad), 0o600))
	ta := startAgent(t, cfg, nil)
	testkit.WaitFor(t, 10*time.Second, "the pin error", func() bool {
		return strings.Contains(ta.a.Status(t.Context()).EnrollError, "pin")
	})
	time.Sleep(500 * time.Millisecond)
	if n := srv.totalRequests(); n != 0 {
		t.Fatalf("the server saw %d requests; a pin mismatch must send nothing", n)
	}
	if _, err := os.Stat(filepath.Join(cfg.DataDir, identityFile)); !os.IsNotExist(err) {
		t.Fatal("enrolled despite the pin mismatch")
	}
	if _, err := os.Stat(cfg.TokenFile); err != nil {
		t.Fatal("the token file must stay after a failed enrollment")
	}
}

// TestEnrollBadTokenBackoff: a used, an expired and an unknown token fail
// with clear errors, and the agent retries with backoff rather than in a
// tight loop; a new token in the file is tried at once.
func TestEnrollBadTokenBackoff(t *testing.T) {
	srv := newFakeServer(t)
	used := srv.token(time.Hour)
	srv.mu.Lock()
	for _, tok := range srv.tokens {
		tok.used = true
	}
	srv.mu.Unlock()
	expired := srv.token(-time.Minute)

	for _, c := range []struct{ name, token, want string }{
		{"used", used, "already used"},
		{"expired", expired, "expired"},
		{"unknown", "drv1.nope.nope." + srv.pin, "invalid enrollment token"},
	} {
		t.Run(c.name, func(t *testing.T) {
			before := srv.count("POST " + pathEnroll)
			cfg := testConfig(t, srv)
			cfg.MaxBackoff = 5 * time.Minute
			must(t, os.WriteFile(cfg.TokenFile, []byte(c.token), 0o600))
			ta := startAgent(t, cfg, nil)
			testkit.WaitFor(t, 10*time.Second, "the enrollment error", func() bool {
				return strings.Contains(ta.a.Status(t.Context()).EnrollError, c.want)
			})
			time.Sleep(2500 * time.Millisecond)
			// Backoff 1 s, 2 s, ...: at most 3 attempts in 2.5 s.
			if n := srv.count("POST "+pathEnroll) - before; n < 1 || n > 3 {
				t.Fatalf("%d enrollment attempts in 2.5 s: want 1-3 (backoff, no tight loop)", n)
			}
			ta.stop()
		})
	}

	t.Run("replaced token", func(t *testing.T) {
		cfg := testConfig(t, srv)
		cfg.MaxBackoff = 5 * time.Minute
		must(t, os.WriteFile(cfg.TokenFile, []byte(used), 0o600))
		ta := startAgent(t, cfg, nil)
		testkit.WaitFor(t, 10*time.Second, "the enrollment error", func() bool {
			return ta.a.Status(t.Context()).EnrollError != ""
		})
		// Wait out the first short retry so the agent is in a longer backoff.
		time.Sleep(2 * time.Second)
		must(t, os.WriteFile(cfg.TokenFile, []byte(srv.token(time.Hour)), 0o600))
		start := time.Now()
		ta.enrolled(10 * time.Second)
		if d := time.Since(start); d > 3*time.Second {
			t.Fatalf("a new token was tried only after %s", d)
		}
	})
}

// TestEnrolledTokenIgnored: an enrolled agent that finds a token file
// enrolls no second time and leaves the file alone.
func TestEnrolledTokenIgnored(t *testing.T) {
	srv := newFakeServer(t)
	cfg := testConfig(t, srv)
	must(t, os.WriteFile(cfg.TokenFile, []byte(srv.token(time.Hour)), 0o600))
	ta := startAgent(t, cfg, nil)
	id := ta.enrolled(10 * time.Second)
	ta.stop()

	must(t, os.WriteFile(cfg.TokenFile, []byte(srv.token(time.Hour)), 0o600))
	ta2 := startAgent(t, cfg, nil)
	id2 := ta2.enrolled(10 * time.Second)
	if id2.AgentID != id.AgentID {
		t.Fatalf("re-enrolled as %s", id2.AgentID)
	}
	time.Sleep(300 * time.Millisecond)
	if n := srv.count("POST " + pathEnroll); n != 1 {
		t.Fatalf("%d enrollments", n)
	}
	if _, err := os.Stat(cfg.TokenFile); err != nil {
		t.Fatalf("token file: %v", err)
	}
	if !strings.Contains(ta2.logs.String(), "already enrolled") {
		t.Fatalf("no info log about the token:\n%s", ta2.logs.String())
	}
}

// TestEnrollEnvToken: DROVER_ENROLL_TOKEN (WithEnrollToken) enrolls too.
func TestEnrollEnvToken(t *testing.T) {
	srv := newFakeServer(t)
	cfg := testConfig(t, srv)
	ta := startAgent(t, cfg, nil, WithEnrollToken(srv.token(time.Hour)))
	ta.enrolled(10 * time.Second)
}

// TestRenewal: at two thirds of the certificate's lifetime the agent gets a
// new certificate for a new key, and keeps working with it.
func TestRenewal(t *testing.T) {
	srv := newFakeServer(t)
	srv.certLifetime = 3 * time.Second
	cfg := testConfig(t, srv)
	ta := startAgent(t, cfg, nil, WithEnrollToken(srv.token(time.Hour)))
	id := ta.enrolled(10 * time.Second)
	srv.mu.Lock()
	srv.certLifetime = time.Hour
	srv.mu.Unlock()
	life := id.NotAfter().Sub(id.NotBefore())
	if d := id.RenewAt().Sub(id.NotBefore()); d != life*2/3 {
		t.Fatalf("renew at +%s, want 2/3 of %s", d, life)
	}
	testkit.WaitFor(t, 10*time.Second, "renewal", func() bool { return ta.a.identity().NotAfter().After(id.NotAfter().Add(time.Minute)) })
	id2 := ta.a.identity()
	if id2.cert.Leaf.PublicKey.(*ecdsa.PublicKey).Equal(id.cert.Leaf.PublicKey) {
		t.Fatal("renewal reused the key")
	}
	onDisk, err := loadIdentity(cfg.DataDir)
	must(t, err)
	if !onDisk.NotAfter().Equal(id2.NotAfter()) {
		t.Fatal("renewed certificate not saved")
	}
	// The new certificate works for mTLS.
	p, b := testPipe(t, "after-renew", "@hourly", "true", 1)
	srv.publish(id.AgentID, []manifest.Pipe{p}, b)
	if r := ta.syncNow(); r.Serial != 1 || r.Error != "" {
		t.Fatalf("sync after renewal: %+v", r)
	}
}

// TestReenrollExpired: an agent whose certificate expired while it was
// down (so it could not renew) reports that at start, and enrolls again
// from a token file, as a new agent whose first manifest is accepted.
func TestReenrollExpired(t *testing.T) {
	srv := newFakeServer(t)
	srv.certLifetime = 2 * time.Second
	cfg := testConfig(t, srv)
	ta := startAgent(t, cfg, nil, WithEnrollToken(srv.token(time.Hour)))
	id := ta.enrolled(10 * time.Second)
	p, b := testPipe(t, "kept", "@hourly", "true", 1)
	for serial := uint64(1); serial <= 3; serial++ {
		srv.publish(id.AgentID, []manifest.Pipe{p}, b)
		if r := ta.syncNow(); r.Serial != serial || r.Error != "" {
			t.Fatalf("sync %d: %+v", serial, r)
		}
	}
	ta.stop()
	// With a 2 s lifetime the agent may have renewed its certificate while
	// it synced (on a slow machine it did): wait for the expiry of the one
	// it stored, which is what the restarted agent holds.
	held, err := loadIdentity(cfg.DataDir)
	must(t, err)
	time.Sleep(time.Until(held.NotAfter().Add(100 * time.Millisecond)))

	srv.mu.Lock()
	srv.certLifetime = time.Hour
	srv.mu.Unlock()
	ta = startAgent(t, cfg, nil)
	testkit.WaitFor(t, 10*time.Second, "the expiry in status", func() bool {
		return strings.Contains(ta.a.Status(t.Context()).IdentityError, "expired")
	})
	must(t, os.WriteFile(cfg.TokenFile, []byte(srv.token(time.Hour)), 0o600))
	testkit.WaitFor(t, 10*time.Second, "re-enrollment", func() bool { return ta.a.identity().AgentID != id.AgentID })
	nid := ta.a.identity()
	if !nid.NotAfter().After(time.Now().Add(30 * time.Minute)) {
		t.Fatalf("new certificate expires %v", nid.NotAfter())
	}
	srv.publish(nid.AgentID, []manifest.Pipe{p}, b)
	// Synced on request too: the SyncNow of publish is lost when the new
	// identity's stream is not connected yet.
	testkit.WaitFor(t, 10*time.Second, "the new agent's first manifest", func() bool {
		if r := ta.syncNow(); r.Serial != 1 || r.Error != "" {
			return false
		}
		st := ta.a.Status(t.Context())
		return st.Serial == 1 && st.AppliedSerial == 1 && st.IdentityError == ""
	})
	if _, err := os.Stat(cfg.TokenFile); !os.IsNotExist(err) {
		t.Error("token file not removed")
	}
}

// TestEnrollOffline: `drover-agent enroll` without a daemon enrolls once,
// refuses while the identity is valid, and enrolls again once the
// certificate expired.
func TestEnrollOffline(t *testing.T) {
	srv := newFakeServer(t)
	srv.certLifetime = 2 * time.Second
	cfg := testConfig(t, srv)
	must(t, os.MkdirAll(cfg.DataDir, 0o700))
	st, err := OpenStore(cfg.DataDir, cfg.OutboxMaxBytes, nil)
	must(t, err)
	defer st.Close()
	id, err := Enroll(t.Context(), cfg, st, srv.token(time.Hour), DefaultHostInfo(), nil)
	must(t, err)
	if _, err := Enroll(t.Context(), cfg, st, srv.token(time.Hour), DefaultHostInfo(), nil); err == nil || !strings.Contains(err.Error(), "already enrolled as "+id.AgentID) {
		t.Fatalf("second enroll while valid: %v", err)
	}
	time.Sleep(time.Until(id.NotAfter().Add(100 * time.Millisecond)))
	srv.mu.Lock()
	srv.certLifetime = time.Hour
	srv.mu.Unlock()
	nid, err := Enroll(t.Context(), cfg, st, srv.token(time.Hour), DefaultHostInfo(), nil)
	must(t, err)
	if nid.AgentID == id.AgentID {
		t.Fatal("same agent id after re-enrollment")
	}
	if got, err := loadIdentity(cfg.DataDir); err != nil || got.AgentID != nid.AgentID || !got.NotAfter().Equal(nid.NotAfter()) {
		t.Fatalf("stored identity %v %v", got, err)
	}
}
