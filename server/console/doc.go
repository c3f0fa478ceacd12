// Package console is drover-server's web console: the embedded page, style
// sheet and script served under /ui/, and the console's login sessions.
//
// A user logs in with an API token (or the bootstrap admin token); the
// server checks the token and the console keeps a random session id in an
// HttpOnly, Secure, SameSite=Strict cookie, mapped server-side to the
// token's id, so that the secret never leaves the login request. Each
// session has a CSRF token that every mutation must carry in the
// X-CSRF-Token header. The page calls the same /api/v1 endpoints as any
// client; the server enforces roles there (see docs/design.md, "Web
// console").
//
// Only the server package imports it.
package console
