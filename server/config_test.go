package server

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/drover/drover/api"

	"github.com/drover/drover/internal/testkit"
	"github.com/drover/drover/manifest"
	agentpb "github.com/drover/drover/proto"
	"math"
	"runtime/debug"
	rtmetrics "runtime/metrics"
)

func TestConfigDefaultsFileEnvAndValidation(t *testing.T) {
	def := DefaultConfig()
	if err := def.Validate(); err != nil {
		t.Fatalf("the defaults do not validate: %v", err)
	}
	if def.DataDir != "/var/lib/drover-server" || def.HTTPAddr != ":8443" || def.GRPCAddr != ":8444" ||
		def.Enrollment.DefaultTTL != time.Hour || def.Enrollment.CertLifetime != 30*24*time.Hour ||
		def.Signing.ManifestLifetime != 7*24*time.Hour || def.Runs.MaxLogBytes != 1<<20 || def.Signing.MaxPayloadBytes != 10<<20 {
		t.Fatalf("defaults: %+v", def)
	}

	// No file at the default path is fine; a named file must exist.
	if _, err := LoadConfig(filepath.Join(t.TempDir(), "none.yaml"), false, nil); err != nil {
		t.Fatalf("missing optional file: %v", err)
	}
	if _, err := LoadConfig(filepath.Join(t.TempDir(), "none.yaml"), true, nil); err == nil {
		t.Fatal("a missing required file was accepted")
	}

	path := filepath.Join(t.TempDir(), "server.yaml")
	os.WriteFile(path, []byte("data_dir: /srv/drover\nhttp_addr: 127.0.0.1:9443\nenrollment:\n  cert_lifetime: 240h\nruns:\n  retention_age: 72h\ntls_sans: [drover.example]\n"), 0o600)
	cfg, err := LoadConfig(path, true, []string{"DROVER_HTTP_ADDR=0.0.0.0:7443", "DROVER_RUNS_MAX_LOG_BYTES=2048", "DROVER_TLS_SANS=a.example, b.example", "DROVER_AGENT_ONLY=x", "PATH=/bin"})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.DataDir != "/srv/drover" || cfg.HTTPAddr != "0.0.0.0:7443" || cfg.Enrollment.CertLifetime != 240*time.Hour ||
		cfg.Runs.RetentionAge != 72*time.Hour || cfg.Runs.MaxLogBytes != 2048 || strings.Join(cfg.TLSSANs, ",") != "a.example,b.example" || cfg.GRPCAddr != ":8444" {
		t.Fatalf("file + env: %+v", cfg)
	}

	os.WriteFile(path, []byte("data_dir: /x\nbogus: 1\n"), 0o600)
	if _, err := LoadConfig(path, true, nil); err == nil || !strings.Contains(err.Error(), "bogus") {
		t.Fatalf("an unknown field was accepted: %v", err)
	}
	if _, err := LoadConfig("", false, []string{"DROVER_HTTP_READ_TIMEOUT=soon"}); err == nil {
		t.Fatal("a bad duration in the environment was accepted")
	}

	bad := DefaultConfig()
	bad.HTTPAddr = "nope"
	bad.LogLevel = "loud"
	bad.Enrollment.CertLifetime = time.Minute
	bad.Signing.Algorithm = "rsa"
	bad.Store.Synchronous = "off"
	bad.Placement.SkewMargin = 10 * time.Minute // longer than the lease
	var ve *manifest.ValidationError
	if err := bad.Validate(); !errors.As(err, &ve) || len(ve.Problems) != 6 {
		t.Fatalf("validation: %v", err)
	}
	for _, f := range []string{"http_addr", "log_level", "enrollment.cert_lifetime", "signing.algorithm", "store.synchronous", "placement.skew_margin"} {
		if !strings.Contains(ve.Error(), f+":") {
			t.Errorf("no problem for %s in %v", f, ve)
		}
	}
}

func TestDataDirModesAndReuse(t *testing.T) {
	ts := startServer(t)
	dir := ts.cfg.DataDir
	fi, err := os.Stat(dir)
	if err != nil || fi.Mode().Perm() != 0o700 {
		t.Fatalf("data dir mode %v %v", fi.Mode(), err)
	}
	entries, _ := os.ReadDir(dir)
	names := map[string]bool{}
	for _, e := range entries {
		info, _ := e.Info()
		names[e.Name()] = true
		want := os.FileMode(0o600)
		if e.Name() == "ca.crt" {
			want = 0o644
		}
		if info.Mode().Perm() != want {
			t.Errorf("%s has mode %v, want %v", e.Name(), info.Mode().Perm(), want)
		}
	}
	for _, n := range []string{"ca.key", "ca.crt", "tls.key", "tls.crt", "root.key", "keylist.dsse", "secrets.key", "admin.token", "server.db"} {
		if !names[n] {
			t.Errorf("%s was not created", n)
		}
	}
	pin, admin := ts.s.CAPin(), ts.admin

	// A second server on the same data dir is refused while the first runs.
	if _, err := New(ts.cfg, testLogger(t), nil); !errors.Is(err, errLocked) {
		t.Fatalf("a second server on the same data dir: %v", err)
	}
	ts.stop()
	ts2 := startServer(t, func(c *Config) { *c = ts.cfg })
	if ts2.s.CAPin() != pin || ts2.admin != admin {
		t.Fatal("a restart did not reuse the CA and the admin token")
	}
}

func TestCommandLine(t *testing.T) {
	ts := startServer(t)
	run := func(args ...string) (string, string, int) {
		var out, errOut bytes.Buffer
		code := Main("test", args, nil, &out, &errOut)
		return out.String(), errOut.String(), code
	}
	// tokens create writes straight into the data dir, even while the server runs.
	out, errOut, code := run("tokens", "create", "--data-dir", ts.cfg.DataDir, "--tag", "role=web", "--ttl", "10m")
	if code != 0 {
		t.Fatalf("tokens create: %d %s", code, errOut)
	}
	a, err := enroll(ts.base, strings.TrimSpace(out), "cli-host")
	if err != nil {
		t.Fatalf("enroll with a CLI token: %v", err)
	}
	defer a.close()
	var ag api.Agent
	ts.adminOK("GET", "/api/v1/agents/"+a.id, nil, &ag)
	if ag.Tags["role"] != "web" {
		t.Errorf("preset tags: %v", ag.Tags)
	}
	// api-tokens create too; the token works at once.
	out, errOut, code = run("api-tokens", "create", "--data-dir", ts.cfg.DataDir, "--name", "rescue", "--role", "admin")
	if code != 0 {
		t.Fatalf("api-tokens create: %d %s", code, errOut)
	}
	var who api.WhoAmI
	ts.as(strings.TrimSpace(out), 200, "GET", "/api/v1/whoami", nil, &who)
	if who.Name != "rescue" || who.Role != "admin" {
		t.Fatalf("whoami with a CLI token: %+v", who)
	}
	var al api.AuditList
	ts.adminOK("GET", "/api/v1/audit?actor=local", nil, &al)
	if len(al.Entries) != 2 || al.Entries[0].Action != "api_tokens.create" || al.Entries[1].Action != "enrollment_tokens.create" {
		t.Fatalf("audit of CLI commands: %+v", al.Entries)
	}
	if _, errOut, code = run("api-tokens", "create", "--data-dir", ts.cfg.DataDir, "--name", "x", "--role", "root"); code != 1 || !strings.Contains(errOut, "role") {
		t.Fatalf("api-tokens create with a bad role: %d %s", code, errOut)
	}
	// keys rotate goes through the running server's API.
	out, errOut, code = run("keys", "rotate", "--data-dir", ts.cfg.DataDir, "--http-addr", ts.s.HTTPAddr())
	if code != 0 || !strings.Contains(out, "key list version 2") {
		t.Fatalf("keys rotate: %d %q %q", code, out, errOut)
	}
	if _, err := a.pullManifest(); err != nil {
		t.Fatalf("manifest after a CLI rotation: %v", err)
	}
	// With the server stopped, it rotates in the data dir, and the next
	// start re-signs every manifest.
	ts.stop()
	if out, errOut, code = run("keys", "rotate", "--data-dir", ts.cfg.DataDir); code != 0 || !strings.Contains(out, "key list version 3") {
		t.Fatalf("offline keys rotate: %d %q %q", code, out, errOut)
	}
	ts2 := startServer(t, func(c *Config) { *c = ts.cfg })
	a.base = ts2.base
	acc, err := a.pullManifest()
	if err != nil || acc.Manifest.KeyListVersion != 3 {
		t.Fatalf("manifest after an offline rotation: %v %+v", err, acc)
	}
	if _, errOut, code = run("serve", "--config", "/nonexistent.yaml"); code != 2 || !strings.Contains(errOut, "nonexistent") {
		t.Fatalf("a missing --config file: %d %s", code, errOut)
	}
	if _, errOut, code = run("serve", "-config", "/nonexistent.yaml"); code != 2 || !strings.Contains(errOut, "nonexistent") {
		t.Fatalf("a single-dash -config: %d %s", code, errOut)
	}
	if _, _, code = run("frobnicate"); code != 2 {
		t.Fatalf("unknown command: %d", code)
	}
	for _, args := range [][]string{{"--version"}, {"version"}} {
		if out, _, code = run(args...); code != 0 || !strings.Contains(out, "drover-server") || !strings.Contains(out, "test") {
			t.Fatalf("%v: %d %q", args, code, out)
		}
	}
}

func TestManifestResignedBeforeExpiry(t *testing.T) {
	ts := startServer(t)
	a := ts.enrollAgent(nil)
	acc1, err := a.pullManifest()
	if err != nil {
		t.Fatal(err)
	}
	// Nothing is due yet.
	if n, err := ts.s.compiler.ResignDue(t.Context()); err != nil || n != 0 {
		t.Fatalf("resign before half-life: %d %v", n, err)
	}
	ts.clock.Advance(4 * 24 * time.Hour)
	if n, err := ts.s.compiler.ResignDue(t.Context()); err != nil || n != 1 {
		t.Fatalf("resign after half-life: %d %v", n, err)
	}
	ts.clock.Advance(-4 * 24 * time.Hour)
	r, _ := a.get("/api/v1/agents/self/manifest")
	if r.header.Get("X-Drover-Manifest-Serial") != "2" {
		t.Fatalf("serial after re-signing: %s", r.header.Get("X-Drover-Manifest-Serial"))
	}
	// A key-list refresh at half its lifetime re-signs the list with a
	// higher version; manifests follow, and agents update through /trust.
	changed, err := ts.s.keys.Refresh(time.Now().Add(200*24*time.Hour), ts.cfg.Signing.KeyListLifetime)
	if err != nil || !changed {
		t.Fatalf("key list refresh: %v %v", changed, err)
	}
	if _, err := ts.s.compiler.Compile(t.Context(), nil); err != nil {
		t.Fatal(err)
	}
	acc, err := a.pullManifest()
	if err != nil || acc.Manifest.KeyListVersion != 2 || acc.KeyID != acc1.KeyID {
		t.Fatalf("after a key-list refresh: %v %+v", err, acc)
	}
}

// The replicas' public addresses: public_url and grpc_public_addr are
// one-element lists that come first; both lists are validated entry by
// entry with field paths, duplicates and more than api.MaxReplicaAddrs
// refused; DROVER_PUBLIC_URLS is comma-separated.
func TestConfigReplicaAddresses(t *testing.T) {
	cfg, err := LoadConfig("", false, []string{"DROVER_PUBLIC_URLS=https://b.example:8443, https://c.example:8443/", "DROVER_GRPC_PUBLIC_ADDRS=b.example:8444,c.example:8444"})
	if err != nil {
		t.Fatal(err)
	}
	cfg.PublicURL = "https://a.example:8443"
	cfg.DataDir = "/x"
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(cfg.ReplicaURLs(), " "); got != "https://a.example:8443 https://b.example:8443 https://c.example:8443" {
		t.Fatalf("ReplicaURLs = %s", got)
	}
	if got := strings.Join(cfg.ReplicaGRPCAddrs(), " "); got != "b.example:8444 c.example:8444" {
		t.Fatalf("ReplicaGRPCAddrs = %s", got)
	}
	// public_url repeated in public_urls is not a duplicate: it is the same entry.
	cfg.PublicURLs = append(cfg.PublicURLs, "https://A.example:8443/")
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	if n := len(cfg.ReplicaURLs()); n != 3 {
		t.Fatalf("%d replica URLs: %v", n, cfg.ReplicaURLs())
	}
	if sans := strings.Join(serverSANs(&cfg), " "); !strings.Contains(sans, "a.example") || !strings.Contains(sans, "c.example") {
		t.Fatalf("SANs %s", sans)
	}

	bad := DefaultConfig()
	bad.PublicURLs = []string{"https://a.example", "http://b.example", "https://a.example/", "https://u@c.example", "https://d.example:99999"}
	bad.GRPCPublicAddrs = []string{"a.example:8444", "nope", "a.example:8444", ":8444"}
	err = bad.Validate()
	var ve *manifest.ValidationError
	if !errors.As(err, &ve) {
		t.Fatalf("err = %v", err)
	}
	want := map[string]bool{"public_urls[1]": true, "public_urls[2]": true, "public_urls[3]": true, "public_urls[4]": true,
		"grpc_public_addrs[1]": true, "grpc_public_addrs[2]": true, "grpc_public_addrs[3]": true}
	got := map[string]bool{}
	for _, p := range ve.Problems {
		got[p.Field] = true
	}
	for f := range want {
		if !got[f] {
			t.Errorf("no problem for %s in %v", f, err)
		}
	}
	if got["public_urls[0]"] || got["grpc_public_addrs[0]"] {
		t.Errorf("a good entry refused: %v", err)
	}
	many := DefaultConfig()
	for i := range api.MaxReplicaAddrs + 1 {
		many.GRPCPublicAddrs = append(many.GRPCPublicAddrs, fmt.Sprintf("r%d.example:8444", i))
	}
	if err := many.Validate(); err == nil || !strings.Contains(err.Error(), "grpc_public_addrs") {
		t.Fatalf("%d addresses accepted: %v", len(many.GRPCPublicAddrs), err)
	}
}

// TestRuntimeSettings: the collector's settings are checked with their
// field paths, read from the environment, and applied when the server
// runs; 0 leaves Go's own settings alone.
func TestRuntimeSettings(t *testing.T) {
	for _, c := range []struct {
		gc    int
		limit int64
		bad   []string
	}{
		{0, 0, nil}, {10, 64 << 20, nil}, {1000, 1 << 40, nil},
		{9, 0, []string{"runtime.gc_percent"}}, {-1, 0, []string{"runtime.gc_percent"}}, {1001, 0, []string{"runtime.gc_percent"}},
		{0, 1, []string{"runtime.memory_limit_bytes"}}, {50, -5, []string{"runtime.memory_limit_bytes"}},
		{5, 1 << 20, []string{"runtime.gc_percent", "runtime.memory_limit_bytes"}},
	} {
		cfg := DefaultConfig()
		cfg.Runtime = RuntimeConfig{GCPercent: c.gc, MemoryLimitBytes: c.limit}
		err := cfg.Validate()
		var ve *manifest.ValidationError
		if len(c.bad) == 0 {
			if err != nil {
				t.Errorf("%+v: %v", cfg.Runtime, err)
			}
			continue
		}
		if !errors.As(err, &ve) || len(ve.Problems) != len(c.bad) {
			t.Errorf("%+v: %v, want problems for %v", cfg.Runtime, err, c.bad)
			continue
		}
		for _, f := range c.bad {
			if !strings.Contains(ve.Error(), f+":") {
				t.Errorf("%+v: no problem for %s in %v", cfg.Runtime, f, ve)
			}
		}
	}
	cfg, err := LoadConfig("", false, []string{"DROVER_RUNTIME_GC_PERCENT=50", "DROVER_RUNTIME_MEMORY_LIMIT_BYTES=1073741824"})
	if err != nil || cfg.Runtime != (RuntimeConfig{GCPercent: 50, MemoryLimitBytes: 1 << 30}) {
		t.Fatalf("from the environment: %+v %v", cfg.Runtime, err)
	}
	if _, err := LoadConfig("", false, []string{"DROVER_RUNTIME_GC_PERCENT=5"}); err == nil || !strings.Contains(err.Error(), "runtime.gc_percent") {
		t.Fatalf("a bad gc_percent from the environment: %v", err)
	}

	oldGC, oldLimit := debug.SetGCPercent(100), debug.SetMemoryLimit(-1)
	t.Cleanup(func() { debug.SetGCPercent(oldGC); debug.SetMemoryLimit(oldLimit) })
	if def := DefaultConfig().Runtime; def != (RuntimeConfig{GCPercent: 50}) {
		t.Errorf("default runtime settings %+v", def)
	}
	debug.SetMemoryLimit(math.MaxInt64)
	startServer(t, func(c *Config) { c.Runtime = RuntimeConfig{} })
	time.Sleep(100 * time.Millisecond) // Run has applied its (no) settings
	if gc, limit := debug.SetGCPercent(-1), debug.SetMemoryLimit(-1); gc != 100 || limit != math.MaxInt64 {
		t.Errorf("0 changed Go's settings: GOGC %d, limit %d", gc, limit)
	}
	debug.SetGCPercent(100)
	startServer(t, func(c *Config) { c.Runtime = RuntimeConfig{GCPercent: 40, MemoryLimitBytes: 3 << 30} })
	// Run, in its own goroutine, applies them.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		// Read without setting, so as not to race with Run.
		samples := []rtmetrics.Sample{{Name: "/gc/gogc:percent"}}
		rtmetrics.Read(samples)
		gc, limit := samples[0].Value.Uint64(), debug.SetMemoryLimit(-1)
		if gc == 40 && limit == 3<<30 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("runtime settings not applied: GOGC %d, limit %d", gc, limit)
		}
	}
}

// grpc.carry_manifest_bytes: 0 (never) up to what agents accept, from the
// environment too; the hub then carries nothing.
func TestCarryManifestBytes(t *testing.T) {
	for _, n := range []int{0, 1, agentpb.MaxSyncNowManifestBytes} {
		cfg := DefaultConfig()
		cfg.GRPC.CarryManifestBytes = n
		if err := cfg.Validate(); err != nil {
			t.Errorf("%d: %v", n, err)
		}
	}
	for _, n := range []int{-1, agentpb.MaxSyncNowManifestBytes + 1} {
		cfg := DefaultConfig()
		cfg.GRPC.CarryManifestBytes = n
		if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "grpc.carry_manifest_bytes") {
			t.Errorf("%d: %v", n, err)
		}
	}
	cfg, err := LoadConfig("", false, []string{"DROVER_GRPC_CARRY_MANIFEST_BYTES=0"})
	if err != nil || cfg.GRPC.CarryManifestBytes != 0 {
		t.Fatalf("from the environment: %v %d", err, cfg.GRPC.CarryManifestBytes)
	}
	ts := startServer(t, func(c *Config) { c.GRPC.CarryManifestBytes = 0 })
	a := ts.enrollAgent(map[string]string{"role": "carry"})
	st := a.mustStream(t)
	defer st.close()
	before := ts.s.fleet.hub.SyncNowCounts()
	ts.putScriptPipe("carry", "true", map[string]string{"role": "carry"})
	testkit.WaitFor(t, 10*time.Second, "the SyncNow of the change", func() bool {
		return ts.s.fleet.hub.SyncNowCounts().Unavailable > before.Unavailable
	})
	if c := ts.s.fleet.hub.SyncNowCounts(); c.Manifest != before.Manifest {
		t.Fatalf("a manifest was carried with carrying off: %+v", c)
	}
}

// TestProfileAddr: runtime.profile_addr accepts only a loopback address with
// a port (checked with its field path, from the environment too); when set,
// the running server serves Go's profiles there and nothing else, and by
// default it serves them nowhere.
func TestProfileAddr(t *testing.T) {
	for addr, ok := range map[string]bool{
		"": true, "127.0.0.1:6060": true, "[::1]:6060": true, "localhost:6060": true, "127.0.0.2:1": true,
		"0.0.0.0:6060": false, ":6060": false, "10.0.0.1:6060": false, "127.0.0.1": false, "127.0.0.1:0": false,
		"127.0.0.1:65536": false, "example.com:6060": false, "[::]:6060": false,
	} {
		cfg := DefaultConfig()
		cfg.Runtime.ProfileAddr = addr
		err := cfg.Validate()
		if ok != (err == nil) || err != nil && !strings.Contains(err.Error(), "runtime.profile_addr:") {
			t.Errorf("profile_addr %q: %v", addr, err)
		}
	}
	if _, err := LoadConfig("", false, []string{"DROVER_RUNTIME_PROFILE_ADDR=0.0.0.0:6060"}); err == nil || !strings.Contains(err.Error(), "runtime.profile_addr") {
		t.Fatalf("a public profile address from the environment: %v", err)
	}

	// A profile address already in use: New fails naming it and releases
	// what it had bound (the same API ports bind again).
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	busy := testConfig(t.TempDir())
	busy.HTTPAddr, busy.GRPCAddr = fmt.Sprintf("127.0.0.1:%d", testkit.FreePort(t)), fmt.Sprintf("127.0.0.1:%d", testkit.FreePort(t))
	busy.Runtime.ProfileAddr = addr
	if s, err := New(busy, testLogger(t), &testkit.Clock{}); err == nil || !strings.Contains(err.Error(), "runtime.profile_addr") {
		if s != nil {
			s.release()
		}
		t.Fatalf("New with the profile address in use: %v", err)
	}
	for _, a := range []string{busy.HTTPAddr, busy.GRPCAddr} {
		l, err := net.Listen("tcp", a)
		if err != nil {
			t.Fatalf("%s still bound after New failed: %v", a, err)
		}
		l.Close()
	}
	ln.Close()

	// Served: a free loopback port, then the profiles there.
	ts := startServer(t, func(c *Config) { c.Runtime.ProfileAddr = addr })
	get := func(path string) (int, string) {
		resp, err := http.Get("http://" + addr + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		return resp.StatusCode, string(b)
	}
	if code, body := get("/debug/pprof/goroutine?debug=1"); code != 200 || !strings.Contains(body, "goroutine profile:") {
		t.Fatalf("goroutine profile: %d %.200s", code, body)
	}
	if code, _ := get("/metrics"); code != http.StatusNotFound {
		t.Fatalf("/metrics on the profile address: %d", code)
	}
	// Not on the API port, and not served by a server without the setting.
	plain := startServer(t)
	for _, s := range []*testServer{ts, plain} {
		resp, err := s.client.Get(s.base + "/debug/pprof/")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode == 200 {
			t.Fatalf("%s serves profiles on the API port", s.base)
		}
	}
	ts.stop()
	if _, err := http.Get("http://" + addr + "/debug/pprof/"); err == nil {
		t.Fatal("profiles still served after the server stopped")
	}
}
