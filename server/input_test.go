package server

import (
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/drover/drover/api"

	"github.com/drover/drover/manifest"
)

// TestBadInputChangesNothing sends one bad request after another. Each is
// answered with its 4xx, its error code and a message naming the problem
// (and the field), and leaves the pipes, secrets, tokens, agents and the
// audit log exactly as they were.
func TestBadInputChangesNothing(t *testing.T) {
	ts := startServer(t, func(c *Config) { c.Signing.MaxPayloadBytes = 64 << 10 })
	op, _ := ts.apiToken("op", "operator", "")
	viewer, _ := ts.apiToken("viewer", "viewer", "")
	expired, _ := ts.apiToken("short", "operator", "1m")
	revoked, revokedID := ts.apiToken("gone", "operator", "")
	ts.adminOK("DELETE", "/api/v1/api-tokens/"+revokedID, nil, nil)
	a := ts.enrollAgent(map[string]string{"role": "web"})
	ts.putScriptPipe("good", "echo ok", map[string]string{"role": "web"})
	ts.adminOK("PUT", "/api/v1/secrets/GOOD", map[string]string{"value": "v"}, nil)
	ts.clock.Advance(2 * time.Minute)
	// Use each good token once now: last_used_at is written at most once a
	// minute, so the snapshots below do not see it move.
	ts.as(op, 200, "GET", "/api/v1/whoami", nil, nil)
	ts.as(viewer, 200, "GET", "/api/v1/whoami", nil, nil)

	snapshot := func() string {
		var b strings.Builder
		for _, p := range []string{"/api/v1/pipes", "/api/v1/pipes/good/versions", "/api/v1/secrets", "/api/v1/api-tokens", "/api/v1/enrollment-tokens", "/api/v1/agents/" + a.id, "/api/v1/runs"} {
			r := ts.adminOK("GET", p, nil, nil)
			b.Write(r.body)
		}
		fmt.Fprintf(&b, "audit %d", ts.auditCount())
		return b.String()
	}
	// agents' last_used and online state move with the clock: take the
	// snapshot after the clock moved.
	base := snapshot()

	spec := func(extra string) string {
		return `{"spec": {"schedule": "@daily", "script": "echo", "targets": {"tags": {"role": "web"}}` + extra + `}}`
	}
	big := make([]byte, 100<<10)
	rand.Read(big)
	bundleBody, _ := json.Marshal(map[string]any{"spec": map[string]any{"schedule": "@daily", "command": []string{"./run.sh"}}, "bundle": base64.StdEncoding.EncodeToString(big)})
	many := strings.Repeat("---\nname: good\nschedule: '@daily'\nscript: x\n", 10000)

	cases := []struct {
		name, method, path, token, ct, body string
		code                                int
		kind, field, msg                    string
	}{
		{"malformed JSON", "PUT", "/api/v1/pipes/good", op, "application/json", `{"spec": {"schedule": }}`, 400, "invalid_request", "", "malformed JSON at byte"},
		{"truncated JSON", "PUT", "/api/v1/pipes/good", op, "application/json", `{"spec": {"schedule": "@daily"`, 400, "invalid_request", "", "ends in the middle"},
		{"trailing data", "PUT", "/api/v1/secrets/GOOD", op, "application/json", `{"value": "x"} {}`, 400, "invalid_request", "", "trailing data"},
		{"wrong type", "PUT", "/api/v1/secrets/GOOD", op, "application/json", `{"value": 5}`, 400, "invalid_request", "value", "wrong type"},
		{"empty body", "PUT", "/api/v1/pipes/good", op, "application/json", ``, 400, "invalid_request", "", "the body is empty"},
		{"malformed YAML", "PUT", "/api/v1/pipes/good", op, "application/yaml", "name: good\nschedule: [\n", 400, "invalid_request", "spec", "invalid YAML"},
		{"YAML not a mapping", "PUT", "/api/v1/pipes/good", op, "application/yaml", "- a\n- b\n", 400, "invalid_request", "spec", "must be a mapping"},
		{"YAML with two specs", "PUT", "/api/v1/pipes/good", op, "application/yaml", "name: good\nschedule: '@daily'\nscript: x\n---\nname: other\nschedule: '@daily'\nscript: x\n", 400, "invalid_request", "", "holds 2 pipe specs"},
		{"YAML duplicate names", "PUT", "/api/v1/pipes/good", op, "application/yaml", "name: good\nschedule: '@daily'\nscript: x\n---\nname: good\nschedule: '@daily'\nscript: x\n", 400, "invalid_request", "", "more than one pipe spec"},
		{"YAML with 10,000 documents", "PUT", "/api/v1/pipes/good", op, "application/yaml", many, 400, "invalid_request", "spec", "more than 1000 documents"},
		{"unknown field", "PUT", "/api/v1/pipes/good", op, "application/json", spec(`, "bogus": 1`), 400, "invalid_request", "spec.bogus", "unknown field bogus"},
		{"unknown top-level field", "PUT", "/api/v1/pipes/good", op, "application/json", `{"spec": {}, "extra": 1}`, 400, "invalid_request", "extra", "unknown field extra"},
		{"unknown YAML field", "PUT", "/api/v1/pipes/good", op, "application/yaml", "name: good\nschedule: '@daily'\nscript: x\nbogus: 1\n", 422, "validation_failed", "spec.bogus", ""},
		{"bundle over the cap", "PUT", "/api/v1/pipes/good", op, "application/json", string(bundleBody), 413, "too_large", "bundle", "too large"},
		{"body over the cap", "PUT", "/api/v1/secrets/GOOD", op, "application/json", `{"value": "` + strings.Repeat("x", 200<<10) + `"}`, 413, "too_large", "", "larger than"},
		{"pipe body over the cap", "PUT", "/api/v1/pipes/good", op, "application/json", `{"spec": {"script": "` + strings.Repeat("x", 2<<20) + `"}}`, 413, "too_large", "", "larger than"},
		{"invalid cron", "PUT", "/api/v1/pipes/good", op, "application/json", `{"spec": {"schedule": "61 * * * *", "script": "x"}}`, 422, "validation_failed", "spec.schedule", "61"},
		{"Quartz extension", "PUT", "/api/v1/pipes/good", op, "application/json", `{"spec": {"schedule": "0 0 L * ?", "script": "x"}}`, 422, "validation_failed", "spec.schedule", ""},
		{"@reboot", "PUT", "/api/v1/pipes/good", op, "application/json", `{"spec": {"schedule": "@reboot", "script": "x"}}`, 422, "validation_failed", "spec.schedule", "@reboot"},
		{"unknown time zone", "PUT", "/api/v1/pipes/good", op, "application/json", `{"spec": {"schedule": "@daily", "timezone": "Mars/Olympus_Mons", "script": "x"}}`, 422, "validation_failed", "spec.timezone", "Mars/Olympus_Mons"},
		{"../ in the spec name", "PUT", "/api/v1/pipes/good", op, "application/json", `{"spec": {"name": "../etc", "schedule": "@daily", "script": "x"}}`, 422, "validation_failed", "spec.name", "does not match"},
		{"../ in the path", "PUT", "/api/v1/pipes/..%2Fetc%2Fpasswd", op, "application/json", spec(""), 400, "invalid_request", "name", `"../etc/passwd"`},
		{"newline in the path", "PUT", "/api/v1/pipes/a%0Ab", op, "application/json", spec(""), 400, "invalid_request", "name", `"a\nb"`},
		{"% in the path", "PUT", "/api/v1/pipes/a%25b", op, "application/json", spec(""), 400, "invalid_request", "name", `"a%b"`},
		{"newline in a secret name", "PUT", "/api/v1/secrets/A%0AB", op, "application/json", `{"value": "x"}`, 400, "invalid_request", "name", `"A\nB"`},
		{"../ in a secret name", "DELETE", "/api/v1/secrets/..%2FGOOD", op, "", "", 400, "invalid_request", "name", "invalid secret name"},
		{"% in a pipe to run", "POST", "/api/v1/pipes/g%25ood/run", op, "application/json", `{}`, 400, "invalid_request", "name", "invalid pipe name"},
		{"viewer applies", "PUT", "/api/v1/pipes/good", viewer, "application/json", spec(""), 403, "permission_denied", "", "needs the operator role"},
		{"viewer sets a secret", "PUT", "/api/v1/secrets/GOOD", viewer, "application/json", `{"value": "x"}`, 403, "permission_denied", "", "needs the operator role"},
		{"operator creates a token", "POST", "/api/v1/api-tokens", op, "application/json", `{"name": "x", "role": "admin"}`, 403, "permission_denied", "", "needs the admin role"},
		{"expired token", "DELETE", "/api/v1/pipes/good", expired, "", "", 401, "token_expired", "", "expired at"},
		{"revoked token", "DELETE", "/api/v1/pipes/good", revoked, "", "", 401, "token_revoked", "", "was revoked"},
		{"garbage token", "DELETE", "/api/v1/pipes/good", "drvt1.aaaaaaaaaaaaaaaa.nope", "", "", 401, "unauthenticated", "", "not valid"},
		{"wrong media type", "PUT", "/api/v1/secrets/GOOD", op, "text/plain", `{"value": "x"}`, 415, "unsupported_media_type", "", "application/json"},
		{"bad tag filter", "GET", "/api/v1/pipes?tag=role", op, "", "", 400, "invalid_request", "tag", `"role"`},
		{"bad cursor", "GET", "/api/v1/runs?cursor=bm9wZQ", op, "", "", 400, "invalid_request", "cursor", ""},
		{"bad limit", "GET", "/api/v1/audit?limit=5000", op, "", "", 400, "invalid_request", "limit", "1-1000"},
		{"bad since", "GET", "/api/v1/runs?since=yesterday", op, "", "", 400, "invalid_request", "since", `"yesterday"`},
		{"bad agent status", "GET", "/api/v1/agents?status=sleeping", op, "", "", 400, "invalid_request", "status", "sleeping"},
		{"bad run status", "GET", "/api/v1/runs?status=done", op, "", "", 400, "invalid_request", "status", ""},
		{"bad schedule count", "GET", "/api/v1/pipes/good/schedule?count=0", op, "", "", 400, "invalid_request", "count", "1-100"},
		{"bad version", "GET", "/api/v1/pipes/good/versions/abc", op, "", "", 400, "invalid_request", "version", `"abc"`},
		{"bad role", "POST", "/api/v1/api-tokens", ts.admin, "application/json", `{"name": "x", "role": "root"}`, 422, "validation_failed", "role", `"root"`},
		{"token without a name", "POST", "/api/v1/api-tokens", ts.admin, "application/json", `{"role": "viewer", "ttl": "forever"}`, 422, "validation_failed", "name", "required"},
		{"bad enrollment ttl", "POST", "/api/v1/enrollment-tokens", ts.admin, "application/json", `{"ttl": "1y"}`, 422, "validation_failed", "ttl", "not a duration"},
		{"bad tag key", "PUT", "/api/v1/agents/" + a.id + "/tags", ts.admin, "application/json", `{"tags": {"bad key": "x"}}`, 422, "validation_failed", "tags", "not a valid tag key"},
		{"run with agent and tags", "POST", "/api/v1/pipes/good/run", op, "application/json", `{"agent": "x", "tags": {"a": "b"}}`, 400, "invalid_request", "tags", "not both"},
		{"dry-run delete with a spec", "POST", "/api/v1/pipes/good/dry-run", op, "application/json", `{"delete": true, "spec": {}}`, 400, "invalid_request", "delete", "no spec"},
	}
	for _, c := range cases {
		r := ts.doCT(c.method, c.path, c.token, c.ct, []byte(c.body))
		var eb api.ErrorBody
		if err := json.Unmarshal(r.body, &eb); err != nil {
			t.Errorf("%s: %d %q is not a JSON error", c.name, r.code, r.body)
			continue
		}
		fields := map[string]bool{}
		all := eb.Error.Message
		for _, d := range eb.Error.Details {
			fields[d.Field] = true
			all += " | " + d.Field + ": " + d.Message
		}
		if r.code != c.code || eb.Error.Code != c.kind || (c.field != "" && !fields[c.field]) || !strings.Contains(all, c.msg) {
			t.Errorf("%s: %d %s, want %d %s field %q message with %q", c.name, r.code, r.body, c.code, c.kind, c.field, c.msg)
		}
		if now := snapshot(); now != base {
			t.Fatalf("%s changed something:\n%s\nwas\n%s", c.name, now, base)
		}
	}

	// Every problem at once, with YAML lines.
	r := ts.doCT("PUT", "/api/v1/pipes/good", op, "application/yaml", []byte("name: good\nschedule: '61 * * * *'\ntimezone: Nowhere/City\ncatchup: sometimes\nscript: x\n"))
	var ve struct {
		Error struct {
			Details []api.Detail `json:"details"`
		} `json:"error"`
	}
	_ = json.Unmarshal(r.body, &ve)
	lines := map[string]int{}
	for _, d := range ve.Error.Details {
		lines[d.Field] = d.Line
	}
	if r.code != 422 || lines["spec.schedule"] != 2 || lines["spec.timezone"] != 3 || lines["spec.catchup"] != 4 {
		t.Fatalf("all problems at once: %d %s", r.code, r.body)
	}
	if snapshot() != base {
		t.Fatal("the invalid YAML changed something")
	}
	if manifest.MaxSpecsPerFile >= 10000 {
		t.Fatal("the 10,000-document case no longer tests the document cap")
	}
}
