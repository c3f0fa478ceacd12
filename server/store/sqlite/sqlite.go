// Package sqlite is the embedded store: one SQLite file in WAL mode holding
// everything the server keeps (store.Store), with its schema migrations
// embedded. The entity code, shared with the PostgreSQL store, is package
// sqlstore's; this package opens the file, migrates it, runs its
// transactions under the one writer and says how SQLite spells what the
// two databases spell differently (its sqlstore.Dialect). Only the server's wiring and tools (the
// drover-server CLI) open it; everything else goes through package store's
// interfaces.
package sqlite

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/drover/drover/server/store"
	"github.com/drover/drover/server/store/sqlstore"
	_ "modernc.org/sqlite" // registers the "sqlite" driver
)

//go:embed migrations/*.sql
var migrations embed.FS

// DB is the embedded store: one SQLite file in WAL mode. All writes
// go through one connection (SQLite has one writer anyway, and this keeps
// BEGIN IMMEDIATE from ever waiting on itself); reads use a pool of
// read-only connections that WAL lets run beside the writer.
type DB struct {
	*sqlstore.DB
	w *sql.DB
	r *sql.DB
	// ckpt copies the WAL into the database file in the background
	// (checkpointer); stopCkpt ends it, ckptDone is closed when it has.
	ckpt     *sql.DB
	stopCkpt chan struct{}
	ckptDone chan struct{}
	ckptErr  atomic.Pointer[error] // the last checkpoint's error, nil if it succeeded
	ckptRuns atomic.Int64          // background checkpoints run
	stopOnce sync.Once
}

// Checkpoints. SQLite's default copies the WAL into the database file
// inside the commit that grows the WAL past 1,000 pages (4 MiB), on the
// writer's connection and with its fsyncs. A recompile of the fleet
// commits 1,000 manifests (~4-5 MiB of pages) a transaction, so nearly
// every chunk paid for a checkpoint while the one writer waited (19,500
// agents: the recompile's saves took 2-7 s for ~1 s of CPU, and the two
// cores were not busy). Now a connection of its own runs a PASSIVE
// checkpoint every checkpointEvery, beside the writer and the readers (it
// takes neither the write lock nor waits for readers), and the writer's own
// automatic checkpoint stays only as a backstop, past walBackstopPages
// (64 MiB), should the background one fall behind or fail.
const (
	checkpointEvery  = time.Second
	walBackstopPages = 16384
)

// dialect is SQLite's SQL where it differs from PostgreSQL's.
var dialect = sqlstore.Dialect{
	JSONValues: func(expr string) string { return "json_each(" + expr + ")" },
	ForUpdate:  "",                           // BEGIN IMMEDIATE: the transaction is the only writer
	Limit:      func(n int) any { return n }, // a negative limit is none
	OffsetAll:  "LIMIT -1 OFFSET ?",
	// NUL is in no routing key.
	NotifyCursorKey: "\x00cursor",
}

// Open opens (creating if needed) the database at path and applies the
// embedded migrations. synchronous is "full" or "normal".
func Open(ctx context.Context, path, synchronous string) (*DB, error) {
	return open(ctx, path, synchronous, checkpointEvery)
}

// open is Open with the checkpointer's interval (0: none; tests call
// Checkpoint themselves).
func open(ctx context.Context, path, synchronous string, every time.Duration) (*DB, error) {
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
	// The writer's page cache is 16 MiB. A bigger one saves nothing the
	// OS's page cache does not, and costs at every commit that split a
	// b-tree page: SQLite renumbers split pages through a page number
	// beyond the file's end, and the commit then walks the whole cache to
	// drop pages past the end (at 64 MiB that walk was ~7% of the server's
	// CPU at rest with 19,500 agents).
	w, err := sql.Open("sqlite", base+"&_pragma=journal_mode(WAL)&_pragma=cache_size(-16384)&_txlock=immediate"+
		"&_pragma=wal_autocheckpoint("+strconv.Itoa(walBackstopPages)+")&_pragma=journal_size_limit("+strconv.Itoa(walBackstopPages*4096)+")")
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
	ckpt, err := sql.Open("sqlite", base)
	if err != nil {
		w.Close()
		r.Close()
		return nil, fmt.Errorf("open store: %w", err)
	}
	ckpt.SetMaxOpenConns(1)
	ckpt.SetMaxIdleConns(1)
	ckpt.SetConnMaxIdleTime(0)
	ckpt.SetConnMaxLifetime(0)
	db := &DB{w: w, r: r, ckpt: ckpt, stopCkpt: make(chan struct{}), ckptDone: make(chan struct{})}
	if every > 0 {
		go db.checkpointer(every)
	} else {
		close(db.ckptDone)
	}
	db.DB = sqlstore.New(sqlstore.Backend{
		W: w, R: r,
		WriteTx: func(ctx context.Context, fn func(sqlstore.Tx) error) error {
			return withTx(ctx, w, func(tx *sql.Tx) error { return fn(tx) })
		},
		InitTx: func(ctx context.Context, _ int64, fn func(sqlstore.Tx) error) error {
			return withTx(ctx, w, func(tx *sql.Tx) error { return fn(tx) }) // the one writer
		},
		ReadTx: func(ctx context.Context) (sqlstore.ReadTx, error) {
			return r.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
		},
	}, dialect)
	if err := db.PrepareIngest(ctx, w); err != nil {
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

// Close stops the checkpointer and closes the pools.
func (s *DB) Close() error {
	s.CloseIngest()
	s.stopOnce.Do(func() { close(s.stopCkpt) })
	<-s.ckptDone
	return errors.Join(s.ckpt.Close(), s.r.Close(), s.w.Close())
}

// checkpointer runs a PASSIVE checkpoint every interval until Close: it
// copies into the database file the WAL frames no reader still needs, so
// that the writer's next transaction after a complete one starts the WAL
// over instead of growing it.
func (s *DB) checkpointer(every time.Duration) {
	defer close(s.ckptDone)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-s.stopCkpt:
			return
		case <-t.C:
		}
		if _, err := s.Checkpoint(context.Background()); err != nil {
			s.ckptErr.Store(&err)
		} else {
			s.ckptErr.Store(nil)
		}
		s.ckptRuns.Add(1)
	}
}

// CheckpointStats is what one PASSIVE checkpoint reports: the WAL's frames
// and how many of them are now in the database file.
type CheckpointStats struct {
	Busy         bool // blocked: another connection was checkpointing
	WALFrames    int
	Checkpointed int
}

// Checkpoint runs one PASSIVE checkpoint on the checkpointer's connection.
func (s *DB) Checkpoint(ctx context.Context) (CheckpointStats, error) {
	var busy int
	var st CheckpointStats
	if err := s.ckpt.QueryRowContext(ctx, "PRAGMA wal_checkpoint(PASSIVE)").Scan(&busy, &st.WALFrames, &st.Checkpointed); err != nil {
		return st, fmt.Errorf("checkpoint: %w", err)
	}
	st.Busy = busy != 0
	return st, nil
}

// CheckpointErr is the last background checkpoint's error, nil when it
// succeeded (or none has run yet).
func (s *DB) CheckpointErr() error {
	if p := s.ckptErr.Load(); p != nil {
		return *p
	}
	return nil
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
	tx, err := db.BeginTx(ctx, nil) // BEGIN IMMEDIATE (_txlock)
	return sqlstore.Run(tx, err, fn)
}

// compile-time check that DB is a complete Store.
var _ store.Store = (*DB)(nil)
