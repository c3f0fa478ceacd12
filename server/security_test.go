package server

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
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
		var dry DryRunResponse
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
	var who WhoAmI
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
// server's own; a root server refuses the cron backend for its internal
// agent (its jobs would run as root) and runs it with systemd, whose
// DynamicUser= jobs cannot enter a 0700 directory of another user.
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
	if _, err := internalAgentBackend("cron", 0); err == nil {
		t.Error("a root server accepted the cron backend for its internal agent")
	}
	for _, b := range []string{"", "auto", "systemd"} {
		if got, err := internalAgentBackend(b, 0); err != nil || got != "systemd" {
			t.Errorf("root, backend %q: %q %v, want systemd", b, got, err)
		}
	}
	if got, _ := internalAgentBackend("cron", 1000); got != "cron" {
		t.Errorf("non-root cron: %q", got)
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
		code, b := do("POST", "/api/v1/api-tokens", admin, "application/json", mustJSON(t, APITokenRequest{Name: role, Role: role}))
		if code != 201 {
			t.Fatalf("create %s token: %d %s", role, code, b)
		}
		var out APITokenCreated
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
