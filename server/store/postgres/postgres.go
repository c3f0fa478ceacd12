// Package postgres is the shared store: a PostgreSQL database holding
// everything the server keeps (store.Store), for several servers in front
// of one database (docs/postgres.md). The entity code, shared with the
// SQLite store, is package sqlstore's; this package opens the pool, applies
// its own embedded schema migrations (numbered like SQLite's so that both
// report the same schema version), runs transactions SERIALIZABLE with
// retries, rewrites ? placeholders to $n and says how PostgreSQL spells what
// the two databases spell differently (its sqlstore.Dialect). Only the server's
// wiring and tools (the drover-server CLI) open it; everything else goes
// through package store's interfaces.
package postgres

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"net/url"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/drover/drover/server/store"
	"github.com/drover/drover/server/store/sqlstore"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
)

//go:embed migrations/*.sql
var migrations embed.FS

// Pool sizes the connection pool; zero fields take pgxpool's defaults
// (max_conns the larger of 4 and the number of CPUs, min_conns 0, an hour's
// lifetime, half an hour idle).
type Pool struct {
	MaxConns        int32
	MinConns        int32
	MaxConnLifetime time.Duration
	MaxConnIdleTime time.Duration
}

// DB is the PostgreSQL store: one pgxpool pool, used through database/sql
// so that it runs the same queries as the SQLite store (package sqlstore). Transactions that the
// SQLite store runs under its single writer run here SERIALIZABLE and are
// retried on a serialization failure.
type DB struct {
	*sqlstore.DB
	pool *pgxpool.Pool
	sql  *sql.DB
	w, r *conn
}

// defaultConnectTimeout bounds each connection attempt when the DSN sets no
// connect_timeout, so that an unreachable database fails the start rather
// than hanging it.
const defaultConnectTimeout = 10 * time.Second

// ErrSchemaNewer is returned by Open when the database was migrated by a
// newer drover-server: this binary does not know its schema and refuses it.
var ErrSchemaNewer = errors.New("the database schema is newer than this drover-server")

// Open connects to the database named by dsn (a postgres:// URL or a
// key=value connection string), checks that it is reachable and applies the
// embedded migrations. Errors never show the DSN's password.
func Open(ctx context.Context, dsn string, p Pool) (*DB, error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("open store: store.dsn is not a valid PostgreSQL connection string: %s", Redact(err.Error(), dsn))
	}
	if cfg.ConnConfig.ConnectTimeout == 0 {
		cfg.ConnConfig.ConnectTimeout = defaultConnectTimeout // the DSN's connect_timeout wins
	}
	if p.MaxConns > 0 {
		cfg.MaxConns = p.MaxConns
	}
	if p.MinConns > 0 {
		cfg.MinConns = p.MinConns
	}
	if p.MaxConnLifetime > 0 {
		cfg.MaxConnLifetime = p.MaxConnLifetime
	}
	if p.MaxConnIdleTime > 0 {
		cfg.MaxConnIdleTime = p.MaxConnIdleTime
	}
	where := fmt.Sprintf("%s:%d database %q user %q", cfg.ConnConfig.Host, cfg.ConnConfig.Port, cfg.ConnConfig.Database, cfg.ConnConfig.User)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("open store: PostgreSQL at %s: %s", where, Redact(err.Error(), dsn))
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("open store: cannot reach PostgreSQL at %s: %s", where, Redact(err.Error(), dsn))
	}
	db := stdlib.OpenDBFromPool(pool)
	s := &DB{pool: pool, sql: db, w: &conn{db}, r: &conn{db}}
	s.DB = sqlstore.New(sqlstore.Backend{
		W: s.w, R: s.r,
		WriteTx: func(ctx context.Context, fn func(sqlstore.Tx) error) error {
			return withTx(ctx, s.w, func(tx *txn) error { return fn(tx) })
		},
		InitTx: func(ctx context.Context, lock int64, fn func(sqlstore.Tx) error) error {
			return lockedTx(ctx, s.w, lock, func(tx *txn) error { return fn(tx) })
		},
		ReadTx: func(ctx context.Context) (sqlstore.ReadTx, error) { return s.readTx(ctx) },
	}, dialect)
	if err := s.migrate(ctx); err != nil {
		s.Close()
		return nil, fmt.Errorf("open store: PostgreSQL at %s: %w", where, err) // migration errors do not hold the DSN
	}
	return s, nil
}

var pwField = regexp.MustCompile(`password=('(?:[^'\\]|\\.)*'|\S+)`)

// Redact removes the password of dsn from msg.
func Redact(msg, dsn string) string {
	var pws []string
	if u, err := url.Parse(dsn); err == nil && u.User != nil {
		if pw, ok := u.User.Password(); ok && pw != "" {
			pws = append(pws, pw, url.QueryEscape(pw), url.PathEscape(pw))
		}
	}
	for _, m := range pwField.FindAllStringSubmatch(dsn, -1) {
		pws = append(pws, m[1], strings.Trim(m[1], "'"))
	}
	for _, pw := range pws {
		if pw != "" {
			msg = strings.ReplaceAll(msg, pw, "xxxxx")
		}
	}
	return pwField.ReplaceAllString(msg, "password=xxxxx")
}

// SQL is the database/sql handle on the pool, for tests and tools that
// inspect the database directly (queries use $1 placeholders).
func (s *DB) SQL() *sql.DB { return s.sql }

// ListenConfig is a copy of the pool's connection settings, for a
// connection of its own (the signal bus's LISTEN).
func (s *DB) ListenConfig() *pgx.ConnConfig { return s.pool.Config().ConnConfig.Copy() }

// Close closes the pool.
func (s *DB) Close() error {
	err := s.sql.Close()
	s.pool.Close()
	return err
}

// migrationLock is the advisory lock key that serialises migrations of one
// database by several servers starting at once.
const migrationLock = 0x64726f76 // "drov"

// SchemaVersion is the version of the last migration applied.
func (s *DB) SchemaVersion(ctx context.Context) (int, error) {
	var v int
	err := s.r.QueryRowContext(ctx, `SELECT version FROM drover_schema`).Scan(&v)
	return v, err
}

// migrate applies migrations/NNNN_*.sql above the version in drover_schema,
// each in its own transaction together with the version bump, under an
// advisory lock so that servers starting together migrate once. A version
// above the last embedded migration is refused (ErrSchemaNewer).
func (s *DB) migrate(ctx context.Context) error {
	files, err := fs.Glob(migrations, "migrations/*.sql")
	if err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	sort.Strings(files)
	// Numbers rise; one may be missing (numbers are handed out ahead of
	// the migrations that take them).
	nums := make([]int, len(files))
	for i, f := range files {
		n, err := strconv.Atoi(strings.SplitN(strings.TrimPrefix(f, "migrations/"), "_", 2)[0])
		if err != nil || n < 1 || i > 0 && n <= nums[i-1] {
			return fmt.Errorf("migrate: bad migration name %s", f)
		}
		nums[i] = n
	}
	known := 0
	if len(nums) > 0 {
		known = nums[len(nums)-1]
	}
	step := func(n int, name, body string) error {
		return lockedTx(ctx, s.w, migrationLock, func(tx *txn) error {
			if _, err := tx.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS drover_schema (version INTEGER NOT NULL)`); err != nil {
				return err
			}
			var v int
			err := tx.QueryRowContext(ctx, `SELECT version FROM drover_schema`).Scan(&v)
			if errors.Is(err, sql.ErrNoRows) {
				if _, err := tx.ExecContext(ctx, `INSERT INTO drover_schema(version) VALUES(0)`); err != nil {
					return err
				}
			} else if err != nil {
				return err
			}
			if v > known {
				return fmt.Errorf("%w: it is at version %d, this binary knows up to %d; run the newer drover-server", ErrSchemaNewer, v, known)
			}
			if n == 0 || v >= n {
				return nil
			}
			if _, err := tx.ExecContext(ctx, body); err != nil {
				return fmt.Errorf("%s: %w", name, err)
			}
			_, err = tx.ExecContext(ctx, `UPDATE drover_schema SET version=?`, n)
			return err
		})
	}
	if err := step(0, "", ""); err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	for i, f := range files {
		body, err := migrations.ReadFile(f)
		if err != nil {
			return fmt.Errorf("migrate: %w", err)
		}
		if err := step(nums[i], f, string(body)); err != nil {
			return fmt.Errorf("migrate: %w", err)
		}
	}
	return nil
}

// notifyCursorKey is the notify_state key of the routing cursor. The SQLite
// store uses "\x00cursor"; PostgreSQL text cannot hold NUL, and \x01 is no
// more possible than NUL in a routing key.
const notifyCursorKey = "\x01cursor"

// dialect is PostgreSQL's SQL where it differs from SQLite's.
var dialect = sqlstore.Dialect{
	JSONValues: func(expr string) string { return "json_array_elements_text(" + expr + "::json)" },
	ForUpdate:  " FOR UPDATE",
	// SQLite reads a negative limit as no limit, PostgreSQL refuses it and
	// reads NULL so.
	Limit: func(n int) any {
		if n < 0 {
			return nil
		}
		return n
	},
	OffsetAll:       "OFFSET ?",
	NotifyCursorKey: notifyCursorKey,
}

// conn is the pool seen through database/sql with the SQLite store's ?
// placeholders rewritten to PostgreSQL's $n.
type conn struct{ db *sql.DB }

func (c *conn) ExecContext(ctx context.Context, q string, args ...any) (sql.Result, error) {
	return c.db.ExecContext(ctx, rebind(q), args...)
}

func (c *conn) QueryContext(ctx context.Context, q string, args ...any) (*sql.Rows, error) {
	return c.db.QueryContext(ctx, rebind(q), args...)
}

func (c *conn) QueryRowContext(ctx context.Context, q string, args ...any) *sql.Row {
	return c.db.QueryRowContext(ctx, rebind(q), args...)
}

func (c *conn) BeginTx(ctx context.Context, opts *sql.TxOptions) (*txn, error) {
	tx, err := c.db.BeginTx(ctx, opts)
	if err != nil {
		return nil, err
	}
	return &txn{tx}, nil
}

// txn is one transaction, with placeholders rewritten like conn's.
type txn struct{ tx *sql.Tx }

func (t *txn) ExecContext(ctx context.Context, q string, args ...any) (sql.Result, error) {
	return t.tx.ExecContext(ctx, rebind(q), args...)
}

func (t *txn) QueryContext(ctx context.Context, q string, args ...any) (*sql.Rows, error) {
	return t.tx.QueryContext(ctx, rebind(q), args...)
}

func (t *txn) QueryRowContext(ctx context.Context, q string, args ...any) *sql.Row {
	return t.tx.QueryRowContext(ctx, rebind(q), args...)
}

func (t *txn) PrepareContext(ctx context.Context, q string) (*sql.Stmt, error) {
	return t.tx.PrepareContext(ctx, rebind(q))
}

func (t *txn) StmtContext(ctx context.Context, st *sql.Stmt) *sql.Stmt {
	return t.tx.StmtContext(ctx, st)
}

func (t *txn) Rollback() error { return t.tx.Rollback() }
func (t *txn) Commit() error   { return t.tx.Commit() }

var rebound sync.Map // query -> rewritten query

// rebind rewrites each ? outside quotes in q to $1, $2, ...
func rebind(q string) string {
	if v, ok := rebound.Load(q); ok {
		return v.(string)
	}
	var b strings.Builder
	n, quoted := 0, false
	for _, r := range q {
		switch {
		case r == '\'':
			quoted = !quoted
		case r == '?' && !quoted:
			n++
			b.WriteString("$" + strconv.Itoa(n))
			continue
		}
		b.WriteRune(r)
	}
	out := b.String()
	rebound.Store(q, out)
	return out
}

// maxAttempts bounds the retries of a transaction that keeps losing
// serialization conflicts.
const maxAttempts = 20

// withTx runs fn in one SERIALIZABLE transaction, retrying it from the
// start when PostgreSQL aborts it for a serialization failure or deadlock:
// fn must be safe to run again.
func withTx(ctx context.Context, c *conn, fn func(*txn) error) error {
	for attempt := 1; ; attempt++ {
		err := tryTx(ctx, c, fn)
		if err == nil || !retryable(err) || attempt == maxAttempts {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(time.Duration(attempt)*5*time.Millisecond + rand.N(5*time.Millisecond)):
		}
	}
}

func tryTx(ctx context.Context, c *conn, fn func(*txn) error) error {
	tx, err := c.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelSerializable})
	return sqlstore.Run(tx, err, fn)
}

// lockedTx runs fn in one READ COMMITTED transaction that first takes the
// advisory lock key: the statements after the lock see what an earlier
// holder committed (a SERIALIZABLE snapshot would be taken before the
// wait and miss it).
func lockedTx(ctx context.Context, c *conn, key int64, fn func(*txn) error) error {
	tx, err := c.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
	return sqlstore.Run(tx, err, func(tx *txn) error {
		if _, err := tx.ExecContext(ctx, `SELECT pg_advisory_xact_lock(?)`, key); err != nil {
			return err
		}
		return fn(tx)
	})
}

func retryable(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && (pe.Code == "40001" || pe.Code == "40P01")
}

// readTx begins a read-only transaction on one snapshot.
func (s *DB) readTx(ctx context.Context) (*txn, error) {
	return s.r.BeginTx(ctx, &sql.TxOptions{ReadOnly: true, Isolation: sql.LevelRepeatableRead})
}

func ns(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}

// compile-time check that DB is a complete Store.
var _ store.Store = (*DB)(nil)
