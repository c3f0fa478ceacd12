package server

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"reflect"
	"strconv"
	"sync/atomic"

	"github.com/drover/drover/api"
	"github.com/drover/drover/server/errs"
	"github.com/drover/drover/server/store"
)

// The audit log: every successful mutation through the API (the routes
// with an action in http_routes.go) writes one entry — who (the token's id and
// name, or the agent or enrollment token), what (the action and its target,
// e.g. "pipe/backup-db"), when, from where, and the sha256 of the object's
// JSON (as the API shows it) before and after. Secret values never reach
// it: a secret's object is its name and times. The entry is committed
// before the client sees the answer.

type auditKey struct{}

// auditRec is what a mutation's handler tells the audit log.
type auditRec struct {
	actor         *principal
	target        string
	before, after any
	// committed: the handler wrote the entry itself, in the transaction
	// of its change (enrollment), so the wrapper writes none.
	committed bool
}

// setAudit records the target of a mutation and the object before and
// after it (nil for none).
func setAudit(r *http.Request, target string, before, after any) {
	if rec, ok := r.Context().Value(auditKey{}).(*auditRec); ok {
		rec.target, rec.before, rec.after = target, before, after
	}
}

// setAuditActor names the actor of a public mutation (enrollment: the token).
func setAuditActor(r *http.Request, p *principal) {
	if rec, ok := r.Context().Value(auditKey{}).(*auditRec); ok {
		rec.actor = p
	}
}

// digestOf is "sha256:<hex>" of v's JSON, or "" for nil.
func digestOf(v any) string {
	if v == nil {
		return ""
	}
	if rv := reflect.ValueOf(v); (rv.Kind() == reflect.Pointer || rv.Kind() == reflect.Map || rv.Kind() == reflect.Slice) && rv.IsNil() {
		return ""
	}
	b, err := json.Marshal(v)
	if err != nil {
		return ""
	}
	sum := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(sum[:])
}

func (s *Server) writeAudit(r *http.Request, action string, rec *auditRec) {
	if rec.committed {
		return
	}
	e := s.auditEntry(r, action, rec)
	if err := s.store.AddAudit(r.Context(), e); err != nil {
		s.log.Error("writing the audit log failed", "action", action, "target", e.Target, "err", err)
		s.metrics.auditFailures.Inc()
	}
}

// auditEntry is the audit entry of a successful mutation.
func (s *Server) auditEntry(r *http.Request, action string, rec *auditRec) *store.AuditEntry {
	e := &store.AuditEntry{At: s.clock.Now(), Action: action, Target: rec.target, Source: sourceIP(r),
		BeforeDigest: digestOf(rec.before), AfterDigest: digestOf(rec.after)}
	if p := rec.actor; p != nil {
		e.ActorID, e.ActorName, e.Role = p.ID, p.Name, p.Role.String()
	}
	if e.Target == "" {
		e.Target = r.URL.Path
	}
	return e
}

func (s *Server) handleListAudit(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	pg, err := parsePage(r)
	if err != nil {
		return err
	}
	f := store.AuditFilter{Actor: q.Get("actor"), Action: q.Get("action"), Target: q.Get("target"), Limit: pg.limit + 1}
	if f.Since, err = queryTime(r, "since"); err != nil {
		return err
	}
	if f.Until, err = queryTime(r, "until"); err != nil {
		return err
	}
	if f.BeforeID, err = pg.idCursor(); err != nil {
		return err
	}
	list, err := s.store.ListAudit(r.Context(), f)
	if err != nil {
		return err
	}
	list, next := cutPage(list, pg, func(e *store.AuditEntry) string { return strconv.FormatInt(e.ID, 10) })
	return writeJSON(w, http.StatusOK, api.AuditList{NextCursor: next, Entries: mapList(list, func(e *store.AuditEntry) api.AuditEntry {
		return api.AuditEntry{ID: strconv.FormatInt(e.ID, 10), At: e.At, Actor: e.ActorName, ActorID: e.ActorID, Role: e.Role,
			Action: e.Action, Target: e.Target, BeforeDigest: e.BeforeDigest, AfterDigest: e.AfterDigest, Source: e.Source}
	})})
}

// Refused requests are audited too, so that an operator can see an attack:
// failed authentication (a bad, revoked or expired token, a refused client
// certificate), requests above the caller's role, refused enrollments and
// renewals. The action is "refused.<error code>" (refused.unauthenticated,
// refused.permission_denied, refused.invalid_token, ...), the target the
// request's path. An attacker must not be able to flood the audit table
// with them: at most refusedPerSource a minute per source address and
// refusedGlobal a minute in all are written; the rest are counted and the
// count is logged with the next entry that is written.
const (
	refusedPerSource = 10
	refusedGlobal    = 120
)

type refusalAuditor struct {
	perSource  *rateLimiter
	global     *rateLimiter
	suppressed atomic.Int64
}

func newRefusalAuditor() *refusalAuditor {
	return &refusalAuditor{perSource: newRateLimiter(refusedPerSource, refusedPerSource), global: newRateLimiter(refusedGlobal, refusedGlobal)}
}

// auditRefusal writes the audit entry of a refused request, if the limits
// allow. actor may be nil (not authenticated).
func (s *Server) auditRefusal(r *http.Request, err error, actor *principal) {
	k := errs.KindOf(err)
	switch {
	case k.HTTP == http.StatusUnauthorized || k.HTTP == http.StatusForbidden:
	case (r.URL.Path == "/api/v1/agents/enroll" || r.URL.Path == "/api/v1/agents/self/renew") && k.HTTP >= 400 && k.HTTP < 500:
	default:
		return
	}
	now := s.clock.Now()
	src := sourceIP(r)
	if !s.refusals.perSource.allow(src, now) || !s.refusals.global.allow("", now) {
		s.refusals.suppressed.Add(1)
		return
	}
	if n := s.refusals.suppressed.Swap(0); n > 0 {
		s.log.Warn("refused requests were not audited (rate limit)", "count", n)
	}
	target := r.Method + " " + r.URL.Path
	if len(target) > 200 {
		target = target[:200]
	}
	e := &store.AuditEntry{At: now, Action: "refused." + k.Code, Target: target, Source: src, ActorID: "", ActorName: "anonymous", Role: rolePublic.String()}
	if actor != nil {
		e.ActorID, e.ActorName, e.Role = actor.ID, actor.Name, actor.Role.String()
	}
	if err := s.store.AddAudit(context.WithoutCancel(r.Context()), e); err != nil {
		s.log.Error("writing the audit log failed", "action", e.Action, "err", err)
		s.metrics.auditFailures.Inc()
	}
}
