package postgres

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// lockAppName names the lock sessions in pg_stat_activity.
const lockAppName = "drover-server leader lock"

// LeaderLock is the advisory lock key of the replica that runs the
// singletons (docs/postgres.md, "Replicas").
const LeaderLock = 0x64726f6c // "drol"

// sessionSettings make PostgreSQL end the lock's session, and so release
// the lock, soon after its holder stops answering: a holder that crashes
// closes its connection at once, one cut off by the network is dropped by
// the TCP settings, and one that is alive but silent by
// idle_session_timeout (PostgreSQL 14 and newer; the holder pings every
// second). Older servers refuse some settings, which is harmless.
var sessionSettings = []string{
	`SET application_name = '` + lockAppName + `'`,
	`SET tcp_keepalives_idle = 5`,
	`SET tcp_keepalives_interval = 2`,
	`SET tcp_keepalives_count = 2`,
	`SET tcp_user_timeout = 6000`,
	`SET idle_session_timeout = 6000`,
}

// SessionLock is a session-level advisory lock held on one connection
// taken out of the pool (so that no other query shares its session). The
// lock lasts as long as the session: closing the connection, or the
// connection dying, releases it. Its methods are not for concurrent use.
type SessionLock struct {
	db  *DB
	key int64

	mu   sync.Mutex
	conn *pgx.Conn
}

// SessionLock returns the lock key on its own connection, opened on the
// first TryLock.
func (s *DB) SessionLock(key int64) *SessionLock { return &SessionLock{db: s, key: key} }

// TryLock takes the lock if it is free (pg_try_advisory_lock), connecting
// first when needed; it reports whether this session holds it.
func (l *SessionLock) TryLock(ctx context.Context) (bool, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.conn == nil {
		pc, err := l.db.pool.Acquire(ctx)
		if err != nil {
			return false, fmt.Errorf("leader lock: connect: %w", err)
		}
		conn := pc.Hijack()
		for _, q := range sessionSettings {
			if _, err := conn.Exec(ctx, q); err != nil && conn.IsClosed() {
				return false, fmt.Errorf("leader lock: %w", err)
			}
		}
		l.conn = conn
	}
	var got bool
	if err := l.conn.QueryRow(ctx, `SELECT pg_try_advisory_lock($1)`, l.key).Scan(&got); err != nil {
		l.closeLocked()
		return false, fmt.Errorf("leader lock: %w", err)
	}
	return got, nil
}

// Ping checks that the session (and so the lock it holds) is alive.
func (l *SessionLock) Ping(ctx context.Context) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.conn == nil {
		return errors.New("leader lock: not connected")
	}
	var held bool
	err := l.conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype='advisory' AND pid=pg_backend_pid() AND granted AND objsubid=1
		AND (classid::bigint << 32 | objid::bigint) = $1)`, l.key).Scan(&held)
	if err != nil {
		l.closeLocked()
		return fmt.Errorf("leader lock: %w", err)
	}
	if !held {
		return errors.New("leader lock: the session no longer holds the lock")
	}
	return nil
}

// Close ends the session, which releases the lock if it was held.
func (l *SessionLock) Close() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.closeLocked()
}

func (l *SessionLock) closeLocked() {
	if l.conn == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	l.conn.Close(ctx)
	l.conn = nil
}

// BackendPID is the PostgreSQL process of the lock's session (0 when not
// connected), for tests that end it as a fault would.
func (l *SessionLock) BackendPID() uint32 {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.conn == nil {
		return 0
	}
	return l.conn.PgConn().PID()
}

// LockSessions counts the leader-lock sessions open on this database: every
// running replica keeps one, holder or not.
func (s *DB) LockSessions(ctx context.Context) (int, error) {
	var n int
	err := s.r.QueryRowContext(ctx, `SELECT count(*) FROM pg_stat_activity WHERE datname=current_database() AND application_name=?`, lockAppName).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("count replicas: %w", err)
	}
	return n, nil
}
