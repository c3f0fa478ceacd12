package server

import (
	"bytes"
	"encoding/json"
	"net/http"
	"os"
	"sort"
	"strings"
	"testing"

	"github.com/drover/drover/api"
)

// openapi.json is generated from the route table and the request and
// response types by buildOpenAPI; this test fails when the checked-in file
// is stale. Regenerate it with
//
//	DROVER_UPDATE_OPENAPI=1 go test -run TestOpenAPI ./server

func TestOpenAPI(t *testing.T) {
	routes := (&Server{cfg: DefaultConfig()}).routeTable()
	want, err := json.MarshalIndent(buildOpenAPI(routes), "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	want = append(want, '\n')
	if os.Getenv("DROVER_UPDATE_OPENAPI") != "" {
		if err := os.WriteFile("openapi.json", want, 0o644); err != nil {
			t.Fatal(err)
		}
		t.Log("wrote openapi.json")
	}
	file, err := os.ReadFile("openapi.json")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(file, want) {
		t.Fatalf("openapi.json is stale: regenerate it with DROVER_UPDATE_OPENAPI=1 go test -run TestOpenAPI ./server")
	}
	if !bytes.Equal(openAPIDoc, file) {
		t.Fatalf("the embedded document differs from openapi.json (rebuild)")
	}

	// The document, read back: every route is in it, and everything in it
	// is a route.
	var doc struct {
		Paths map[string]map[string]json.RawMessage `json:"paths"`
	}
	if err := json.Unmarshal(file, &doc); err != nil {
		t.Fatal(err)
	}
	documented := map[string]bool{}
	for path, ops := range doc.Paths {
		for method := range ops {
			documented[strings.ToUpper(method)+" "+path] = true
		}
	}
	registered := map[string]bool{}
	for _, rt := range routes {
		key := rt.method + " " + rt.path
		registered[key] = true
		if !documented[key] {
			t.Errorf("route %s is not in openapi.json", key)
		}
	}
	for key := range documented {
		if !registered[key] {
			t.Errorf("openapi.json documents %s, which is not a route", key)
		}
	}

	// The served document is the file; every documented operation reaches
	// a handler of the real router (not the mux's 404 or 405).
	ts := startServer(t)
	r := ts.do("GET", "/api/v1/openapi.json", "", nil)
	if r.code != 200 || !bytes.Equal(r.body, file) || r.header.Get("Content-Type") != "application/json" {
		t.Fatalf("GET /api/v1/openapi.json: %d %s, %d bytes (file %d)", r.code, r.header.Get("Content-Type"), len(r.body), len(file))
	}
	if r2 := ts.do("GET", "/api/v1/openapi.json", "", nil); r2.header.Get("ETag") != r.header.Get("ETag") || r.header.Get("ETag") == "" {
		t.Errorf("ETag %q then %q", r.header.Get("ETag"), r2.header.Get("ETag"))
	}
	keys := make([]string, 0, len(documented))
	for k := range documented {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, key := range keys {
		method, path, _ := strings.Cut(key, " ")
		if method == "POST" && path == "/api/v1/keys/rotate" {
			continue // admin-only and effective; TestRoleMatrix reaches it
		}
		res := ts.do(method, fillPath(path), "", nil)
		var eb api.ErrorBody
		_ = json.Unmarshal(res.body, &eb)
		if res.code == http.StatusMethodNotAllowed || (res.code == 404 && eb.Error.Message == "no such endpoint") {
			t.Errorf("%s: the router answers %d %s", key, res.code, res.body)
		}
	}
}

// fillPath replaces {params} with sample values.
func fillPath(path string) string {
	for _, p := range pathParams(path) {
		v := "x"
		switch p {
		case "version":
			v = "1"
		case "digest":
			v = "sha256:" + strings.Repeat("0", 64)
		case "name":
			v = "sample"
		}
		path = strings.Replace(path, "{"+p+"}", v, 1)
	}
	return path
}
