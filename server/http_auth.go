package server

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/drover/drover/server/console"
	"github.com/drover/drover/server/errs"
	"github.com/drover/drover/server/pki"
	"github.com/drover/drover/server/store"
)

// Roles of API tokens, in increasing power. A route names the least role
// that may use it (http_routes.go); a token may use every route whose role is
// at most its own.
//
//	viewer    reads everything but secrets' values, API tokens and enrollment tokens
//	operator  also applies and deletes pipes, runs and cancels, sets secrets
//	admin     also manages API tokens, enrollment tokens, agents (tags,
//	          revocation, deletion) and rotates the manifest key
type role int

const (
	rolePublic role = iota // no authentication
	roleAgent              // an agent's client certificate (mTLS)
	roleViewer
	roleOperator
	roleAdmin
)

var roleNames = map[role]string{rolePublic: "public", roleAgent: "agent", roleViewer: "viewer", roleOperator: "operator", roleAdmin: "admin"}

func (r role) String() string { return roleNames[r] }

// parseRole maps a token role name to its role.
func parseRole(s string) (role, bool) {
	switch s {
	case "viewer":
		return roleViewer, true
	case "operator":
		return roleOperator, true
	case "admin":
		return roleAdmin, true
	}
	return 0, false
}

// API tokens are "drvt1.<id>.<secret>": id is 16 lowercase base32
// characters, secret 43 base64url characters (32 random bytes). Only
// sha256(secret) is stored: the secret has 256 bits of entropy, so a fast
// hash is enough. The bootstrap admin token (admin.token, 64 hex digits) is
// the token with id "bootstrap": its hash is stored like the others, so it
// is listed and can be revoked.
const (
	apiTokenPrefix   = "drvt1"
	bootstrapTokenID = "bootstrap"
	bootstrapName    = "admin.token"
)

var apiTokenIDRE = regexp.MustCompile(`^[a-z2-7]{16}$`)

// principal is who makes an API request.
type principal struct {
	ID   string
	Name string
	Role role
}

type principalKey struct{}

func principalOf(r *http.Request) *principal {
	p, _ := r.Context().Value(principalKey{}).(*principal)
	return p
}

// newAPIToken makes a token and the record to store for it.
func newAPIToken(name string, rl role, createdBy string, now time.Time, ttl time.Duration) (string, *store.APIToken) {
	id := strings.ToLower(b32.EncodeToString(randomBytes(10)))
	secret := base64.RawURLEncoding.EncodeToString(randomBytes(32))
	sum := sha256.Sum256([]byte(secret))
	t := &store.APIToken{ID: id, Name: name, Role: rl.String(), SecretHash: sum[:], CreatedAt: now, CreatedBy: createdBy}
	if ttl > 0 {
		t.ExpiresAt = now.Add(ttl)
	}
	return apiTokenPrefix + "." + id + "." + secret, t
}

// ensureBootstrapToken records the admin.token's hash under the id
// "bootstrap" unless that token was revoked.
func ensureBootstrapToken(ctx context.Context, st store.AuthStore, admin *pki.AdminToken, now time.Time) error {
	hash := admin.Hash()
	return st.EnsureAPIToken(ctx, &store.APIToken{ID: bootstrapTokenID, Name: bootstrapName, Role: roleAdmin.String(),
		SecretHash: hash[:], CreatedAt: now, CreatedBy: "drover-server"})
}

// authenticator maps bearer tokens to principals.
type authenticator struct {
	store store.AuthStore
	clock Clock

	mu      sync.Mutex
	touched map[string]time.Time // last last_used_at write per token

	// sessions are the web console's logins (cookie → token id); a
	// request without an Authorization header may use one.
	sessions console.Sessions
}

// touchEvery bounds how often a token's last_used_at is written.
const touchEvery = time.Minute

func newAuthenticator(st store.AuthStore, clock Clock) *authenticator {
	return &authenticator{store: st, clock: clock, touched: map[string]time.Time{}}
}

var errNoBearer = errs.New(errs.ErrUnauthenticated, "an Authorization: Bearer token is required")

// authenticate checks the request's bearer token.
func (a *authenticator) authenticate(r *http.Request) (*principal, error) {
	h := r.Header.Get("Authorization")
	if h == "" && a.sessions != nil && console.SessionID(r) != "" {
		p, _, err := a.authenticateSession(r)
		return p, err
	}
	tok, ok := strings.CutPrefix(h, "Bearer ")
	if !ok {
		tok, ok = strings.CutPrefix(h, "bearer ")
	}
	tok = strings.TrimSpace(tok)
	if !ok || tok == "" {
		return nil, errNoBearer
	}
	invalid := errs.New(errs.ErrUnauthenticated, "the bearer token is not valid")
	var id, secret string
	if parts := strings.Split(tok, "."); len(parts) == 3 && parts[0] == apiTokenPrefix && apiTokenIDRE.MatchString(parts[1]) {
		id, secret = parts[1], parts[2]
	} else if len(tok) == 64 && !strings.Contains(tok, ".") {
		id, secret = bootstrapTokenID, tok
	} else {
		return nil, invalid
	}
	t, err := a.store.GetAPIToken(r.Context(), id)
	if errors.Is(err, errs.ErrNotFound) {
		return nil, invalid
	}
	if err != nil {
		return nil, err
	}
	sum := sha256.Sum256([]byte(secret))
	if subtle.ConstantTimeCompare(sum[:], t.SecretHash) != 1 {
		return nil, invalid
	}
	return a.checkToken(r.Context(), t, invalid)
}

// checkToken refuses a revoked or expired token and makes its principal.
func (a *authenticator) checkToken(ctx context.Context, t *store.APIToken, invalid error) (*principal, error) {
	now := a.clock.Now()
	if !t.RevokedAt.IsZero() {
		return nil, errs.New(errs.ErrTokenRevoked, "the API token "+t.ID+" was revoked")
	}
	if !t.ExpiresAt.IsZero() && !now.Before(t.ExpiresAt) {
		return nil, errs.New(errs.ErrTokenExpired, "the API token "+t.ID+" expired at "+t.ExpiresAt.UTC().Format(time.RFC3339))
	}
	rl, ok := parseRole(t.Role)
	if !ok {
		return nil, invalid
	}
	a.touch(ctx, t.ID, now)
	return &principal{ID: t.ID, Name: t.Name, Role: rl}, nil
}

// touch writes last_used_at at most once a minute per token.
func (a *authenticator) touch(ctx context.Context, id string, now time.Time) {
	a.mu.Lock()
	last, ok := a.touched[id]
	due := !ok || now.Sub(last) >= touchEvery
	if due {
		if len(a.touched) > 10000 {
			clear(a.touched)
		}
		a.touched[id] = now
	}
	a.mu.Unlock()
	if due {
		_ = a.store.TouchAPIToken(ctx, id, now) // best effort
	}
}

// authorize authenticates the request and checks that its token's role is
// at least need. A token below the role is returned with the error, for
// the audit entry of the refusal.
func (s *Server) authorize(r *http.Request, need role) (*principal, error) {
	p, err := s.auth.authenticate(r)
	if err != nil {
		return nil, err
	}
	if p.Role < need {
		return p, errs.New(errs.ErrPermissionDenied, "this needs the "+need.String()+" role; token "+p.ID+" ("+p.Name+") has "+p.Role.String())
	}
	return p, nil
}
