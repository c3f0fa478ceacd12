package server

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/drover/drover/server/errs"
)

// The parts of SQLiteStore the operator API added (migration 0003): token
// listing, agent deletion, pipe history, run filters, live logs, API tokens
// and the audit log.

// ---- enrollment tokens

func (s *SQLiteStore) ListTokens(ctx context.Context) ([]*EnrollmentToken, error) {
	rows, err := s.r.QueryContext(ctx, `SELECT id, name, tags, created_at, expires_at, used_at, agent_id FROM enrollment_tokens ORDER BY created_at DESC, id DESC`)
	if err != nil {
		return nil, fmt.Errorf("list tokens: %w", err)
	}
	defer rows.Close()
	var out []*EnrollmentToken
	for rows.Next() {
		var t EnrollmentToken
		var tags string
		var created, expires, used int64
		if err := rows.Scan(&t.ID, &t.Name, &tags, &created, &expires, &used, &t.AgentID); err != nil {
			return nil, fmt.Errorf("list tokens: %w", err)
		}
		if err := json.Unmarshal([]byte(tags), &t.Tags); err != nil {
			return nil, fmt.Errorf("list tokens: %w", err)
		}
		t.CreatedAt, t.ExpiresAt, t.UsedAt = fromNS(created), fromNS(expires), fromNS(used)
		out = append(out, &t)
	}
	return out, rows.Err()
}

func (s *SQLiteStore) DeleteToken(ctx context.Context, id string) error {
	res, err := s.w.ExecContext(ctx, `DELETE FROM enrollment_tokens WHERE id=?`, id)
	if err != nil {
		return fmt.Errorf("delete token: %w", err)
	}
	if n, _ := res.RowsAffected(); n != 1 {
		return errs.NotFound("enrollment token")
	}
	return nil
}

// ---- agents

func (s *SQLiteStore) DeleteAgent(ctx context.Context, id string) error {
	return withTx(ctx, s.w, func(tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, `DELETE FROM agents WHERE id=?`, id)
		if err != nil {
			return fmt.Errorf("delete agent: %w", err)
		}
		if n, _ := res.RowsAffected(); n != 1 {
			return errs.NotFound("agent")
		}
		if _, err := tx.ExecContext(ctx, `DELETE FROM manifests WHERE agent_id=?`, id); err != nil {
			return fmt.Errorf("delete agent: %w", err)
		}
		if _, err := tx.ExecContext(ctx, `DELETE FROM manifest_envelopes WHERE agent_id=?`, id); err != nil {
			return fmt.Errorf("delete agent: %w", err)
		}
		return nil
	})
}

// ---- pipe history

func (s *SQLiteStore) GetPipeVersion(ctx context.Context, name string, version uint64) (*PipeVersion, error) {
	v, err := scanPipeVersion(s.r.QueryRowContext(ctx, `SELECT name, version, spec, payload_digest, payload_size, created_at
		FROM pipe_versions WHERE name=? AND version=?`, name, version))
	if errors.Is(err, sql.ErrNoRows) {
		return nil, errs.NotFound("pipe version")
	}
	if err != nil {
		return nil, fmt.Errorf("get pipe version: %w", err)
	}
	return v, nil
}

func (s *SQLiteStore) PipeState(ctx context.Context, name string) (uint64, bool, error) {
	var cur uint64
	var deleted int64
	err := s.r.QueryRowContext(ctx, `SELECT current_version, deleted_at FROM pipes WHERE name=?`, name).Scan(&cur, &deleted)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, false, errs.NotFound("pipe")
	}
	if err != nil {
		return 0, false, fmt.Errorf("pipe state: %w", err)
	}
	return cur, deleted != 0, nil
}

// ---- runs

// listRuns is ListRuns with the filters of RunFilter.
func (s *SQLiteStore) listRuns(ctx context.Context, f RunFilter) ([]*Run, error) {
	q := `SELECT ` + runColumns + ` FROM runs WHERE 1=1`
	var args []any
	add := func(cond string, v any) {
		q += ` AND ` + cond
		args = append(args, v)
	}
	if f.Pipe != "" {
		add(`pipe=?`, f.Pipe)
	}
	if f.Agent != "" {
		add(`agent_id=?`, f.Agent)
	}
	if f.Status != "" {
		add(`status=?`, f.Status)
	}
	if f.RequestID != "" {
		add(`request_id=?`, f.RequestID)
	}
	if f.Reason != "" {
		add(`reason=?`, f.Reason)
	}
	if !f.ScheduledSince.IsZero() {
		add(`scheduled_at>=?`, ns(f.ScheduledSince))
	}
	if !f.ScheduledUntil.IsZero() {
		add(`scheduled_at<? AND scheduled_at<>0`, ns(f.ScheduledUntil))
	}
	if !f.Since.IsZero() {
		add(`created_at>=?`, ns(f.Since))
	}
	if !f.Until.IsZero() {
		add(`created_at<?`, ns(f.Until))
	}
	if !f.BeforeAt.IsZero() {
		q += ` AND (created_at<? OR (created_at=? AND id<?))`
		args = append(args, ns(f.BeforeAt), ns(f.BeforeAt), f.BeforeID)
	}
	q += ` ORDER BY created_at DESC, id DESC LIMIT ?`
	args = append(args, f.Limit)
	return queryAll(ctx, s.r, "list runs", scanRun, q, args...)
}

func (s *SQLiteStore) GetLogsAfter(ctx context.Context, runID string, after int64, limit int) ([]*LogChunk, error) {
	return queryAll(ctx, s.r, "get logs", scanLogChunk, `SELECT run_id, seq, stream, data, at FROM log_chunks WHERE run_id=? AND seq>? ORDER BY seq LIMIT ?`, runID, after, limit)
}

func (s *SQLiteStore) CountLogChunks(ctx context.Context, runID string) (uint64, error) {
	var n uint64
	if err := s.r.QueryRowContext(ctx, `SELECT COUNT(*) FROM log_chunks WHERE run_id=?`, runID).Scan(&n); err != nil {
		return 0, fmt.Errorf("count log chunks: %w", err)
	}
	return n, nil
}

func (s *SQLiteStore) RunCounts(ctx context.Context) (map[string]int, error) {
	rows, err := s.r.QueryContext(ctx, `SELECT status, COUNT(*) FROM runs GROUP BY status`)
	if err != nil {
		return nil, fmt.Errorf("run counts: %w", err)
	}
	defer rows.Close()
	out := map[string]int{}
	for rows.Next() {
		var st string
		var n int
		if err := rows.Scan(&st, &n); err != nil {
			return nil, fmt.Errorf("run counts: %w", err)
		}
		out[st] = n
	}
	return out, rows.Err()
}

// ---- API tokens

const apiTokenColumns = `id, name, role, secret_hash, created_at, created_by, expires_at, last_used_at, revoked_at`

func scanAPIToken(row interface{ Scan(...any) error }) (*APIToken, error) {
	var t APIToken
	var created, expires, used, revoked int64
	if err := row.Scan(&t.ID, &t.Name, &t.Role, &t.SecretHash, &created, &t.CreatedBy, &expires, &used, &revoked); err != nil {
		return nil, err
	}
	t.CreatedAt, t.ExpiresAt, t.LastUsedAt, t.RevokedAt = fromNS(created), fromNS(expires), fromNS(used), fromNS(revoked)
	return &t, nil
}

func (s *SQLiteStore) CreateAPIToken(ctx context.Context, t *APIToken) error {
	_, err := s.w.ExecContext(ctx, `INSERT INTO api_tokens(`+apiTokenColumns+`) VALUES(?,?,?,?,?,?,?,?,?)`,
		t.ID, t.Name, t.Role, t.SecretHash, ns(t.CreatedAt), t.CreatedBy, ns(t.ExpiresAt), ns(t.LastUsedAt), ns(t.RevokedAt))
	if err != nil {
		return fmt.Errorf("create api token: %w", err)
	}
	return nil
}

func (s *SQLiteStore) EnsureAPIToken(ctx context.Context, t *APIToken) error {
	_, err := s.w.ExecContext(ctx, `INSERT INTO api_tokens(`+apiTokenColumns+`) VALUES(?,?,?,?,?,?,?,?,?)
		ON CONFLICT(id) DO UPDATE SET secret_hash=excluded.secret_hash WHERE api_tokens.revoked_at=0`,
		t.ID, t.Name, t.Role, t.SecretHash, ns(t.CreatedAt), t.CreatedBy, ns(t.ExpiresAt), ns(t.LastUsedAt), ns(t.RevokedAt))
	if err != nil {
		return fmt.Errorf("ensure api token: %w", err)
	}
	return nil
}

func (s *SQLiteStore) GetAPIToken(ctx context.Context, id string) (*APIToken, error) {
	t, err := scanAPIToken(s.r.QueryRowContext(ctx, `SELECT `+apiTokenColumns+` FROM api_tokens WHERE id=?`, id))
	if errors.Is(err, sql.ErrNoRows) {
		return nil, errs.NotFound("API token")
	}
	if err != nil {
		return nil, fmt.Errorf("get api token: %w", err)
	}
	return t, nil
}

func (s *SQLiteStore) ListAPITokens(ctx context.Context) ([]*APIToken, error) {
	return queryAll(ctx, s.r, "list api tokens", scanAPIToken, `SELECT `+apiTokenColumns+` FROM api_tokens ORDER BY created_at, id`)
}

func (s *SQLiteStore) RevokeAPIToken(ctx context.Context, id string, now time.Time) error {
	res, err := s.w.ExecContext(ctx, `UPDATE api_tokens SET revoked_at=CASE WHEN revoked_at=0 THEN ? ELSE revoked_at END WHERE id=?`, ns(now), id)
	if err != nil {
		return fmt.Errorf("revoke api token: %w", err)
	}
	if n, _ := res.RowsAffected(); n != 1 {
		return errs.NotFound("API token")
	}
	return nil
}

func (s *SQLiteStore) TouchAPIToken(ctx context.Context, id string, now time.Time) error {
	if _, err := s.w.ExecContext(ctx, `UPDATE api_tokens SET last_used_at=? WHERE id=? AND last_used_at<?`, ns(now), id, ns(now)); err != nil {
		return fmt.Errorf("touch api token: %w", err)
	}
	return nil
}

// ---- audit log

func (s *SQLiteStore) AddAudit(ctx context.Context, e *AuditEntry) error {
	res, err := s.w.ExecContext(ctx, `INSERT INTO audit_log(at, actor_id, actor_name, role, action, target, before_digest, after_digest, source)
		VALUES(?,?,?,?,?,?,?,?,?)`, ns(e.At), e.ActorID, e.ActorName, e.Role, e.Action, e.Target, e.BeforeDigest, e.AfterDigest, e.Source)
	if err != nil {
		return fmt.Errorf("add audit entry: %w", err)
	}
	e.ID, _ = res.LastInsertId()
	return nil
}

func (s *SQLiteStore) ListAudit(ctx context.Context, f AuditFilter) ([]*AuditEntry, error) {
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
	args = append(args, f.Limit)
	rows, err := s.r.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("list audit: %w", err)
	}
	defer rows.Close()
	out := []*AuditEntry{}
	for rows.Next() {
		var e AuditEntry
		var at int64
		if err := rows.Scan(&e.ID, &at, &e.ActorID, &e.ActorName, &e.Role, &e.Action, &e.Target, &e.BeforeDigest, &e.AfterDigest, &e.Source); err != nil {
			return nil, fmt.Errorf("list audit: %w", err)
		}
		e.At = fromNS(at)
		out = append(out, &e)
	}
	return out, rows.Err()
}
