package server

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/drover/drover/api"
	"github.com/drover/drover/server/console"
)

// consoleLogin logs in to the console with token and returns the session
// cookie and CSRF token.
func (ts *testServer) consoleLogin(token string) (cookie, csrf string) {
	ts.t.Helper()
	b, _ := json.Marshal(map[string]string{"token": token})
	resp, err := ts.client.Post(ts.base+"/ui/login", "application/json", bytes.NewReader(b))
	if err != nil {
		ts.t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		ts.t.Fatalf("login: %d %s", resp.StatusCode, body)
	}
	var out struct {
		CSRF string `json:"csrf"`
	}
	_ = json.Unmarshal(body, &out)
	for _, c := range resp.Cookies() {
		if c.Name == console.CookieName {
			return c.Value, out.CSRF
		}
	}
	ts.t.Fatal("no session cookie")
	return "", ""
}

// consoleDo sends a request with a console session cookie and headers.
func (ts *testServer) consoleDo(method, path, cookie string, body any, hdr ...string) *apiResult {
	ts.t.Helper()
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, _ := http.NewRequest(method, ts.base+path, rd)
	if rd != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	req.AddCookie(&http.Cookie{Name: console.CookieName, Value: cookie})
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := ts.client.Do(req)
	if err != nil {
		ts.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return &apiResult{code: resp.StatusCode, header: resp.Header, body: b}
}

// A console session acts with its token's role on /api/v1; mutations need
// the session's CSRF header and this origin; revoking the token or logging
// out ends the session; the secret never appears in the cookie.
func TestConsoleSessionAuth(t *testing.T) {
	ts := startServer(t)
	ts.putScriptPipe("job", "echo hi", map[string]string{"x": "y"})
	opTok, opID := ts.apiToken("ops", "operator", "")
	viewTok, _ := ts.apiToken("watcher", "viewer", "")

	r := ts.do("GET", "/ui/", "", nil)
	if r.code != 200 || r.header.Get("Content-Security-Policy") != console.CSP || r.header.Get("X-Content-Type-Options") != "nosniff" {
		t.Fatalf("/ui/: %d %v", r.code, r.header)
	}
	if r := ts.do("GET", "/ui", "", nil); r.code != 200 { // redirected
		t.Fatalf("/ui: %d", r.code)
	}

	cookie, csrf := ts.consoleLogin(opTok)
	if strings.Contains(opTok, cookie) || strings.Contains(cookie, strings.Split(opTok, ".")[2]) {
		t.Fatal("the cookie carries the token")
	}
	var who api.WhoAmI
	r = ts.consoleDo("GET", "/api/v1/whoami", cookie, nil)
	r.decode(t, &who)
	if r.code != 200 || who.Role != "operator" || who.ID != opID {
		t.Fatalf("whoami: %d %s", r.code, r.body)
	}
	run := api.RunPipeRequest{}
	if r := ts.consoleDo("POST", "/api/v1/pipes/job/run", cookie, run); r.code != 403 {
		t.Fatalf("a mutation without the CSRF header: %d %s", r.code, r.body)
	}
	if r := ts.consoleDo("POST", "/api/v1/pipes/job/run", cookie, run, console.CSRFHeader, "forged"); r.code != 403 {
		t.Fatalf("a mutation with a wrong CSRF header: %d %s", r.code, r.body)
	}
	if r := ts.consoleDo("POST", "/api/v1/pipes/job/run", cookie, run, console.CSRFHeader, csrf, "Origin", "https://evil.example"); r.code != 403 {
		t.Fatalf("a mutation from another origin: %d %s", r.code, r.body)
	}
	if r := ts.consoleDo("POST", "/api/v1/pipes/job/run", cookie, run, console.CSRFHeader, csrf, "Origin", ts.base); r.code != 202 {
		t.Fatalf("a mutation with the CSRF header: %d %s", r.code, r.body)
	}
	// The role is the token's: an operator may not create tokens.
	if r := ts.consoleDo("POST", "/api/v1/api-tokens", cookie, api.APITokenRequest{Name: "x", Role: "admin"}, console.CSRFHeader, csrf); r.code != 403 {
		t.Fatalf("an operator session created a token: %d %s", r.code, r.body)
	}
	// A viewer session's forged mutation is refused whatever it carries.
	vc, vcsrf := ts.consoleLogin(viewTok)
	if r := ts.consoleDo("POST", "/api/v1/pipes/job/run", vc, run, console.CSRFHeader, vcsrf); r.code != 403 {
		t.Fatalf("a viewer ran a pipe: %d %s", r.code, r.body)
	}
	// Revoking the token ends its sessions.
	ts.adminOK("DELETE", "/api/v1/api-tokens/"+opID, nil, nil)
	if r := ts.consoleDo("GET", "/api/v1/whoami", cookie, nil); r.code != 401 {
		t.Fatalf("a session of a revoked token: %d %s", r.code, r.body)
	}
	if r := ts.consoleDo("GET", "/ui/session", cookie, nil); r.code != 204 {
		t.Fatalf("the session of a revoked token: %d %s", r.code, r.body)
	}
	// Logout needs the CSRF header, then ends the session.
	if r := ts.consoleDo("POST", "/ui/logout", vc, nil); r.code != 403 {
		t.Fatalf("logout without CSRF: %d", r.code)
	}
	if r := ts.consoleDo("POST", "/ui/logout", vc, nil, console.CSRFHeader, vcsrf); r.code != 204 {
		t.Fatalf("logout: %d %s", r.code, r.body)
	}
	if r := ts.consoleDo("GET", "/api/v1/whoami", vc, nil); r.code != 401 {
		t.Fatalf("after logout: %d", r.code)
	}
	// A cookie never made by the server is refused.
	if r := ts.consoleDo("GET", "/api/v1/whoami", "made-up", nil); r.code != 401 {
		t.Fatalf("a made-up session: %d", r.code)
	}
	// The bootstrap token logs in as admin.
	ac, _ := ts.consoleLogin(ts.admin)
	r = ts.consoleDo("GET", "/api/v1/whoami", ac, nil)
	r.decode(t, &who)
	if who.Role != "admin" {
		t.Fatalf("bootstrap session: %s", r.body)
	}
}
