package console

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
	"time"
)

var inlineHandler = regexp.MustCompile(`\son[a-z]+=`)

type fakeClock struct{ t time.Time }

func (c *fakeClock) now() time.Time { return c.t }

func TestSessionExpiry(t *testing.T) {
	ctx := context.Background()
	clk := &fakeClock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	m := NewMemory(Expiry{Idle: 10 * time.Minute, Absolute: time.Hour}, clk.now)
	s, err := m.Create(ctx, "tok")
	if err != nil {
		t.Fatal(err)
	}
	if s.ID == s.CSRF || len(s.ID) < 40 || len(s.CSRF) < 40 {
		t.Fatalf("weak session %+v", s)
	}
	// Used every 9 minutes it lives until the absolute limit.
	for i := 0; i < 6; i++ {
		clk.t = clk.t.Add(9 * time.Minute)
		if _, err := m.Get(ctx, s.ID); err != nil {
			t.Fatalf("after %d uses: %v", i, err)
		}
	}
	clk.t = clk.t.Add(7 * time.Minute) // 61 minutes since login
	if _, err := m.Get(ctx, s.ID); !errors.Is(err, ErrNoSession) {
		t.Fatalf("past the absolute expiry: %v", err)
	}
	// Idle for 10 minutes: gone.
	s2, _ := m.Create(ctx, "tok")
	clk.t = clk.t.Add(10 * time.Minute)
	if _, err := m.Get(ctx, s2.ID); !errors.Is(err, ErrNoSession) {
		t.Fatalf("past the idle expiry: %v", err)
	}
	// Deleted: gone.
	s3, _ := m.Create(ctx, "tok")
	_ = m.Delete(ctx, s3.ID)
	if _, err := m.Get(ctx, s3.ID); !errors.Is(err, ErrNoSession) {
		t.Fatalf("after delete: %v", err)
	}
	if _, err := m.Get(ctx, "nope"); !errors.Is(err, ErrNoSession) {
		t.Fatalf("unknown id: %v", err)
	}
}

func TestCheckRequest(t *testing.T) {
	s := &Session{ID: "id", CSRF: "the-csrf"}
	req := func(method string, hdr ...string) *http.Request {
		r := httptest.NewRequest(method, "https://drover.example:8443/api/v1/pipes/x/run", nil)
		for i := 0; i+1 < len(hdr); i += 2 {
			r.Header.Set(hdr[i], hdr[i+1])
		}
		return r
	}
	for _, c := range []struct {
		name string
		r    *http.Request
		ok   bool
	}{
		{"GET needs no token", req("GET"), true},
		{"POST without token", req("POST"), false},
		{"POST with a wrong token", req("POST", CSRFHeader, "nope"), false},
		{"POST with the token", req("POST", CSRFHeader, "the-csrf", "Origin", "https://drover.example:8443", "Sec-Fetch-Site", "same-origin"), true},
		{"POST from another origin", req("POST", CSRFHeader, "the-csrf", "Origin", "https://evil.example"), false},
		{"GET from another site", req("GET", "Sec-Fetch-Site", "cross-site"), false},
		{"DELETE without token", req("DELETE"), false},
		{"PUT with the token", req("PUT", CSRFHeader, "the-csrf"), true},
	} {
		if err := CheckRequest(c.r, s); (err == nil) != c.ok {
			t.Errorf("%s: %v", c.name, err)
		}
	}
}

type fakeAuth struct{ sessions Sessions }

func (f fakeAuth) Login(r *http.Request, token string) (Principal, error) {
	if token != "good" {
		return Principal{}, errors.New("bad token")
	}
	return Principal{ID: "t1", Name: "alice", Role: "viewer"}, nil
}

func (f fakeAuth) Session(r *http.Request) (Principal, *Session, error) {
	s, err := f.sessions.Get(r.Context(), SessionID(r))
	if err != nil {
		return Principal{}, nil, err
	}
	return Principal{ID: s.TokenID, Name: "alice", Role: "viewer"}, s, nil
}

func newTestHandler() (*Handler, Sessions) {
	m := NewMemory(DefaultExpiry, time.Now)
	h := New(Config{Sessions: m, Expiry: DefaultExpiry, Auth: fakeAuth{m},
		WriteError:      func(w http.ResponseWriter, err error) { http.Error(w, err.Error(), http.StatusForbidden) },
		Unauthenticated: errors.New, Forbidden: errors.New, BadRequest: errors.New})
	return h, m
}

func TestAssetsAndHeaders(t *testing.T) {
	h, _ := newTestHandler()
	for _, p := range []string{"/ui/", "/ui/app.js", "/ui/app.css"} {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest("GET", p, nil))
		if w.Code != 200 {
			t.Fatalf("%s: %d", p, w.Code)
		}
		hd := w.Header()
		if hd.Get("Content-Security-Policy") != CSP || hd.Get("X-Content-Type-Options") != "nosniff" || hd.Get("Cache-Control") != "no-cache" || hd.Get("ETag") == "" {
			t.Fatalf("%s: headers %v", p, hd)
		}
		w2 := httptest.NewRecorder()
		r2 := httptest.NewRequest("GET", p, nil)
		r2.Header.Set("If-None-Match", hd.Get("ETag"))
		h.ServeHTTP(w2, r2)
		if w2.Code != http.StatusNotModified {
			t.Fatalf("%s revalidated: %d", p, w2.Code)
		}
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest("GET", "/ui/nope.js", nil))
	if w.Code != 404 {
		t.Fatalf("unknown asset: %d", w.Code)
	}
	// The page has no inline script and loads nothing from elsewhere.
	idx := string(h.files["index.html"].body)
	if strings.Contains(idx, "<script>") || strings.Contains(idx, "http://") || strings.Contains(idx, "https://") || inlineHandler.MatchString(idx) {
		t.Fatalf("index.html has inline script or external references")
	}
	// Data goes into the page as text only.
	js := string(h.files["app.js"].body)
	for _, bad := range []string{"innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval("} {
		if strings.Contains(js, bad) {
			t.Errorf("app.js uses %s", bad)
		}
	}
}

func TestLoginLogout(t *testing.T) {
	h, m := newTestHandler()
	post := func(path, body string, hdr ...string) *httptest.ResponseRecorder {
		r := httptest.NewRequest("POST", path, strings.NewReader(body))
		for i := 0; i+1 < len(hdr); i += 2 {
			r.Header.Set(hdr[i], hdr[i+1])
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w
	}
	if w := post("/ui/login", `{"token":"bad"}`); w.Code == 200 {
		t.Fatal("a bad token logged in")
	}
	if w := post("/ui/login", `{"token":"good"}`, "Origin", "https://evil.example"); w.Code == 200 {
		t.Fatal("a cross-origin login succeeded")
	}
	w := post("/ui/login", `{"token":"good"}`)
	if w.Code != 200 {
		t.Fatalf("login: %d %s", w.Code, w.Body)
	}
	cs := w.Result().Cookies()
	if len(cs) != 1 || !cs[0].HttpOnly || !cs[0].Secure || cs[0].SameSite != http.SameSiteStrictMode || cs[0].Path != "/" || cs[0].Value == "" || strings.Contains(cs[0].Value, "good") {
		t.Fatalf("cookie %+v", cs)
	}
	if !strings.Contains(w.Body.String(), `"csrf"`) || strings.Contains(w.Body.String(), cs[0].Value) {
		t.Fatalf("login answer %s", w.Body)
	}
	s, err := m.Get(context.Background(), cs[0].Value)
	if err != nil || s.TokenID != "t1" {
		t.Fatalf("session %+v %v", s, err)
	}
	cookie := "drover_session=" + cs[0].Value
	if w := post("/ui/logout", "", "Cookie", cookie); w.Code == 204 {
		t.Fatal("logout without the CSRF token")
	}
	if w := post("/ui/logout", "", "Cookie", cookie, CSRFHeader, s.CSRF); w.Code != 204 {
		t.Fatalf("logout: %d %s", w.Code, w.Body)
	}
	if _, err := m.Get(context.Background(), cs[0].Value); !errors.Is(err, ErrNoSession) {
		t.Fatalf("after logout: %v", err)
	}
}
