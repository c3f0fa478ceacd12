package sqlstore

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/drover/drover/server/errs"
	"github.com/drover/drover/server/store"
)

func (s *DB) CreateToken(ctx context.Context, t *store.EnrollmentToken) error {
	_, err := s.w.ExecContext(ctx, `INSERT INTO enrollment_tokens(id, secret_hash, name, tags, created_at, expires_at) VALUES(?,?,?,?,?,?)`,
		t.ID, t.SecretHash, t.Name, jsonText(t.Tags), ns(t.CreatedAt), ns(t.ExpiresAt))
	if err != nil {
		return fmt.Errorf("create token: %w", err)
	}
	return nil
}

func (s *DB) GetToken(ctx context.Context, id string) (*store.EnrollmentToken, error) {
	var hash []byte
	t, err := scanToken(s.r.QueryRowContext(ctx, `SELECT `+tokenColumns+`, secret_hash FROM enrollment_tokens WHERE id=?`, id), &hash)
	if err != nil {
		return nil, rowErr(err, "token", "get token")
	}
	t.SecretHash = hash
	return t, nil
}

const tokenColumns = `id, name, tags, created_at, expires_at, used_at, agent_id`

// scanToken scans the tokenColumns of a row and then extra.
func scanToken(row rowScanner, extra ...any) (*store.EnrollmentToken, error) {
	var t store.EnrollmentToken
	var tags string
	var created, expires, used int64
	if err := row.Scan(append([]any{&t.ID, &t.Name, &tags, &created, &expires, &used, &t.AgentID}, extra...)...); err != nil {
		return nil, err
	}
	if err := json.Unmarshal([]byte(tags), &t.Tags); err != nil {
		return nil, err
	}
	t.CreatedAt, t.ExpiresAt, t.UsedAt = fromNS(created), fromNS(expires), fromNS(used)
	return &t, nil
}

func (s *DB) EnrollAgent(ctx context.Context, tokenID string, now time.Time, a *store.Agent) error {
	failed, err := s.EnrollAgents(ctx, []store.Enrollment{{TokenID: tokenID, Now: now, Agent: a}})
	if err != nil {
		return err
	}
	return failed[0]
}

// MaxEnrollBatch bounds how many enrollments one EnrollAgents call commits.
const MaxEnrollBatch = 1000

// EnrollAgents commits the enrollments in one write transaction, one
// fsync for the batch. A refused enrollment (its token used, expired or
// unknown) changes nothing and is skipped. An enrollment whose statements
// fail otherwise (a constraint, say) aborts the transaction: writeTx retries
// it whole if the store finds the error transient (a PostgreSQL
// serialization failure), and if the error stays, that enrollment is given
// the error and the others are committed again without it. The statements
// are prepared once per transaction, not once per enrollment.
func (s *DB) EnrollAgents(ctx context.Context, es []store.Enrollment) ([]error, error) {
	if len(es) > MaxEnrollBatch {
		return nil, fmt.Errorf("enroll: %d enrollments in one batch (at most %d)", len(es), MaxEnrollBatch)
	}
	failed := make([]error, len(es))
	excluded := make([]bool, len(es))
	for {
		refused := make([]error, len(es))
		err := s.writeTx(ctx, func(tx Tx) error {
			clear(refused) // the transaction may run more than once
			st, err := prepareEnroll(ctx, tx)
			if err != nil {
				return fmt.Errorf("enroll: %w", err)
			}
			defer st.close()
			for i := range es {
				if excluded[i] {
					continue
				}
				ref, err := st.enroll(ctx, &es[i])
				if err != nil {
					return &enrollError{i: i, err: err}
				}
				refused[i] = ref
			}
			return nil
		})
		var ee *enrollError
		switch {
		case err == nil:
			for i, ref := range refused {
				if !excluded[i] {
					failed[i] = ref
				}
			}
			return failed, nil
		case errors.As(err, &ee):
			failed[ee.i], excluded[ee.i] = ee.err, true
		default:
			return nil, err
		}
	}
}

// enrollError is the error of enrollment i, which aborted its transaction.
type enrollError struct {
	i   int
	err error
}

func (e *enrollError) Error() string { return e.err.Error() }
func (e *enrollError) Unwrap() error { return e.err }

// enrollStmts are EnrollAgents' statements, prepared in its transaction.
type enrollStmts struct {
	useToken, tokenUsed, agent, audit *sql.Stmt
}

func prepareEnroll(ctx context.Context, tx Tx) (*enrollStmts, error) {
	st := &enrollStmts{}
	for _, p := range []struct {
		to  **sql.Stmt
		sql string
	}{
		{&st.useToken, `UPDATE enrollment_tokens SET used_at=?, agent_id=? WHERE id=? AND used_at=0 AND expires_at>?`},
		{&st.tokenUsed, `SELECT used_at FROM enrollment_tokens WHERE id=?`},
		{&st.agent, `INSERT INTO agents(id, name, hostname, os, arch, agent_version, tags, created_at, updated_at, cert_serial, cert_expires_at, machine_id)
			VALUES(?,?,?,?,?,?,?,?,?,?,?,?)`},
		{&st.audit, `INSERT INTO audit_log(at, actor_id, actor_name, role, action, target, before_digest, after_digest, source)
			VALUES(?,?,?,?,?,?,?,?,?) RETURNING id`},
	} {
		stmt, err := tx.PrepareContext(ctx, p.sql)
		if err != nil {
			st.close()
			return nil, err
		}
		*p.to = stmt
	}
	return st, nil
}

func (st *enrollStmts) close() {
	for _, s := range []*sql.Stmt{st.useToken, st.tokenUsed, st.agent, st.audit} {
		if s != nil {
			s.Close()
		}
	}
}

// enroll consumes e's token, creates its agent and writes its audit entry.
// refused is ErrTokenUsed, ErrTokenExpired or ErrInvalidToken when the
// token cannot be used (nothing was changed); err is a statement's error
// (the transaction is to be abandoned).
func (st *enrollStmts) enroll(ctx context.Context, e *store.Enrollment) (refused, err error) {
	a := e.Agent
	res, err := st.useToken.ExecContext(ctx, ns(e.Now), a.ID, e.TokenID, ns(e.Now))
	if err != nil {
		return nil, fmt.Errorf("enroll: %w", err)
	}
	if n, _ := res.RowsAffected(); n != 1 {
		var used int64
		err := st.tokenUsed.QueryRowContext(ctx, e.TokenID).Scan(&used)
		switch {
		case errors.Is(err, sql.ErrNoRows):
			return errs.ErrInvalidToken, nil
		case err != nil:
			return nil, fmt.Errorf("enroll: %w", err)
		case used != 0:
			return errs.ErrTokenUsed, nil
		}
		return errs.ErrTokenExpired, nil
	}
	_, err = st.agent.ExecContext(ctx, a.ID, a.Name, a.Hostname, a.OS, a.Arch, a.AgentVersion, jsonText(a.Tags), ns(a.CreatedAt), ns(a.CreatedAt), a.CertSerial, ns(a.CertExpiresAt), a.MachineID)
	if err != nil {
		return nil, fmt.Errorf("enroll: %w", err)
	}
	if au := e.Audit; au != nil {
		err := st.audit.QueryRowContext(ctx, ns(au.At), au.ActorID, au.ActorName, au.Role, au.Action, au.Target, au.BeforeDigest, au.AfterDigest, au.Source).Scan(&au.ID)
		if err != nil {
			return nil, fmt.Errorf("enroll: audit entry: %w", err)
		}
	}
	return nil, nil
}

func (s *DB) ListTokens(ctx context.Context) ([]*store.EnrollmentToken, error) {
	return queryAll(ctx, s.r, "list tokens", func(row rowScanner) (*store.EnrollmentToken, error) { return scanToken(row) },
		`SELECT `+tokenColumns+` FROM enrollment_tokens ORDER BY created_at DESC, id DESC`)
}

func (s *DB) DeleteToken(ctx context.Context, id string) error {
	return execOne(ctx, s.w, "enrollment token", "delete token", `DELETE FROM enrollment_tokens WHERE id=?`, id)
}

const apiTokenColumns = `id, name, role, secret_hash, created_at, created_by, expires_at, last_used_at, revoked_at`

func scanAPIToken(row rowScanner) (*store.APIToken, error) {
	var t store.APIToken
	var created, expires, used, revoked int64
	if err := row.Scan(&t.ID, &t.Name, &t.Role, &t.SecretHash, &created, &t.CreatedBy, &expires, &used, &revoked); err != nil {
		return nil, err
	}
	t.CreatedAt, t.ExpiresAt, t.LastUsedAt, t.RevokedAt = fromNS(created), fromNS(expires), fromNS(used), fromNS(revoked)
	return &t, nil
}

func (s *DB) CreateAPIToken(ctx context.Context, t *store.APIToken) error {
	_, err := s.w.ExecContext(ctx, `INSERT INTO api_tokens(`+apiTokenColumns+`) VALUES(?,?,?,?,?,?,?,?,?)`,
		t.ID, t.Name, t.Role, t.SecretHash, ns(t.CreatedAt), t.CreatedBy, ns(t.ExpiresAt), ns(t.LastUsedAt), ns(t.RevokedAt))
	if err != nil {
		return fmt.Errorf("create api token: %w", err)
	}
	return nil
}

func (s *DB) EnsureAPIToken(ctx context.Context, t *store.APIToken) error {
	_, err := s.w.ExecContext(ctx, `INSERT INTO api_tokens(`+apiTokenColumns+`) VALUES(?,?,?,?,?,?,?,?,?)
		ON CONFLICT(id) DO UPDATE SET secret_hash=excluded.secret_hash WHERE api_tokens.revoked_at=0`,
		t.ID, t.Name, t.Role, t.SecretHash, ns(t.CreatedAt), t.CreatedBy, ns(t.ExpiresAt), ns(t.LastUsedAt), ns(t.RevokedAt))
	if err != nil {
		return fmt.Errorf("ensure api token: %w", err)
	}
	return nil
}

func (s *DB) GetAPIToken(ctx context.Context, id string) (*store.APIToken, error) {
	return queryOne(ctx, s.r, "API token", "get api token", scanAPIToken, `SELECT `+apiTokenColumns+` FROM api_tokens WHERE id=?`, id)
}

func (s *DB) ListAPITokens(ctx context.Context) ([]*store.APIToken, error) {
	return queryAll(ctx, s.r, "list api tokens", scanAPIToken, `SELECT `+apiTokenColumns+` FROM api_tokens ORDER BY created_at, id`)
}

func (s *DB) RevokeAPIToken(ctx context.Context, id string, now time.Time) error {
	return execOne(ctx, s.w, "API token", "revoke api token", `UPDATE api_tokens SET revoked_at=CASE WHEN revoked_at=0 THEN ? ELSE revoked_at END WHERE id=?`, ns(now), id)
}

func (s *DB) TouchAPIToken(ctx context.Context, id string, now time.Time) error {
	if _, err := s.w.ExecContext(ctx, `UPDATE api_tokens SET last_used_at=? WHERE id=? AND last_used_at<?`, ns(now), id, ns(now)); err != nil {
		return fmt.Errorf("touch api token: %w", err)
	}
	return nil
}
