package server

import (
	"errors"
	"net/http"

	"github.com/drover/drover/server/console"
	"github.com/drover/drover/server/errs"
)

// The web console (server/console) under /ui/: its sessions stand for the
// API token a user logged in with, and act with that token's role on
// /api/v1 (authenticateSession); the token is checked again on every
// request, so revoking it ends its sessions.

var errNoSession = errs.New(errs.ErrUnauthenticated, "the console session expired or was ended; log in again")

// authenticateSession checks the request's console session: it must be
// live, from this origin, carry the session's CSRF token on a mutation,
// and its token must still be valid.
func (a *authenticator) authenticateSession(r *http.Request) (*principal, *console.Session, error) {
	s, err := a.sessions.Get(r.Context(), console.SessionID(r))
	if errors.Is(err, console.ErrNoSession) {
		return nil, nil, errNoSession
	}
	if err != nil {
		return nil, nil, err
	}
	if err := console.CheckRequest(r, s); err != nil {
		return nil, nil, errs.New(errs.ErrPermissionDenied, err.Error())
	}
	t, err := a.store.GetAPIToken(r.Context(), s.TokenID)
	if errors.Is(err, errs.ErrNotFound) {
		_ = a.sessions.Delete(r.Context(), s.ID)
		return nil, nil, errNoSession
	}
	if err != nil {
		return nil, nil, err
	}
	p, err := a.checkToken(r.Context(), t, errNoSession)
	if err != nil {
		_ = a.sessions.Delete(r.Context(), s.ID)
		return nil, nil, err
	}
	return p, s, nil
}

// consoleAuth is the server's side of the console's login.
type consoleAuth struct{ a *authenticator }

func (c consoleAuth) Login(r *http.Request, token string) (console.Principal, error) {
	req := r.Clone(r.Context())
	req.Header = http.Header{"Authorization": {"Bearer " + token}}
	p, err := c.a.authenticate(req)
	if err != nil {
		return console.Principal{}, err
	}
	return console.Principal{ID: p.ID, Name: p.Name, Role: p.Role.String()}, nil
}

func (c consoleAuth) Session(r *http.Request) (console.Principal, *console.Session, error) {
	if console.SessionID(r) == "" {
		return console.Principal{}, nil, errNoSession
	}
	p, s, err := c.a.authenticateSession(r)
	if err != nil {
		return console.Principal{}, nil, err
	}
	return console.Principal{ID: p.ID, Name: p.Name, Role: p.Role.String()}, s, nil
}

// newConsole makes the /ui/ handler and hooks its sessions into the
// authenticator.
func (s *Server) newConsole() http.Handler {
	sessions := console.NewMemory(console.DefaultExpiry, s.clock.Now)
	s.auth.sessions = sessions
	return console.New(console.Config{
		Sessions:        sessions,
		Expiry:          console.DefaultExpiry,
		Auth:            consoleAuth{s.auth},
		WriteError:      errs.Write,
		Unauthenticated: func(m string) error { return errs.New(errs.ErrUnauthenticated, m) },
		Forbidden:       func(m string) error { return errs.New(errs.ErrPermissionDenied, m) },
		BadRequest:      func(m string) error { return errs.New(errs.ErrInvalidRequest, m) },
	})
}

// consoleSessionKey is the key a console session's requests are pooled
// and limited under, or "" without a session cookie.
func consoleSessionKey(r *http.Request) string {
	if id := console.SessionID(r); id != "" {
		return "session " + id
	}
	return ""
}
