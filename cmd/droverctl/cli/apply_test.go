package cli

import (
	"crypto/rand"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/drover/drover/api"
	"github.com/drover/drover/manifest"
)

// pipesV1 is a directory of pipe YAML as it would sit in git.
var pipesV1 = map[string]string{
	"db.yaml": `# Database jobs
name: backup-db
description: Nightly database dump
schedule: "30 2 * * *"
timezone: Europe/Berlin
command: ["./bin/backup.sh", "--full"]
files: [bin/, lib/common.sh]
env: {PGHOST: localhost}
secrets: [PGPASSWORD]
timeout: 1h
catchup: once
jitter: 5m
hardening: strict
limits: {cpu_percent: 50, memory_mb: 512, tasks: 64}
targets: {tags: {role: db}}
---
name: vacuum-db
schedule: "@weekly"
script: |
  psql -c 'VACUUM ANALYZE'
targets: {tags: {role: db}}
`,
	"bin/backup.sh*": "#!/bin/sh\n. ./lib/common.sh\npg_dump mydb > /var/backups/mydb.sql\n",
	// A YAML file inside a bundled directory is payload, not a pipe.
	"bin/settings.yaml": "compress: true\n",
	"lib/common.sh":     "set -eu\n",
	"web/rotate.yml": `name: rotate-logs
schedule: "0 * * * *"
script: logrotate /etc/logrotate.conf
targets: {tags: {role: web}}
`,
	// Hidden directories and other files are not read.
	".git/config.yaml": "this: [is not a pipe\n",
	"README.md":        "Pipes of the fleet.\n",
}

// pipesV2 changes backup-db (schedule and payload), keeps vacuum-db, drops
// rotate-logs and adds report.
var pipesV2 = map[string]string{
	"db.yaml":           strings.Replace(pipesV1["db.yaml"], `schedule: "30 2 * * *"`, `schedule: "0 3 * * *"`, 1),
	"bin/backup.sh*":    "#!/bin/sh\n. ./lib/common.sh\npg_dump --format=custom mydb > /var/backups/mydb.dump\n",
	"bin/settings.yaml": "compress: true\n",
	"lib/common.sh":     "set -eu\n",
	"report.yaml": `name: report
schedule: "0 8 * * mon-fri"
timezone: America/New_York
script: echo report
targets: {tags: {env: prod}}
`,
}

// pipeVersions maps pipe names to their versions on the server.
func (ts *testServer) pipeVersions() map[string]uint64 {
	ts.t.Helper()
	var body api.PipeList
	if err := json.Unmarshal([]byte(ts.pipesSnapshot()), &body); err != nil {
		ts.t.Fatal(err)
	}
	out := map[string]uint64{}
	for _, p := range body.Pipes {
		out[p.Name] = p.Version
	}
	return out
}

func fmtVersions(m map[string]uint64) string {
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(m)) {
		parts = append(parts, fmt.Sprintf("%s=%d", k, m[k]))
	}
	return strings.Join(parts, " ")
}

func TestApplyRoundTrip(t *testing.T) {
	ts := startServer(t)
	web := ts.enroll("web-1", map[string]string{"role": "web", "env": "prod"}, true)
	db := ts.enroll("db-1", map[string]string{"role": "db", "env": "prod"}, true)
	dir := t.TempDir()
	writeFiles(t, filepath.Join(dir, "v1"), pipesV1)
	writeFiles(t, filepath.Join(dir, "v2"), pipesV2)
	t.Chdir(dir)
	m := &masker{}
	m.add(web.id, "agt-web1")
	m.add(db.id, "agt-db1")

	// Dry run of a create: nothing changes; agents are computed.
	r := ts.ctlOK("apply", "-f", "v1", "--dry-run")
	golden(t, "apply-v1-dry-run.txt", m.apply(r.stdout))
	if v := ts.pipeVersions(); len(v) != 0 {
		t.Fatalf("a dry run created pipes: %v", v)
	}

	// Create.
	r = ts.ctlOK("apply", "-f", "v1")
	golden(t, "apply-v1.txt", r.stdout)
	if got := fmtVersions(ts.pipeVersions()); got != "backup-db=1 rotate-logs=1 vacuum-db=1" {
		t.Fatalf("after apply v1: %s", got)
	}
	// The bundle holds bin/ (with settings.yaml) and lib/common.sh.
	code, b := ts.api("GET", "/api/v1/pipes/backup-db", nil)
	if code != 200 || !strings.Contains(string(b), `"files":["bin/","lib/common.sh"]`) {
		t.Fatalf("backup-db: %d %s", code, b)
	}

	// Again: nothing changes, and diff agrees.
	r = ts.ctlOK("apply", "-f", "v1")
	if r.stdout != "pipe/backup-db unchanged\npipe/vacuum-db unchanged\npipe/rotate-logs unchanged\n" {
		t.Fatalf("re-apply:\n%s", r)
	}
	r = ts.ctlOK("diff", "-f", "v1")
	if r.stdout != "No differences.\n" {
		t.Fatalf("diff after apply:\n%s", r)
	}

	// Diff against v2 (with --prune: rotate-logs would go).
	r = ts.ctlOK("diff", "-f", "v2", "--prune")
	golden(t, "diff-v2-prune.txt", r.stdout)

	// Dry run of v2 with --prune, as a table and as JSON.
	before := ts.pipesSnapshot()
	r = ts.ctlOK("apply", "-f", "v2", "--prune", "--dry-run")
	golden(t, "apply-v2-prune-dry-run.txt", m.apply(r.stdout))
	r = ts.ctlOK("apply", "-f", "v2", "--prune", "--dry-run", "-o", "json")
	golden(t, "apply-v2-prune-dry-run.json", m.apply(r.stdout))
	if ts.pipesSnapshot() != before {
		t.Fatal("a dry run changed the server")
	}

	// Update without --prune: rotate-logs stays.
	r = ts.ctlOK("apply", "-f", "v2")
	golden(t, "apply-v2.txt", r.stdout)
	if got := fmtVersions(ts.pipeVersions()); got != "backup-db=2 report=1 rotate-logs=1 vacuum-db=1" {
		t.Fatalf("after apply v2: %s", got)
	}

	// --prune removes it.
	r = ts.ctlOK("apply", "-f", "v2", "--prune", "-o", "json")
	golden(t, "apply-v2-prune.json", r.stdout)
	if got := fmtVersions(ts.pipeVersions()); got != "backup-db=2 report=1 vacuum-db=1" {
		t.Fatalf("after apply v2 --prune: %s", got)
	}
	r = ts.ctlOK("diff", "-f", "v2", "--prune")
	if r.stdout != "No differences.\n" {
		t.Fatalf("diff after prune:\n%s", r)
	}

	// Back to v1 from one file plus stdin; single files work as well as directories.
	stdin, err := os.ReadFile(filepath.Join("v1", "web", "rotate.yml"))
	if err != nil {
		t.Fatal(err)
	}
	r = runCtl(t.Context(), ts.env(), string(stdin), "apply", "-f", "v1/db.yaml", "-f", "-")
	if r.code != 0 || r.stdout != "pipe/backup-db configured (version 3)\npipe/vacuum-db unchanged\npipe/rotate-logs created (version 2)\n" {
		t.Fatalf("apply file + stdin:\n%s", r)
	}

	// --prune with no pipes would delete everything: refused.
	writeFiles(t, "empty", map[string]string{"README.md": "nothing\n"})
	r = ts.ctl("apply", "-f", "empty", "--prune")
	if r.code != 1 || !strings.Contains(r.stderr, "no pipe in the files would delete every pipe") {
		t.Fatalf("prune with nothing:\n%s", r)
	}
}

// TestApplyDryRunAgents: the per-agent view comes from the server's dry-run
// endpoint; the client's own computation (for servers without one) agrees.
func TestApplyDryRunAgents(t *testing.T) {
	ts := startServer(t)
	ts.requireEndpoint("POST", "/api/v1/pipes/x/dry-run", map[string]any{"spec": map[string]any{"schedule": "@daily", "script": "true"}}, "the pipe dry-run endpoint")
	ts.enroll("web-1", map[string]string{"role": "web", "env": "prod"}, true)
	ts.enroll("db-1", map[string]string{"role": "db", "env": "prod"}, true)
	ts.enroll("batch-1", map[string]string{"role": "batch", "env": "prod"}, false)
	dir := t.TempDir()
	writeFiles(t, filepath.Join(dir, "v1"), pipesV1)
	writeFiles(t, filepath.Join(dir, "v2"), pipesV2)
	t.Chdir(dir)
	ts.ctlOK("apply", "-f", "v1")
	agents := func(from string) string {
		t.Helper()
		r := ts.ctlOK("apply", "-f", "v2", "--prune", "--dry-run", "-o", "json")
		var res applyResult
		if err := json.Unmarshal([]byte(r.stdout), &res); err != nil {
			t.Fatal(err)
		}
		if res.AgentsFrom != from {
			t.Fatalf("agents from %q, want %q", res.AgentsFrom, from)
		}
		var lines []string
		for _, ch := range res.Pipes {
			var as []string
			for _, a := range ch.Agents {
				as = append(as, a.Hostname+":"+a.Action)
			}
			sort.Strings(as)
			lines = append(lines, ch.Name+" "+ch.Action+" "+strings.Join(as, ","))
		}
		return strings.Join(lines, "\n")
	}
	server := agents("server")
	want := "backup-db update db-1:update\nvacuum-db unchanged \nreport create batch-1:add,db-1:add,web-1:add\nrotate-logs delete web-1:remove"
	if server != want {
		t.Fatalf("server dry run:\n%s\nwant\n%s", server, want)
	}
	useServerDryRun = false
	defer func() { useServerDryRun = true }()
	if client := agents("client"); client != server {
		t.Fatalf("client dry run:\n%s\nserver:\n%s", client, server)
	}
}

// TestApplyBadInput: every bad file is refused with exit 1 and a precise
// FILE:LINE: FIELD: MESSAGE, and nothing reaches the server, even when the
// other files are fine.
func TestApplyBadInput(t *testing.T) {
	ts := startServer(t)
	dir := t.TempDir()
	t.Chdir(dir)
	writeFiles(t, "good", map[string]string{"ok.yaml": "name: fine\nschedule: '@daily'\nscript: 'true'\n"})
	// An existing pipe: a failed apply must neither change nor prune it.
	ts.ctlOK("apply", "-f", "good")
	before := ts.pipesSnapshot()

	big := make([]byte, 10<<20+512<<10) // incompressible, over the 10 MiB cap
	if _, err := rand.Read(big); err != nil {
		t.Fatal(err)
	}
	var many strings.Builder
	for i := 0; i < 10000; i++ {
		fmt.Fprintf(&many, "name: p%d\nschedule: '@daily'\nscript: 'true'\n---\n", i)
	}
	cases := []struct {
		name  string
		files map[string]string
		want  []string // lines expected on stderr
	}{
		{"malformed", map[string]string{"a.yaml": "name: x\n  schedule: '@daily'\nscript: echo\n"},
			[]string{"bad/a.yaml:2: mapping values are not allowed in this context"}},
		{"unknown-field", map[string]string{"a.yaml": "name: x\nschedule: '@daily'\nscript: echo\nretry: 3\n"},
			[]string{"bad/a.yaml:4: retry: unknown field (known: catchup, command, description, enabled, env, files, grace, hardening, interpreter, jitter, limits, max_duration, name, placement, retries, run_as, schedule, script, secrets, targets, timeout, timezone, writable_paths)"}},
		{"unknown-nested-field", map[string]string{"a.yaml": "name: x\nschedule: '@daily'\nscript: echo\nlimits:\n  memory: 5\n"},
			[]string{"bad/a.yaml:5: limits.memory: unknown field (known: cpu_percent, memory_mb, tasks)"}},
		{"payload-over-cap", map[string]string{"a.yaml": "name: x\nschedule: '@daily'\ncommand: [./run]\nfiles: [run, blob]\n", "run*": "#!/bin/sh\n", "blob": string(big)},
			[]string{"bad/a.yaml:4: files: the payload is "}},
		{"10000-documents", map[string]string{"many.yaml": many.String()},
			[]string{"bad/many.yaml: more than 1000 documents; split the file"}},
		{"invalid-cron", map[string]string{"a.yaml": "name: x\nschedule: '61 * * * *'\nscript: echo\n"},
			[]string{"bad/a.yaml:2: schedule: "}},
		{"quartz-cron", map[string]string{"a.yaml": "name: x\nschedule: '0 0 L * ?'\nscript: echo\n"},
			[]string{"bad/a.yaml:2: schedule: "}},
		{"unknown-timezone", map[string]string{"a.yaml": "name: x\nschedule: '@daily'\ntimezone: Mars/Olympus_Mons\nscript: echo\n"},
			[]string{`bad/a.yaml:3: timezone: unknown time zone "Mars/Olympus_Mons"`}},
		{"duplicate-in-file", map[string]string{"a.yaml": "name: x\nschedule: '@daily'\nscript: echo\n---\nname: x\nschedule: '@hourly'\nscript: echo\n"},
			[]string{"bad/a.yaml:5: name: duplicate of [0] (x)"}},
		{"duplicate-across-files", map[string]string{"a.yaml": "name: x\nschedule: '@daily'\nscript: echo\n", "b/c.yaml": "\n\nname: x\nschedule: '@daily'\nscript: echo\n"},
			[]string{`bad/b/c.yaml:3: name: "x" is also defined at bad/a.yaml:1`}},
		{"name-dotdot", map[string]string{"a.yaml": "name: ../etc\nschedule: '@daily'\nscript: echo\n"},
			[]string{`bad/a.yaml:1: name: "../etc" is not a valid name`}},
		{"name-newline", map[string]string{"a.yaml": "name: \"a\\nb\"\nschedule: '@daily'\nscript: echo\n"},
			[]string{`bad/a.yaml:1: name: "a\nb" is not a valid name`}},
		{"name-percent", map[string]string{"a.yaml": "name: a%n\nschedule: '@daily'\nscript: echo\n"},
			[]string{`bad/a.yaml:1: name: "a%n" is not a valid name`}},
		{"files-dotdot", map[string]string{"a.yaml": "name: x\nschedule: '@daily'\ncommand: [./run]\nfiles: [../secret]\n"},
			[]string{`bad/a.yaml:4: files[0]: "../secret" must not leave the pipe's directory`}},
		{"files-missing", map[string]string{"a.yaml": "name: x\nschedule: '@daily'\ncommand: [./run]\nfiles: [run]\n"},
			[]string{"bad/a.yaml:4: files: lstat run: no such file or directory"}},
		{"command-not-executable", map[string]string{"a.yaml": "name: x\nschedule: '@daily'\ncommand: [./run]\nfiles: [run]\n", "run": "#!/bin/sh\n"},
			[]string{`bad/a.yaml:3: command[0]: "./run" is not executable (chmod +x it)`}},
		{"several-problems", map[string]string{"a.yaml": "name: x\nschedule: '* * * * 8'\nscript: echo\ncatchup: sometimes\n", "z.yaml": "name: Upper\nschedule: '@reboot'\nscript: echo\n"},
			[]string{"bad/a.yaml:2: schedule: ", `bad/a.yaml:4: catchup: "sometimes" is not one of once, all, skip`, `bad/z.yaml:1: name: "Upper" is not a valid name`, "bad/z.yaml:2: schedule: ", "4 problems in 2 files; nothing was sent to the server"}},
		{"not-a-mapping", map[string]string{"a.yaml": "- name: x\n"},
			[]string{"bad/a.yaml:1: a pipe must be a mapping of fields"}},
		{"empty-file", map[string]string{"a.yaml": "# nothing\n"},
			[]string{"bad/a.yaml: no pipe in this file"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			os.RemoveAll("bad")
			writeFiles(t, "bad", c.files)
			for _, args := range [][]string{
				{"apply", "-f", "good", "-f", "bad", "--prune"},
				{"apply", "-f", "good", "-f", "bad", "--dry-run"},
				{"diff", "-f", "good", "-f", "bad"},
			} {
				r := ts.ctl(args...)
				if r.code != 1 || r.stdout != "" {
					t.Fatalf("%v: want exit 1 and no output:\n%s", args, r)
				}
				for _, w := range c.want {
					if !strings.Contains(r.stderr, w) {
						t.Errorf("%v: stderr lacks %q:\n%s", args, w, r.stderr)
					}
				}
				if !strings.Contains(r.stderr, "nothing was sent to the server") {
					t.Errorf("%v: stderr lacks the summary:\n%s", args, r.stderr)
				}
			}
			if ts.pipesSnapshot() != before {
				t.Fatal("the server changed")
			}
		})
	}
	os.RemoveAll("bad")

	// A problem only the server sees (its payload cap is lower than the
	// one given here) is found by its dry run before anything changes, and
	// is reported against the file.
	writeFiles(t, "bad", map[string]string{"a.yaml": "name: x\nschedule: '@daily'\ncommand: [./run]\nfiles: [run, blob]\n", "run*": "#!/bin/sh\n", "blob": string(big),
		"b.yaml": "name: fresh\nschedule: '@daily'\nscript: 'true'\n"})
	r := ts.ctl("apply", "-f", "bad", "--max-payload-bytes", "20000000")
	if r.code != 1 || r.stdout != "" || !strings.Contains(r.stderr, "bad/a.yaml:4: files: ") || !strings.Contains(r.stderr, "the server refused pipe x") {
		t.Fatalf("server-side refusal:\n%s", r)
	}
	if ts.pipesSnapshot() != before {
		t.Fatal("the server changed")
	}
	os.RemoveAll("bad")

	// A missing path, and a -f that is not YAML.
	r = ts.ctl("apply", "-f", "nowhere")
	if r.code != 1 || !strings.Contains(r.stderr, "nowhere: no such file or directory") {
		t.Fatalf("missing path:\n%s", r)
	}
	if ts.pipesSnapshot() != before {
		t.Fatal("the server changed")
	}
}

// TestApplyServerRefusal: a problem only the server sees (a secret-less
// field is fine locally, but the server refuses something) is mapped back
// to the file and line. Here: a file the server's cap refuses when the
// server's cap is lower than the client's.
func TestApplyServerRefusalIsMapped(t *testing.T) {
	ch := &change{Name: "x"}
	f, err := manifest.DecodeSpecFile([]byte("name: x\nschedule: '@daily'\nscript: echo\n"))
	if err != nil {
		t.Fatal(err)
	}
	lp := &localPipe{src: &source{name: "p.yaml", specs: f}}
	ch.local = lp
	var errb strings.Builder
	a := &app{env: &Env{Stderr: &errb}}
	err = a.pipeError(ch, &apiError{err: &api.Error{Status: 422, ErrorInfo: api.ErrorInfo{Code: "validation_failed", Message: "the request has invalid fields",
		Details: []api.Detail{{Field: "spec.schedule", Message: "nope"}, {Field: "bundle", Message: "too big"}}}}})
	if err == nil || !strings.Contains(err.Error(), "the server refused pipe x") {
		t.Fatalf("err = %v", err)
	}
	if errb.String() != "p.yaml:2: schedule: nope\np.yaml:1: files: too big\n" {
		t.Fatalf("stderr:\n%s", errb.String())
	}
}
