package cli

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/drover/drover/units"
)

func runAgent(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	code := Run(context.Background(), args, Env{Stdout: &out, Stderr: &errb})
	return code, out.String(), errb.String()
}

func writePipe(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "pipe.yaml")
	if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestRenderWritesUnits(t *testing.T) {
	pipe := writePipe(t, "name: hello\ndescription: Say hello\nschedule: '*/5 * * * *'\nscript: echo hello\n")
	out := filepath.Join(t.TempDir(), "units")
	code, stdout, stderr := runAgent(t, "render", "--pipe", pipe, "--out", out)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	for _, name := range []string{"drover-pipe-hello.service", "drover-pipe-hello.timer"} {
		b, err := os.ReadFile(filepath.Join(out, name))
		if err != nil {
			t.Fatal(err)
		}
		if !units.IsManaged(b) {
			t.Errorf("%s lacks the managed header", name)
		}
		if !strings.Contains(stdout, name) {
			t.Errorf("stdout does not name %s: %q", name, stdout)
		}
	}
	svc, _ := os.ReadFile(filepath.Join(out, "drover-pipe-hello.service"))
	if !strings.Contains(string(svc), "ExecStart=/usr/bin/drover-agent run hello") {
		t.Errorf("service:\n%s", svc)
	}
}

func TestRenderPrints(t *testing.T) {
	pipe := writePipe(t, "name: hello\nschedule: '@daily'\nscript: echo hello\n")
	code, stdout, _ := runAgent(t, "render", "--pipe", pipe, "--scope", "user", "--agent-path", "/opt/drover/bin/drover-agent")
	if code != 0 || !strings.Contains(stdout, "# --- drover-pipe-hello.timer ---") || !strings.Contains(stdout, "ExecStart=/opt/drover/bin/drover-agent run hello") {
		t.Fatalf("exit %d:\n%s", code, stdout)
	}
	if strings.Contains(stdout, "DynamicUser") {
		t.Errorf("user scope must not use DynamicUser:\n%s", stdout)
	}
}

func TestRenderRefusesBadSpecAndWritesNothing(t *testing.T) {
	pipe := writePipe(t, "name: hello\nschedule: '61 * * * *'\nscript: echo\nbogus: 1\n")
	out := filepath.Join(t.TempDir(), "units")
	code, _, stderr := runAgent(t, "render", "--pipe", pipe, "--out", out)
	if code != 1 || !strings.Contains(stderr, "pipe.yaml:4: [0].bogus: unknown field") {
		t.Fatalf("exit %d, stderr:\n%s", code, stderr)
	}
	if _, err := os.Stat(out); !os.IsNotExist(err) {
		t.Fatalf("output dir created for a refused spec")
	}
	pipe = writePipe(t, "name: hello\nschedule: '61 * * * *'\nscript: echo\n")
	code, _, stderr = runAgent(t, "render", "--pipe", pipe)
	if code != 1 || !strings.Contains(stderr, "pipe.yaml:2: [0].schedule:") {
		t.Fatalf("exit %d, stderr:\n%s", code, stderr)
	}
	two := writePipe(t, "name: a\nschedule: '@daily'\nscript: x\n---\nname: b\nschedule: '@daily'\nscript: x\n")
	if code, _, stderr = runAgent(t, "render", "--pipe", two); code != 1 || !strings.Contains(stderr, "exactly one") {
		t.Fatalf("exit %d, stderr:\n%s", code, stderr)
	}
	if code, _, _ = runAgent(t, "render"); code != 2 {
		t.Fatalf("missing --pipe: exit %d, want 2", code)
	}
	if code, _, _ = runAgent(t, "render", "--pipe", pipe, "--scope", "galaxy"); code != 2 {
		t.Fatalf("bad scope: exit %d, want 2", code)
	}
}

// TestRenderNow: --now selects the DST correction lines the agent would
// render at that time, the same lines droverctl schedule explain --after
// prints.
func TestRenderNow(t *testing.T) {
	pipe := writePipe(t, "name: nightly\nschedule: '30 2 * * *'\ntimezone: America/New_York\nscript: ./backup\n")
	code, stdout, stderr := runAgent(t, "render", "--pipe", pipe, "--now", "2027-03-01T00:00:00Z")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	for _, w := range []string{"OnCalendar=*-*-* 02:30:00 America/New_York\n", "OnCalendar=2027-03-14 07:00:00 UTC\n", "OnCalendar=2028-03-12 07:00:00 UTC\n"} {
		if !strings.Contains(stdout, w) {
			t.Errorf("output lacks %q:\n%s", w, stdout)
		}
	}
	_, later, _ := runAgent(t, "render", "--pipe", pipe, "--now", "2027-06-01T00:00:00Z")
	if strings.Contains(later, "2027-03-14") || !strings.Contains(later, "OnCalendar=2027-11-07 07:30:00 UTC\n") {
		t.Errorf("--now 2027-06-01:\n%s", later)
	}
	if code, _, stderr := runAgent(t, "render", "--pipe", pipe, "--now", "soon"); code != 2 || !strings.Contains(stderr, "RFC 3339") {
		t.Errorf("--now soon: exit %d, %s", code, stderr)
	}
}
