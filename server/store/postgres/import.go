package postgres

import (
	"context"
	"database/sql"
	"fmt"
	"sort"
	"strings"

	"github.com/drover/drover/server/store"
	"github.com/jackc/pgx/v5"
)

// sqliteCursorKey is the SQLite store's notify_state key of the routing
// cursor, renamed to notifyCursorKey on import.
const sqliteCursorKey = "\x00cursor"

// ImportSQLite copies every table of a SQLite store at the same schema
// version (src is its read handle) into this database, which must be
// empty, in one transaction: a failed import leaves the database empty.
// keys, sealed by the caller, are stored as the server keys in the same
// transaction (a SQLite server keeps its keys in files). progress, if not
// nil, is told each table and how many rows it copied.
func (s *DB) ImportSQLite(ctx context.Context, src *sql.DB, keys []*store.ServerKey, progress func(table string, rows int64)) error {
	var srcVersion int
	if err := src.QueryRowContext(ctx, `PRAGMA user_version`).Scan(&srcVersion); err != nil {
		return fmt.Errorf("import: read the SQLite schema version: %w", err)
	}
	v, err := s.SchemaVersion(ctx)
	if err != nil {
		return fmt.Errorf("import: %w", err)
	}
	if srcVersion != v {
		return fmt.Errorf("import: the SQLite database is at schema version %d, PostgreSQL at %d", srcVersion, v)
	}
	tx, err := s.pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.Serializable})
	if err != nil {
		return fmt.Errorf("import: %w", err)
	}
	defer tx.Rollback(ctx)
	tables, err := importTables(ctx, tx)
	if err != nil {
		return fmt.Errorf("import: %w", err)
	}
	for _, t := range tables {
		var any bool
		if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM `+pgx.Identifier{t.name}.Sanitize()+`)`).Scan(&any); err != nil {
			return fmt.Errorf("import: %s: %w", t.name, err)
		}
		if any {
			return fmt.Errorf("import: the PostgreSQL database is not empty (table %s has rows): import only into a new database", t.name)
		}
	}
	for _, t := range tables {
		n, err := copyTable(ctx, src, tx, t)
		if err != nil {
			return fmt.Errorf("import: %s: %w", t.name, err)
		}
		if t.identity != "" {
			if _, err := tx.Exec(ctx, fmt.Sprintf(`SELECT setval(pg_get_serial_sequence('%s', '%s'), COALESCE((SELECT MAX(%s) FROM %s), 0) + 1, false)`,
				t.name, t.identity, t.identity, t.name)); err != nil {
				return fmt.Errorf("import: %s: %w", t.name, err)
			}
		}
		if progress != nil {
			progress(t.name, n)
		}
	}
	for _, k := range keys {
		if _, err := tx.Exec(ctx, `INSERT INTO server_keys(id, sealed, version, updated_at) VALUES($1,$2,$3,$4)`, k.ID, k.Sealed, int64(k.Version), ns(k.UpdatedAt)); err != nil {
			return fmt.Errorf("import: server key %s: %w", k.ID, err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("import: commit: %w", err)
	}
	return nil
}

type importTable struct {
	name     string
	cols     []string
	boolCols map[int]bool
	byteCols map[int]bool
	identity string
}

// importTables lists the store's tables and columns from the PostgreSQL
// catalogue, payloads first (pipe_versions refers to it).
func importTables(ctx context.Context, tx pgx.Tx) ([]*importTable, error) {
	rows, err := tx.Query(ctx, `SELECT table_name, column_name, data_type, is_identity FROM information_schema.columns
		WHERE table_schema=current_schema() AND table_name<>'drover_schema' ORDER BY table_name, ordinal_position`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	byName := map[string]*importTable{}
	var out []*importTable
	for rows.Next() {
		var table, col, typ, ident string
		if err := rows.Scan(&table, &col, &typ, &ident); err != nil {
			return nil, err
		}
		t := byName[table]
		if t == nil {
			t = &importTable{name: table, boolCols: map[int]bool{}, byteCols: map[int]bool{}}
			byName[table] = t
			out = append(out, t)
		}
		if typ == "boolean" {
			t.boolCols[len(t.cols)] = true
		}
		if typ == "bytea" {
			t.byteCols[len(t.cols)] = true
		}
		if ident == "YES" {
			t.identity = col
		}
		t.cols = append(t.cols, col)
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].name == "payloads" && out[j].name != "payloads" })
	return out, nil
}

func copyTable(ctx context.Context, src *sql.DB, tx pgx.Tx, t *importTable) (int64, error) {
	quoted := make([]string, len(t.cols))
	for i, c := range t.cols {
		quoted[i] = `"` + c + `"`
	}
	rows, err := src.QueryContext(ctx, `SELECT `+strings.Join(quoted, ", ")+` FROM "`+t.name+`"`)
	if err != nil {
		return 0, fmt.Errorf("read from SQLite: %w", err)
	}
	defer rows.Close()
	vals := make([]any, len(t.cols))
	ptrs := make([]any, len(t.cols))
	for i := range vals {
		ptrs[i] = &vals[i]
	}
	var scanErr error
	n, err := tx.CopyFrom(ctx, pgx.Identifier{t.name}, t.cols, pgx.CopyFromFunc(func() ([]any, error) {
		if !rows.Next() {
			return nil, rows.Err()
		}
		if err := rows.Scan(ptrs...); err != nil {
			scanErr = err
			return nil, err
		}
		row := make([]any, len(vals))
		for i, v := range vals {
			if t.boolCols[i] {
				n, _ := v.(int64)
				v = n != 0
			}
			if s, ok := v.(string); ok && t.byteCols[i] {
				v = []byte(s)
			}
			if t.name == "notify_state" && t.cols[i] == "key" && v == sqliteCursorKey {
				v = notifyCursorKey
			}
			row[i] = v
		}
		return row, nil
	}))
	if scanErr != nil {
		return 0, fmt.Errorf("read from SQLite: %w", scanErr)
	}
	return n, err
}
