package cli

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/drover/drover/api"
	"github.com/drover/drover/internal/testkit"
	agentpb "github.com/drover/drover/proto"
)

// fleet is a server with pipes, agents, a secret and runs, for the goldens.
type fleet struct {
	ts       *testServer
	web, db  *fakeAgent
	batch    *fakeAgent // enrolled, never connected: offline
	m        *masker
	runStart time.Time
}

func newFleet(t *testing.T) *fleet { return newFleetOn(t, startServer(t)) }

func newFleetOn(t *testing.T, ts *testServer) *fleet {
	f := &fleet{ts: ts, m: &masker{}, runStart: time.Date(2030, 1, 15, 10, 0, 0, 0, time.UTC)}
	f.web = ts.enroll("web-1", map[string]string{"role": "web", "env": "prod"}, true)
	f.db = ts.enroll("db-1", map[string]string{"role": "db", "env": "prod"}, true)
	f.batch = ts.enroll("batch-1", map[string]string{"role": "batch"}, false)
	f.m.add(f.web.id, "agt-web1")
	f.m.add(f.db.id, "agt-db1")
	f.m.add(f.batch.id, "agt-batch1")
	dir := t.TempDir()
	writeFiles(t, dir, pipesV1)
	t.Chdir(dir)
	ts.ctlOK("apply", "-f", ".")
	r := runCtl(context.Background(), ts.env(), "s3cr3t\n", "secrets", "set", "PGPASSWORD", "--from-stdin")
	if r.code != 0 || r.stdout != "secret PGPASSWORD set\n" {
		t.Fatalf("secrets set: %s", r)
	}
	f.db.manifestApplied(1, map[string]uint64{"backup-db": 1, "vacuum-db": 1}, time.Date(2030, 1, 16, 1, 30, 0, 0, time.UTC))
	// A finished run with output, then a failed one, then one still running.
	f.db.runStarted("run-0001", "backup-db", 1, f.runStart)
	f.db.logChunks("run-0001", 0, f.runStart, "dumping mydb\n", "done: 42 MB\n")
	f.db.runFinished("run-0001", "backup-db", 1, agentpb.RunStatus_RUN_STATUS_SUCCEEDED, 0, f.runStart, 83500*time.Millisecond, 2)
	f.db.runStarted("run-0002", "vacuum-db", 1, f.runStart.Add(time.Hour))
	f.db.logChunks("run-0002", 0, f.runStart.Add(time.Hour), "ERROR: permission denied\n")
	f.db.runFinished("run-0002", "vacuum-db", 1, agentpb.RunStatus_RUN_STATUS_FAILED, 3, f.runStart.Add(time.Hour), 1200*time.Millisecond, 1)
	f.db.runStarted("run-0003", "backup-db", 1, f.runStart.Add(2*time.Hour))
	f.db.logChunks("run-0003", 0, f.runStart.Add(2*time.Hour), "dumping mydb\n")
	return f
}

// check runs droverctl, wants exit 0, and compares masked stdout with a golden file.
func (f *fleet) check(t *testing.T, goldenName string, args ...string) {
	t.Helper()
	r := f.ts.ctl(args...)
	if r.code != 0 {
		t.Fatalf("droverctl %s: %s", strings.Join(args, " "), r)
	}
	golden(t, goldenName, f.m.apply(r.stdout))
}

func TestGoldenOutput(t *testing.T) {
	f := newFleet(t)
	for _, c := range []struct {
		golden string
		args   []string
	}{
		{"get-pipes.txt", []string{"get", "pipes"}},
		{"get-pipes.json", []string{"get", "pipes", "-o", "json"}},
		{"get-pipes.yaml", []string{"get", "pipes", "-o", "yaml"}},
		{"get-pipes-tag.txt", []string{"get", "pipes", "--tag", "role=db"}},
		{"get-pipes-agent.txt", []string{"get", "pipes", "--agent", f.web.id}},
		{"get-pipe-one.json", []string{"get", "pipe", "rotate-logs", "-o", "json"}},
		{"get-agents.txt", []string{"get", "agents"}},
		{"get-agents.json", []string{"get", "agents", "-o", "json"}},
		{"get-agents-tag.txt", []string{"get", "agents", "--tag", "env=prod"}},
		{"get-agents-offline.txt", []string{"get", "agents", "--status", "offline"}},
		{"get-runs.txt", []string{"get", "runs"}},
		{"get-runs.json", []string{"get", "runs", "-o", "json"}},
		{"get-runs-wide.txt", []string{"get", "runs", "-o", "wide"}},
		{"get-runs-reason.txt", []string{"get", "runs", "--reason", "exit 3", "--scheduled-until", "2100-01-01T00:00:00Z", "-o", "wide"}},
		{"get-agents-wide.txt", []string{"get", "agents", "-o", "wide"}},
		{"get-runs-filtered.txt", []string{"get", "runs", "--pipe", "backup-db", "--status", "succeeded"}},
		{"get-runs-since.txt", []string{"get", "runs", "--status", "failed", "--since", "2020-01-01T00:00:00Z", "--until", "2100-01-01T00:00:00Z"}},
		{"get-runs-until.txt", []string{"get", "runs", "--until", "2020-01-01T00:00:00Z"}},
		{"get-run-one.json", []string{"get", "run", "run-0001", "-o", "json"}},
		{"get-secrets.txt", []string{"get", "secrets"}},
		{"get-secrets.json", []string{"get", "secrets", "-o", "json"}},
		{"describe-pipe.txt", []string{"describe", "pipe", "backup-db"}},
		{"describe-agent.txt", []string{"describe", "agent", f.db.id}},
		{"describe-run.txt", []string{"describe", "run", "run-0001"}},
		{"describe-run.yaml", []string{"describe", "run", "run-0002", "-o", "yaml"}},
		{"logs.txt", []string{"logs", "run-0001"}},
		{"logs.json", []string{"logs", "run-0001", "-o", "json"}},
	} {
		t.Run(c.golden, func(t *testing.T) { f.check(t, c.golden, c.args...) })
	}

	// JSON carries the API's field names: id everywhere, status for runs.
	r := f.ts.ctlOK("get", "runs", "-o", "json")
	var runs struct {
		Runs []map[string]any `json:"runs"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &runs); err != nil || len(runs.Runs) != 3 {
		t.Fatalf("runs JSON: %v\n%s", err, r.stdout)
	}
	for _, run := range runs.Runs {
		if run["id"] == nil || run["status"] == nil || run["agent_id"] != f.db.id {
			t.Errorf("run JSON lacks id/status/agent_id: %v", run)
		}
	}
	r = f.ts.ctlOK("get", "agents", "-o", "json")
	var agents struct {
		Agents []map[string]any `json:"agents"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &agents); err != nil || len(agents.Agents) != 3 || agents.Agents[0]["id"] != f.web.id {
		t.Fatalf("agents JSON: %v\n%s", err, r.stdout)
	}

	// Errors: not found, on stderr, exit 1.
	r = f.ts.ctl("describe", "pipe", "nope")
	if r.code != 1 || r.stdout != "" || !strings.Contains(r.stderr, "droverctl: pipe nope: ") || !strings.Contains(r.stderr, "(not_found, HTTP 404)") {
		t.Fatalf("describe missing pipe:\n%s", r)
	}
	r = f.ts.ctl("logs", "run-9999")
	if r.code != 1 || !strings.Contains(r.stderr, "not_found") {
		t.Fatalf("logs of a missing run:\n%s", r)
	}
}

func TestLogsFollow(t *testing.T) {
	f := newFleet(t)
	old := pollInterval
	pollInterval = 20 * time.Millisecond
	defer func() { pollInterval = old }()

	// A finished run: -f prints everything and ends at once.
	r := f.ts.ctlOK("logs", "-f", "run-0001")
	if r.stdout != "dumping mydb\ndone: 42 MB\n" || !strings.Contains(r.stderr, "run run-0001 succeeded (exit 0)") {
		t.Fatalf("logs -f of a finished run:\n%s", r)
	}

	// A running run: -f prints chunks as they come and ends with the run.
	var wg sync.WaitGroup
	var res result
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	wg.Add(1)
	out := &testkit.Buffer{}
	go func() {
		defer wg.Done()
		var errb strings.Builder
		code := Run(ctx, []string{"logs", "-f", "run-0003"}, Env{Stdout: out, Stderr: &errb, Getenv: func(k string) string { return f.ts.env()[k] }})
		res = result{code: code, stderr: errb.String()}
	}()
	testkit.WaitFor(t, 10*time.Second, "the first chunk", func() bool { return out.String() == "dumping mydb\n" })
	f.db.logChunks("run-0003", 1, f.runStart.Add(2*time.Hour), "still dumping\n")
	testkit.WaitFor(t, 10*time.Second, "the second chunk", func() bool { return strings.HasSuffix(out.String(), "still dumping\n") })
	f.db.logChunks("run-0003", 2, f.runStart.Add(2*time.Hour), "done\n")
	f.db.runFinished("run-0003", "backup-db", 1, agentpb.RunStatus_RUN_STATUS_SUCCEEDED, 0, f.runStart.Add(2*time.Hour), 5*time.Second, 3)
	wg.Wait()
	if res.code != 0 || out.String() != "dumping mydb\nstill dumping\ndone\n" || !strings.Contains(res.stderr, "run run-0003 succeeded (exit 0)") {
		t.Fatalf("logs -f: exit %d\nstdout:\n%s\nstderr:\n%s", res.code, out.String(), res.stderr)
	}

	// -o json prints one chunk per line.
	r = f.ts.ctlOK("logs", "-f", "run-0003", "-o", "json")
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	if len(lines) != 3 || !strings.HasPrefix(lines[0], `{"seq":0,"stream":"stdout"`) {
		t.Fatalf("logs -f -o json:\n%s", r)
	}
}

// TestLogsFollowSSE follows a run over the server's Server-Sent Events.
func TestLogsFollowSSE(t *testing.T) {
	ts := startServer(t)
	ts.requireEndpoint("GET", "/api/v1/runs/run-0001/logs/stream", nil, "live logs as Server-Sent Events")
	f := newFleetOn(t, ts)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out := &testkit.Buffer{}
	done := make(chan int, 1)
	go func() {
		done <- Run(ctx, []string{"logs", "-f", "run-0003"}, Env{Stdout: out, Getenv: func(k string) string { return f.ts.env()[k] }})
	}()
	testkit.WaitFor(t, 10*time.Second, "the first chunk", func() bool { return out.String() == "dumping mydb\n" })
	start := time.Now()
	f.db.logChunks("run-0003", 1, f.runStart.Add(2*time.Hour), "live\n")
	testkit.WaitFor(t, 5*time.Second, "the live chunk", func() bool { return strings.HasSuffix(out.String(), "live\n") })
	if d := time.Since(start); d > time.Second {
		t.Errorf("a live chunk took %s to arrive", d)
	}
	f.db.runFinished("run-0003", "backup-db", 1, agentpb.RunStatus_RUN_STATUS_SUCCEEDED, 0, f.runStart.Add(2*time.Hour), time.Second, 2)
	if code := <-done; code != 0 {
		t.Fatalf("exit %d", code)
	}
}

func TestRunPipe(t *testing.T) {
	f := newFleet(t)
	m := f.m
	// Every targeted agent (db-1 for backup-db).
	r := f.ts.ctlOK("run", "backup-db")
	golden(t, "run.txt", m.apply(r.stdout))
	testkit.WaitFor(t, 5*time.Second, "RunNow", func() bool { return f.db.runNowCount() == 1 })
	// One agent, JSON.
	r = f.ts.ctlOK("run", "backup-db", "--agent", f.db.id, "-o", "json")
	golden(t, "run-agent.json", m.apply(r.stdout))
	testkit.WaitFor(t, 5*time.Second, "RunNow", func() bool { return f.db.runNowCount() == 2 })
	// By tag.
	r = f.ts.ctlOK("run", "backup-db", "--tag", "env=prod")
	if !strings.Contains(r.stdout, "sent to: "+f.db.id) {
		t.Fatalf("run --tag:\n%s", r)
	}
	testkit.WaitFor(t, 5*time.Second, "RunNow", func() bool { return f.db.runNowCount() == 3 })
	if f.web.runNowCount() != 0 {
		t.Fatal("web-1 got a RunNow for a pipe that does not target it")
	}
	// A pipe that reaches no agent with the tag, and an agent it does not run on.
	r = f.ts.ctl("run", "backup-db", "--tag", "role=web")
	if r.code != 1 || !strings.Contains(r.stderr, "no agent") {
		t.Fatalf("run --tag role=web:\n%s", r)
	}
	r = f.ts.ctl("run", "backup-db", "--agent", f.web.id)
	if r.code != 1 || !strings.Contains(r.stderr, "does not run on agent") {
		t.Fatalf("run --agent web-1:\n%s", r)
	}
}

func TestCancel(t *testing.T) {
	ts := startServer(t)
	ts.requireEndpoint("POST", "/api/v1/runs/run-0003/cancel", map[string]any{}, "run cancel")
	f := newFleetOn(t, ts)
	r := f.ts.ctlOK("cancel", "run-0003")
	if r.stdout != "cancel requested for run run-0003\n" {
		t.Fatalf("cancel:\n%s", r)
	}
}

func TestAgentsCommands(t *testing.T) {
	f := newFleet(t)
	m := f.m
	r := f.ts.ctlOK("agents", "tag", f.web.id, "tier=front", "env-")
	golden(t, "agents-tag.txt", m.apply(r.stdout))
	r = f.ts.ctlOK("agents", "tag", f.web.id, "role=web", "--replace", "-o", "json")
	var ag map[string]any
	if err := json.Unmarshal([]byte(r.stdout), &ag); err != nil || ag["id"] != f.web.id {
		t.Fatalf("tag -o json: %v\n%s", err, r)
	}
	if tags, _ := ag["tags"].(map[string]any); len(tags) != 1 || tags["role"] != "web" {
		t.Fatalf("tags after --replace: %v", ag["tags"])
	}
	r = f.ts.ctl("agents", "tag", f.web.id, "bad key=x")
	if r.code != 2 {
		t.Fatalf("bad tag:\n%s", r)
	}
	r = f.ts.ctlOK("agents", "revoke", f.batch.id)
	golden(t, "agents-revoke.txt", m.apply(r.stdout))
	r = f.ts.ctlOK("get", "agents", f.batch.id)
	if !strings.Contains(r.stdout, "revoked") {
		t.Fatalf("revoked agent:\n%s", r)
	}
	r = f.ts.ctl("agents", "revoke", "agt-nope")
	if r.code != 1 || !strings.Contains(r.stderr, "not_found") {
		t.Fatalf("revoke unknown:\n%s", r)
	}
}

func TestAgentsRemove(t *testing.T) {
	ts := startServer(t)
	ts.requireEndpoint("DELETE", "/api/v1/agents/agt-nope", nil, "agent deletion")
	f := newFleetOn(t, ts)
	f.ts.ctlOK("agents", "revoke", f.batch.id)
	r := f.ts.ctlOK("agents", "rm", f.batch.id)
	if r.stdout != "agent "+f.batch.id+" deleted\n" {
		t.Fatalf("agents rm:\n%s", r)
	}
	r = f.ts.ctl("describe", "agent", f.batch.id)
	if r.code != 1 {
		t.Fatalf("deleted agent still there:\n%s", r)
	}
}

func TestSecrets(t *testing.T) {
	ts := startServer(t)
	dir := t.TempDir()
	vf := filepath.Join(dir, "v")
	os.WriteFile(vf, []byte("line1\nline2\n"), 0o600)
	r := ts.ctlOK("secrets", "set", "A_FILE", "--from-file", vf)
	if r.stdout != "secret A_FILE set\n" {
		t.Fatalf("from-file:\n%s", r)
	}
	r = ts.ctlOK("secrets", "set", "B_VALUE", "--value", "x")
	if !strings.Contains(r.stderr, "shell history") {
		t.Fatalf("--value without a warning:\n%s", r)
	}
	r = ts.ctlOK("secrets", "ls", "-o", "json")
	if !strings.Contains(r.stdout, `"name": "A_FILE"`) || !strings.Contains(r.stdout, `"name": "B_VALUE"`) || strings.Contains(r.stdout, "line1") {
		t.Fatalf("secrets ls:\n%s", r)
	}
	r = ts.ctlOK("secrets", "rm", "B_VALUE")
	if r.stdout != "secret B_VALUE deleted\n" {
		t.Fatalf("rm:\n%s", r)
	}
	for _, c := range []struct {
		args []string
		code int
		msg  string
	}{
		{[]string{"secrets", "set", "X", "value"}, 2, "never from an argument"},
		{[]string{"secrets", "set", "X"}, 2, "exactly one of --from-file, --from-stdin or --value"},
		{[]string{"secrets", "set", "X", "--from-stdin", "--value", "v"}, 2, "exactly one of"},
		{[]string{"secrets", "set", "1X", "--value", "v"}, 2, "secret name"},
		{[]string{"secrets", "set", "DROVER_X", "--value", "v"}, 2, "secret name"},
		{[]string{"secrets", "set", "X", "--from-file", filepath.Join(dir, "nope")}, 1, "no such file"},
		{[]string{"secrets", "rm", "NOPE"}, 1, "not_found"},
	} {
		r := ts.ctl(c.args...)
		if r.code != c.code || !strings.Contains(r.stderr, c.msg) {
			t.Errorf("%v: want exit %d and %q:\n%s", c.args, c.code, c.msg, r)
		}
	}
	big := strings.Repeat("x", maxSecretBytes+1)
	r = runCtl(context.Background(), ts.env(), big, "secrets", "set", "BIG", "--from-stdin")
	if r.code != 1 || !strings.Contains(r.stderr, "at most 65536") {
		t.Fatalf("big secret:\n%s", r)
	}
}

func TestTokens(t *testing.T) {
	ts := startServer(t)
	r := ts.ctlOK("tokens", "create", "--ttl", "2h", "--tag", "role=db", "--name", "db-7")
	tok := strings.TrimSpace(r.stdout)
	if !tokenShapeRE.MatchString(tok) || !strings.Contains(r.stderr, "shown only once") {
		t.Fatalf("tokens create:\n%s", r)
	}
	// The token enrolls an agent that gets the preset name and tags.
	a := ts.enrollWith(tok, "db-host", false)
	r = ts.ctlOK("get", "agents", a.id, "-o", "json")
	if !strings.Contains(r.stdout, `"name": "db-7"`) || !strings.Contains(r.stdout, `"role": "db"`) {
		t.Fatalf("enrolled agent:\n%s", r)
	}

	r = ts.ctlOK("tokens", "create", "-o", "json")
	var resp map[string]any
	if err := json.Unmarshal([]byte(r.stdout), &resp); err != nil || resp["id"] == nil || resp["expires_at"] == nil {
		t.Fatalf("tokens create -o json: %v\n%s", err, r)
	}
	if s, _ := resp["token"].(string); !tokenShapeRE.MatchString(s) {
		t.Fatalf("token %q", resp["token"])
	}

	// The drop-in line writes the token with mode 0600, atomically.
	dir := t.TempDir()
	target := filepath.Join(dir, "etc", "drover", "enroll.token")
	r = ts.ctlOK("tokens", "create", "--print-dropin", "--dropin-path", target)
	line := strings.TrimSpace(r.stdout)
	if strings.Count(r.stdout, "\n") != 1 || !strings.Contains(line, "umask 077") {
		t.Fatalf("drop-in:\n%s", r)
	}
	out, err := exec.Command("/bin/sh", "-c", line).CombinedOutput()
	if err != nil {
		t.Fatalf("sh: %v\n%s", err, out)
	}
	st, err := os.Stat(target)
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("token file: %v %v", st, err)
	}
	b, _ := os.ReadFile(target)
	if !tokenShapeRE.MatchString(strings.TrimSpace(string(b))) || !strings.Contains(line, strings.TrimSpace(string(b))) {
		t.Fatalf("token file holds %q", b)
	}
	// Default path.
	r = ts.ctlOK("tokens", "create", "--print-dropin")
	if !strings.HasPrefix(r.stdout, "install -d -m 0755 /etc/drover && (umask 077 && t=$(mktemp /etc/drover/.enroll.token.XXXXXX) && printf '%s\\n' 'drv1.") ||
		!strings.HasSuffix(r.stdout, `' > "$t" && mv -f "$t" /etc/drover/enroll.token)`+"\n") {
		t.Fatalf("default drop-in:\n%s", r.stdout)
	}

	for _, c := range []struct {
		args []string
		code int
		msg  string
	}{
		{[]string{"tokens", "create", "--ttl", "soon"}, 2, "--ttl"},
		{[]string{"tokens", "create", "--tag", "novalue"}, 2, "key=value"},
		{[]string{"tokens", "create", "--ttl", "1s"}, 1, "ttl: must be between"},
		{[]string{"tokens", "create", "--name", "bad name"}, 1, "name: use 1-63"},
		{[]string{"tokens", "create", "--print-dropin", "--dropin-path", "/etc/x y"}, 2, "--dropin-path"},
		{[]string{"tokens", "create", "--print-dropin", "--dropin-path", "relative/path"}, 2, "--dropin-path"},
	} {
		r := ts.ctl(c.args...)
		if r.code != c.code || !strings.Contains(r.stderr, c.msg) || r.stdout != "" {
			t.Errorf("%v: want exit %d and %q:\n%s", c.args, c.code, c.msg, r)
		}
	}
}

func TestTokensListAndDelete(t *testing.T) {
	ts := startServer(t)
	ts.requireEndpoint("GET", "/api/v1/enrollment-tokens", nil, "listing enrollment tokens")
	r := ts.ctlOK("tokens", "create", "--name", "n1", "-o", "json")
	var tok api.EnrollmentTokenCreated
	json.Unmarshal([]byte(r.stdout), &tok)
	r = ts.ctlOK("get", "tokens")
	if !strings.Contains(r.stdout, tok.ID) || strings.Contains(r.stdout, tok.Token) {
		t.Fatalf("get tokens:\n%s", r)
	}
	r = ts.ctlOK("get", "tokens", "-o", "json")
	if strings.Contains(r.stdout, tok.Token) || strings.Contains(r.stdout, strings.Split(tok.Token, ".")[2]) {
		t.Fatalf("the token list shows a secret:\n%s", r)
	}
	ts.requireEndpoint("DELETE", "/api/v1/enrollment-tokens/nope", nil, "deleting enrollment tokens")
	ts.ctlOK("tokens", "rm", tok.ID)
	r = ts.ctlOK("get", "tokens")
	if strings.Contains(r.stdout, tok.ID) {
		t.Fatalf("deleted token still listed:\n%s", r)
	}
}

func TestAPITokens(t *testing.T) {
	ts := startServer(t)
	ts.requireEndpoint("GET", "/api/v1/api-tokens", nil, "operator API tokens")
	r := ts.ctlOK("api-tokens", "create", "--name", "ci", "--role", "viewer", "-o", "json")
	var tok api.APITokenCreated
	if err := json.Unmarshal([]byte(r.stdout), &tok); err != nil || tok.Token == "" {
		t.Fatalf("api-tokens create: %v\n%s", err, r)
	}
	env := ts.env("DROVER_TOKEN", tok.Token)
	if r := runCtl(context.Background(), env, "", "get", "pipes"); r.code != 0 {
		t.Fatalf("a viewer cannot read:\n%s", r)
	}
	r = runCtl(context.Background(), env, "", "secrets", "set", "X", "--value", "v")
	if r.code != 1 || !strings.Contains(r.stderr, "permission_denied") {
		t.Fatalf("a viewer could write:\n%s", r)
	}
	ts.ctlOK("api-tokens", "revoke", tok.ID)
	if r := runCtl(context.Background(), env, "", "get", "pipes"); r.code != 1 || !strings.Contains(r.stderr, "revoked") {
		t.Fatalf("a revoked token still works:\n%s", r)
	}
}

func TestAudit(t *testing.T) {
	ts := startServer(t)
	ts.requireEndpoint("GET", "/api/v1/audit", nil, "the audit log")
	ts.ctlOK("secrets", "set", "X", "--value", "v")
	r := ts.ctlOK("audit", "-o", "json")
	if !strings.Contains(r.stdout, `"entries"`) || !strings.Contains(r.stdout, "secret") {
		t.Fatalf("audit:\n%s", r)
	}
	r = ts.ctlOK("audit")
	if !strings.HasPrefix(r.stdout, "TIME ") {
		t.Fatalf("audit table:\n%s", r)
	}
}

func TestLoginAndConnection(t *testing.T) {
	ts := startServer(t)
	home := t.TempDir()
	env := map[string]string{"XDG_CONFIG_HOME": filepath.Join(home, "cfg"), "HOME": home}
	ctl := func(stdin string, args ...string) result { return runCtl(context.Background(), env, stdin, args...) }

	// Nothing configured.
	r := ctl("", "get", "pipes")
	if r.code != 1 || !strings.Contains(r.stderr, "no server given") {
		t.Fatalf("no config:\n%s", r)
	}
	// No CA: the server's certificate is not trusted, and the message says what to do.
	r = ctl("", "get", "pipes", "--server", ts.base, "--token", ts.admin)
	if r.code != 1 || !strings.Contains(r.stderr, "--ca") {
		t.Fatalf("no CA:\n%s", r)
	}
	// A wrong token.
	r = ctl("", "login", "--server", ts.base, "--ca", ts.caFile, "--token", "wrong")
	if r.code != 1 || !strings.Contains(r.stderr, "unauthenticated") {
		t.Fatalf("login with a wrong token:\n%s", r)
	}
	// Plain HTTP is refused.
	r = ctl("", "get", "pipes", "--server", "http://"+strings.TrimPrefix(ts.base, "https://"))
	if r.code != 1 || !strings.Contains(r.stderr, "only https") {
		t.Fatalf("http:\n%s", r)
	}

	// login with the server's data dir files, then a bare command works.
	r = ctl("", "login", "--server", strings.TrimPrefix(ts.base, "https://"), "--ca", ts.caFile, "--token-file", filepath.Join(ts.dir, "admin.token"))
	cfgPath := filepath.Join(home, "cfg", "drover", "config.yaml")
	if r.code != 0 || r.stdout != "logged in to "+ts.base+"; wrote "+cfgPath+"\n" {
		t.Fatalf("login:\n%s", r)
	}
	st, err := os.Stat(cfgPath)
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("config file: %v %v", st, err)
	}
	if d, _ := os.Stat(filepath.Dir(cfgPath)); d.Mode().Perm() != 0o700 {
		t.Fatalf("config dir mode %v", d.Mode())
	}
	if r := ctl("", "get", "pipes"); r.code != 0 {
		t.Fatalf("after login:\n%s", r)
	}
	// Flags beat the environment, which beats the file.
	env["DROVER_TOKEN"] = "wrong"
	if r := ctl("", "get", "pipes"); r.code != 1 || !strings.Contains(r.stderr, "unauthenticated") {
		t.Fatalf("DROVER_TOKEN ignored:\n%s", r)
	}
	if r := ctl("", "get", "pipes", "--token", ts.admin); r.code != 0 {
		t.Fatalf("--token ignored:\n%s", r)
	}
	delete(env, "DROVER_TOKEN")
	// Without XDG_CONFIG_HOME: ~/.config/drover/config.yaml; --token-stdin.
	delete(env, "XDG_CONFIG_HOME")
	r = ctl(ts.admin+"\n", "login", "--server", ts.base, "--ca", ts.caFile, "--token-stdin")
	if r.code != 0 || !strings.Contains(r.stdout, filepath.Join(home, ".config", "drover", "config.yaml")) {
		t.Fatalf("login to ~/.config:\n%s", r)
	}
	// --config names the file; a broken file is an error.
	bad := filepath.Join(home, "bad.yaml")
	os.WriteFile(bad, []byte("server: x\nbogus: 1\n"), 0o600)
	r = ctl("", "get", "pipes", "--config", bad)
	if r.code != 1 || !strings.Contains(r.stderr, "bogus") {
		t.Fatalf("bad config:\n%s", r)
	}
}

func TestCompletion(t *testing.T) {
	for _, sh := range []string{"bash", "zsh", "fish"} {
		r := runCtl(context.Background(), nil, "", "completion", sh)
		if r.code != 0 || !strings.Contains(r.stdout, "droverctl") || len(r.stdout) < 1000 {
			t.Errorf("completion %s: exit %d, %d bytes, stderr %s", sh, r.code, len(r.stdout), r.stderr)
		}
	}
	// Resource names complete.
	r := runCtl(context.Background(), nil, "", "__complete", "get", "")
	if !strings.Contains(r.stdout, "pipes") || !strings.Contains(r.stdout, "agents") {
		t.Errorf("get completion:\n%s", r)
	}
	// Commands complete, the pipe history's among them.
	r = runCtl(context.Background(), nil, "", "__complete", "")
	for _, c := range []string{"history\t", "restore\t", "describe\t", "get\t"} {
		if !strings.Contains(r.stdout, c) {
			t.Errorf("command completion lacks %q:\n%s", strings.TrimSpace(c), r)
		}
	}
	r = runCtl(context.Background(), nil, "", "__complete", "describe", "pipe", "x", "--")
	if !strings.Contains(r.stdout, "--version\t") {
		t.Errorf("describe flag completion lacks --version:\n%s", r)
	}
}

func TestUsageErrors(t *testing.T) {
	for _, args := range [][]string{
		{"apply"},
		{"apply", "extra", "-f", "x"},
		{"diff"},
		{"get"},
		{"get", "widgets"},
		{"get", "secrets", "--status", "failed"},
		{"get", "runs", "--limit", "0"},
		{"get", "agents", "--status", "sleeping"},
		{"get", "runs", "--status", "bogus"},
		{"get", "runs", "--since", "yesterday"},
		{"get", "pipes", "--tag", "x"},
		{"get", "tokens", "extra"},
		{"describe", "pipe"},
		{"describe", "widget", "x"},
		{"logs"},
		{"logs", "a", "b"},
		{"run"},
		{"run", "p", "--agent", "a", "--tag", "k=v"},
		{"cancel"},
		{"history"},
		{"history", "a", "b"},
		{"restore", "p"},
		{"restore", "p", "abc"},
		{"restore", "p", "0"},
		{"restore", "p", "1", "extra"},
		{"describe", "pipe", "p", "--version", "0"},
		{"describe", "agent", "a", "--version", "1"},
		{"tokens", "bogus"},
		{"agents", "tag", "a"},
		{"agents", "bogus"},
		{"secrets", "set"},
		{"completion", "tcsh"},
		{"completion"},
		{"login", "--token-file", "a", "--token-stdin"},
		{"api-tokens", "create", "--name", "x", "--role", "god"},
		{"audit", "--limit", "0"},
		{"get", "pipes", "-o", "xml"},
		{"--bogus"},
		{"nonsense"},
	} {
		r := runCtl(context.Background(), map[string]string{"DROVER_SERVER": "https://127.0.0.1:1"}, "", args...)
		if r.code != 2 || r.stdout != "" || !strings.HasPrefix(r.stderr, "droverctl: ") {
			t.Errorf("%v: want exit 2 with a message on stderr only:\n%s", args, r)
		}
	}
	// Help is not an error.
	if r := runCtl(context.Background(), nil, "", "agents"); r.code != 0 || !strings.Contains(r.stdout, "revoke") {
		t.Errorf("agents (help):\n%s", r)
	}
	// An unreachable server is an error, not a usage error.
	if r := runCtl(context.Background(), map[string]string{"DROVER_SERVER": "https://127.0.0.1:1"}, "", "get", "pipes"); r.code != 1 || !strings.Contains(r.stderr, "cannot reach") {
		t.Errorf("unreachable:\n%s", r)
	}
}
