package server

import (
	"context"
	"database/sql"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/drover/drover/api"
	"github.com/drover/drover/server/errs"
	_ "modernc.org/sqlite" // registers the "sqlite" driver

	"github.com/drover/drover/manifest"
)

//go:embed migrations/*.sql
var migrations embed.FS

// SQLiteStore is the embedded store: one SQLite file in WAL mode. All writes
// go through one connection (SQLite has one writer anyway, and this keeps
// BEGIN IMMEDIATE from ever waiting on itself); reads use a pool of
// read-only connections that WAL lets run beside the writer.
type SQLiteStore struct {
	w *sql.DB
	r *sql.DB
}

// OpenSQLite opens (creating if needed) the database at path and applies the
// embedded migrations. synchronous is "full" or "normal".
func OpenSQLite(ctx context.Context, path, synchronous string) (*SQLiteStore, error) {
	if synchronous == "" {
		synchronous = "full"
	}
	// SQLite creates files with the process umask; create the database
	// 0600 first (its -wal and -shm files inherit the mode).
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open store: %w", err)
	}
	f.Close()
	if err := os.Chmod(path, 0o600); err != nil {
		return nil, fmt.Errorf("open store: %w", err)
	}
	base := path + "?_pragma=busy_timeout(10000)&_pragma=foreign_keys(1)&_pragma=synchronous(" + synchronous + ")"
	w, err := sql.Open("sqlite", base+"&_pragma=journal_mode(WAL)&_pragma=cache_size(-65536)&_txlock=immediate")
	if err != nil {
		return nil, fmt.Errorf("open store: %w", err)
	}
	w.SetMaxOpenConns(1)
	w.SetMaxIdleConns(1)
	w.SetConnMaxIdleTime(0)
	w.SetConnMaxLifetime(0)
	if err := migrate(ctx, w); err != nil {
		w.Close()
		return nil, err
	}
	r, err := sql.Open("sqlite", base+"&_pragma=query_only(1)&_pragma=cache_size(-16384)")
	if err != nil {
		w.Close()
		return nil, fmt.Errorf("open store: %w", err)
	}
	r.SetMaxOpenConns(4)
	r.SetMaxIdleConns(4)
	r.SetConnMaxIdleTime(0)
	return &SQLiteStore{w: w, r: r}, nil
}

// Close closes both pools.
func (s *SQLiteStore) Close() error {
	return errors.Join(s.r.Close(), s.w.Close())
}

// migrate applies migrations/NNNN_*.sql above PRAGMA user_version, each in
// its own transaction together with the version bump.
func migrate(ctx context.Context, db *sql.DB) error {
	files, err := fs.Glob(migrations, "migrations/*.sql")
	if err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	sort.Strings(files)
	for _, f := range files {
		n, err := strconv.Atoi(strings.SplitN(strings.TrimPrefix(f, "migrations/"), "_", 2)[0])
		if err != nil {
			return fmt.Errorf("migrate: bad migration name %s", f)
		}
		body, err := migrations.ReadFile(f)
		if err != nil {
			return fmt.Errorf("migrate: %w", err)
		}
		if err := withTx(ctx, db, func(tx *sql.Tx) error {
			var v int
			if err := tx.QueryRowContext(ctx, "PRAGMA user_version").Scan(&v); err != nil {
				return err
			}
			if v >= n {
				return nil
			}
			if _, err := tx.ExecContext(ctx, string(body)); err != nil {
				return fmt.Errorf("%s: %w", f, err)
			}
			_, err := tx.ExecContext(ctx, fmt.Sprintf("PRAGMA user_version = %d", n))
			return err
		}); err != nil {
			return fmt.Errorf("migrate: %w", err)
		}
	}
	return nil
}

func withTx(ctx context.Context, db *sql.DB, fn func(*sql.Tx) error) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	if err := fn(tx); err != nil {
		tx.Rollback()
		return err
	}
	return tx.Commit()
}

func ns(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}

func fromNS(n int64) time.Time {
	if n == 0 {
		return time.Time{}
	}
	return time.Unix(0, n).UTC()
}

func jsonText(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err) // only maps and slices of plain values are stored
	}
	return string(b)
}

// ---- enrollment tokens

func (s *SQLiteStore) CreateToken(ctx context.Context, t *EnrollmentToken) error {
	_, err := s.w.ExecContext(ctx, `INSERT INTO enrollment_tokens(id, secret_hash, name, tags, created_at, expires_at) VALUES(?,?,?,?,?,?)`,
		t.ID, t.SecretHash, t.Name, jsonText(t.Tags), ns(t.CreatedAt), ns(t.ExpiresAt))
	if err != nil {
		return fmt.Errorf("create token: %w", err)
	}
	return nil
}

func (s *SQLiteStore) GetToken(ctx context.Context, id string) (*EnrollmentToken, error) {
	var t EnrollmentToken
	var tags string
	var created, expires, used int64
	err := s.r.QueryRowContext(ctx, `SELECT id, secret_hash, name, tags, created_at, expires_at, used_at, agent_id FROM enrollment_tokens WHERE id=?`, id).
		Scan(&t.ID, &t.SecretHash, &t.Name, &tags, &created, &expires, &used, &t.AgentID)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, errs.NotFound("token")
	}
	if err != nil {
		return nil, fmt.Errorf("get token: %w", err)
	}
	if err := json.Unmarshal([]byte(tags), &t.Tags); err != nil {
		return nil, fmt.Errorf("get token: %w", err)
	}
	t.CreatedAt, t.ExpiresAt, t.UsedAt = fromNS(created), fromNS(expires), fromNS(used)
	return &t, nil
}

func (s *SQLiteStore) EnrollAgent(ctx context.Context, tokenID string, now time.Time, a *Agent) error {
	return withTx(ctx, s.w, func(tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, `UPDATE enrollment_tokens SET used_at=?, agent_id=? WHERE id=? AND used_at=0 AND expires_at>?`,
			ns(now), a.ID, tokenID, ns(now))
		if err != nil {
			return fmt.Errorf("enroll: %w", err)
		}
		if n, _ := res.RowsAffected(); n != 1 {
			var used int64
			err := tx.QueryRowContext(ctx, `SELECT used_at FROM enrollment_tokens WHERE id=?`, tokenID).Scan(&used)
			switch {
			case errors.Is(err, sql.ErrNoRows):
				return errs.ErrInvalidToken
			case err != nil:
				return fmt.Errorf("enroll: %w", err)
			case used != 0:
				return errs.ErrTokenUsed
			}
			return errs.ErrTokenExpired
		}
		_, err = tx.ExecContext(ctx, `INSERT INTO agents(id, name, hostname, os, arch, agent_version, tags, created_at, updated_at, cert_serial, cert_expires_at, machine_id)
			VALUES(?,?,?,?,?,?,?,?,?,?,?,?)`,
			a.ID, a.Name, a.Hostname, a.OS, a.Arch, a.AgentVersion, jsonText(a.Tags), ns(a.CreatedAt), ns(a.CreatedAt), a.CertSerial, ns(a.CertExpiresAt), a.MachineID)
		if err != nil {
			return fmt.Errorf("enroll: %w", err)
		}
		return nil
	})
}

// ---- agents

const agentColumns = `id, name, hostname, os, arch, agent_version, tags, created_at, cert_serial, cert_expires_at, revoked_at, last_seen_at,
	backend, scope, systemd_version, accepted_serial, accepted_digest, applied_serial, manifest_state, manifest_error, pipe_status, status_at,
	manifest_expired, manifest_expires_at, machine_id, reported_hostname, identity_conflicts, identity_conflict_at, identity_conflict_machine`

func scanAgent(row interface{ Scan(...any) error }) (*Agent, error) {
	var a Agent
	var tags, pipes string
	var created, certExp, revoked, seen, statusAt, expiresAt, conflictAt int64
	err := row.Scan(&a.ID, &a.Name, &a.Hostname, &a.OS, &a.Arch, &a.AgentVersion, &tags, &created, &a.CertSerial, &certExp, &revoked, &seen,
		&a.Backend, &a.Scope, &a.SystemdVersion, &a.AcceptedSerial, &a.AcceptedDigest, &a.AppliedSerial, &a.ManifestState, &a.ManifestError, &pipes, &statusAt,
		&a.ManifestExpired, &expiresAt, &a.MachineID, &a.ReportedHostname, &a.IdentityConflicts, &conflictAt, &a.IdentityConflictMachine)
	if err != nil {
		return nil, err
	}
	if err := json.Unmarshal([]byte(tags), &a.Tags); err != nil {
		return nil, err
	}
	if err := json.Unmarshal([]byte(pipes), &a.Pipes); err != nil {
		return nil, err
	}
	a.CreatedAt, a.CertExpiresAt, a.RevokedAt, a.LastSeenAt, a.StatusAt = fromNS(created), fromNS(certExp), fromNS(revoked), fromNS(seen), fromNS(statusAt)
	a.ManifestExpiresAt, a.IdentityConflictAt = fromNS(expiresAt), fromNS(conflictAt)
	return &a, nil
}

// queryAll runs a query on db and scans every row with scan; the result is
// empty, not nil, when no row matches.
func queryAll[T any](ctx context.Context, db *sql.DB, what string, scan func(row interface{ Scan(...any) error }) (T, error), query string, args ...any) ([]T, error) {
	rows, err := db.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	defer rows.Close()
	out := []T{}
	for rows.Next() {
		v, err := scan(rows)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", what, err)
		}
		out = append(out, v)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	return out, nil
}

func (s *SQLiteStore) GetAgent(ctx context.Context, id string) (*Agent, error) {
	a, err := scanAgent(s.r.QueryRowContext(ctx, `SELECT `+agentColumns+` FROM agents WHERE id=?`, id))
	if errors.Is(err, sql.ErrNoRows) {
		return nil, errs.NotFound("agent")
	}
	if err != nil {
		return nil, fmt.Errorf("get agent: %w", err)
	}
	return a, nil
}

func (s *SQLiteStore) ListAgents(ctx context.Context) ([]*Agent, error) {
	return queryAll(ctx, s.r, "list agents", scanAgent, `SELECT `+agentColumns+` FROM agents ORDER BY created_at, id`)
}

func (s *SQLiteStore) AgentCert(ctx context.Context, id string) (*AgentCert, error) {
	var c AgentCert
	var revoked int64
	err := s.r.QueryRowContext(ctx, `SELECT cert_serial, next_cert_serial, revoked_at FROM agents WHERE id=?`, id).Scan(&c.Serial, &c.NextSerial, &revoked)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, errs.NotFound("agent")
	}
	if err != nil {
		return nil, fmt.Errorf("agent cert: %w", err)
	}
	c.Revoked = revoked != 0
	return &c, nil
}

func (s *SQLiteStore) SetNextCert(ctx context.Context, id, serial string, expires time.Time) error {
	res, err := s.w.ExecContext(ctx, `UPDATE agents SET next_cert_serial=?, next_cert_expires_at=? WHERE id=? AND revoked_at=0`, serial, ns(expires), id)
	if err != nil {
		return fmt.Errorf("set next cert: %w", err)
	}
	if n, _ := res.RowsAffected(); n != 1 {
		return errs.NotFound("agent")
	}
	return nil
}

func (s *SQLiteStore) PromoteCert(ctx context.Context, id, serial string) error {
	_, err := s.w.ExecContext(ctx, `UPDATE agents SET cert_serial=next_cert_serial, cert_expires_at=next_cert_expires_at, next_cert_serial='', next_cert_expires_at=0
		WHERE id=? AND next_cert_serial=? AND revoked_at=0`, id, serial)
	if err != nil {
		return fmt.Errorf("promote cert: %w", err)
	}
	return nil
}

func (s *SQLiteStore) SetAgentTags(ctx context.Context, id string, tags map[string]string, now time.Time) error {
	res, err := s.w.ExecContext(ctx, `UPDATE agents SET tags=?, updated_at=? WHERE id=?`, jsonText(tags), ns(now), id)
	if err != nil {
		return fmt.Errorf("set tags: %w", err)
	}
	if n, _ := res.RowsAffected(); n != 1 {
		return errs.NotFound("agent")
	}
	return nil
}

func (s *SQLiteStore) RevokeAgent(ctx context.Context, id string, now time.Time) error {
	res, err := s.w.ExecContext(ctx, `UPDATE agents SET revoked_at=CASE WHEN revoked_at=0 THEN ? ELSE revoked_at END, next_cert_serial='', updated_at=? WHERE id=?`,
		ns(now), ns(now), id)
	if err != nil {
		return fmt.Errorf("revoke agent: %w", err)
	}
	if n, _ := res.RowsAffected(); n != 1 {
		return errs.NotFound("agent")
	}
	return nil
}

func (s *SQLiteStore) BindMachine(ctx context.Context, id, machineID string, now time.Time) (string, error) {
	if _, err := s.w.ExecContext(ctx, `UPDATE agents SET machine_id=?, updated_at=? WHERE id=? AND machine_id=''`, machineID, ns(now), id); err != nil {
		return "", fmt.Errorf("bind machine: %w", err)
	}
	var bound string
	err := s.w.QueryRowContext(ctx, `SELECT machine_id FROM agents WHERE id=?`, id).Scan(&bound)
	if errors.Is(err, sql.ErrNoRows) {
		return "", errs.NotFound("agent")
	}
	if err != nil {
		return "", fmt.Errorf("bind machine: %w", err)
	}
	return bound, nil
}

func (s *SQLiteStore) NoteIdentityConflict(ctx context.Context, id, machineID string, now time.Time) error {
	_, err := s.w.ExecContext(ctx, `UPDATE agents SET identity_conflicts=identity_conflicts+1, identity_conflict_at=?, identity_conflict_machine=? WHERE id=?`,
		ns(now), machineID, id)
	if err != nil {
		return fmt.Errorf("note identity conflict: %w", err)
	}
	return nil
}

// ---- pipes and payloads

func (s *SQLiteStore) PutPipe(ctx context.Context, p *PipeVersion, payload []byte, now time.Time) (version uint64, created bool, err error) {
	err = withTx(ctx, s.w, func(tx *sql.Tx) error {
		var cur uint64
		var deleted int64
		err := tx.QueryRowContext(ctx, `SELECT current_version, deleted_at FROM pipes WHERE name=?`, p.Name).Scan(&cur, &deleted)
		if err != nil && !errors.Is(err, sql.ErrNoRows) {
			return err
		}
		if err == nil && deleted == 0 {
			var spec, digest string
			if err := tx.QueryRowContext(ctx, `SELECT spec, payload_digest FROM pipe_versions WHERE name=? AND version=?`, p.Name, cur).Scan(&spec, &digest); err != nil {
				return err
			}
			if spec == string(p.SpecJSON) && digest == p.PayloadDigest {
				version = cur
				return nil
			}
		}
		version, created = cur+1, true
		if _, err := tx.ExecContext(ctx, `INSERT INTO payloads(digest, size, data, created_at) VALUES(?,?,?,?) ON CONFLICT(digest) DO NOTHING`,
			p.PayloadDigest, len(payload), payload, ns(now)); err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO pipe_versions(name, version, spec, payload_digest, payload_size, created_at) VALUES(?,?,?,?,?,?)`,
			p.Name, version, string(p.SpecJSON), p.PayloadDigest, p.PayloadSize, ns(now)); err != nil {
			return err
		}
		_, err = tx.ExecContext(ctx, `INSERT INTO pipes(name, current_version, deleted_at, created_at, updated_at) VALUES(?,?,0,?,?)
			ON CONFLICT(name) DO UPDATE SET current_version=excluded.current_version, deleted_at=0, updated_at=excluded.updated_at,
			created_at=CASE WHEN pipes.deleted_at<>0 THEN excluded.created_at ELSE pipes.created_at END`,
			p.Name, version, ns(now), ns(now))
		return err
	})
	if err != nil {
		return 0, false, fmt.Errorf("put pipe: %w", err)
	}
	return version, created, nil
}

func scanPipeVersion(row interface{ Scan(...any) error }, extra ...any) (*PipeVersion, error) {
	var v PipeVersion
	var spec string
	var created int64
	if err := row.Scan(append([]any{&v.Name, &v.Version, &spec, &v.PayloadDigest, &v.PayloadSize, &created}, extra...)...); err != nil {
		return nil, err
	}
	v.SpecJSON = []byte(spec)
	if err := json.Unmarshal(v.SpecJSON, &v.Spec); err != nil {
		return nil, err
	}
	v.CreatedAt = fromNS(created)
	return &v, nil
}

const pipeQuery = `SELECT v.name, v.version, v.spec, v.payload_digest, v.payload_size, v.created_at, p.created_at, p.updated_at
	FROM pipes p JOIN pipe_versions v ON v.name=p.name AND v.version=p.current_version WHERE p.deleted_at=0`

func scanPipe(row interface{ Scan(...any) error }) (*Pipe, error) {
	var created, updated int64
	v, err := scanPipeVersion(row, &created, &updated)
	if err != nil {
		return nil, err
	}
	return &Pipe{PipeVersion: *v, CreatedAt: fromNS(created), UpdatedAt: fromNS(updated)}, nil
}

func (s *SQLiteStore) GetPipe(ctx context.Context, name string) (*Pipe, error) {
	p, err := scanPipe(s.r.QueryRowContext(ctx, pipeQuery+` AND p.name=?`, name))
	if errors.Is(err, sql.ErrNoRows) {
		return nil, errs.NotFound("pipe")
	}
	if err != nil {
		return nil, fmt.Errorf("get pipe: %w", err)
	}
	return p, nil
}

func (s *SQLiteStore) ListPipes(ctx context.Context) ([]*Pipe, error) {
	return queryAll(ctx, s.r, "list pipes", scanPipe, pipeQuery+` ORDER BY p.name`)
}

func (s *SQLiteStore) ListPipeVersions(ctx context.Context, name string) ([]*PipeVersion, error) {
	return queryAll(ctx, s.r, "list pipe versions", func(r interface{ Scan(...any) error }) (*PipeVersion, error) { return scanPipeVersion(r) }, `SELECT name, version, spec, payload_digest, payload_size, created_at FROM pipe_versions WHERE name=? ORDER BY version`, name)
}

func (s *SQLiteStore) DeletePipe(ctx context.Context, name string, now time.Time) error {
	res, err := s.w.ExecContext(ctx, `UPDATE pipes SET deleted_at=?, updated_at=? WHERE name=? AND deleted_at=0`, ns(now), ns(now), name)
	if err != nil {
		return fmt.Errorf("delete pipe: %w", err)
	}
	if n, _ := res.RowsAffected(); n != 1 {
		return errs.NotFound("pipe")
	}
	return nil
}

func (s *SQLiteStore) PayloadSize(ctx context.Context, digest string) (int64, error) {
	var n int64
	err := s.r.QueryRowContext(ctx, `SELECT size FROM payloads WHERE digest=?`, digest).Scan(&n)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, errs.NotFound("payload")
	}
	if err != nil {
		return 0, fmt.Errorf("payload size: %w", err)
	}
	return n, nil
}

// ReadPayload reads a slice of the payload blob with substr, so that a
// fetch holds one buffer, not the whole payload.
func (s *SQLiteStore) ReadPayload(ctx context.Context, digest string, offset int64, buf []byte) (int, error) {
	var b []byte
	err := s.r.QueryRowContext(ctx, `SELECT substr(data, ?, ?) FROM payloads WHERE digest=?`, offset+1, len(buf), digest).Scan(&b)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, errs.NotFound("payload")
	}
	if err != nil {
		return 0, fmt.Errorf("read payload: %w", err)
	}
	return copy(buf, b), nil
}

func (s *SQLiteStore) GetPayload(ctx context.Context, digest string) ([]byte, error) {
	var b []byte
	err := s.r.QueryRowContext(ctx, `SELECT data FROM payloads WHERE digest=?`, digest).Scan(&b)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, errs.NotFound("payload")
	}
	if err != nil {
		return nil, fmt.Errorf("get payload: %w", err)
	}
	return b, nil
}

// ---- manifests

func (s *SQLiteStore) CompileInputs(ctx context.Context, ids []string) ([]*PipeVersion, []*CompileAgent, error) {
	tx, err := s.r.BeginTx(ctx, &sql.TxOptions{ReadOnly: true}) // one snapshot for both queries
	if err != nil {
		return nil, nil, fmt.Errorf("compile inputs: %w", err)
	}
	defer tx.Rollback()
	rows, err := tx.QueryContext(ctx, pipeQuery+` ORDER BY p.name`)
	if err != nil {
		return nil, nil, fmt.Errorf("compile inputs: %w", err)
	}
	var pipes []*PipeVersion
	for rows.Next() {
		p, err := scanPipe(rows)
		if err != nil {
			rows.Close()
			return nil, nil, fmt.Errorf("compile inputs: %w", err)
		}
		pipes = append(pipes, &p.PipeVersion)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, nil, fmt.Errorf("compile inputs: %w", err)
	}

	q := `SELECT a.id, a.tags, m.serial, m.content_hash, m.digest, m.issued_at, m.expires_at, m.key_list_version
		FROM agents a LEFT JOIN manifests m ON m.agent_id=a.id WHERE a.revoked_at=0`
	var args []any
	if ids != nil {
		q += ` AND a.id IN (SELECT value FROM json_each(?))`
		args = append(args, jsonText(ids))
	}
	rows, err = tx.QueryContext(ctx, q+` ORDER BY a.id`, args...)
	if err != nil {
		return nil, nil, fmt.Errorf("compile inputs: %w", err)
	}
	defer rows.Close()
	var agents []*CompileAgent
	for rows.Next() {
		var a CompileAgent
		var tags string
		var serial, issued, expires, klv sql.NullInt64
		var hash, digest sql.NullString
		if err := rows.Scan(&a.ID, &tags, &serial, &hash, &digest, &issued, &expires, &klv); err != nil {
			return nil, nil, fmt.Errorf("compile inputs: %w", err)
		}
		if err := json.Unmarshal([]byte(tags), &a.Tags); err != nil {
			return nil, nil, fmt.Errorf("compile inputs: %w", err)
		}
		if serial.Valid {
			a.Prev = &StoredManifest{AgentID: a.ID, Serial: uint64(serial.Int64), ContentHash: hash.String, Digest: digest.String,
				IssuedAt: fromNS(issued.Int64), ExpiresAt: fromNS(expires.Int64), KeyListVersion: uint64(klv.Int64)}
		}
		agents = append(agents, &a)
	}
	return pipes, agents, rows.Err()
}

func (s *SQLiteStore) SaveManifests(ctx context.Context, ms []*StoredManifest) error {
	err := withTx(ctx, s.w, func(tx *sql.Tx) error {
		meta, err := tx.PrepareContext(ctx, `INSERT INTO manifests(agent_id, serial, content_hash, digest, issued_at, expires_at, key_list_version, payloads, secrets)
			VALUES(?,?,?,?,?,?,?,?,?)
			ON CONFLICT(agent_id) DO UPDATE SET serial=excluded.serial, content_hash=excluded.content_hash, digest=excluded.digest,
			issued_at=excluded.issued_at, expires_at=excluded.expires_at, key_list_version=excluded.key_list_version,
			payloads=excluded.payloads, secrets=excluded.secrets
			WHERE excluded.serial > manifests.serial`)
		if err != nil {
			return err
		}
		defer meta.Close()
		env, err := tx.PrepareContext(ctx, `INSERT OR REPLACE INTO manifest_envelopes(agent_id, envelope) VALUES(?,?)`)
		if err != nil {
			return err
		}
		defer env.Close()
		for _, m := range ms {
			res, err := meta.ExecContext(ctx, m.AgentID, m.Serial, m.ContentHash, m.Digest, ns(m.IssuedAt), ns(m.ExpiresAt),
				m.KeyListVersion, jsonText(nonNil(m.Payloads)), jsonText(nonNil(m.Secrets)))
			if err != nil {
				return err
			}
			if n, _ := res.RowsAffected(); n == 0 {
				continue // a newer serial is already stored
			}
			if _, err := env.ExecContext(ctx, m.AgentID, m.Envelope); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("save manifests: %w", err)
	}
	return nil
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

func (s *SQLiteStore) GetManifest(ctx context.Context, agentID string) (*StoredManifest, error) {
	var m StoredManifest
	var issued, expires int64
	var payloads, secrets string
	err := s.r.QueryRowContext(ctx, `SELECT m.agent_id, m.serial, m.content_hash, m.digest, e.envelope, m.issued_at, m.expires_at, m.key_list_version,
		m.payloads, m.secrets FROM manifests m JOIN manifest_envelopes e ON e.agent_id=m.agent_id WHERE m.agent_id=?`, agentID).
		Scan(&m.AgentID, &m.Serial, &m.ContentHash, &m.Digest, &m.Envelope, &issued, &expires, &m.KeyListVersion, &payloads, &secrets)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, errs.NotFound("manifest")
	}
	if err != nil {
		return nil, fmt.Errorf("get manifest: %w", err)
	}
	if err := json.Unmarshal([]byte(payloads), &m.Payloads); err != nil {
		return nil, fmt.Errorf("get manifest: %w", err)
	}
	if err := json.Unmarshal([]byte(secrets), &m.Secrets); err != nil {
		return nil, fmt.Errorf("get manifest: %w", err)
	}
	m.IssuedAt, m.ExpiresAt = fromNS(issued), fromNS(expires)
	return &m, nil
}

func (s *SQLiteStore) ManifestsDue(ctx context.Context, issuedBefore time.Time) ([]string, error) {
	rows, err := s.r.QueryContext(ctx, `SELECT m.agent_id FROM manifests m JOIN agents a ON a.id=m.agent_id WHERE a.revoked_at=0 AND m.issued_at<?`, ns(issuedBefore))
	if err != nil {
		return nil, fmt.Errorf("manifests due: %w", err)
	}
	defer rows.Close()
	var ids []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			return nil, fmt.Errorf("manifests due: %w", err)
		}
		ids = append(ids, id)
	}
	return ids, rows.Err()
}

func (s *SQLiteStore) AgentsUsingSecret(ctx context.Context, name string) ([]string, error) {
	rows, err := s.r.QueryContext(ctx, `SELECT m.agent_id FROM manifests m JOIN agents a ON a.id=m.agent_id
		WHERE a.revoked_at=0 AND EXISTS (SELECT 1 FROM json_each(m.secrets) WHERE value=?)`, name)
	if err != nil {
		return nil, fmt.Errorf("agents using secret: %w", err)
	}
	defer rows.Close()
	var ids []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			return nil, fmt.Errorf("agents using secret: %w", err)
		}
		ids = append(ids, id)
	}
	return ids, rows.Err()
}

// ---- secrets

func (s *SQLiteStore) PutSecret(ctx context.Context, name string, sealed []byte, now time.Time) error {
	_, err := s.w.ExecContext(ctx, `INSERT INTO secrets(name, sealed, created_at, updated_at) VALUES(?,?,?,?)
		ON CONFLICT(name) DO UPDATE SET sealed=excluded.sealed, updated_at=excluded.updated_at`, name, sealed, ns(now), ns(now))
	if err != nil {
		return fmt.Errorf("put secret: %w", err)
	}
	return nil
}

func (s *SQLiteStore) ListSecrets(ctx context.Context) ([]api.Secret, error) {
	rows, err := s.r.QueryContext(ctx, `SELECT name, created_at, updated_at FROM secrets ORDER BY name`)
	if err != nil {
		return nil, fmt.Errorf("list secrets: %w", err)
	}
	defer rows.Close()
	out := []api.Secret{}
	for rows.Next() {
		var si api.Secret
		var c, u int64
		if err := rows.Scan(&si.Name, &c, &u); err != nil {
			return nil, fmt.Errorf("list secrets: %w", err)
		}
		si.CreatedAt, si.UpdatedAt = fromNS(c), fromNS(u)
		out = append(out, si)
	}
	return out, rows.Err()
}

func (s *SQLiteStore) DeleteSecret(ctx context.Context, name string) error {
	res, err := s.w.ExecContext(ctx, `DELETE FROM secrets WHERE name=?`, name)
	if err != nil {
		return fmt.Errorf("delete secret: %w", err)
	}
	if n, _ := res.RowsAffected(); n != 1 {
		return errs.NotFound("secret")
	}
	return nil
}

func (s *SQLiteStore) GetSecrets(ctx context.Context, names []string) (map[string][]byte, error) {
	out := map[string][]byte{}
	if len(names) == 0 {
		return out, nil
	}
	rows, err := s.r.QueryContext(ctx, `SELECT name, sealed FROM secrets WHERE name IN (SELECT value FROM json_each(?))`, jsonText(names))
	if err != nil {
		return nil, fmt.Errorf("get secrets: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var name string
		var sealed []byte
		if err := rows.Scan(&name, &sealed); err != nil {
			return nil, fmt.Errorf("get secrets: %w", err)
		}
		out[name] = sealed
	}
	return out, rows.Err()
}

// ---- runs and logs

const runColumns = `id, agent_id, pipe, pipe_version, trigger, status, exit_code, signal, error, request_id, scheduled_at, started_at, finished_at,
	duration_ms, log_chunks, log_bytes, log_truncated, created_at, updated_at, reason, attempts, written_by`

func scanRun(row interface{ Scan(...any) error }) (*Run, error) {
	var r Run
	var sched, started, finished, created, updated int64
	var truncated int
	if err := row.Scan(&r.ID, &r.AgentID, &r.Pipe, &r.PipeVersion, &r.Trigger, &r.Status, &r.ExitCode, &r.Signal, &r.Error, &r.RequestID,
		&sched, &started, &finished, &r.DurationMS, &r.LogChunks, &r.LogBytes, &truncated, &created, &updated, &r.Reason, &r.Attempts, &r.WrittenBy); err != nil {
		return nil, err
	}
	r.ScheduledAt, r.StartedAt, r.FinishedAt, r.CreatedAt, r.UpdatedAt = fromNS(sched), fromNS(started), fromNS(finished), fromNS(created), fromNS(updated)
	r.LogTruncated = truncated != 0
	return &r, nil
}

func (s *SQLiteStore) ListRuns(ctx context.Context, f RunFilter) ([]*Run, error) {
	return s.listRuns(ctx, f)
}

func (s *SQLiteStore) GetRun(ctx context.Context, id string) (*Run, error) {
	r, err := scanRun(s.r.QueryRowContext(ctx, `SELECT `+runColumns+` FROM runs WHERE id=?`, id))
	if errors.Is(err, sql.ErrNoRows) {
		return nil, errs.NotFound("run")
	}
	if err != nil {
		return nil, fmt.Errorf("get run: %w", err)
	}
	return r, nil
}

// scanLogChunk reads run_id, seq, stream, data, at.
func scanLogChunk(row interface{ Scan(...any) error }) (*LogChunk, error) {
	var c LogChunk
	var at int64
	if err := row.Scan(&c.RunID, &c.Seq, &c.Stream, &c.Data, &at); err != nil {
		return nil, err
	}
	c.At = fromNS(at)
	return &c, nil
}

func (s *SQLiteStore) GetLogs(ctx context.Context, runID string) ([]*LogChunk, error) {
	return queryAll(ctx, s.r, "get logs", scanLogChunk, `SELECT run_id, seq, stream, data, at FROM log_chunks WHERE run_id=? ORDER BY seq`, runID)
}

func (s *SQLiteStore) PruneRuns(ctx context.Context, before time.Time, perPipe int) (int, error) {
	var total int
	err := withTx(ctx, s.w, func(tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, `DELETE FROM log_chunks WHERE run_id IN (SELECT id FROM runs WHERE updated_at<?)`, ns(before)); err != nil {
			return err
		}
		res, err := tx.ExecContext(ctx, `DELETE FROM runs WHERE updated_at<?`, ns(before))
		if err != nil {
			return err
		}
		n, _ := res.RowsAffected()
		total += int(n)
		rows, err := tx.QueryContext(ctx, `SELECT pipe FROM runs GROUP BY pipe HAVING COUNT(*)>?`, perPipe)
		if err != nil {
			return err
		}
		var pipes []string
		for rows.Next() {
			var p string
			if err := rows.Scan(&p); err != nil {
				rows.Close()
				return err
			}
			pipes = append(pipes, p)
		}
		rows.Close()
		for _, p := range pipes {
			old := `SELECT id FROM runs WHERE pipe=? ORDER BY created_at DESC, id DESC LIMIT -1 OFFSET ?`
			if _, err := tx.ExecContext(ctx, `DELETE FROM log_chunks WHERE run_id IN (`+old+`)`, p, perPipe); err != nil {
				return err
			}
			res, err := tx.ExecContext(ctx, `DELETE FROM runs WHERE id IN (`+old+`)`, p, perPipe)
			if err != nil {
				return err
			}
			n, _ := res.RowsAffected()
			total += int(n)
		}
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("prune runs: %w", err)
	}
	return total, nil
}

// ---- ingestion

// ingestTx holds the prepared statements of one ApplyRecords transaction.
type ingestTx struct {
	ctx   context.Context
	tx    *sql.Tx
	stmts map[string]*sql.Stmt
}

func (t *ingestTx) exec(query string, args ...any) (sql.Result, error) {
	st, ok := t.stmts[query]
	if !ok {
		var err error
		if st, err = t.tx.PrepareContext(t.ctx, query); err != nil {
			return nil, err
		}
		t.stmts[query] = st
	}
	return st.ExecContext(t.ctx, args...)
}

const (
	// A Hello's hostname is kept as reported_hostname: the hostname checked
	// at enrollment is not the agent's to change.
	sqlHello = `UPDATE agents SET agent_version=?, os=?, arch=?, reported_hostname=?, backend=?, scope=?, systemd_version=?,
		accepted_serial=?, accepted_digest=?, updated_at=? WHERE id=?`
	sqlStatus = `UPDATE agents SET applied_serial=?, manifest_state=?, manifest_error=?, pipe_status=?, status_seq=?, status_at=?, updated_at=?,
		manifest_expired=?, manifest_expires_at=?
		WHERE id=? AND status_seq<?`
	sqlRunStarted = `INSERT INTO runs(id, agent_id, pipe, pipe_version, trigger, status, started_at, scheduled_at, request_id, attempts, created_at, updated_at)
		VALUES(?,?,?,?,?,'running',?,?,?,?,?,?)
		ON CONFLICT(id) DO UPDATE SET
			pipe=CASE WHEN runs.pipe='' THEN excluded.pipe ELSE runs.pipe END,
			pipe_version=CASE WHEN runs.pipe_version=0 THEN excluded.pipe_version ELSE runs.pipe_version END,
			trigger=CASE WHEN runs.trigger='' THEN excluded.trigger ELSE runs.trigger END,
			started_at=CASE WHEN runs.started_at=0 THEN excluded.started_at ELSE runs.started_at END,
			scheduled_at=CASE WHEN runs.scheduled_at=0 THEN excluded.scheduled_at ELSE runs.scheduled_at END,
			request_id=CASE WHEN runs.request_id='' THEN excluded.request_id ELSE runs.request_id END,
			attempts=CASE WHEN runs.status IN ('pending','running') AND excluded.attempts>runs.attempts THEN excluded.attempts ELSE runs.attempts END,
			status=CASE WHEN runs.status IN ('pending','running') THEN 'running' ELSE runs.status END,
			updated_at=excluded.updated_at
		WHERE runs.agent_id=excluded.agent_id`
	sqlRunFinished = `INSERT INTO runs(id, agent_id, pipe, pipe_version, trigger, status, exit_code, signal, error, request_id, scheduled_at,
			started_at, finished_at, duration_ms, log_chunks, reason, attempts, written_by, created_at, updated_at)
		VALUES(?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)
		ON CONFLICT(id) DO UPDATE SET
			pipe=CASE WHEN excluded.pipe<>'' THEN excluded.pipe ELSE runs.pipe END,
			pipe_version=CASE WHEN excluded.pipe_version<>0 THEN excluded.pipe_version ELSE runs.pipe_version END,
			trigger=CASE WHEN excluded.trigger<>'' THEN excluded.trigger ELSE runs.trigger END,
			status=excluded.status, exit_code=excluded.exit_code, signal=excluded.signal, error=excluded.error,
			request_id=CASE WHEN excluded.request_id<>'' THEN excluded.request_id ELSE runs.request_id END,
			scheduled_at=CASE WHEN excluded.scheduled_at<>0 THEN excluded.scheduled_at ELSE runs.scheduled_at END,
			started_at=CASE WHEN excluded.started_at<>0 THEN excluded.started_at ELSE runs.started_at END,
			finished_at=excluded.finished_at, duration_ms=excluded.duration_ms, log_chunks=excluded.log_chunks,
			reason=excluded.reason, attempts=CASE WHEN excluded.attempts<>0 THEN excluded.attempts ELSE runs.attempts END,
			written_by=excluded.written_by, updated_at=excluded.updated_at
		WHERE runs.agent_id=excluded.agent_id`
	// A drained heartbeat clears the strikes of the unfinished runs it
	// lists, adds one to those it does not list that started before it
	// (started_at on the agent's clock, else created_at on the server's),
	// and settles those with lostStrikes strikes.
	sqlListed = `UPDATE runs SET unlisted=0
		WHERE agent_id=? AND status IN ('pending','running') AND unlisted<>0 AND id IN (SELECT value FROM json_each(?))`
	sqlUnlisted = `UPDATE runs SET unlisted=unlisted+1
		WHERE agent_id=? AND status IN ('pending','running')
			AND ((started_at<>0 AND started_at<?) OR (started_at=0 AND created_at<?))
			AND id NOT IN (SELECT value FROM json_each(?))`
	sqlSettle = `UPDATE runs SET status='failed', reason='lost', written_by='server', finished_at=?, updated_at=?, unlisted=0,
			error='the agent no longer runs it and every record it had was committed: its end was never reported'
		WHERE agent_id=? AND status IN ('pending','running') AND unlisted>=?
		RETURNING id`
	sqlRunPlaceholder = `INSERT INTO runs(id, agent_id, status, created_at, updated_at) VALUES(?,?,'running',?,?) ON CONFLICT(id) DO NOTHING`
	sqlChunk          = `INSERT INTO log_chunks(run_id, seq, stream, data, at) VALUES(?,?,?,?,?) ON CONFLICT(run_id, seq) DO NOTHING`
	sqlRunLog         = `UPDATE runs SET log_bytes=?, log_truncated=?, updated_at=? WHERE id=?`
	sqlSeen           = `UPDATE agents SET last_seen_at=? WHERE id=? AND last_seen_at<?`
)

// runLog tracks one run's log accounting within a batch.
type runLog struct {
	agentID   string
	bytes     int64
	truncated bool
	dirty     bool
	at        time.Time
}

// ApplyRecords commits recs in one transaction. Every statement is an
// idempotent upsert, so a replayed record changes nothing. Runs belong to
// the agent that first reported them: records about another agent's run are
// ignored. Log chunks are counted against the per-run cap only when they are
// new; the first chunk over the cap is replaced by a truncation marker and
// later ones are dropped.
func (s *SQLiteStore) ApplyRecords(ctx context.Context, recs []*Record, lim IngestLimits) error {
	tx, err := s.w.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("apply records: %w", err)
	}
	t := &ingestTx{ctx: ctx, tx: tx, stmts: map[string]*sql.Stmt{}}
	err = t.apply(recs, lim)
	for _, st := range t.stmts {
		st.Close()
	}
	if err != nil {
		tx.Rollback()
		return fmt.Errorf("apply records: %w", err)
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("apply records: commit: %w", err)
	}
	return nil
}

func (t *ingestTx) apply(recs []*Record, lim IngestLimits) error {
	seen := map[string]time.Time{}
	runs := map[string]*runLog{}
	for _, r := range recs {
		now := r.Received
		if now.After(seen[r.AgentID]) {
			seen[r.AgentID] = now
		}
		var err error
		switch {
		case r.Hello != nil:
			h := r.Hello
			_, err = t.exec(sqlHello, h.AgentVersion, h.OS, h.Arch, h.Hostname, h.Backend, h.Scope, h.SystemdVersion,
				h.ManifestSerial, h.ManifestDigest, ns(now), r.AgentID)
		case r.Status != nil:
			st := r.Status
			at := st.At
			if at.IsZero() {
				at = now
			}
			_, err = t.exec(sqlStatus, st.AppliedSerial, st.State, st.Error, jsonText(nonNilPipes(st.Pipes)), r.Seq, ns(at), ns(now),
				st.Expired, ns(st.ExpiresAt), r.AgentID, r.Seq)
		case r.RunStarted != nil:
			x := r.RunStarted
			if err = t.dropMissed(r.AgentID, x); err != nil {
				return err
			}
			_, err = t.exec(sqlRunStarted, x.ID, r.AgentID, x.Pipe, x.PipeVersion, x.Trigger, ns(x.StartedAt), ns(x.ScheduledAt), x.RequestID, x.Attempts, ns(now), ns(now))
		case r.RunFinished != nil:
			x := r.RunFinished
			if err = t.dropMissed(r.AgentID, x); err != nil {
				return err
			}
			_, err = t.exec(sqlRunFinished, x.ID, r.AgentID, x.Pipe, x.PipeVersion, x.Trigger, x.Status, x.ExitCode, x.Signal, x.Error, x.RequestID,
				ns(x.ScheduledAt), ns(x.StartedAt), ns(x.FinishedAt), x.DurationMS, x.LogChunks, x.Reason, x.Attempts, x.WrittenBy, ns(now), ns(now))
		case r.Chunk != nil:
			err = t.chunk(r, runs, lim)
		case r.Settle != nil:
			err = t.settle(r)
		}
		if err != nil {
			return err
		}
	}
	for id, rl := range runs {
		if rl.dirty {
			if _, err := t.exec(sqlRunLog, rl.bytes, rl.truncated, ns(rl.at), id); err != nil {
				return err
			}
		}
	}
	for id, at := range seen {
		if _, err := t.exec(sqlSeen, ns(at), id, ns(at)); err != nil {
			return err
		}
	}
	return nil
}

// dropMissed removes the missed run that the server recorded for the fire
// time a real record serves (sqlite_monitor.go): the truth replaces it.
func (t *ingestTx) dropMissed(agentID string, x *Run) error {
	if x.ScheduledAt.IsZero() || x.Pipe == "" {
		return nil
	}
	id := missedRunID(agentID, x.Pipe, x.ScheduledAt)
	if id == x.ID {
		return nil
	}
	_, err := t.exec(`DELETE FROM runs WHERE id=? AND agent_id=? AND status='missed'`, id, agentID)
	return err
}

func (t *ingestTx) chunk(r *Record, runs map[string]*runLog, lim IngestLimits) error {
	c := r.Chunk
	rl := runs[c.RunID]
	if rl == nil {
		if _, err := t.exec(sqlRunPlaceholder, c.RunID, r.AgentID, ns(r.Received), ns(r.Received)); err != nil {
			return err
		}
		rl = &runLog{}
		var truncated int
		err := t.tx.QueryRowContext(t.ctx, `SELECT agent_id, log_bytes, log_truncated FROM runs WHERE id=?`, c.RunID).Scan(&rl.agentID, &rl.bytes, &truncated)
		if err != nil {
			return err
		}
		rl.truncated = truncated != 0
		runs[c.RunID] = rl
	}
	if rl.agentID != r.AgentID || rl.truncated {
		return nil
	}
	data, stream, over := c.Data, c.Stream, false
	if rl.bytes+int64(len(data)) > lim.MaxLogBytes {
		data, stream, over = truncationMarker(lim.MaxLogBytes), "system", true
	}
	at := c.At
	if at.IsZero() {
		at = r.Received
	}
	res, err := t.exec(sqlChunk, c.RunID, c.Seq, stream, data, ns(at))
	if err != nil {
		return err
	}
	if n, _ := res.RowsAffected(); n == 1 {
		if over {
			rl.truncated = true
		} else {
			rl.bytes += int64(len(data))
		}
		rl.dirty, rl.at = true, r.Received
	}
	return nil
}

// lostStrikes is how many drained heartbeats in a row must leave a run out
// before it is settled lost: one heartbeat built while the agent could not
// read its scheduler's state must not settle runs that are alive.
const lostStrikes = 2

func (t *ingestTx) settle(r *Record) error {
	st := r.Settle
	sent := st.SentAt
	if sent.IsZero() {
		sent = r.Received
	}
	running := make([]string, 0, len(st.Running))
	for id := range st.Running {
		running = append(running, id)
	}
	listed := jsonText(running)
	if _, err := t.exec(sqlListed, r.AgentID, listed); err != nil {
		return err
	}
	if _, err := t.exec(sqlUnlisted, r.AgentID, ns(sent), ns(r.Received), listed); err != nil {
		return err
	}
	rows, err := t.tx.QueryContext(t.ctx, sqlSettle, ns(r.Received), ns(r.Received), r.AgentID, lostStrikes)
	if err != nil {
		return err
	}
	defer rows.Close()
	st.Settled = st.Settled[:0]
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			return err
		}
		st.Settled = append(st.Settled, id)
	}
	return rows.Err()
}

func nonNilPipes(p []api.PipeStatus) []api.PipeStatus {
	if p == nil {
		return []api.PipeStatus{}
	}
	return p
}

// compile-time check that SQLiteStore is a complete Store.
var _ Store = (*SQLiteStore)(nil)

// specJSON returns the canonical JSON of a normalized spec, as stored and as
// compared to decide whether a pipe changed.
func specJSON(s *manifest.Spec) ([]byte, error) {
	return json.Marshal(s)
}
