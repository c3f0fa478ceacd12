package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"sort"
	"strings"
	"testing"
)

// histSpec is the YAML of the pipe "hist" with a schedule and a script.
func histSpec(schedule, script string) string {
	return fmt.Sprintf("name: hist\ndescription: history test\nschedule: %q\nscript: %s\ntargets: {tags: {role: db}}\n", schedule, script)
}

// histVersions are the schedules and scripts of hist's versions 1-3.
var histVersions = [][2]string{{"0 1 * * *", "echo one"}, {"0 2 * * *", "echo two"}, {"0 3 * * *", "echo three"}}

// newHistory starts a server and stores hist three times with droverctl
// apply: versions 1, 2 and 3 (current).
func newHistory(t *testing.T) *testServer {
	ts := startServer(t)
	file := filepath.Join(t.TempDir(), "hist.yaml")
	for i, v := range histVersions {
		if err := os.WriteFile(file, []byte(histSpec(v[0], v[1])), 0o644); err != nil {
			t.Fatal(err)
		}
		r := ts.ctlOK("apply", "-f", file)
		if want := fmt.Sprintf("(version %d)", i+1); !strings.Contains(r.stdout, want) {
			t.Fatalf("apply %d: want %q:\n%s", i+1, want, r)
		}
	}
	return ts
}

// apiVersion is GET /api/v1/pipes/{name}/versions/{version}, decoded.
func (ts *testServer) apiVersion(pipe string, version int) map[string]any {
	ts.t.Helper()
	code, b := ts.api("GET", fmt.Sprintf("/api/v1/pipes/%s/versions/%d", pipe, version), nil)
	if code != 200 {
		ts.t.Fatalf("GET version %d of %s: %d %s", version, pipe, code, b)
	}
	var v map[string]any
	if err := json.Unmarshal(b, &v); err != nil {
		ts.t.Fatal(err)
	}
	return v
}

// historyJSON is the output of history -o json, decoded.
type historyJSON struct {
	Name     string           `json:"name"`
	Deleted  bool             `json:"deleted"`
	Versions []map[string]any `json:"versions"`
}

func (ts *testServer) historyJSON(pipe string) historyJSON {
	ts.t.Helper()
	r := ts.ctlOK("history", pipe, "-o", "json")
	var h historyJSON
	if err := json.Unmarshal([]byte(r.stdout), &h); err != nil {
		ts.t.Fatalf("history -o json: %v\n%s", err, r)
	}
	return h
}

// versionNumbers lists the versions of a history, in its order.
func (h historyJSON) versionNumbers() []int {
	var out []int
	for _, v := range h.Versions {
		n, _ := v["version"].(float64)
		out = append(out, int(n))
	}
	return out
}

var tableRowRE = regexp.MustCompile(`\s{2,}`)

// tableRows splits a table's lines into cells (a header first).
func tableRows(out string) [][]string {
	var rows [][]string
	for _, l := range strings.Split(strings.TrimRight(out, "\n"), "\n") {
		rows = append(rows, tableRowRE.Split(strings.TrimSpace(l), -1))
	}
	return rows
}

func TestHistory(t *testing.T) {
	ts := newHistory(t)
	m := &masker{}

	// The table: newest first, the current version marked, each version's
	// schedule and payload.
	r := ts.ctlOK("history", "hist")
	golden(t, "history.txt", m.apply(r.stdout))
	rows := tableRows(r.stdout)
	if len(rows) != 4 || strings.Join(rows[0], "|") != "VERSION|CURRENT|CREATED|SCHEDULE|PAYLOAD" {
		t.Fatalf("history table:\n%s", r)
	}
	for i, row := range rows[1:] {
		v := 3 - i
		want := histVersions[v-1][0]
		cur := "-"
		if v == 3 {
			cur = "*"
		}
		digest, _ := ts.apiVersion("hist", v)["payload"].(map[string]any)["digest"].(string)
		if len(row) != 5 || row[0] != itoa(v) || row[1] != cur || !timeRE.MatchString(row[2]) || row[3] != want || row[4] != shortDigest(digest) {
			t.Errorf("history row %d: %q, want version %d, current %q, schedule %q, payload %s", i+1, row, v, cur, want, shortDigest(digest))
		}
	}
	if r.stderr != "" {
		t.Errorf("history wrote to stderr:\n%s", r)
	}

	// JSON: the API's objects with the API's field names.
	h := ts.historyJSON("hist")
	if h.Name != "hist" || h.Deleted || !reflect.DeepEqual(h.versionNumbers(), []int{3, 2, 1}) {
		t.Fatalf("history -o json: %+v", h)
	}
	for i, v := range h.Versions {
		keys := make([]string, 0, len(v))
		for k := range v {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		if strings.Join(keys, ",") != "created_at,current,name,payload,spec,version" {
			t.Errorf("version %v has the fields %v", v["version"], keys)
		}
		if v["current"] != (i == 0) || v["name"] != "hist" {
			t.Errorf("version %v: current %v, name %v", v["version"], v["current"], v["name"])
		}
		spec, _ := v["spec"].(map[string]any)
		if want := histVersions[2-i]; spec["schedule"] != want[0] || spec["script"] != want[1] {
			t.Errorf("version %v: spec %v, want schedule %q, script %q", v["version"], spec, want[0], want[1])
		}
		if !reflect.DeepEqual(v, ts.apiVersion("hist", 3-i)) {
			t.Errorf("version %v differs from the API's:\n%v\n%v", v["version"], v, ts.apiVersion("hist", 3-i))
		}
	}
	// YAML: the same names.
	r = ts.ctlOK("history", "hist", "-o", "yaml")
	if !strings.HasPrefix(r.stdout, "name: hist\ndeleted: false\nversions:\n  - name: hist\n    version: 3\n") || !strings.Contains(r.stdout, "    current: true\n") {
		t.Fatalf("history -o yaml:\n%s", r)
	}

	// One version: its spec as YAML under the details, or the API's JSON.
	r = ts.ctlOK("describe", "pipe", "hist", "--version", "1")
	golden(t, "describe-pipe-version.txt", m.apply(r.stdout))
	for _, want := range []string{"Name:         hist\n", "Version:      1\n", "Current:      false\n", "Schedule:     0 1 * * *\n",
		"\nSpec:\n  name: hist\n  description: history test\n  schedule: 0 1 * * *\n", "  script: echo one\n"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("describe pipe --version 1 lacks %q:\n%s", want, r)
		}
	}
	if strings.Contains(r.stdout, "echo three") {
		t.Errorf("describe pipe --version 1 shows the current spec:\n%s", r)
	}
	r = ts.ctlOK("describe", "pipe", "hist", "--version", "1", "-o", "json")
	var one map[string]any
	if err := json.Unmarshal([]byte(r.stdout), &one); err != nil || !reflect.DeepEqual(one, ts.apiVersion("hist", 1)) {
		t.Fatalf("describe pipe --version 1 -o json: %v\n%s", err, r)
	}
	// Without --version describe is as before: the current version.
	r = ts.ctlOK("describe", "pipe", "hist")
	if !strings.Contains(r.stdout, "Version:      3\n") || !strings.Contains(r.stdout, "script: echo three") {
		t.Fatalf("describe pipe:\n%s", r)
	}

	// Restore version 1: a new version 4 with version 1's spec and payload.
	r = ts.ctlOK("restore", "hist", "1")
	golden(t, "restore.txt", m.apply(r.stdout))
	if !strings.HasPrefix(r.stdout, "pipe/hist restored from version 1 (version 4, payload sha256:") {
		t.Fatalf("restore:\n%s", r)
	}
	v1, v4 := ts.apiVersion("hist", 1), ts.apiVersion("hist", 4)
	if !reflect.DeepEqual(v1["spec"], v4["spec"]) || !reflect.DeepEqual(v1["payload"], v4["payload"]) || v4["current"] != true {
		t.Fatalf("version 4 is not version 1:\n%v\n%v", v1, v4)
	}
	if got := ts.pipeVersions()["hist"]; got != 4 {
		t.Fatalf("current version after restore: %d", got)
	}
	r = ts.ctlOK("describe", "pipe", "hist")
	if !strings.Contains(r.stdout, "Version:      4\n") || !strings.Contains(r.stdout, "Schedule:     0 1 * * *\n") || !strings.Contains(r.stdout, "script: echo one") {
		t.Fatalf("describe pipe after restore:\n%s", r)
	}
	h = ts.historyJSON("hist")
	if !reflect.DeepEqual(h.versionNumbers(), []int{4, 3, 2, 1}) || h.Versions[0]["current"] != true || h.Versions[1]["current"] != false {
		t.Fatalf("history after restore: %+v", h)
	}
	// Restoring what is current changes nothing; -o json is the API's answer.
	r = ts.ctlOK("restore", "hist", "1", "-o", "json")
	var put map[string]any
	if err := json.Unmarshal([]byte(r.stdout), &put); err != nil || put["name"] != "hist" || put["version"] != float64(4) || put["created"] != false || put["digest"] != v1["payload"].(map[string]any)["digest"] {
		t.Fatalf("restore of the current spec -o json: %v\n%s", err, r)
	}
	r = ts.ctlOK("restore", "hist", "4")
	if r.stdout != "pipe/hist unchanged (version 4): version 4 matches the current spec\n" {
		t.Fatalf("restore of the current version:\n%s", r)
	}
	r = ts.ctlOK("restore", "hist", "2", "-o", "yaml")
	if !strings.HasPrefix(r.stdout, "name: hist\nversion: 5\ndigest: sha256:") || !strings.Contains(r.stdout, "\ncreated: true\nmanifests:\n  done: true\n") {
		t.Fatalf("restore -o yaml:\n%s", r)
	}

	// Errors: unknown versions and pipes are the server's 404, exit 1.
	before := ts.pipesSnapshot()
	for _, c := range []struct {
		args []string
		msg  string
	}{
		{[]string{"restore", "hist", "9"}, "droverctl: restore hist version 9: pipe version not found (not_found, HTTP 404)"},
		{[]string{"restore", "nope", "1"}, "droverctl: restore nope version 1: pipe not found (not_found, HTTP 404)"},
		{[]string{"history", "nope"}, "droverctl: pipe nope: pipe not found (not_found, HTTP 404)"},
		{[]string{"describe", "pipe", "hist", "--version", "9"}, "droverctl: pipe hist version 9: pipe version not found (not_found, HTTP 404)"},
	} {
		r := ts.ctl(c.args...)
		if r.code != 1 || r.stdout != "" || strings.TrimSpace(r.stderr) != c.msg {
			t.Errorf("%v: want exit 1 and %q:\n%s", c.args, c.msg, r)
		}
	}
	// Usage errors: exit 2, naming the argument; nothing is sent.
	for _, c := range []struct {
		args []string
		msg  string
	}{
		{[]string{"restore", "hist", "abc"}, `VERSION "abc": want a version number`},
		{[]string{"restore", "hist", "0"}, `VERSION "0": want a version number`},
		{[]string{"restore", "hist", "1.5"}, `VERSION "1.5"`},
		{[]string{"restore", "hist"}, "a pipe name and a VERSION"},
		{[]string{"describe", "pipe", "hist", "--version", "x"}, `--version "x": want a version number`},
		{[]string{"describe", "run", "r", "--version", "1"}, "--version applies to describe pipe only"},
		{[]string{"history"}, "a pipe name"},
	} {
		r := ts.ctl(c.args...)
		if r.code != 2 || r.stdout != "" || !strings.HasPrefix(r.stderr, "droverctl: ") || !strings.Contains(r.stderr, c.msg) {
			t.Errorf("%v: want exit 2 and %q:\n%s", c.args, c.msg, r)
		}
	}
	if ts.pipesSnapshot() != before {
		t.Fatal("a failed restore changed the pipes")
	}
}

func TestHistoryViewer(t *testing.T) {
	ts := newHistory(t)
	r := ts.ctlOK("api-tokens", "create", "--name", "ro", "--role", "viewer", "-o", "json")
	var tok struct{ Token string }
	if err := json.Unmarshal([]byte(r.stdout), &tok); err != nil || tok.Token == "" {
		t.Fatalf("api-tokens create: %v\n%s", err, r)
	}
	env := ts.env("DROVER_TOKEN", tok.Token)
	ctx := context.Background()
	if r := runCtl(ctx, env, "", "history", "hist"); r.code != 0 || len(tableRows(r.stdout)) != 4 {
		t.Fatalf("a viewer cannot list the history:\n%s", r)
	}
	if r := runCtl(ctx, env, "", "describe", "pipe", "hist", "--version", "2"); r.code != 0 || !strings.Contains(r.stdout, "script: echo two") {
		t.Fatalf("a viewer cannot show a version:\n%s", r)
	}
	r = runCtl(ctx, env, "", "restore", "hist", "1")
	if r.code != 1 || r.stdout != "" || !strings.Contains(r.stderr, "droverctl: restore hist version 1: ") || !strings.Contains(r.stderr, "(permission_denied, HTTP 403)") {
		t.Fatalf("a viewer's restore:\n%s", r)
	}
	if got := ts.pipeVersions()["hist"]; got != 3 {
		t.Fatalf("a viewer's restore made version %d", got)
	}
}

// TestHistoryDeletedAndPages lists a deleted pipe's history, brings it back,
// and follows the pages of a history longer than the server's page.
func TestHistoryDeletedAndPages(t *testing.T) {
	ts := startServer(t)
	const n = 103 // the server's default page is 100
	for i := 1; i <= n; i++ {
		spec := map[string]any{"name": "many", "schedule": "@daily", "script": fmt.Sprintf("echo %d", i), "targets": map[string]any{"tags": map[string]string{"role": "db"}}}
		if code, b := ts.api("PUT", "/api/v1/pipes/many", map[string]any{"spec": spec}); code != 201 {
			t.Fatalf("PUT %d: %d %s", i, code, b)
		}
	}
	h := ts.historyJSON("many")
	got := h.versionNumbers()
	if len(got) != n || got[0] != n || got[n-1] != 1 || !sort.SliceIsSorted(got, func(i, j int) bool { return got[i] > got[j] }) {
		t.Fatalf("history of %d versions: %d listed: %v", n, len(got), got)
	}
	r := ts.ctlOK("history", "many")
	if rows := tableRows(r.stdout); len(rows) != n+1 || rows[1][0] != itoa(n) || rows[n][0] != "1" {
		t.Fatalf("history table of %d versions: %d lines", n, len(rows)-1)
	}

	if code, b := ts.api("DELETE", "/api/v1/pipes/many", nil); code != 204 {
		t.Fatalf("DELETE: %d %s", code, b)
	}
	h = ts.historyJSON("many")
	if !h.Deleted || len(h.Versions) != n || h.Versions[0]["current"] != false {
		t.Fatalf("history of a deleted pipe: deleted %v, %d versions, first %v", h.Deleted, len(h.Versions), h.Versions[0])
	}
	r = ts.ctlOK("history", "many")
	if strings.Contains(r.stdout, "*") || !strings.Contains(r.stderr, "note: pipe many is deleted") {
		t.Fatalf("history table of a deleted pipe:\n%s", r)
	}
	r = ts.ctlOK("restore", "many", "7")
	if r.stdout != fmt.Sprintf("pipe/many restored from version 7 (version %d, payload %s)\n", n+1, shortDigest(ts.apiVersion("many", 7)["payload"].(map[string]any)["digest"].(string))) {
		t.Fatalf("restore of a deleted pipe:\n%s", r)
	}
	r = ts.ctlOK("describe", "pipe", "many")
	if !strings.Contains(r.stdout, "script: echo 7\n") {
		t.Fatalf("the restored pipe:\n%s", r)
	}
}
