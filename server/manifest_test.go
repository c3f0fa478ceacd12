package server

import (
	"encoding/base64"
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/drover/drover/api"
	"github.com/drover/drover/internal/testkit"

	"github.com/drover/drover/manifest"
	"github.com/drover/drover/signing"
)

func TestManifestETagAndSyncNow(t *testing.T) {
	ts := startServer(t)
	a := ts.enrollAgent(map[string]string{"role": "web"})
	st := a.mustStream(t)

	r1, err := a.get("/api/v1/agents/self/manifest")
	if err != nil || r1.code != 200 {
		t.Fatalf("GET manifest: %v %v", r1, err)
	}
	etag := r1.header.Get("ETag")
	if etag != `"`+manifest.Digest(r1.body)+`"` || r1.header.Get("Content-Type") != ManifestMediaType {
		t.Fatalf("ETag %s Content-Type %s", etag, r1.header.Get("Content-Type"))
	}
	r2, err := a.get("/api/v1/agents/self/manifest", "If-None-Match", etag)
	if err != nil || r2.code != 304 || len(r2.body) != 0 || r2.header.Get("ETag") != etag {
		t.Fatalf("conditional GET: %v %v, want 304 with the same ETag", r2, err)
	}

	// A change that does not affect the agent publishes nothing new.
	ts.putScriptPipe("db-only", "echo db", map[string]string{"role": "db"})
	if r, _ := a.get("/api/v1/agents/self/manifest", "If-None-Match", etag); r.code != 304 {
		t.Fatalf("a pipe for other agents changed this agent's manifest: %d", r.code)
	}
	// One that does raises the serial, changes the ETag and sends SyncNow.
	ts.putScriptPipe("web-job", "echo web", map[string]string{"role": "web"})
	r3, _ := a.get("/api/v1/agents/self/manifest", "If-None-Match", etag)
	if r3.code != 200 || r3.header.Get("ETag") == etag || r3.header.Get("X-Drover-Manifest-Serial") != "2" {
		t.Fatalf("after a pipe change: %d ETag %s serial %s", r3.code, r3.header.Get("ETag"), r3.header.Get("X-Drover-Manifest-Serial"))
	}
	testkit.WaitFor(t, 5*time.Second, "SyncNow", func() bool {
		st.mu.Lock()
		defer st.mu.Unlock()
		return slices.Contains(st.syncs, 2)
	})
	// Putting the same spec again is not a change.
	if out := ts.putScriptPipe("web-job", "echo web", map[string]string{"role": "web"}); out.Created || out.Version != 1 {
		t.Fatalf("an identical PUT created a version: %+v", out)
	}
	// Tags decide assignment: moving the agent to role=db swaps its pipes.
	ts.adminOK("PUT", "/api/v1/agents/"+a.id+"/tags", api.TagsRequest{Tags: map[string]string{"role": "db"}}, nil)
	acc, err := a.pullManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(acc.Manifest.Pipes) != 1 || acc.Manifest.Pipes[0].Name != "db-only" || acc.Manifest.Serial != 3 {
		t.Fatalf("after the tag change: %+v", acc.Manifest)
	}
	// Explicit agent ids assign too, and targets never reach the agent.
	spec := map[string]any{"schedule": "@hourly", "script": "true", "targets": map[string]any{"agents": []string{a.id}}}
	ts.adminOK("PUT", "/api/v1/pipes/by-id", map[string]any{"spec": spec}, nil)
	if acc, err = a.pullManifest(); err != nil {
		t.Fatal(err)
	}
	if p := acc.Manifest.Pipe("by-id"); p == nil || p.Spec.Targets != nil {
		t.Fatalf("pipe by id: %+v", acc.Manifest.Pipes)
	}
	// Deleting a pipe removes it.
	ts.adminOK("DELETE", "/api/v1/pipes/by-id", nil, nil)
	if acc, err = a.pullManifest(); err != nil || acc.Manifest.Pipe("by-id") != nil {
		t.Fatalf("after delete: %v %+v", err, acc)
	}
}

func TestPayloadsAndSecretsLimitedToOwnManifest(t *testing.T) {
	ts := startServer(t)
	web := ts.enrollAgent(map[string]string{"role": "web"})
	db := ts.enrollAgent(map[string]string{"role": "db"})
	ts.adminOK("PUT", "/api/v1/secrets/WEB_TOKEN", map[string]string{"value": "w-s3cret"}, nil)
	ts.adminOK("PUT", "/api/v1/secrets/DB_PASSWORD", map[string]string{"value": "d-s3cret"}, nil)
	ts.adminOK("PUT", "/api/v1/secrets/UNUSED", map[string]string{"value": "nobody"}, nil)
	wp := ts.putScriptPipe("web-job", "echo web", map[string]string{"role": "web"}, "WEB_TOKEN")
	dp := ts.putScriptPipe("db-job", "echo db", map[string]string{"role": "db"}, "DB_PASSWORD")

	// Bundles with a command: uploaded, stored content-addressed, served.
	bundle, err := manifest.BuildBundle([]manifest.BundleFile{{Path: "run.sh", Mode: 0o755, Data: []byte("#!/bin/sh\necho hi\n")}})
	if err != nil {
		t.Fatal(err)
	}
	b64 := base64.StdEncoding.EncodeToString(bundle)
	spec := map[string]any{"schedule": "@daily", "command": []string{"./run.sh", "--full"}, "files": []string{"run.sh"},
		"targets": map[string]any{"tags": map[string]string{"role": "web"}}}
	var cp api.PutPipeResponse
	ts.adminOK("PUT", "/api/v1/pipes/cmd-job", map[string]any{"spec": spec, "bundle": b64}, &cp)
	if cp.Digest != manifest.Digest(bundle) {
		t.Fatalf("digest %s, want %s", cp.Digest, manifest.Digest(bundle))
	}

	acc, err := web.pullManifest()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range acc.Manifest.Pipes {
		r, err := web.get("/api/v1/agents/self/payloads/" + p.Payload.Digest)
		if err != nil || r.code != 200 || manifest.Digest(r.body) != p.Payload.Digest || int64(len(r.body)) != p.Payload.Size {
			t.Fatalf("payload of %s: %v %v", p.Name, r, err)
		}
	}
	if r, _ := web.get("/api/v1/agents/self/payloads/" + dp.Digest); r.code != 404 {
		t.Errorf("web fetched db's payload: %d", r.code)
	}
	if r, _ := db.get("/api/v1/agents/self/payloads/" + wp.Digest); r.code != 404 {
		t.Errorf("db fetched web's payload: %d", r.code)
	}
	if r, _ := web.get("/api/v1/agents/self/payloads/not-a-digest"); r.code != 404 {
		t.Errorf("malformed digest: %d", r.code)
	}

	for _, c := range []struct {
		a    *testAgent
		want map[string]string
	}{{web, map[string]string{"WEB_TOKEN": "w-s3cret"}}, {db, map[string]string{"DB_PASSWORD": "d-s3cret"}}} {
		r, err := c.a.get("/api/v1/agents/self/secrets")
		if err != nil || r.code != 200 {
			t.Fatalf("secrets: %v %v", r, err)
		}
		var sr api.SecretsResponse
		r.decode(t, &sr)
		if len(sr.Secrets) != len(c.want) || sr.Secrets[firstKey(c.want)] != c.want[firstKey(c.want)] {
			t.Errorf("agent got secrets %v, want %v", sr.Secrets, c.want)
		}
	}
	// Changing a secret re-publishes the manifests that use it (agents fetch
	// values when they apply), and only those.
	webSerial, dbSerial := mustHeader(t, web, "X-Drover-Manifest-Serial"), mustHeader(t, db, "X-Drover-Manifest-Serial")
	ts.adminOK("PUT", "/api/v1/secrets/WEB_TOKEN", map[string]string{"value": "w-new"}, nil)
	if got := mustHeader(t, web, "X-Drover-Manifest-Serial"); got == webSerial {
		t.Errorf("web's manifest was not re-published after its secret changed")
	}
	if got := mustHeader(t, db, "X-Drover-Manifest-Serial"); got != dbSerial {
		t.Errorf("db's manifest changed after a secret it does not use changed")
	}
	if r, _ := web.get("/api/v1/agents/self/secrets"); !strings.Contains(string(r.body), "w-new") {
		t.Errorf("new secret value not served: %s", r.body)
	}
	// Secrets are write-only through the admin API.
	r := ts.adminOK("GET", "/api/v1/secrets", nil, nil)
	if strings.Contains(string(r.body), "s3cret") || !strings.Contains(string(r.body), "WEB_TOKEN") {
		t.Errorf("secret list: %s", r.body)
	}
	// Admin endpoints refuse agents' certificates: the admin token is required.
	if r, _ := web.get("/api/v1/secrets"); r.code != 401 {
		t.Errorf("agent on an admin endpoint: %d", r.code)
	}
}

func firstKey(m map[string]string) string {
	for k := range m {
		return k
	}
	return ""
}

func TestManifestSignaturesThroughKeyRotation(t *testing.T) {
	ts := startServer(t)
	a := ts.enrollAgent(map[string]string{"role": "web"})
	ts.putScriptPipe("job", "echo 1", map[string]string{"role": "web"})
	acc1, err := a.pullManifest()
	if err != nil {
		t.Fatal(err)
	}

	var rot api.RotateResponse
	ts.adminOK("POST", "/api/v1/keys/rotate", nil, &rot)
	if rot.KeyID == acc1.KeyID || rot.KeyListVersion != 2 {
		t.Fatalf("rotation: %+v (old key %s)", rot, acc1.KeyID)
	}
	// The agent's trust root still holds key list 1: the manifest names 2,
	// so it fetches the new list (root-signed) and then accepts.
	acc2, err := a.pullManifest()
	if err != nil {
		t.Fatalf("manifest after rotation: %v", err)
	}
	if acc2.KeyID != rot.KeyID || acc2.Manifest.Serial <= acc1.Manifest.Serial || acc2.Manifest.KeyListVersion != 2 {
		t.Fatalf("after rotation: key %s serial %d klv %d", acc2.KeyID, acc2.Manifest.Serial, acc2.Manifest.KeyListVersion)
	}
	kl, err := a.trust.CurrentKeyList(time.Now())
	if err != nil || kl.Version != 2 || len(kl.Keys) != 2 {
		t.Fatalf("key list after rotation: %+v %v", kl, err)
	}
	// Further changes keep verifying under the new key.
	ts.putScriptPipe("job", "echo 2", map[string]string{"role": "web"})
	acc3, err := a.pullManifest()
	if err != nil || acc3.KeyID != rot.KeyID {
		t.Fatalf("after an edit: %v", err)
	}
	// An old envelope is now a rollback.
	if _, err := signing.AcceptManifest(mustGet(t, a), a.trust, signing.State{AgentID: a.id, Serial: acc3.Manifest.Serial + 1}, time.Now(), 0); err == nil {
		t.Fatal("a lower serial was accepted")
	}

	// Restarting the server keeps the keys, the serial and the ETag.
	etag := mustHeader(t, a, "ETag")
	ts.stop()
	cfg := ts.cfg
	ts2 := startServer(t, func(c *Config) { *c = cfg })
	a.base = ts2.base
	if got := mustHeader(t, a, "ETag"); got != etag {
		t.Errorf("ETag changed across a restart: %s -> %s", etag, got)
	}
}

func mustGet(t *testing.T, a *testAgent) []byte {
	t.Helper()
	r, err := a.get("/api/v1/agents/self/manifest")
	if err != nil || r.code != 200 {
		t.Fatalf("GET manifest: %v %v", r, err)
	}
	return r.body
}

func mustHeader(t *testing.T, a *testAgent, name string) string {
	t.Helper()
	r, err := a.get("/api/v1/agents/self/manifest")
	if err != nil || r.code != 200 {
		t.Fatalf("GET manifest: %v %v", r, err)
	}
	return r.header.Get(name)
}

func TestPipeValidationAllAtOnce(t *testing.T) {
	ts := startServer(t)
	bad := map[string]any{"spec": map[string]any{"name": "other", "schedule": "", "timezone": "Mars/Base", "catchup": "never", "command": []string{"./x"}}}
	r := ts.do("PUT", "/api/v1/pipes/job", ts.admin, bad)
	if r.code != 422 || r.errorCode() != "validation_failed" {
		t.Fatalf("invalid spec: %d %s", r.code, r.body)
	}
	var eb api.ErrorBody
	r.decode(t, &eb)
	fields := map[string]bool{}
	for _, d := range eb.Error.Details {
		fields[d.Field] = true
	}
	for _, f := range []string{"spec.name", "spec.schedule", "spec.timezone", "spec.catchup", "bundle"} {
		if !fields[f] {
			t.Errorf("no problem reported for %s: %s", f, r.body)
		}
	}
	if r := ts.adminOK("GET", "/api/v1/pipes", nil, nil); strings.Contains(string(r.body), `"job"`) {
		t.Fatalf("a refused pipe was stored: %s", r.body)
	}
	cases := []struct {
		name string
		body any
		code int
		kind string
	}{
		{"unknown field", map[string]any{"spec": map[string]any{"schedule": "@daily", "script": "x", "bogus": 1}}, 400, "invalid_request"},
		{"unknown top field", map[string]any{"spec": map[string]any{"schedule": "@daily", "script": "x"}, "x": 1}, 400, "invalid_request"},
		{"script with bundle", map[string]any{"spec": map[string]any{"schedule": "@daily", "script": "x"}, "bundle": "AAAA"}, 422, "validation_failed"},
		{"not a bundle", map[string]any{"spec": map[string]any{"schedule": "@daily", "command": []string{"./x"}}, "bundle": "AAAA"}, 422, "validation_failed"},
		{"malformed json", []byte(`{"spec": `), 400, "invalid_request"},
	}
	for _, c := range cases {
		r := ts.do("PUT", "/api/v1/pipes/job", ts.admin, c.body)
		if r.code != c.code || r.errorCode() != c.kind {
			t.Errorf("%s: %d %s, want %d %s", c.name, r.code, r.body, c.code, c.kind)
		}
	}
	// Versions are immutable and counted.
	ts.putScriptPipe("job", "echo 1", nil)
	ts.putScriptPipe("job", "echo 2", nil)
	var p api.Pipe
	ts.adminOK("GET", "/api/v1/pipes/job", nil, &p)
	if p.Version != 2 || len(p.Versions) != 2 || p.Spec.Script != "echo 2" || p.Spec.Timezone != "UTC" {
		t.Fatalf("pipe: %+v", p)
	}
}

func TestErrorsAreJSON(t *testing.T) {
	ts := startServer(t)
	for _, c := range []struct {
		method, path, token string
		code                int
		kind                string
	}{
		{"GET", "/api/v1/nope", ts.admin, 404, "not_found"},
		{"PATCH", "/api/v1/pipes/x", ts.admin, 405, "method_not_allowed"},
		{"GET", "/api/v1/pipes", "", 401, "unauthenticated"},
		{"GET", "/api/v1/pipes", "wrong", 401, "unauthenticated"},
		{"GET", "/api/v1/pipes/missing", ts.admin, 404, "not_found"},
		{"GET", "/api/v1/agents/self/manifest", "", 401, "unauthenticated"},
		{"GET", "/api/v1/runs?limit=0", ts.admin, 400, "invalid_request"},
	} {
		r := ts.do(c.method, c.path, c.token, nil)
		var eb api.ErrorBody
		if err := json.Unmarshal(r.body, &eb); err != nil || r.code != c.code || eb.Error.Code != c.kind || eb.Error.Message == "" {
			t.Errorf("%s %s: %d %s, want %d %s", c.method, c.path, r.code, r.body, c.code, c.kind)
		}
	}
	r := ts.do("POST", "/api/v1/enrollment-tokens", ts.admin, []byte(strings.Repeat(" ", 2<<20)))
	if r.code != 413 {
		t.Errorf("oversized body: %d %s", r.code, r.body)
	}
}
