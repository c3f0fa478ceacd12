package cli

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/drover/drover/internal/testkit"
)

// runFleet is a real server with two agents that run what they are asked
// to (serveRunNow) and one that is offline, and pipes that succeed, fail
// and sleep.
type runFleet struct {
	ts          *testServer
	web, db     *fakeAgent // online, running pipes
	dbOff       *fakeAgent // enrolled, never connected
	mute        *fakeAgent // online, never reports a run
	webID, dbID string
}

func newRunFleet(t *testing.T) *runFleet {
	t.Helper()
	testkit.RequireCommand(t, "sh", "to run the pipes' scripts")
	ts := startServer(t)
	f := &runFleet{ts: ts}
	f.web = ts.enroll("web-1", map[string]string{"role": "web", "zone": "a"}, true)
	f.db = ts.enroll("db-1", map[string]string{"role": "db", "zone": "a"}, true)
	f.dbOff = ts.enroll("db-2", map[string]string{"role": "db", "zone": "b"}, false)
	f.mute = ts.enroll("mute-1", map[string]string{"role": "mute"}, true)
	f.web.serveRunNow(ts)
	f.db.serveRunNow(ts)
	f.webID, f.dbID = f.web.id, f.db.id
	web := "targets: {tags: {role: web}}\n"
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{
		"pipes.yaml": "name: hello\nschedule: '@daily'\nscript: echo hello\n" + web +
			"---\nname: broken\nschedule: '@daily'\nscript: 'echo oops >&2; exit 3'\n" + web +
			"---\nname: slow\nschedule: '@daily'\nscript: sleep 30\n" + web +
			"---\nname: slow-too\nschedule: '@daily'\nscript: sleep 30\n" + web +
			// db-1 (online) and db-2 (offline).
			"---\nname: db-check\nschedule: '@daily'\nscript: 'true'\ntargets: {tags: {role: db}}\n" +
			// web-1 and db-1, both online.
			"---\nname: zone-a\nschedule: '@daily'\nscript: echo zone a\ntargets: {tags: {zone: a}}\n" +
			// mute-1, which never answers.
			"---\nname: unheard\nschedule: '@daily'\nscript: 'true'\ntargets: {tags: {role: mute}}\n",
	})
	t.Chdir(dir)
	ts.ctlOK("apply", "-f", ".")
	return f
}

// waitRow is one row of the run --wait table.
type waitRow struct{ agent, run, status, exit, duration, err string }

// waitTable parses the table run --wait prints after the request lines.
func waitTable(t *testing.T, stdout string) []waitRow {
	t.Helper()
	_, table, ok := strings.Cut(stdout, "\nAGENT ")
	if !ok {
		t.Fatalf("no AGENT table in:\n%s", stdout)
	}
	lines := strings.Split(strings.TrimSuffix(table, "\n"), "\n")
	if h := strings.Fields("AGENT " + lines[0]); strings.Join(h, " ") != "AGENT RUN STATUS EXIT DURATION ERROR" {
		t.Fatalf("table header %q", h)
	}
	var rows []waitRow
	for _, l := range lines[1:] {
		// The status "no run yet" is the one cell with spaces but the error.
		l = strings.Replace(l, "no run yet", "no-run-yet", 1)
		c := strings.Fields(l)
		if len(c) < 6 {
			t.Fatalf("short row %q in:\n%s", l, stdout)
		}
		rows = append(rows, waitRow{c[0], c[1], strings.Replace(c[2], "no-run-yet", "no run yet", 1), c[3], c[4], strings.Join(c[5:], " ")})
	}
	return rows
}

func TestRunWait(t *testing.T) {
	f := newRunFleet(t)
	ts := f.ts

	// A succeeding pipe: exit 0, one row per agent the request was sent to.
	r := ts.ctl("run", "hello", "--wait")
	if r.code != 0 || r.stderr != "" {
		t.Fatalf("run hello --wait: %s", r)
	}
	if !strings.HasPrefix(r.stdout, "run of hello requested (request req-") || !strings.Contains(r.stdout, "\n  sent to: "+f.webID+"\n") {
		t.Fatalf("run hello --wait lacks the request lines:\n%s", r.stdout)
	}
	rows := waitTable(t, r.stdout)
	if len(rows) != 1 {
		t.Fatalf("want 1 row:\n%s", r.stdout)
	}
	if w := rows[0]; w.agent != f.webID || !strings.HasPrefix(w.run, "run-web-1-") || w.status != "succeeded" || w.exit != "0" || w.duration == "-" || w.err != "-" {
		t.Fatalf("row %+v:\n%s", w, r.stdout)
	}
	// The row is the run the server holds for that request.
	reqID := strings.Fields(strings.SplitN(r.stdout, "(request ", 2)[1])[0]
	reqID = strings.TrimSuffix(reqID, ")")
	code, b := ts.api("GET", "/api/v1/runs?request_id="+reqID, nil)
	if code != 200 || !strings.Contains(string(b), `"id":"`+rows[0].run+`"`) || !strings.Contains(string(b), `"status":"succeeded"`) {
		t.Fatalf("runs of %s: %d %s", reqID, code, b)
	}

	// A failing script: exit 1, status failed, EXIT 3.
	r = ts.ctl("run", "broken", "--wait")
	if r.code != 1 {
		t.Fatalf("run broken --wait: want exit 1: %s", r)
	}
	rows = waitTable(t, r.stdout)
	if len(rows) != 1 || rows[0].agent != f.webID || rows[0].status != "failed" || rows[0].exit != "3" {
		t.Fatalf("rows %+v:\n%s", rows, r)
	}
	if want := "droverctl: the run on agent " + f.webID + " failed (exit 3)\n"; r.stderr != want {
		t.Fatalf("stderr %q, want %q", r.stderr, want)
	}

	// A pipe that sleeps 30s with --timeout 1s: exit 1 after about a
	// second, naming the agent; its row shows the run as running.
	start := time.Now()
	r = ts.ctl("run", "slow", "--wait", "--timeout", "1s")
	took := time.Since(start)
	if r.code != 1 {
		t.Fatalf("run slow --wait --timeout 1s: want exit 1: %s", r)
	}
	if want := "droverctl: timed out after 1s waiting for agent " + f.webID + "\n"; r.stderr != want {
		t.Fatalf("stderr %q, want %q", r.stderr, want)
	}
	if took < time.Second || took > 10*time.Second {
		t.Fatalf("the wait took %v, want about 1s", took)
	}
	rows = waitTable(t, r.stdout)
	if len(rows) != 1 || rows[0].agent != f.webID || rows[0].status != "running" || rows[0].exit != "-" || rows[0].duration != "-" {
		t.Fatalf("rows %+v:\n%s", rows, r)
	}

	// An agent that reports no run: "no run yet" when the wait ends.
	r = ts.ctl("run", "unheard", "--wait", "--timeout", "1s")
	if r.code != 1 || r.stderr != "droverctl: timed out after 1s waiting for agent "+f.mute.id+"\n" {
		t.Fatalf("run unheard --wait: %s", r)
	}
	if rows = waitTable(t, r.stdout); len(rows) != 1 || rows[0].agent != f.mute.id || rows[0].status != "no run yet" || rows[0].run != "-" {
		t.Fatalf("rows %+v:\n%s", rows, r)
	}
	if f.mute.runNowCount() != 1 {
		t.Fatalf("mute-1 got %d RunNow, want 1", f.mute.runNowCount())
	}

	// Again while it runs: the agent skips the request (runs never
	// overlap), which is not a success.
	r = ts.ctl("run", "slow", "--wait", "--timeout", "20s")
	if r.code != 1 {
		t.Fatalf("run slow while running: want exit 1: %s", r)
	}
	rows = waitTable(t, r.stdout)
	if len(rows) != 1 || rows[0].status != "skipped" || rows[0].exit != "-" || rows[0].duration != "-" || !strings.Contains(rows[0].err, "in progress") {
		t.Fatalf("rows %+v:\n%s", rows, r)
	}
	if !strings.HasPrefix(r.stderr, "droverctl: the run on agent "+f.webID+" was skipped: ") {
		t.Fatalf("stderr %q", r.stderr)
	}

	// Interrupted (Ctrl-C): the rows so far, exit 1 naming the agent.
	ctx, cancel := context.WithCancel(context.Background())
	stop := time.AfterFunc(1500*time.Millisecond, cancel) // as Main's signal context
	r = runCtl(ctx, ts.env(), "", "run", "slow-too", "--wait")
	stop.Stop()
	cancel()
	if r.code != 1 || r.stderr != "droverctl: interrupted waiting for agent "+f.webID+"\n" {
		t.Fatalf("interrupted wait: %s", r)
	}
	if rows = waitTable(t, r.stdout); len(rows) != 1 || rows[0].status != "running" {
		t.Fatalf("rows %+v:\n%s", rows, r)
	}

	// Runs of two agents, read one per page: both are found.
	runWaitPageSize = 1
	r = ts.ctl("run", "zone-a", "--wait", "--timeout", "20s")
	runWaitPageSize = 0
	if r.code != 0 {
		t.Fatalf("run zone-a --wait: %s", r)
	}
	rows = waitTable(t, r.stdout)
	if len(rows) != 2 || rows[0].status != "succeeded" || rows[1].status != "succeeded" || rows[0].agent == rows[1].agent {
		t.Fatalf("rows %+v:\n%s", rows, r)
	}

	// An offline agent did not run the pipe: exit 1 though db-1's run succeeded.
	r = ts.ctl("run", "db-check", "--wait", "--timeout", "20s")
	if r.code != 1 || !strings.Contains(r.stdout, "\n  offline (not run): "+f.dbOff.id+"\n") {
		t.Fatalf("run db-check --wait: %s", r)
	}
	rows = waitTable(t, r.stdout)
	if len(rows) != 1 || rows[0].agent != f.dbID || rows[0].status != "succeeded" {
		t.Fatalf("rows %+v:\n%s", rows, r)
	}
	if want := "droverctl: agent " + f.dbOff.id + " was offline and did not run the pipe\n"; r.stderr != want {
		t.Fatalf("stderr %q, want %q", r.stderr, want)
	}
	// Without --wait the same request succeeds, as before.
	if r = ts.ctl("run", "db-check"); r.code != 0 || strings.Contains(r.stdout, "AGENT") {
		t.Fatalf("run db-check: %s", r)
	}

	// No agent got the request: an error, as without --wait.
	r = ts.ctl("run", "db-check", "--agent", f.dbOff.id, "--wait")
	if r.code != 1 || !strings.Contains(r.stderr, "no agent that runs pipe db-check is online") || strings.Contains(r.stdout, "AGENT") {
		t.Fatalf("run on an offline agent --wait: %s", r)
	}
}

func TestRunWaitJSON(t *testing.T) {
	f := newRunFleet(t)
	var out struct {
		RequestID string            `json:"request_id"`
		Sent      []string          `json:"sent"`
		Offline   []string          `json:"offline"`
		Runs      []json.RawMessage `json:"runs"`
	}
	r := f.ts.ctl("run", "db-check", "--wait", "--timeout", "20s", "-o", "json")
	if r.code != 1 { // db-2 is offline
		t.Fatalf("run db-check --wait -o json: %s", r)
	}
	// One object, with exactly these keys.
	var keys map[string]json.RawMessage
	if err := json.Unmarshal([]byte(r.stdout), &keys); err != nil {
		t.Fatalf("stdout is not one JSON object: %v\n%s", err, r.stdout)
	}
	if len(keys) != 4 || keys["request_id"] == nil || keys["sent"] == nil || keys["offline"] == nil || keys["runs"] == nil {
		t.Fatalf("keys of %s", r.stdout)
	}
	if err := json.Unmarshal([]byte(r.stdout), &out); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(out.RequestID, "req-") || len(out.Sent) != 1 || out.Sent[0] != f.dbID || len(out.Offline) != 1 || out.Offline[0] != f.dbOff.id || len(out.Runs) != 1 {
		t.Fatalf("result:\n%s", r.stdout)
	}
	// The run is the API's object, with its field names.
	var run map[string]any
	if err := json.Unmarshal(out.Runs[0], &run); err != nil {
		t.Fatal(err)
	}
	if run["agent_id"] != f.dbID || run["pipe"] != "db-check" || run["status"] != "succeeded" || run["exit_code"] != 0.0 ||
		run["request_id"] != out.RequestID || run["trigger"] != "api" || run["id"] == nil || run["duration_ms"] == nil {
		t.Fatalf("run object: %s", out.Runs[0])
	}
	code, b := f.ts.api("GET", "/api/v1/runs/"+run["id"].(string), nil)
	if code != 200 {
		t.Fatalf("GET run: %d %s", code, b)
	}
	var api map[string]any
	if err := json.Unmarshal(b, &api); err != nil {
		t.Fatal(err)
	}
	for k := range api {
		if _, ok := run[k]; !ok {
			t.Errorf("the printed run lacks the API's field %q", k)
		}
	}
	if !strings.Contains(r.stderr, "was offline and did not run the pipe") {
		t.Fatalf("stderr %q", r.stderr)
	}

	// A success, as YAML: exit 0, the same keys.
	r = f.ts.ctl("run", "hello", "--wait", "-o", "yaml")
	if r.code != 0 || r.stderr != "" {
		t.Fatalf("run hello --wait -o yaml: %s", r)
	}
	var y struct {
		RequestID string           `yaml:"request_id"`
		Sent      []string         `yaml:"sent"`
		Offline   []string         `yaml:"offline"`
		Runs      []map[string]any `yaml:"runs"`
	}
	if err := yaml.Unmarshal([]byte(r.stdout), &y); err != nil {
		t.Fatalf("%v\n%s", err, r.stdout)
	}
	if y.RequestID == "" || len(y.Sent) != 1 || y.Offline == nil || len(y.Offline) != 0 || len(y.Runs) != 1 || y.Runs[0]["status"] != "succeeded" {
		t.Fatalf("yaml:\n%s", r.stdout)
	}

	// Timed out: the run so far is in runs, and stderr names the agent.
	r = f.ts.ctl("run", "slow", "--wait", "--timeout", "1s", "-o", "json")
	if r.code != 1 || r.stderr != "droverctl: timed out after 1s waiting for agent "+f.webID+"\n" {
		t.Fatalf("run slow -o json: %s", r)
	}
	out.Runs = nil
	if err := json.Unmarshal([]byte(r.stdout), &out); err != nil || len(out.Runs) != 1 || !strings.Contains(string(out.Runs[0]), `"status": "running"`) {
		t.Fatalf("timed-out result (%v):\n%s", err, r.stdout)
	}
}

func TestRunWaitUsage(t *testing.T) {
	env := map[string]string{"DROVER_SERVER": "https://127.0.0.1:1"}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"run", "p", "--timeout", "5s"}, "--timeout applies to --wait only"},
		{[]string{"run", "p", "--timeout", "0"}, "--timeout applies to --wait only"},
		{[]string{"run", "p", "--wait", "--timeout", "-1s"}, "--timeout -1s: must not be negative"},
		{[]string{"run", "p", "--wait", "--timeout", "soon"}, `invalid argument "soon" for "--timeout" flag`},
		{[]string{"run", "p", "--wait", "--timeout", "30"}, `"--timeout" flag`},
		{[]string{"run", "p", "--wait", "--agent", "a", "--tag", "k=v"}, "use --agent or --tag, not both"},
	} {
		r := runCtl(context.Background(), env, "", c.args...)
		if r.code != 2 || r.stdout != "" || !strings.HasPrefix(r.stderr, "droverctl: ") || !strings.Contains(r.stderr, c.want) {
			t.Errorf("%v: want exit 2 and %q on stderr:\n%s", c.args, c.want, r)
		}
	}
	// The help says what --wait and --timeout do.
	r := runCtl(context.Background(), nil, "", "run", "--help")
	for _, want := range []string{"--wait", "--timeout duration", "offline"} {
		if r.code != 0 || !strings.Contains(r.stdout, want) {
			t.Errorf("run --help lacks %q:\n%s", want, r)
		}
	}
}
