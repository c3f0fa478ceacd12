package server

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/drover/drover/api"
	"github.com/drover/drover/internal/testkit"

	agentpb "github.com/drover/drover/proto"
)

// The regression tests of the "hostile operators, agents and clients"
// review, one per finding, against a real server on 127.0.0.1.

// TestOperatorCannotReachInternalAgent: an operator token used to be able to
// put a pipe on the server's internal agent (tag drover.internal) and read
// admin.token and the CA key from the server's data dir. Privileged specs
// now need the admin role on every path that creates a pipe version.
func TestOperatorCannotReachInternalAgent(t *testing.T) {
	ts := startServer(t)
	internal := ts.enrollAgent(map[string]string{internalAgentTag: "true"})
	ts.enrollAgent(map[string]string{"role": "web"})
	op, _ := ts.apiToken("ops", "operator", "")
	steal := "cat " + ts.cfg.DataDir + "/admin.token"

	cases := map[string]map[string]any{
		"internal tag":      {"schedule": "@hourly", "script": steal, "targets": map[string]any{"tags": map[string]string{internalAgentTag: "true"}}},
		"internal by id":    {"schedule": "@hourly", "script": steal, "targets": map[string]any{"agents": []string{internal.id}}},
		"run_as root":       {"schedule": "@hourly", "script": "id", "run_as": "root", "targets": map[string]any{"tags": map[string]string{"role": "web"}}},
		"hardening none":    {"schedule": "@hourly", "script": "id", "hardening": "none", "targets": map[string]any{"tags": map[string]string{"role": "web"}}},
		"writable /etc":     {"schedule": "@hourly", "script": "id", "writable_paths": []string{"/etc/systemd/system"}, "targets": map[string]any{"tags": map[string]string{"role": "web"}}},
		"writable /var/lib": {"schedule": "@hourly", "script": "id", "writable_paths": []string{"/var/lib"}, "targets": map[string]any{"tags": map[string]string{"role": "web"}}},
		"writable /root":    {"schedule": "@hourly", "script": "id", "writable_paths": []string{"/root/.ssh"}, "targets": map[string]any{"tags": map[string]string{"role": "web"}}},
		"writable /proc":    {"schedule": "@hourly", "script": "id", "writable_paths": []string{"/proc"}, "targets": map[string]any{"tags": map[string]string{"role": "web"}}},
		"LD_PRELOAD":        {"schedule": "@hourly", "script": "id", "env": map[string]string{"LD_PRELOAD": "/tmp/x.so"}, "targets": map[string]any{"tags": map[string]string{"role": "web"}}},
		"LD_LIBRARY_PATH":   {"schedule": "@hourly", "script": "id", "env": map[string]string{"LD_LIBRARY_PATH": "/tmp"}, "targets": map[string]any{"tags": map[string]string{"role": "web"}}},
	}
	for name, spec := range cases {
		r := ts.do("PUT", "/api/v1/pipes/p", op, map[string]any{"spec": spec})
		if r.code != 403 || r.errorCode() != "permission_denied" || !strings.Contains(string(r.body), `"field":"spec.`) {
			t.Errorf("%s: operator PUT answered %d %s, want 403 permission_denied with a spec field", name, r.code, r.body)
		}
		var dry api.DryRunResponse
		if r := ts.do("POST", "/api/v1/pipes/p/dry-run", op, map[string]any{"spec": spec}); r.code != 200 {
			t.Errorf("%s: dry-run %d %s", name, r.code, r.body)
		} else if r.decode(t, &dry); len(dry.Privileged) == 0 || !strings.Contains(dry.Refused, "admin") {
			t.Errorf("%s: dry-run does not show the refusal: %s", name, r.body)
		}
	}
	// The YAML form of a PUT goes through the same check.
	y := "name: p\nschedule: '@hourly'\nscript: " + steal + "\ntargets: {tags: {drover.internal: 'true'}}\n"
	if r := ts.doYAML("PUT", "/api/v1/pipes/p", op, y); r.code != 403 {
		t.Errorf("operator YAML PUT to the internal agent: %d %s", r.code, r.body)
	}
	// An ordinary pipe is still the operator's.
	if r := ts.do("PUT", "/api/v1/pipes/ok", op, map[string]any{"spec": map[string]any{"schedule": "@hourly", "script": "id",
		"writable_paths": []string{"/var/backups"}, "targets": map[string]any{"tags": map[string]string{"role": "web"}}}}); r.code != 201 {
		t.Errorf("operator PUT of an ordinary pipe: %d %s", r.code, r.body)
	}
	// The admin may; an operator may not restore the admin's version.
	ts.adminOK("PUT", "/api/v1/pipes/p", map[string]any{"spec": cases["internal tag"]}, nil)
	ts.adminOK("PUT", "/api/v1/pipes/p", map[string]any{"spec": map[string]any{"schedule": "@hourly", "script": "id", "targets": map[string]any{"tags": map[string]string{"role": "web"}}}}, nil)
	if r := ts.do("POST", "/api/v1/pipes/p/versions/1/restore", op, nil); r.code != 403 {
		t.Errorf("operator restore of a privileged version: %d %s", r.code, r.body)
	}
	// The operator is still an operator.
	var who api.WhoAmI
	ts.do("GET", "/api/v1/whoami", op, nil).decode(t, &who)
	if who.Role != "operator" {
		t.Errorf("whoami: %+v", who)
	}

	// An allow-listed token may.
	ts2 := startServer(t, func(c *Config) { c.Privileged.AllowTokens = []string{"deployer"} })
	dep, _ := ts2.apiToken("deployer", "operator", "")
	if r := ts2.do("PUT", "/api/v1/pipes/p", dep, map[string]any{"spec": cases["run_as root"]}); r.code != 201 {
		t.Errorf("allow-listed operator: %d %s", r.code, r.body)
	}
}

// TestInternalAgentCannotReadDataDir: the server's data dir is 0700 and the
// server's own; the internal agent's unprivileged user is never root (the
// end-to-end proof is TestInternalAgentJobsCannotReadDataDir).
func TestInternalAgentCannotReadDataDir(t *testing.T) {
	ts := startServer(t)
	fi, err := os.Stat(ts.cfg.DataDir)
	if err != nil {
		t.Fatal(err)
	}
	st := fi.Sys().(*syscall.Stat_t)
	if fi.Mode().Perm() != 0o700 || int(st.Uid) != os.Geteuid() {
		t.Fatalf("data dir mode %v uid %d, want 0700 owned by %d", fi.Mode().Perm(), st.Uid, os.Geteuid())
	}
	if got := internalAgentBackend("cron", 1000); got != "cron" {
		t.Errorf("non-root cron: %q", got)
	}
	if !inside(ts.cfg.DataDir+"/internal-agent", ts.cfg.DataDir) || inside(ts.cfg.DataDir+"-internal-agent", ts.cfg.DataDir) {
		t.Error("inside() is wrong")
	}
	if _, err := internalAgentUser("root"); err == nil {
		t.Error("root was accepted as the internal agent's unprivileged user")
	}
}

// doYAML sends a YAML body.
func (ts *testServer) doYAML(method, path, token, body string) *apiResult {
	ts.t.Helper()
	return ts.doCT(method, path, token, "application/yaml", []byte(body))
}

func mustJSON(t testing.TB, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// procStatusKB reads a field (VmRSS, VmHWM) of /proc/<pid>/status in KiB.
func procStatusKB(t testing.TB, pid int, field string) int {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			n, err := strconv.Atoi(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")))
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Fatalf("no %s in /proc/%d/status", field, pid)
	return 0
}

// memoryBombBoundMiB is the documented bound on a drover-server's peak RSS
// (VmHWM) while it refuses six 10 MB dry-runs with a 1M-element command at
// once and a 14 MB YAML PUT with a 7M-element flow sequence (before: 595 MB
// for one dry-run, 3.2 GB for six, 2.2 GB for the YAML).
const memoryBombBoundMiB = 150

// TestMemoryBombsBounded runs drover-server as a process and measures its
// peak RSS from /proc while it refuses the memory bombs.
func TestMemoryBombsBounded(t *testing.T) {
	bin := buildServer(t)
	dir := t.TempDir()
	p := startProcess(t, bin, dir)
	client, admin := adminClient(t, dir)
	base := "https://" + p.https
	do := func(method, path, token, ct string, body []byte) (int, []byte) {
		req, _ := http.NewRequest(method, base+path, bytes.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+token)
		req.Header.Set("Content-Type", ct)
		resp, err := client.Do(req)
		if err != nil {
			t.Errorf("%s %s: %v", method, path, err)
			return 0, nil
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, b
	}
	mkToken := func(role string) string {
		code, b := do("POST", "/api/v1/api-tokens", admin, "application/json", mustJSON(t, api.APITokenRequest{Name: role, Role: role}))
		if code != 201 {
			t.Fatalf("create %s token: %d %s", role, code, b)
		}
		var out api.APITokenCreated
		json.Unmarshal(b, &out)
		return out.Token
	}
	viewer, operator := mkToken("viewer"), mkToken("operator")
	pid := p.cmd.Process.Pid
	before := procStatusKB(t, pid, "VmHWM")

	// A viewer's dry-run with a 1M-element command, six at once.
	var dry bytes.Buffer
	dry.WriteString(`{"spec":{"schedule":"@hourly","command":[`)
	for i := range 1_000_000 {
		if i > 0 {
			dry.WriteByte(',')
		}
		dry.WriteString(`"aaaaaaa"`)
	}
	dry.WriteString(`]},"bundle":""}`)
	var wg sync.WaitGroup
	for range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			code, b := do("POST", "/api/v1/pipes/bomb/dry-run", viewer, "application/json", dry.Bytes())
			if code != 413 || len(b) > 4096 {
				t.Errorf("dry-run bomb: %d, %d bytes: %.300s", code, len(b), b)
			}
		}()
	}
	wg.Wait()
	// An operator's YAML PUT with a 7M-element flow sequence.
	var y bytes.Buffer
	y.WriteString("name: bomb\nschedule: '@hourly'\ncommand: [")
	for i := range 7_000_000 {
		if i > 0 {
			y.WriteByte(',')
		}
		y.WriteByte('1')
	}
	y.WriteString("]\n")
	code, b := do("PUT", "/api/v1/pipes/bomb", operator, "application/yaml", y.Bytes())
	if code/100 != 4 || len(b) > 4096 {
		t.Errorf("YAML bomb: %d, %d bytes: %.300s", code, len(b), b)
	}
	// Many bad elements below the count limits: the error list is capped.
	var many bytes.Buffer
	many.WriteString(`{"spec":{"schedule":"@hourly","script":"x","secrets":[`)
	for i := range 9000 {
		if i > 0 {
			many.WriteByte(',')
		}
		many.WriteString(`"1bad"`)
	}
	many.WriteString(`]}}`)
	code, b = do("POST", "/api/v1/pipes/bomb/dry-run", viewer, "application/json", many.Bytes())
	if code != 422 || !strings.Contains(string(b), "more problems") || len(b) > 64<<10 {
		t.Errorf("9,000 bad secrets: %d, %d bytes: %.300s", code, len(b), b)
	}
	after := procStatusKB(t, pid, "VmHWM")
	t.Logf("drover-server VmHWM: %d KiB before, %d KiB after the bombs (bound %d MiB)", before, after, memoryBombBoundMiB)
	if after > memoryBombBoundMiB<<10 {
		t.Errorf("peak RSS %d KiB is over the bound of %d MiB", after, memoryBombBoundMiB)
	}
}

// TestSlowBodyFloodSparesAgents: 540 unauthenticated enroll POSTs that
// declare a 100 kB body and trickle it, from six loopback addresses, used to
// hold every request slot for the 60 s read timeout, so that agents' manifest
// polls got 503. Now unauthenticated requests have a pool of their own and
// a short body deadline: the agents' polls keep answering (within seconds,
// not the 60 s hold), and the trickling connections are cut off.
func TestSlowBodyFloodSparesAgents(t *testing.T) {
	ts := startServer(t)
	a := ts.enrollAgent(map[string]string{"role": "db"})
	ts.putScriptPipe("backup", "true", map[string]string{"role": "db"})
	if _, err := a.pullManifest(); err != nil {
		t.Fatal(err)
	}
	_, port, _ := net.SplitHostPort(ts.s.HTTPAddr())
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var opened, answered atomic.Int64
	var wg sync.WaitGroup
	const flood = 540
	attack := func(src *net.TCPAddr) {
		d := &net.Dialer{LocalAddr: src, Timeout: 10 * time.Second}
		raw, err := d.DialContext(ctx, "tcp", net.JoinHostPort("127.0.0.1", port))
		if err != nil {
			return
		}
		defer raw.Close()
		c := tls.Client(raw, &tls.Config{InsecureSkipVerify: true, NextProtos: []string{"http/1.1"}}) // the attacker checks nothing
		if err := c.HandshakeContext(ctx); err != nil {
			return
		}
		if _, err := fmt.Fprintf(c, "POST /api/v1/agents/enroll HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n{"); err != nil {
			return
		}
		opened.Add(1)
		got := make(chan struct{})
		go func() {
			// Any answer (or the connection closing) ends the attack on this slot.
			_, _ = c.Read(make([]byte, 1))
			close(got)
		}()
		tick := time.NewTicker(500 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-got:
				answered.Add(1)
				return
			case <-tick.C:
				if _, err := c.Write([]byte(" ")); err != nil {
					answered.Add(1)
					return
				}
			}
		}
	}
	for i := range flood {
		wg.Add(1)
		go func() {
			defer wg.Done()
			src := &net.TCPAddr{IP: net.IPv4(127, 0, 0, byte(2+i%6))}
			for ctx.Err() == nil { // a connection cut off comes back: the flood lasts
				attack(src)
			}
		}()
	}
	testkit.WaitFor(t, 60*time.Second, "the flood to open its connections", func() bool { return opened.Load() >= flood*9/10 })

	// During the flood every manifest poll answers 200 or 304 within
	// pollBound. Before the fix the flood held every request slot for the
	// 60 s read timeout, so polls got 503 or waited that long. The flood
	// itself costs CPU (540 connections handshaking again as they are cut
	// off), and on two cores shared with another test suite a poll then
	// waited up to 1.75 s for the CPU alone, so the bound is well above
	// that and far below the slot hold it guards against.
	const pollBound = 5 * time.Second
	var slowest time.Duration
	etag := ""
	for i := range 40 { // 40 polls, 200 ms apart: longer than the public body timeout
		time.Sleep(100 * time.Millisecond)
		start := time.Now()
		r, err := a.get("/api/v1/agents/self/manifest", "If-None-Match", etag)
		took := time.Since(start)
		if err != nil {
			t.Fatalf("poll %d: %v", i, err)
		}
		if r.code != 200 && r.code != 304 {
			t.Fatalf("poll %d during the flood: %d %s", i, r.code, r.body)
		}
		if took > pollBound {
			t.Fatalf("poll %d took %v during the flood", i, took)
		}
		slowest = max(slowest, took)
		if e := r.header.Get("ETag"); e != "" {
			etag = e
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("slowest poll during the flood: %v", slowest)
	// The body deadline cuts the trickling connections off (and they come back).
	testkit.WaitFor(t, 30*time.Second, "the trickling connections to be cut off", func() bool { return answered.Load() >= flood })
	cancel()
	wg.Wait()
}

// TestLiveLogFollowersBounded: one viewer used to hold all 256 live-log
// slots on a run that never ends. Followers are now capped per token, and a
// run that makes no progress ends its followers with an "idle" event.
func TestLiveLogFollowersBounded(t *testing.T) {
	ts := startServer(t, func(c *Config) { c.LiveLogs.MaxPerToken, c.LiveLogs.IdleTimeout = 2, time.Second })
	viewer, _ := ts.apiToken("tail", "viewer", "")
	other, _ := ts.apiToken("other", "viewer", "")
	a := ts.enrollAgent(map[string]string{"role": "db"})
	ts.putScriptPipe("job", "sleep 1d", map[string]string{"role": "db"})
	if _, err := a.pullManifest(); err != nil {
		t.Fatal(err)
	}
	st := a.mustStream(t)
	sendAll(t, st, 1, &agentpb.AgentMessage{Body: &agentpb.AgentMessage_RunStarted{RunStarted: &agentpb.RunStarted{RunId: "forever", Pipe: "job", PipeVersion: 1}}})

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var streams []<-chan sseEvent
	for range 2 {
		resp, ev := ts.openSSE(ctx, viewer, "forever", "")
		defer resp.Body.Close()
		streams = append(streams, ev)
	}
	// The third stream of the same token is refused; another token's is not.
	req, _ := http.NewRequestWithContext(ctx, "GET", ts.base+"/api/v1/runs/forever/logs/stream", nil)
	req.Header.Set("Authorization", "Bearer "+viewer)
	resp, err := ts.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("third follower of one token: %d, want 429", resp.StatusCode)
	}
	r2, _ := ts.openSSE(ctx, other, "forever", "")
	defer r2.Body.Close()
	// The run makes no progress: every follower gets "idle" and its stream ends.
	for i, ev := range streams {
		var got []string
		deadline := time.After(30 * time.Second)
	wait:
		for {
			select {
			case e, ok := <-ev:
				if !ok {
					break wait
				}
				got = append(got, e.event)
			case <-deadline:
				t.Fatalf("follower %d still open after 30s; events %v", i, got)
			}
		}
		if len(got) == 0 || got[len(got)-1] != "idle" {
			t.Fatalf("follower %d events %v, want the last to be idle", i, got)
		}
	}
	// Its slots are free again.
	r3, _ := ts.openSSE(ctx, viewer, "forever", "")
	r3.Body.Close()
}

// renewWith posts a renewal CSR on key.
func (a *testAgent) renewWith(key *ecdsa.PrivateKey) (int, []byte) {
	body, _ := json.Marshal(api.RenewRequest{CSR: newCSR(key)})
	resp, err := a.client.Post(a.base+"/api/v1/agents/self/renew", "application/json", bytes.NewReader(body))
	if err != nil {
		return 0, []byte(err.Error())
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

// TestRenewalNeedsFreshKeyAndIsRateLimited: renewal accepted a CSR on the
// agent's previous, retired key and had no rate limit (500 renewals at
// 377/s). Now a key the agent held before is refused, and renewals are
// limited per agent; the refusals are audited.
func TestRenewalNeedsFreshKeyAndIsRateLimited(t *testing.T) {
	ts := startServer(t)
	a := ts.enrollAgent(nil)
	k1 := a.key
	if code, b := a.renewWith(k1); code != 422 && code != 400 {
		t.Fatalf("renewal on the current key: %d %s", code, b)
	}
	k2, c2, err := a.renew()
	if err != nil {
		t.Fatal(err)
	}
	if err := a.setCert(k2, c2); err != nil {
		t.Fatal(err)
	}
	if _, err := a.get("/api/v1/agents/self/trust"); err != nil { // promotes c2, retires c1
		t.Fatal(err)
	}
	code, b := a.renewWith(k1)
	if code != 422 && code != 400 || !strings.Contains(string(b), "held before") {
		t.Fatalf("renewal on the retired key: %d %s", code, b)
	}
	// The budget (3 at once) is spent after a few renewals.
	limited := false
	for i := 0; i < 10 && !limited; i++ {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		code, b := a.renewWith(k)
		switch code {
		case 200:
		case 429:
			limited = true
		default:
			t.Fatalf("renewal %d: %d %s", i, code, b)
		}
	}
	if !limited {
		t.Fatal("ten renewals in a row were all accepted")
	}
	var audit api.AuditList
	ts.adminOK("GET", "/api/v1/audit?action=refused.rate_limited", nil, &audit)
	if len(audit.Entries) == 0 {
		t.Fatal("the refused renewal is not in the audit log")
	}
}

// TestRefusalsAudited: failed logins, 403s and refused enrollments leave an
// entry; a flood of them is rate-limited.
func TestRefusalsAudited(t *testing.T) {
	ts := startServer(t)
	viewer, viewerID := ts.apiToken("peek", "viewer", "")
	ts.do("GET", "/api/v1/whoami", "drvt1.aaaaaaaaaaaaaaaa.bogus", nil)
	ts.do("DELETE", "/api/v1/pipes/x", viewer, nil)
	ts.do("POST", "/api/v1/agents/enroll", "", map[string]string{"token": "drv1.x.y.z", "hostname": "h", "csr": "x"})
	count := func(action string) []api.AuditEntry {
		var out api.AuditList
		ts.adminOK("GET", "/api/v1/audit?limit=1000&action="+action, nil, &out)
		return out.Entries
	}
	if e := count("refused.unauthenticated"); len(e) != 1 || e[0].Target != "GET /api/v1/whoami" || e[0].Source == "" {
		t.Errorf("bad token: %+v", e)
	}
	if e := count("refused.permission_denied"); len(e) != 1 || e[0].ActorID != viewerID {
		t.Errorf("403: %+v", e)
	}
	if e := count("refused.invalid_token"); len(e) != 1 {
		t.Errorf("refused enrollment: %+v", e)
	}
	// 300 bad logins from one address write at most the per-source budget.
	for range 300 {
		ts.do("GET", "/api/v1/pipes", "drvt1.aaaaaaaaaaaaaaaa.bogus", nil)
	}
	if n := len(count("refused.unauthenticated")); n > refusedPerSource+1 {
		t.Errorf("a flood of 300 bad logins wrote %d audit entries", n)
	}
}

// tarGz builds a bundle of entries exactly as given (name ending in "/" is
// a directory).
func tarGz(t testing.TB, entries ...[2]string) []byte {
	t.Helper()
	var buf bytes.Buffer
	gz := gzip.NewWriter(&buf)
	tw := tar.NewWriter(gz)
	for _, e := range entries {
		h := &tar.Header{Name: e[0], Mode: 0o755, Typeflag: tar.TypeReg, Size: int64(len(e[1])), Format: tar.FormatPAX}
		if strings.HasSuffix(e[0], "/") {
			h.Typeflag, h.Size = tar.TypeDir, 0
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		tw.Write([]byte(e[1]))
	}
	tw.Close()
	gz.Close()
	return buf.Bytes()
}

// TestUploadRefusesBundlesAgentsRefuse: the server used to accept bundles
// that every agent then refused ("a\b", "x\ny", "d/x" then a file "d").
// Both sides now apply manifest.ScanBundle.
func TestUploadRefusesBundlesAgentsRefuse(t *testing.T) {
	ts := startServer(t)
	bad := map[string][]byte{
		"backslash":     tarGz(t, [2]string{"run.sh", "#!/bin/sh\n"}, [2]string{`a\b`, "x"}),
		"newline":       tarGz(t, [2]string{"run.sh", "#!/bin/sh\n"}, [2]string{"x\ny", "x"}),
		"dir then file": tarGz(t, [2]string{"run.sh", "#!/bin/sh\n"}, [2]string{"d/x", "x"}, [2]string{"d", "y"}),
		"file then dir": tarGz(t, [2]string{"run.sh", "#!/bin/sh\n"}, [2]string{"d", "y"}, [2]string{"d/x", "x"}),
		"duplicate":     tarGz(t, [2]string{"run.sh", "#!/bin/sh\n"}, [2]string{"run.sh", "#!/bin/sh\n"}),
	}
	for name, b := range bad {
		body := map[string]any{"spec": map[string]any{"schedule": "@hourly", "command": []string{"./run.sh"}}, "bundle": base64.StdEncoding.EncodeToString(b)}
		r := ts.do("PUT", "/api/v1/pipes/b", ts.admin, body)
		if r.code != 422 || !strings.Contains(string(r.body), `"field":"bundle"`) {
			t.Errorf("%s: %d %s, want 422 with a bundle field error", name, r.code, r.body)
		}
	}
	ok := tarGz(t, [2]string{"d/", ""}, [2]string{"d/x", "x"}, [2]string{"run.sh", "#!/bin/sh\n"})
	if r := ts.do("PUT", "/api/v1/pipes/b", ts.admin, map[string]any{"spec": map[string]any{"schedule": "@hourly", "command": []string{"./run.sh"}},
		"bundle": base64.StdEncoding.EncodeToString(ok)}); r.code != 201 {
		t.Errorf("good bundle: %d %s", r.code, r.body)
	}
}

// TestTLS12OffersOnlyAEAD: TLS 1.2 used to offer the CBC-SHA1 suites
// (ECDHE-ECDSA-AES128-SHA, ...) on both listeners.
func TestTLS12OffersOnlyAEAD(t *testing.T) {
	ts := startServer(t)
	a := ts.enrollAgent(nil)
	cbc := []uint16{tls.TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA, tls.TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA,
		tls.TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA256, tls.TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA, tls.TLS_RSA_WITH_AES_128_CBC_SHA}
	for _, addr := range []string{ts.s.HTTPAddr(), ts.s.GRPCAddr()} {
		for _, suite := range cbc {
			c, err := tls.Dial("tcp", addr, &tls.Config{InsecureSkipVerify: true, MaxVersion: tls.VersionTLS12, CipherSuites: []uint16{suite}, Certificates: []tls.Certificate{a.cert}}) // a scanner checks nothing
			if err == nil {
				c.Close()
				t.Errorf("%s accepted %s", addr, tls.CipherSuiteName(suite))
			}
		}
		c, err := tls.Dial("tcp", addr, &tls.Config{InsecureSkipVerify: true, MaxVersion: tls.VersionTLS12, CipherSuites: []uint16{tls.TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256}, Certificates: []tls.Certificate{a.cert}})
		if err != nil {
			t.Errorf("%s refused ECDHE-ECDSA-AES128-GCM-SHA256: %v", addr, err)
		} else {
			c.Close()
		}
	}
}

// TestJSONShapeLimits checks the edges of checkJSONShape.
func TestJSONShapeLimits(t *testing.T) {
	arr := func(n int) []byte {
		return []byte("[" + strings.TrimSuffix(strings.Repeat(`"a",`, n), ",") + "]")
	}
	obj := func(n int) []byte {
		var b strings.Builder
		b.WriteString("{")
		for i := range n {
			if i > 0 {
				b.WriteString(",")
			}
			fmt.Fprintf(&b, `"k%d": {"x": 1}`, i)
		}
		return []byte(b.String() + "}")
	}
	for _, c := range []struct {
		name string
		b    []byte
		ok   bool
	}{
		{"array at the limit", arr(maxJSONContainer), true},
		{"array over it", arr(maxJSONContainer + 1), false},
		{"object at the limit", obj(maxJSONContainer), true},
		{"object over it", obj(maxJSONContainer + 1), false},
		{"depth at the limit", []byte(strings.Repeat("[", maxJSONDepth) + strings.Repeat("]", maxJSONDepth)), true},
		{"depth over it", []byte(strings.Repeat("[", maxJSONDepth+1) + strings.Repeat("]", maxJSONDepth+1)), false},
		{"values over the total", []byte("[" + strings.Repeat(strings.TrimSuffix(string(arr(9999)), "")+",", 21) + "1]"), false},
	} {
		if err := checkJSONShape(c.b); (err == nil) != c.ok {
			t.Errorf("%s: %v", c.name, err)
		}
	}
}

// TestViewerSlowDryRunsSpareOthers: a viewer trickling dry-run bodies from
// one address holds at most its token's share of the pool; an operator's
// requests and the agents' polls keep answering.
func TestViewerSlowDryRunsSpareOthers(t *testing.T) {
	ts := startServer(t, func(c *Config) { c.HTTP.MaxConcurrent, c.HTTP.MaxConcurrentPerToken = 16, 4 })
	viewer, _ := ts.apiToken("v", "viewer", "")
	op, _ := ts.apiToken("o", "operator", "")
	a := ts.enrollAgent(nil)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var held, refused atomic.Int64
	var wg sync.WaitGroup
	h1 := ts.client.Transport.(*http.Transport).Clone()
	h1.ForceAttemptHTTP2 = false
	h1.TLSNextProto = map[string]func(string, *tls.Conn) http.RoundTripper{} // one connection per request, as the attack had
	client := &http.Client{Transport: h1}
	for range 40 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			pr, pw := io.Pipe()
			req, _ := http.NewRequestWithContext(ctx, "POST", ts.base+"/api/v1/pipes/x/dry-run", pr)
			req.Header.Set("Authorization", "Bearer "+viewer)
			req.Header.Set("Content-Type", "application/json")
			req.ContentLength = 100000
			go func() {
				pw.Write([]byte("{"))
				held.Add(1)
				<-ctx.Done()
				pw.CloseWithError(ctx.Err())
			}()
			resp, err := client.Do(req)
			if err == nil {
				if resp.StatusCode == 503 {
					refused.Add(1)
				}
				resp.Body.Close()
			}
		}()
	}
	testkit.WaitFor(t, 30*time.Second, "most of the viewer's slow dry-runs to be refused", func() bool { return refused.Load() >= 30 })
	t.Logf("%d slow dry-runs sent, %d refused", held.Load(), refused.Load())
	for i := range 5 {
		start := time.Now()
		r := ts.do("GET", "/api/v1/whoami", op, nil)
		if r.code != 200 || time.Since(start) > time.Second {
			t.Fatalf("operator request %d during the viewer's flood: %d after %v", i, r.code, time.Since(start))
		}
		if res, err := a.get("/api/v1/agents/self/trust"); err != nil || res.code != 200 {
			t.Fatalf("agent request %d: %v %+v", i, err, res)
		}
	}
	cancel()
	wg.Wait()
}
