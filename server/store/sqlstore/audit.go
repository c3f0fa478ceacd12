package sqlstore

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
	q := listQuery{sql: `SELECT id, at, actor_id, actor_name, role, action, target, before_digest, after_digest, source FROM audit_log WHERE 1=1`}
	q.and(f.Actor != "", `(actor_id=? OR actor_name=?)`, f.Actor, f.Actor)
	q.and(f.Action != "", `action=?`, f.Action)
	q.and(f.Target != "", `target=?`, f.Target)
	q.and(!f.Since.IsZero(), `at>=?`, ns(f.Since))
	q.and(!f.Until.IsZero(), `at<?`, ns(f.Until))
	q.and(f.BeforeID > 0, `id<?`, f.BeforeID)
	q.append(` ORDER BY id DESC LIMIT ?`, s.d.Limit(f.Limit))
	return queryAll(ctx, s.r, "list audit", func(row rowScanner) (*store.AuditEntry, error) {
		var e store.AuditEntry
		var at int64
		if err := row.Scan(&e.ID, &at, &e.ActorID, &e.ActorName, &e.Role, &e.Action, &e.Target, &e.BeforeDigest, &e.AfterDigest, &e.Source); err != nil {
			return nil, err
		}
		e.At = fromNS(at)
		return &e, nil
	}, q.sql, q.args...)
}
