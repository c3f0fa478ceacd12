package cli

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestReadSSE(t *testing.T) {
	stream := ": keep-alive\n\n" +
		"id: 0\nevent: chunk\ndata: {\"seq\":0,\"stream\":\"stdout\",\"at\":\"2030-01-15T10:00:00Z\",\"data\":\"aGVsbG8K\"}\n\n" +
		"id: 1\nevent: chunk\ndata: {\"seq\":1,\"stream\":\"stdout\",\"at\":\"2030-01-15T10:00:00Z\",\"data\":\"d29ybGQK\"}\n\n" +
		// A repeated chunk after a reconnect is printed once.
		"id: 1\nevent: chunk\ndata: {\"seq\":1,\"stream\":\"stdout\",\"at\":\"2030-01-15T10:00:00Z\",\"data\":\"d29ybGQK\"}\n\n" +
		"event: end\ndata: {\"id\":\"run-1\",\"status\":\"failed\",\"exit_code\":2,\"finished_at\":\"2030-01-15T10:00:01Z\"}\n\n"
	var out strings.Builder
	p := &chunkPrinter{a: &app{env: &Env{Stdout: &out}}, seen: map[uint64]bool{}}
	last := ""
	run, err := readSSE(strings.NewReader(stream), p, &last)
	if err != nil || run == nil || run.Status != "failed" || runExit(run) != "2" {
		t.Fatalf("run %+v, err %v", run, err)
	}
	if out.String() != "hello\nworld\n" || last != "1" {
		t.Fatalf("output %q, last id %q", out.String(), last)
	}
	// A stream that breaks without an end event says so.
	run, err = readSSE(strings.NewReader("id: 5\ndata: {\"seq\":5,\"data\":\"eA==\"}\n\n"), p, &last)
	if run != nil || err != io.EOF || last != "5" {
		t.Fatalf("broken stream: %v %v %q", run, err, last)
	}
}

func TestUnifiedDiff(t *testing.T) {
	a := strings.Split("a b c d e f g h i j k l", " ")
	b := strings.Split("a b C d e f g h i j k l m", " ")
	got := unifiedDiff("old", "new", a, b, 2)
	want := "--- old\n+++ new\n@@ -1,5 +1,5 @@\n a\n b\n-c\n+C\n d\n e\n@@ -11,2 +11,3 @@\n k\n l\n+m\n"
	if got != want {
		t.Fatalf("got\n%s\nwant\n%s", got, want)
	}
	if unifiedDiff("x", "y", a, a, 3) != "" {
		t.Fatal("equal inputs give a diff")
	}
	if got := unifiedDiff("x", "y", nil, []string{"n"}, 3); got != "--- x\n+++ y\n@@ -0,0 +1,1 @@\n+n\n" {
		t.Fatalf("from empty:\n%s", got)
	}
}

func TestNormalizeServer(t *testing.T) {
	for in, want := range map[string]string{
		"drover.example:8443":          "https://drover.example:8443",
		"https://drover.example:8443/": "https://drover.example:8443",
		"https://h/prefix/":            "https://h/prefix",
		" https://[::1]:8443 ":         "https://[::1]:8443",
	} {
		if got, err := normalizeServer(in); err != nil || got != want {
			t.Errorf("%q: %q, %v (want %q)", in, got, err, want)
		}
	}
	for _, bad := range []string{"http://h:8443", "https://", "https://u:p@h", "https://h?x=1", "ftp://h"} {
		if _, err := normalizeServer(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

func TestDropinLineIsSafe(t *testing.T) {
	tok := "drv1.abcdefghijklmnop." + strings.Repeat("A", 43) + "." + strings.Repeat("a", 64)
	line, err := dropinLine(tok, "/etc/drover/enroll.token")
	if err != nil || !strings.Contains(line, "'"+tok+"'") {
		t.Fatalf("%q %v", line, err)
	}
	for _, bad := range []string{"drv1.x.y'; rm -rf /; '.z", "drv1.abc.$(id)." + strings.Repeat("a", 64), tok + "\n"} {
		if _, err := dropinLine(bad, "/etc/drover/enroll.token"); err == nil {
			t.Errorf("%q put in a shell line", bad)
		}
	}
}

func TestSanitize(t *testing.T) {
	if got := sanitizeLine("a\x1b[31mb\tc\nd"); got != `a\x1b[31mb\tc\nd` {
		t.Fatalf("%q", got)
	}
	if got := sanitizeText("x\ny\x07"); got != "x\ny\\a" {
		t.Fatalf("%q", got)
	}
}

func TestJSONToYAML(t *testing.T) {
	y, err := jsonToYAML([]byte(`{"b":"1","a":true,"s":"x: y","n":2,"m":"l1\nl2\n","e":[],"z":null}`))
	if err != nil {
		t.Fatal(err)
	}
	want := "b: \"1\"\na: true\ns: 'x: y'\nn: 2\nm: |\n  l1\n  l2\ne: []\nz: null\n"
	if string(y) != want {
		t.Fatalf("got\n%s\nwant\n%s", y, want)
	}
}

// A YAML file named by -f inside a bundled directory is still a pipe file;
// found by walking, it is payload.
func TestLoadSkipsBundledYAML(t *testing.T) {
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{
		"p.yaml":          "name: p\nschedule: '@daily'\ncommand: [./conf/run]\nfiles: [conf]\n",
		"conf/run*":       "#!/bin/sh\n",
		"conf/x.yaml":     "not: a pipe\n",
		"other/link.yaml": "name: q\nschedule: '@daily'\nscript: echo\n",
	})
	if err := os.Symlink(filepath.Join(dir, "other", "link.yaml"), filepath.Join(dir, "sym.yaml")); err != nil {
		t.Fatal(err)
	}
	var warnings []string
	pipes, probs := loadPipes([]string{dir}, nil, func(f string, a ...any) { warnings = append(warnings, f) }, defaultMaxPayload)
	if len(probs) != 0 || len(pipes) != 2 || pipes[0].spec.Name != "q" || pipes[1].spec.Name != "p" {
		t.Fatalf("pipes %d, problems %v", len(pipes), probs)
	}
	if len(warnings) != 1 {
		t.Fatalf("warnings %v", warnings)
	}
	_, probs = loadPipes([]string{filepath.Join(dir, "conf", "x.yaml")}, nil, nil, defaultMaxPayload)
	if len(probs) != 1 || !strings.Contains(probs[0].String(), "not: unknown field") {
		t.Fatalf("explicit file: %v", probs)
	}
}

// TestVersionFlag: --version prints "droverctl version V", as drover-agent
// prints its own, and exits 0.
func TestVersionFlag(t *testing.T) {
	old := Version
	Version = "1.2.3"
	defer func() { Version = old }()
	var out strings.Builder
	if code := Run(context.Background(), []string{"--version"}, Env{Stdout: &out}); code != 0 || out.String() != "droverctl version 1.2.3\n" {
		t.Fatalf("exit %d, output %q", code, out.String())
	}
}
