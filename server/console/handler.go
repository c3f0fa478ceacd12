package console

import (
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"io/fs"
	"mime"
	"net/http"
	"path"
	"strings"
)

//go:embed assets
var assets embed.FS

// CSP is the Content-Security-Policy of every console response: only the
// console's own files, no inline script, no frames, no plugins.
const CSP = "default-src 'self'; script-src 'self'; object-src 'none'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'"

// Principal is who a token or session acts as.
type Principal struct {
	ID   string `json:"id"`
	Name string `json:"name"`
	Role string `json:"role"`
}

// Auth is the server's side of the console's login.
type Auth interface {
	// Login checks an API token (or the bootstrap token).
	Login(r *http.Request, token string) (Principal, error)
	// Session checks the request's session cookie and the token behind it.
	Session(r *http.Request) (Principal, *Session, error)
}

// Config is what the handler needs from the server.
type Config struct {
	Sessions Sessions
	Expiry   Expiry
	Auth     Auth
	// WriteError writes an error as the API does.
	WriteError func(w http.ResponseWriter, err error)
	// Refuse makes the errors the console itself refuses with: an
	// unauthenticated (401) or forbidden (403) error with msg.
	Unauthenticated, Forbidden, BadRequest func(msg string) error
}

type file struct {
	body []byte
	etag string
	ct   string
}

// Handler serves /ui/: the page, its assets, login, session and logout.
type Handler struct {
	cfg   Config
	files map[string]file
}

// New makes the console's handler.
func New(cfg Config) *Handler {
	h := &Handler{cfg: cfg, files: map[string]file{}}
	_ = fs.WalkDir(assets, "assets", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := assets.ReadFile(p)
		if err != nil {
			return err
		}
		sum := sha256.Sum256(b)
		ct := mime.TypeByExtension(path.Ext(p))
		if ct == "" {
			ct = "application/octet-stream"
		}
		h.files[strings.TrimPrefix(p, "assets/")] = file{body: b, etag: `"` + hex.EncodeToString(sum[:16]) + `"`, ct: ct}
		return nil
	})
	return h
}

// Files lists the embedded asset names.
func (h *Handler) Files() []string {
	var out []string
	for n := range h.files {
		out = append(out, n)
	}
	return out
}

// SecurityHeaders sets the headers every console response carries.
func SecurityHeaders(w http.ResponseWriter) {
	hd := w.Header()
	hd.Set("Content-Security-Policy", CSP)
	hd.Set("X-Content-Type-Options", "nosniff")
	hd.Set("X-Frame-Options", "DENY")
	hd.Set("Referrer-Policy", "no-referrer")
	hd.Set("Cross-Origin-Opener-Policy", "same-origin")
	hd.Set("Cross-Origin-Resource-Policy", "same-origin")
}

func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	SecurityHeaders(w)
	p := strings.TrimPrefix(r.URL.Path, "/ui")
	switch p {
	case "/login":
		h.method(w, r, http.MethodPost, h.login)
		return
	case "/logout":
		h.method(w, r, http.MethodPost, h.logout)
		return
	case "/session":
		h.method(w, r, http.MethodGet, h.session)
		return
	}
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	name := strings.TrimPrefix(p, "/")
	if name == "" {
		name = "index.html"
	}
	f, ok := h.files[name]
	if !ok {
		http.NotFound(w, r)
		return
	}
	w.Header().Set("Cache-Control", "no-cache") // revalidate: an upgrade is seen at once
	w.Header().Set("ETag", f.etag)
	if inm := r.Header.Get("If-None-Match"); inm != "" && inm == f.etag {
		w.WriteHeader(http.StatusNotModified)
		return
	}
	w.Header().Set("Content-Type", f.ct)
	if r.Method == http.MethodHead {
		return
	}
	_, _ = w.Write(f.body)
}

func (h *Handler) method(w http.ResponseWriter, r *http.Request, m string, fn func(http.ResponseWriter, *http.Request) error) {
	w.Header().Set("Cache-Control", "no-store")
	if r.Method != m {
		w.Header().Set("Allow", m)
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	if err := fn(w, r); err != nil {
		h.cfg.WriteError(w, err)
	}
}

// sessionInfo is the answer of login and session.
type sessionInfo struct {
	Principal
	CSRF string `json:"csrf"`
}

const maxLoginBody = 4 << 10

func (h *Handler) login(w http.ResponseWriter, r *http.Request) error {
	if !sameOrigin(r) {
		return h.cfg.Forbidden(errCrossOrigin.Error())
	}
	var req struct {
		Token string `json:"token"`
	}
	b, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxLoginBody))
	if err != nil {
		return h.cfg.BadRequest("the login body is too large")
	}
	if err := json.Unmarshal(b, &req); err != nil || strings.TrimSpace(req.Token) == "" {
		return h.cfg.BadRequest(`the login body must be {"token": "..."}`)
	}
	p, err := h.cfg.Auth.Login(r, strings.TrimSpace(req.Token))
	if err != nil {
		return err
	}
	// A session already on this browser is ended: a login never reuses an
	// id it did not make (no session fixation).
	if old := SessionID(r); old != "" {
		_ = h.cfg.Sessions.Delete(r.Context(), old)
	}
	s, err := h.cfg.Sessions.Create(r.Context(), p.ID)
	if err != nil {
		return err
	}
	setCookie(w, s.ID, h.cfg.Expiry.Absolute)
	return writeJSON(w, http.StatusOK, sessionInfo{Principal: p, CSRF: s.CSRF})
}

// session answers the page's "am I logged in?": the session's principal
// and CSRF token, or 204 without a live session (not an error: the page
// then shows the login form).
func (h *Handler) session(w http.ResponseWriter, r *http.Request) error {
	if SessionID(r) == "" {
		w.WriteHeader(http.StatusNoContent)
		return nil
	}
	p, s, err := h.cfg.Auth.Session(r)
	if err != nil {
		setCookie(w, "", 0)
		w.WriteHeader(http.StatusNoContent)
		return nil
	}
	return writeJSON(w, http.StatusOK, sessionInfo{Principal: p, CSRF: s.CSRF})
}

func (h *Handler) logout(w http.ResponseWriter, r *http.Request) error {
	id := SessionID(r)
	if id == "" {
		return h.cfg.Unauthenticated("no console session")
	}
	s, err := h.cfg.Sessions.Get(r.Context(), id)
	if errors.Is(err, ErrNoSession) {
		setCookie(w, "", 0)
		w.WriteHeader(http.StatusNoContent)
		return nil
	}
	if err != nil {
		return err
	}
	if err := CheckRequest(r, s); err != nil {
		return h.cfg.Forbidden(err.Error())
	}
	if err := h.cfg.Sessions.Delete(r.Context(), id); err != nil {
		return err
	}
	setCookie(w, "", 0)
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func writeJSON(w http.ResponseWriter, code int, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_, err = w.Write(append(b, '\n'))
	return err
}
