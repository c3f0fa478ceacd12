package console

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"net/http"
	"sync"
	"time"

	"github.com/drover/drover/server/errs"
	"github.com/drover/drover/server/store"
)

// CookieName is the session cookie.
const CookieName = "drover_session"

// CSRFHeader carries a session's CSRF token on every mutation.
const CSRFHeader = "X-CSRF-Token"

// Session is one logged-in browser. TokenID names the API token the user
// logged in with: the server checks that token again on every request, so
// revoking it ends its sessions.
type Session struct {
	ID       string
	CSRF     string
	TokenID  string
	Created  time.Time
	LastSeen time.Time
}

// ErrNoSession: the session does not exist, expired or was ended.
var ErrNoSession = errors.New("console: no such session")

// Sessions stores console sessions: in the server's store (Stored), or in
// memory (Memory, for tests of the console alone).
type Sessions interface {
	// Create starts a session for the token.
	Create(ctx context.Context, tokenID string) (*Session, error)
	// Get returns a live session and marks it used now; ErrNoSession when
	// it does not exist or is past its idle or absolute expiry.
	Get(ctx context.Context, id string) (*Session, error)
	// Delete ends a session.
	Delete(ctx context.Context, id string) error
}

// Expiry bounds a session: Idle since its last use, Absolute since login.
type Expiry struct {
	Idle     time.Duration
	Absolute time.Duration
}

// DefaultExpiry is 30 minutes idle, 12 hours in all.
var DefaultExpiry = Expiry{Idle: 30 * time.Minute, Absolute: 12 * time.Hour}

// Memory is an in-memory Sessions.
type Memory struct {
	exp Expiry
	now func() time.Time

	mu   sync.Mutex
	byID map[string]*Session
}

// maxSessions bounds the map; the oldest are dropped past it.
const maxSessions = 10000

// NewMemory makes an in-memory session store; now is the clock.
func NewMemory(exp Expiry, now func() time.Time) *Memory {
	return &Memory{exp: exp, now: now, byID: map[string]*Session{}}
}

func randomToken() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b)
	return base64.RawURLEncoding.EncodeToString(b)
}

func (m *Memory) Create(_ context.Context, tokenID string) (*Session, error) {
	now := m.now()
	s := &Session{ID: randomToken(), CSRF: randomToken(), TokenID: tokenID, Created: now, LastSeen: now}
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(m.byID) >= maxSessions {
		m.sweep(now)
		for len(m.byID) >= maxSessions {
			var oldest *Session
			for _, o := range m.byID {
				if oldest == nil || o.Created.Before(oldest.Created) {
					oldest = o
				}
			}
			delete(m.byID, oldest.ID)
		}
	}
	m.byID[s.ID] = s
	c := *s
	return &c, nil
}

func (m *Memory) expired(s *Session, now time.Time) bool {
	return !now.Before(s.LastSeen.Add(m.exp.Idle)) || !now.Before(s.Created.Add(m.exp.Absolute))
}

// sweep drops expired sessions; m.mu is held.
func (m *Memory) sweep(now time.Time) {
	for id, s := range m.byID {
		if m.expired(s, now) {
			delete(m.byID, id)
		}
	}
}

func (m *Memory) Get(_ context.Context, id string) (*Session, error) {
	now := m.now()
	m.mu.Lock()
	defer m.mu.Unlock()
	s, ok := m.byID[id]
	if !ok {
		return nil, ErrNoSession
	}
	if m.expired(s, now) {
		delete(m.byID, id)
		return nil, ErrNoSession
	}
	s.LastSeen = now
	c := *s
	return &c, nil
}

func (m *Memory) Delete(_ context.Context, id string) error {
	m.mu.Lock()
	delete(m.byID, id)
	m.mu.Unlock()
	return nil
}

// SessionID is the request's session cookie value, or "".
func SessionID(r *http.Request) string {
	c, err := r.Cookie(CookieName)
	if err != nil {
		return ""
	}
	return c.Value
}

// Safe reports whether the method changes nothing (no CSRF check).
func Safe(method string) bool {
	return method == http.MethodGet || method == http.MethodHead || method == http.MethodOptions
}

// CheckRequest checks a request made with session s: every mutation must
// carry the session's CSRF token, and no request may come from another
// site (Sec-Fetch-Site, or an Origin that is not the request's host).
func CheckRequest(r *http.Request, s *Session) error {
	if !sameOrigin(r) {
		return errCrossOrigin
	}
	if Safe(r.Method) {
		return nil
	}
	got := r.Header.Get(CSRFHeader)
	if got == "" || subtle.ConstantTimeCompare([]byte(got), []byte(s.CSRF)) != 1 {
		return errCSRF
	}
	return nil
}

var (
	errCrossOrigin = errors.New("a console session may not be used from another origin")
	errCSRF        = errors.New("a console mutation needs the session's " + CSRFHeader + " header")
)

// sameOrigin: browsers send Sec-Fetch-Site and, on mutations, Origin.
func sameOrigin(r *http.Request) bool {
	switch r.Header.Get("Sec-Fetch-Site") {
	case "", "same-origin", "none":
	default:
		return false
	}
	if o := r.Header.Get("Origin"); o != "" && o != "https://"+r.Host {
		return false
	}
	return true
}

// setCookie sets (or, with an empty id, clears) the session cookie.
func setCookie(w http.ResponseWriter, id string, maxAge time.Duration) {
	c := &http.Cookie{Name: CookieName, Value: id, Path: "/", HttpOnly: true, Secure: true, SameSite: http.SameSiteStrictMode}
	if id == "" {
		c.MaxAge = -1
	} else {
		c.MaxAge = int(maxAge / time.Second)
	}
	http.SetCookie(w, c)
}

// Stored is Sessions kept in the server's store: a login on one replica
// works on every other, and a restart logs no one out. Only the SHA-256 of
// a session's cookie value is stored; its CSRF token is derived from the
// value, so neither can be read back from the database. A use is recorded
// at most once a minute (touchEvery), so the idle expiry is kept to within
// that minute.
type Stored struct {
	st  store.SessionStore
	exp Expiry
	now func() time.Time
}

// maxSessionID bounds a cookie value looked up (the ids made are 43
// characters).
const maxSessionID = 128

// touchEvery bounds how often a session's last use is written.
const touchEvery = time.Minute

// NewStored makes the store-backed sessions; now is the clock.
func NewStored(st store.SessionStore, exp Expiry, now func() time.Time) *Stored {
	return &Stored{st: st, exp: exp, now: now}
}

func hashID(id string) []byte {
	sum := sha256.Sum256([]byte("drover console session\x00" + id))
	return sum[:]
}

func csrfFor(id string) string {
	sum := sha256.Sum256([]byte("drover console csrf\x00" + id))
	return base64.RawURLEncoding.EncodeToString(sum[:])
}

func (s *Stored) limits(now time.Time) store.SessionLimits {
	return store.SessionLimits{IdleBefore: now.Add(-s.exp.Idle), CreatedBefore: now.Add(-s.exp.Absolute), Max: maxSessions}
}

func (s *Stored) Create(ctx context.Context, tokenID string) (*Session, error) {
	now := s.now()
	id := randomToken()
	if err := s.st.CreateSession(ctx, &store.ConsoleSession{IDHash: hashID(id), TokenID: tokenID, CreatedAt: now, LastSeenAt: now}, s.limits(now)); err != nil {
		return nil, err
	}
	return &Session{ID: id, CSRF: csrfFor(id), TokenID: tokenID, Created: now, LastSeen: now}, nil
}

func (s *Stored) Get(ctx context.Context, id string) (*Session, error) {
	if id == "" || len(id) > maxSessionID {
		return nil, ErrNoSession
	}
	now := s.now()
	cs, err := s.st.GetSession(ctx, hashID(id), s.limits(now))
	if errors.Is(err, errs.ErrNotFound) {
		return nil, ErrNoSession
	}
	if err != nil {
		return nil, err
	}
	if now.Sub(cs.LastSeenAt) >= touchEvery {
		if err := s.st.TouchSession(ctx, cs.IDHash, now); err != nil {
			return nil, err
		}
	}
	return &Session{ID: id, CSRF: csrfFor(id), TokenID: cs.TokenID, Created: cs.CreatedAt, LastSeen: now}, nil
}

func (s *Stored) Delete(ctx context.Context, id string) error {
	if id == "" || len(id) > maxSessionID {
		return nil
	}
	return s.st.DeleteSession(ctx, hashID(id))
}
