// Package sqlstore is the SQL both stores share: the entity code of
// store.Store (agents, pipes, runs, the ingest, manifests, tokens, keys,
// secrets, notifications, monitoring, placement, presence, audit) written
// once against database/sql, with ? placeholders, and a small Dialect for
// what SQLite and PostgreSQL spell differently. It is imported only by
// server/store/sqlite and server/store/postgres, which keep their opening,
// migrations, transaction runners and dialect, and embed a *DB to have its
// methods.
package sqlstore

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/drover/drover/server/errs"
)

// Querier runs statements: a pool or a transaction, with ? placeholders
// (the PostgreSQL store rewrites them to $n).
type Querier interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// Tx is a write transaction.
type Tx interface {
	Querier
	PrepareContext(ctx context.Context, query string) (*sql.Stmt, error)
	// StmtContext binds a statement prepared on the writer pool (see
	// DB.PrepareIngest) to the transaction.
	StmtContext(ctx context.Context, st *sql.Stmt) *sql.Stmt
}

// ReadTx is a read-only transaction on one snapshot.
type ReadTx interface {
	Querier
	Rollback() error
}

// Dialect is what the two databases spell differently.
type Dialect struct {
	// JSONValues is a table, with one text column value, of the elements of
	// the JSON array of strings held in expr (a placeholder or a column).
	JSONValues func(expr string) string
	// ForUpdate ends a SELECT, inside a write transaction, whose rows the
	// transaction then changes ("" where the transaction holds the only
	// writer).
	ForUpdate string
	// Limit is the argument of LIMIT ? for a limit n, negative meaning none.
	Limit func(n int) any
	// OffsetAll skips the first ? rows and returns the rest.
	OffsetAll string
	// NotifyCursorKey is the notify_state key of the routing cursor, which
	// no routing key can equal.
	NotifyCursorKey string
}

// Backend is how a store runs the shared code.
type Backend struct {
	// W runs writes outside a transaction, R reads.
	W, R Querier
	// WriteTx runs fn in one write transaction that behaves as if it held
	// the only writer; it may run fn more than once.
	WriteTx func(ctx context.Context, fn func(Tx) error) error
	// InitTx runs fn in one write transaction that sees what an earlier
	// holder of lock committed, for a first initialisation that servers
	// starting together must do once.
	InitTx func(ctx context.Context, lock int64, fn func(Tx) error) error
	// ReadTx begins a read-only transaction on one snapshot.
	ReadTx func(ctx context.Context) (ReadTx, error)
}

// DB is the shared part of a store; each store embeds one.
type DB struct {
	w, r    Querier
	writeTx func(ctx context.Context, fn func(Tx) error) error
	initTx  func(ctx context.Context, lock int64, fn func(Tx) error) error
	readTx  func(ctx context.Context) (ReadTx, error)
	d       Dialect

	// ingestStmts are ApplyRecords' statements prepared on the writer pool
	// (PrepareIngest), nil where each transaction prepares its own.
	ingestStmts            map[string]*sql.Stmt
	sqlListed, sqlUnlisted string
}

// New is the shared code run through b in dialect d.
func New(b Backend, d Dialect) *DB {
	s := &DB{w: b.W, r: b.R, writeTx: b.WriteTx, initTx: b.InitTx, readTx: b.ReadTx, d: d}
	s.sqlListed, s.sqlUnlisted = listedQueries(d)
	return s
}

// Txn is a transaction that Run ends.
type Txn interface {
	Commit() error
	Rollback() error
}

// Run runs fn in tx, just begun with err: it commits tx when fn succeeds
// and rolls it back when fn fails.
func Run[T Txn](tx T, err error, fn func(T) error) error {
	if err != nil {
		return err
	}
	if err := fn(tx); err != nil {
		tx.Rollback()
		return err
	}
	return tx.Commit()
}

// keysLock is the lock key of the first initialisation of the server keys
// by servers starting at once.
const keysLock = 0x64726f6b // "drok"

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

// queryAll runs a query on db and scans every row with scan; the result is
// empty, not nil, when no row matches. Errors are wrapped in what.
func queryAll[T any](ctx context.Context, db Querier, what string, scan func(row rowScanner) (T, error), query string, args ...any) ([]T, error) {
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
func queryMap[V any](ctx context.Context, db Querier, what string, query string, args ...any) (map[string]V, error) {
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
func execOne(ctx context.Context, db Querier, noun, what, query string, args ...any) error {
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
func queryOne[T any](ctx context.Context, db Querier, noun, what string, scan func(row rowScanner) (T, error), query string, args ...any) (T, error) {
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
