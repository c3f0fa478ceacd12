// Package sqlite is the embedded store: one SQLite file in WAL mode holding
// everything the server keeps (store.Store), one file per entity, with its
// schema migrations embedded. Only the server's wiring and tools (the
// drover-server CLI) open it; everything else goes through package store's
// interfaces.
package sqlite

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

	"github.com/drover/drover/server/errs"
	"github.com/drover/drover/server/store"
	_ "modernc.org/sqlite" // registers the "sqlite" driver
)

//go:embed migrations/*.sql
var migrations embed.FS

// DB is the embedded store: one SQLite file in WAL mode. All writes
// go through one connection (SQLite has one writer anyway, and this keeps
// BEGIN IMMEDIATE from ever waiting on itself); reads use a pool of
// read-only connections that WAL lets run beside the writer.
type DB struct {
	w *sql.DB
	r *sql.DB
	// ingestStmts are ApplyRecords' statements, prepared on w at open.
	ingestStmts map[string]*sql.Stmt
}

// Open opens (creating if needed) the database at path and applies the
// embedded migrations. synchronous is "full" or "normal".
func Open(ctx context.Context, path, synchronous string) (*DB, error) {
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
	db := &DB{w: w, r: r}
	if err := db.prepareIngest(ctx); err != nil {
		db.Close()
		return nil, err
	}
	return db, nil
}

// InTx runs fn in one write transaction: for tests and tools that seed or
// inspect the file directly.
func (s *DB) InTx(ctx context.Context, fn func(*sql.Tx) error) error { return withTx(ctx, s.w, fn) }

// Reader is the pool of read-only connections, for tests and tools that
// inspect the file directly.
func (s *DB) Reader() *sql.DB { return s.r }

// Close closes both pools.
func (s *DB) Close() error {
	for _, st := range s.ingestStmts {
		st.Close()
	}
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

// rowScanner is a row of a query: *sql.Row or *sql.Rows (an alias, so
// that a scan function may spell the interface out).
type rowScanner = interface{ Scan(...any) error }

// querier is what runs a query: the pool (*sql.DB) or a transaction.
type querier interface {
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

// queryAll runs a query on db and scans every row with scan; the result is
// empty, not nil, when no row matches. Errors are wrapped in what.
func queryAll[T any](ctx context.Context, db querier, what string, scan func(row rowScanner) (T, error), query string, args ...any) ([]T, error) {
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

// listQuery is a SELECT built from a list filter: and adds a condition
// when its filter field is set, then the ORDER BY and LIMIT are appended.
type listQuery struct {
	sql  string
	args []any
}

func (q *listQuery) and(set bool, cond string, args ...any) {
	if set {
		q.append(` AND `+cond, args...)
	}
}

func (q *listQuery) append(sql string, args ...any) {
	q.sql += sql
	q.args = append(q.args, args...)
}

// queryMap runs a query of (key, value) rows on db and returns them as a
// map. Errors are wrapped in what.
func queryMap[V any](ctx context.Context, db querier, what string, query string, args ...any) (map[string]V, error) {
	rows, err := db.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	defer rows.Close()
	out := map[string]V{}
	for rows.Next() {
		var k string
		var v V
		if err := rows.Scan(&k, &v); err != nil {
			return nil, fmt.Errorf("%s: %w", what, err)
		}
		out[k] = v
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	return out, nil
}

// execOne runs a statement on db that must change one row: none is
// ErrNotFound naming noun, any other error is wrapped in what.
func execOne(ctx context.Context, db interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
}, noun, what, query string, args ...any) error {
	res, err := db.ExecContext(ctx, query, args...)
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	if n, _ := res.RowsAffected(); n != 1 {
		return errs.NotFound(noun)
	}
	return nil
}

// queryOne runs a one-row query on db and scans the row with scan; no row
// is ErrNotFound naming noun, any other error is wrapped in what.
func queryOne[T any](ctx context.Context, db *sql.DB, noun, what string, scan func(row rowScanner) (T, error), query string, args ...any) (T, error) {
	v, err := scan(db.QueryRowContext(ctx, query, args...))
	if err != nil {
		var zero T
		return zero, rowErr(err, noun, what)
	}
	return v, nil
}

// scanOne scans a one-column row.
func scanOne[T any](row rowScanner) (T, error) {
	var v T
	err := row.Scan(&v)
	return v, err
}

// rowErr is the error of a one-row query: ErrNotFound naming noun when
// there is no row, else err wrapped in what.
func rowErr(err error, noun, what string) error {
	if errors.Is(err, sql.ErrNoRows) {
		return errs.NotFound(noun)
	}
	return fmt.Errorf("%s: %w", what, err)
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

// compile-time check that DB is a complete Store.
var _ store.Store = (*DB)(nil)
