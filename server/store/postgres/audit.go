package postgres

import (
	"context"
	"fmt"

	"github.com/drover/drover/server/store"
)

func (s *DB) AddAudit(ctx context.Context, e *store.AuditEntry) error {
	err := s.w.QueryRowContext(ctx, `INSERT INTO audit_log(at, actor_id, actor_name, role, action, target, before_digest, after_digest, source)
		VALUES(?,?,?,?,?,?,?,?,?) RETURNING id`, ns(e.At), e.ActorID, e.ActorName, e.Role, e.Action, e.Target, e.BeforeDigest, e.AfterDigest, e.Source).Scan(&e.ID)
	if err != nil {
		return fmt.Errorf("add audit entry: %w", err)
	}
	return nil
}

func (s *DB) ListAudit(ctx context.Context, f store.AuditFilter) ([]*store.AuditEntry, error) {
	q := `SELECT id, at, actor_id, actor_name, role, action, target, before_digest, after_digest, source FROM audit_log WHERE 1=1`
	var args []any
	if f.Actor != "" {
		q += ` AND (actor_id=? OR actor_name=?)`
		args = append(args, f.Actor, f.Actor)
	}
	if f.Action != "" {
		q += ` AND action=?`
		args = append(args, f.Action)
	}
	if f.Target != "" {
		q += ` AND target=?`
		args = append(args, f.Target)
	}
	if !f.Since.IsZero() {
		q += ` AND at>=?`
		args = append(args, ns(f.Since))
	}
	if !f.Until.IsZero() {
		q += ` AND at<?`
		args = append(args, ns(f.Until))
	}
	if f.BeforeID > 0 {
		q += ` AND id<?`
		args = append(args, f.BeforeID)
	}
	q += ` ORDER BY id DESC LIMIT ?`
	args = append(args, limitArg(f.Limit))
	rows, err := s.r.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("list audit: %w", err)
	}
	defer rows.Close()
	out := []*store.AuditEntry{}
	for rows.Next() {
		var e store.AuditEntry
		var at int64
		if err := rows.Scan(&e.ID, &at, &e.ActorID, &e.ActorName, &e.Role, &e.Action, &e.Target, &e.BeforeDigest, &e.AfterDigest, &e.Source); err != nil {
			return nil, fmt.Errorf("list audit: %w", err)
		}
		e.At = fromNS(at)
		out = append(out, &e)
	}
	return out, rows.Err()
}
