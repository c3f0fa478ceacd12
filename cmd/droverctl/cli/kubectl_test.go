package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/drover/drover/api"
	agentpb "github.com/drover/drover/proto"
)

// The kubectl-style commands: -o name, -l, get -w, delete pipe, version and
// completion from the server.

func TestOutputNameAndSelectors(t *testing.T) {
	f := newFleet(t)
	for _, c := range []struct {
		golden string
		args   []string
	}{
		{"get-pipes-name.txt", []string{"get", "pipes", "-o", "name"}},
		{"get-pipes-wide.txt", []string{"get", "pipes", "-o", "wide"}},
		{"get-pipe-one-name.txt", []string{"get", "pipe", "backup-db", "-o", "name"}},
		{"get-agents-name.txt", []string{"get", "agents", "-o", "name"}},
		{"get-runs-name.txt", []string{"get", "runs", "-o", "name"}},
		{"get-agents-selector.txt", []string{"get", "agents", "-l", "env=prod,role=web"}},
		{"get-pipes-selector.txt", []string{"get", "pipes", "-l", "role=db", "-o", "name"}},
	} {
		t.Run(c.golden, func(t *testing.T) { f.check(t, c.golden, c.args...) })
	}
	// -l means what --tag means, and both together must all match.
	same := func(a, b []string) {
		t.Helper()
		if x, y := f.ts.ctlOK(a...).stdout, f.ts.ctlOK(b...).stdout; x != y {
			t.Errorf("%v printed\n%s\n%v printed\n%s", a, x, b, y)
		}
	}
	same([]string{"get", "agents", "-l", "role=db"}, []string{"get", "agents", "--tag", "role=db"})
	same([]string{"get", "pipes", "-l", "role=web"}, []string{"get", "pipes", "--tag", "role=web"})
	same([]string{"get", "agents", "--tag", "env=prod", "-l", "role=db", "-o", "name"}, []string{"get", "agents", "-l", "role=db,env=prod", "-o", "name"})
	if r := f.ts.ctlOK("get", "agents", "--tag", "role=db", "-l", "role=db", "-o", "name"); r.stdout != "agent/"+f.db.id+"\n" {
		t.Errorf("the same tag by --tag and -l: %q", r.stdout)
	}
	if r := f.ts.ctl("get", "agents", "--tag", "role=db", "-l", "role=web"); r.code != 2 || !strings.Contains(r.stderr, `tag "role" given twice`) {
		t.Errorf("--tag role=db -l role=web: %s", r)
	}
	if r := f.ts.ctlOK("get", "agents", "-l", "env=prod", "-l", "role=batch"); strings.Count(r.stdout, "\n") != 1 {
		t.Errorf("-l env=prod -l role=batch should match nothing:\n%s", r.stdout)
	}
	if r := f.ts.ctl("get", "runs", "-l", "role=db"); r.code != 2 || !strings.Contains(r.stderr, "--selector does not apply to get runs") {
		t.Errorf("get runs -l: %s", r)
	}
	if r := f.ts.ctl("get", "agents", "-l", "role"); r.code != 2 {
		t.Errorf("-l role: %s", r)
	}
	if r := f.ts.ctl("describe", "pipe", "backup-db", "-o", "name"); r.code != 2 || !strings.Contains(r.stderr, "-o name") {
		t.Errorf("describe -o name: %s", r)
	}
	if r := f.ts.ctl("get", "pipes", "-o", "nam"); r.code != 2 || !strings.Contains(r.stderr, "table, wide, json, yaml or name") {
		t.Errorf("-o nam: %s", r)
	}
}

// syncBuffer is a bytes.Buffer safe to read while a command writes it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// startWatch runs droverctl args in the background; stop ends it (as
// Ctrl-C does) and returns its exit code.
func startWatch(t *testing.T, ts *testServer, args ...string) (out, errb *syncBuffer, stop func() int) {
	out, errb = &syncBuffer{}, &syncBuffer{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int, 1)
	env := ts.env()
	go func() {
		done <- Run(ctx, args, Env{Stdout: out, Stderr: errb, Getenv: func(k string) string { return env[k] }, Now: func() time.Time { return testNow }})
	}()
	stopped := false
	code := 0
	stop = func() int {
		if !stopped {
			stopped = true
			cancel()
			select {
			case code = <-done:
			case <-time.After(10 * time.Second):
				t.Fatalf("droverctl %v did not stop within 10s of its context", args)
			}
		}
		return code
	}
	t.Cleanup(func() { stop() })
	return out, errb, stop
}

// waitFor waits until cond holds for out's text.
func waitFor(t *testing.T, out *syncBuffer, what string, cond func(string) bool) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for !cond(out.String()) {
		if time.Now().After(deadline) {
			t.Fatalf("waiting for %s; output so far:\n%s", what, out.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func TestGetRunsWatch(t *testing.T) {
	f := newFleet(t)
	out, errb, stop := startWatch(t, f.ts, "get", "runs", "-w", "--watch-interval", "500ms")
	waitFor(t, out, "the first list", func(s string) bool { return strings.Contains(s, "run-0001") && strings.Contains(s, "run-0003") })
	first := out.String()
	// An unchanged list prints nothing more.
	time.Sleep(1200 * time.Millisecond)
	if s := out.String(); s != first {
		t.Fatalf("output grew with nothing changed:\n%s", s[len(first):])
	}
	// A new run, and the running one finishing, each print one row.
	start := f.runStart.Add(3 * time.Hour)
	f.web.runStarted("run-0004", "rotate-logs", 1, start)
	waitFor(t, out, "the new run", func(s string) bool { return strings.Contains(s, "run-0004") })
	f.db.runFinished("run-0003", "backup-db", 1, agentpb.RunStatus_RUN_STATUS_SUCCEEDED, 0, f.runStart.Add(2*time.Hour), 2*time.Second, 1)
	waitFor(t, out, "the finished run", func(s string) bool {
		for _, l := range strings.Split(s[len(first):], "\n") {
			if strings.HasPrefix(l, "run-0003") && strings.Contains(l, "succeeded") {
				return true
			}
		}
		return false
	})
	if code := stop(); code != 0 {
		t.Fatalf("watch ended with %d: %s", code, errb.String())
	}
	s := out.String()
	if n := strings.Count(s, "ID "); n != 1 {
		t.Errorf("the header was printed %d times:\n%s", n, s)
	}
	later := s[len(first):]
	if strings.Contains(later, "run-0001") || strings.Contains(later, "run-0002") || strings.Count(later, "run-0004") != 1 {
		t.Errorf("after the first list, only changed rows belong:\n%s", later)
	}
	// Unchanged lists were answered 304 Not Modified.
	code, metrics := f.ts.api("GET", "/metrics", nil)
	if code != 200 || !strings.Contains(string(metrics), `code="304",route="GET /api/v1/runs"`) {
		t.Errorf("no 304 answer to GET /api/v1/runs in /metrics (%d)", code)
	}
}

func TestGetWatchJSONAndName(t *testing.T) {
	f := newFleet(t)
	out, _, stop := startWatch(t, f.ts, "get", "agents", "-w", "-o", "json", "--watch-interval", "500ms")
	waitFor(t, out, "three agents", func(s string) bool { return strings.Count(s, "\n") >= 3 })
	f.ts.ctlOK("agents", "tag", f.batch.id, "tier=2")
	waitFor(t, out, "the tagged agent", func(s string) bool { return strings.Contains(s, `"tier":"2"`) })
	stop()
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 4 {
		t.Errorf("want 3 agents then the changed one, one JSON object a line:\n%s", out.String())
	}
	for _, l := range lines {
		var ag api.Agent
		if err := json.Unmarshal([]byte(l), &ag); err != nil || ag.ID == "" {
			t.Errorf("not an agent on one line: %q (%v)", l, err)
		}
	}

	out, _, stop = startWatch(t, f.ts, "get", "pipes", "-w", "-o", "name", "--watch-interval", "500ms")
	waitFor(t, out, "three pipes", func(s string) bool { return strings.Count(s, "\n") == 3 })
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{"new.yaml": "name: new-pipe\nschedule: '@daily'\nscript: echo\n"})
	f.ts.ctlOK("apply", "-f", dir)
	waitFor(t, out, "the new pipe", func(s string) bool { return strings.Contains(s, "pipe/new-pipe") })
	stop()
	if got := out.String(); got != "pipe/backup-db\npipe/rotate-logs\npipe/vacuum-db\npipe/new-pipe\n" {
		t.Errorf("get pipes -w -o name:\n%s", got)
	}

	for _, args := range [][]string{
		{"get", "tokens", "-w"},
		{"get", "runs", "-w", "--watch-interval", "10ms"},
	} {
		if r := f.ts.ctl(args...); r.code != 2 {
			t.Errorf("%v: %s", args, r)
		}
	}
	// A watch of something missing fails at once.
	if r := f.ts.ctl("get", "fires", "no-such-pipe", "-w"); r.code != 1 {
		t.Errorf("get fires no-such-pipe -w: %s", r)
	}
}

func TestDeletePipe(t *testing.T) {
	f := newFleet(t)
	var before api.Agent
	if code, b := f.ts.api("GET", "/api/v1/agents/"+f.db.id, nil); code != 200 || json.Unmarshal(b, &before) != nil || before.Manifest == nil {
		t.Fatalf("agent: %d %s", code, b)
	}
	snap := f.ts.pipesSnapshot()
	f.check(t, "delete-pipe-dry-run.txt", "delete", "pipe", "vacuum-db", "--dry-run")
	if f.ts.pipesSnapshot() != snap {
		t.Fatal("--dry-run changed the pipes")
	}
	// One missing name: nothing is deleted.
	if r := f.ts.ctl("delete", "pipe", "vacuum-db", "no-such"); r.code != 1 || !strings.Contains(r.stderr, "pipe no-such") || !strings.Contains(r.stderr, "nothing was deleted") {
		t.Errorf("delete with a missing pipe: %s", r)
	}
	if f.ts.pipesSnapshot() != snap {
		t.Fatal("a failed delete changed the pipes")
	}
	f.check(t, "delete-pipe.txt", "delete", "pipe", "vacuum-db")
	if r := f.ts.ctl("get", "pipe", "vacuum-db"); r.code != 1 {
		t.Errorf("the pipe is still there: %s", r)
	}
	// The deletion is audited and the agent's manifest is recompiled without it.
	if r := f.ts.ctlOK("audit", "--action", "pipes.delete", "-o", "json"); !strings.Contains(r.stdout, `"target": "pipe/vacuum-db"`) {
		t.Errorf("no audit entry for the deletion:\n%s", r.stdout)
	}
	var after api.Agent
	if code, b := f.ts.api("GET", "/api/v1/agents/"+f.db.id, nil); code != 200 || json.Unmarshal(b, &after) != nil || after.Manifest == nil {
		t.Fatalf("agent: %d %s", code, b)
	}
	if after.Manifest.Serial <= before.Manifest.Serial {
		t.Errorf("the agent's manifest was not recompiled: serial %d then %d", before.Manifest.Serial, after.Manifest.Serial)
	}
	if r := f.ts.ctlOK("get", "pipes", "--agent", f.db.id, "-o", "name"); r.stdout != "pipe/backup-db\n" {
		t.Errorf("the db agent's pipes after the deletion: %q", r.stdout)
	}
	f.check(t, "delete-pipe.json", "delete", "pipe", "backup-db", "-o", "json")
	for _, args := range [][]string{{"delete"}, {"delete", "pipe"}, {"delete", "agent", "x"}, {"delete", "pipe", "Bad Name"}} {
		if r := f.ts.ctl(args...); r.code != 2 {
			t.Errorf("%v: %s", args, r)
		}
	}
}

func TestVersion(t *testing.T) {
	ts := startServer(t)
	if r := ts.ctlOK("version"); r.stdout != "Client Version: dev\nServer Version: dev\n" {
		t.Errorf("version: %q", r.stdout)
	}
	if r := ts.ctlOK("version", "-o", "json"); r.stdout != "{\n  \"client\": \"dev\",\n  \"server\": \"dev\"\n}\n" {
		t.Errorf("version -o json: %q", r.stdout)
	}
	// --client asks no server.
	if r := runCtl(context.Background(), nil, "", "version", "--client"); r.code != 0 || r.stdout != "Client Version: dev\n" {
		t.Errorf("version --client: %s", r)
	}
	if r := runCtl(context.Background(), map[string]string{"DROVER_SERVER": "https://127.0.0.1:1", "DROVER_TOKEN": "x"}, "", "version"); r.code != 1 ||
		r.stdout != "Client Version: dev\n" || !strings.Contains(r.stderr, "cannot reach") {
		t.Errorf("version with the server down: %s", r)
	}
}

func TestCompletionFromServer(t *testing.T) {
	f := newFleet(t)
	for _, c := range []struct {
		golden string
		args   []string
	}{
		{"complete-get-pipes.txt", []string{"__complete", "get", "pipes", ""}},
		{"complete-get-agents.txt", []string{"__complete", "get", "agents", ""}},
		{"complete-get-runs.txt", []string{"__complete", "get", "runs", "run-000"}},
		{"complete-get.txt", []string{"__complete", "get", ""}},
		{"complete-output.txt", []string{"__complete", "get", "pipes", "-o", ""}},
		{"complete-logs.txt", []string{"__complete", "logs", ""}},
		{"complete-agents-revoke.txt", []string{"__complete", "agents", "revoke", "agt"}},
		{"complete-delete-pipe.txt", []string{"__complete", "delete", "pipe", "backup-db", ""}},
	} {
		t.Run(c.golden, func(t *testing.T) { f.check(t, c.golden, c.args...) })
	}
	// Without a server: no names, no error.
	r := runCtl(context.Background(), map[string]string{"DROVER_SERVER": "https://127.0.0.1:1", "DROVER_TOKEN": "x"}, "", "__complete", "get", "pipes", "")
	if r.code != 0 || r.stdout != ":4\n" {
		t.Errorf("completion with the server down: %s", r)
	}
}

// get fires -w and get events -w: a run reported late changes its fire
// time's line and adds an event.
func TestWatchFiresAndEvents(t *testing.T) {
	ts, a, b, fire := monitoredPipe(t)
	a.runFinished("r-a", "nightly", 1, agentpb.RunStatus_RUN_STATUS_SUCCEEDED, 0, fire, time.Second, 0)
	since := fire.Add(-10 * time.Minute).Format(time.RFC3339)
	fires, _, stopFires := startWatch(t, ts, "get", "fires", "nightly", "--since", since, "-w", "--watch-interval", "500ms")
	events, _, stopEvents := startWatch(t, ts, "get", "events", "--kind", "run.failed", "-w", "--watch-interval", "500ms")
	at := fire.Format("15:04") + "  "
	waitFor(t, fires, "the fire time", func(s string) bool { return strings.Contains(s, at) })
	waitFor(t, events, "the header", func(s string) bool { return strings.HasPrefix(s, "AT ") })

	b.runFinished("r-b", "nightly", 1, agentpb.RunStatus_RUN_STATUS_FAILED, 1, fire, time.Second, 0)
	waitFor(t, fires, "the failed run's fire time", func(s string) bool { return strings.Contains(s, at+"2 expected  1 succeeded  1 failed\n") })
	waitFor(t, events, "the run.failed event", func(s string) bool { return strings.Contains(s, "r-b") })
	if code := stopFires(); code != 0 {
		t.Errorf("fires watch: exit %d", code)
	}
	if code := stopEvents(); code != 0 {
		t.Errorf("events watch: exit %d", code)
	}
	if s := events.String(); strings.Count(s, "AT ") != 1 || strings.Count(s, "r-b") != 1 {
		t.Errorf("get events -w:\n%s", s)
	}
}
