package e2e

import (
	"bytes"
	"encoding/json"
	"errors"
	"github.com/drover/drover/internal/testkit"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestDroverctlApplyRoundTrip drives the operator path end to end with the
// real binaries: `droverctl apply` of a directory of pipe YAML (with a
// bundled command) against a real drover-server, a real drover-agent (cron
// backend, so the test needs no systemd) picking the pipes up, then an
// update of a bundled file, `--prune`, `--dry-run`, and a run of the new
// payload whose output reaches the server.
func TestDroverctlApplyRoundTrip(t *testing.T) {
	t.Parallel()
	srv := startServer(t)
	tags := map[string]string{"e2e": "ctl"}
	ag, id := enrolledAgent(t, srv, agentOpts{name: "agent-ctl", backend: "cron", tags: tags})

	dir := t.TempDir()
	write := func(rel, body string, mode os.FileMode) {
		t.Helper()
		p := filepath.Join(dir, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), mode); err != nil {
			t.Fatal(err)
		}
	}
	target := "targets: {tags: {e2e: ctl}}\n"
	write("pipes.yaml", "name: ctl-a\nschedule: '@daily'\nscript: echo a\n"+target+
		"---\nname: ctl-b\nschedule: '@daily'\ncommand: [./run.sh]\nfiles: [run.sh, lib/]\n"+target, 0o644)
	write("run.sh", "#!/bin/sh\n. ./lib/words.sh\necho \"ctl-b says $WORD\"\n", 0o755)
	write("lib/words.sh", "WORD=first\n", 0o644)
	write("more/c.yaml", "name: ctl-c\nschedule: '*/10 * * * *'\nscript: echo c\n"+target, 0o644)

	home := t.TempDir()
	// ctlExit runs droverctl and returns its output and exit code.
	ctlExit := func(args ...string) (string, string, int) {
		t.Helper()
		cmd := exec.Command(ctlBin(), args...)
		cmd.Env = childEnv("HOME="+home, "XDG_CONFIG_HOME="+home, "DROVER_SERVER="+srv.base,
			"DROVER_TOKEN="+srv.admin, "DROVER_CA="+filepath.Join(srv.dataDir, "ca.crt"))
		var out, errb bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errb
		err := cmd.Run()
		var ee *exec.ExitError
		switch {
		case err == nil:
			return out.String(), errb.String(), 0
		case errors.As(err, &ee):
			return out.String(), errb.String(), ee.ExitCode()
		}
		t.Fatalf("droverctl %v: %v", args, err)
		return "", "", -1
	}
	ctl := func(args ...string) (string, string) {
		t.Helper()
		out, errs, code := ctlExit(args...)
		if code != 0 {
			t.Fatalf("droverctl %v: exit %d\nstdout:\n%s\nstderr:\n%s", args, code, out, errs)
		}
		return out, errs
	}
	serverPipes := func() []string {
		var out struct {
			Pipes []struct {
				Name string `json:"name"`
			} `json:"pipes"`
		}
		srv.api("GET", "/api/v1/pipes", nil, &out)
		var names []string
		for _, p := range out.Pipes {
			names = append(names, p.Name)
		}
		return names
	}

	// --dry-run shows the three pipes reaching the agent and changes nothing.
	out, _ := ctl("apply", "-f", dir, "--dry-run")
	for _, want := range []string{"ctl-a", "ctl-b", "ctl-c", id} {
		if !strings.Contains(out, want) {
			t.Fatalf("dry-run output lacks %q:\n%s", want, out)
		}
	}
	if names := serverPipes(); len(names) != 0 {
		t.Fatalf("dry-run created pipes: %v", names)
	}

	ctl("apply", "-f", dir)
	ag.waitPipes(60*time.Second, "ctl-a", "ctl-b", "ctl-c")
	payload := func() string {
		b, err := os.ReadFile(filepath.Join(ag.dataDir, "pipes", "ctl-b", "payload", "lib", "words.sh"))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	if got := payload(); got != "WORD=first\n" {
		t.Fatalf("bundled file on the host: %q", got)
	}

	// Update a bundled file: a new version reaches the host.
	write("lib/words.sh", "WORD=second\n", 0o644)
	ctl("apply", "-f", dir)
	testkit.WaitFor(t, 60*time.Second, "the updated bundle on the host", func() bool { return payload() == "WORD=second\n" })

	// --prune removes what the files no longer hold, from the server and the host.
	if err := os.RemoveAll(filepath.Join(dir, "more")); err != nil {
		t.Fatal(err)
	}
	out, _ = ctl("apply", "-f", dir, "--prune", "--dry-run")
	if !strings.Contains(out, "ctl-c") {
		t.Fatalf("prune dry-run does not name ctl-c:\n%s", out)
	}
	if names := serverPipes(); len(names) != 3 {
		t.Fatalf("prune dry-run changed the server: %v", names)
	}
	ctl("apply", "-f", dir, "--prune")
	ag.waitPipes(60*time.Second, "ctl-a", "ctl-b")

	// The new payload runs and its output reaches the server.
	req := srv.runNow("ctl-b", id)
	run := srv.runOfRequest(req.RequestID, 60*time.Second, "succeeded", "failed")
	if run.Status != "succeeded" || !strings.Contains(srv.logText(run.ID), "ctl-b says second") {
		t.Fatalf("run %s: %s, log %q", run.ID, run.Status, srv.logText(run.ID))
	}

	// `run --wait` from CI: a pipe applied and run at once (the agent syncs
	// before running it) succeeds with exit 0; a failing one exits 1.
	write("more/f.yaml", "name: ctl-f\nschedule: '@daily'\nscript: echo failing; exit 3\n"+target, 0o644)
	write("more/ok.yaml", "name: ctl-ok\nschedule: '@daily'\nscript: echo fine\n"+target, 0o644)
	ctl("apply", "-f", dir)
	out, errs, code := ctlExit("run", "ctl-ok", "--agent", id, "--wait", "--timeout", "60s", "-o", "json")
	var waited struct {
		Runs []struct {
			Status   string `json:"status"`
			AgentID  string `json:"agent_id"`
			ExitCode int    `json:"exit_code"`
		} `json:"runs"`
	}
	if err := json.Unmarshal([]byte(out), &waited); code != 0 || err != nil || len(waited.Runs) != 1 || waited.Runs[0].Status != "succeeded" || waited.Runs[0].AgentID != id {
		t.Fatalf("run --wait of a new pipe: exit %d, %v\nstdout:\n%s\nstderr:\n%s", code, err, out, errs)
	}
	out, errs, code = ctlExit("run", "ctl-f", "--wait", "--timeout", "60s")
	if code != 1 || !strings.Contains(out, "failed") || !strings.Contains(errs, "exit 3") {
		t.Fatalf("run --wait of a failing pipe: exit %d\nstdout:\n%s\nstderr:\n%s", code, out, errs)
	}
}
