package bus

import (
	"context"
	"database/sql"
	"log/slog"
	"math/rand/v2"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/drover/drover/internal/tick"
)

// Channel is the PostgreSQL notification channel of every replica.
const Channel = "drover_signals"

// Execer runs a statement; the store's connection pool (*sql.DB) is one.
type Execer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
}

// Postgres is the bus of replicas sharing one PostgreSQL database: Publish
// is a NOTIFY through the store's pool, and Run LISTENs on a connection of
// its own. When that connection fails (the database restarted, the
// network broke) it reconnects with a jittered backoff of up to
// MaxBackoff and then calls Resync, since what was published meanwhile
// never arrives.
type Postgres struct {
	id     string
	listen *pgx.ConnConfig
	pub    Execer
	log    *slog.Logger
	up     atomic.Bool

	// MaxBackoff bounds the wait between reconnection attempts (5 s);
	// Probe is how long the connection may be silent before it is
	// checked with a round trip (10 s).
	MaxBackoff, Probe time.Duration

	reconnects atomic.Int64
}

// NewPostgres makes the bus: listen is the configuration of the dedicated
// connection (a copy of the pool's), pub the pool that sends NOTIFY.
func NewPostgres(listen *pgx.ConnConfig, pub Execer, log *slog.Logger) *Postgres {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Postgres{id: NewReplicaID(), listen: listen, pub: pub, log: log, MaxBackoff: 5 * time.Second, Probe: 10 * time.Second}
}

func (p *Postgres) Replica() string { return p.id }
func (p *Postgres) Up() bool        { return p.up.Load() }
func (p *Postgres) Shared() bool    { return true }

// Reconnects counts the connections made after the first.
func (p *Postgres) Reconnects() int64 { return p.reconnects.Load() }

// Publish sends a NOTIFY (delivered when it commits, in order per
// publisher).
func (p *Postgres) Publish(ctx context.Context, kind, payload string) error {
	if err := checkKind(kind, payload); err != nil {
		return err
	}
	_, err := p.pub.ExecContext(ctx, `SELECT pg_notify($1, $2)`, Channel, p.id+" "+kind+" "+payload)
	return err
}

// Run listens until ctx is done, reconnecting whenever the connection
// fails. Resync is called after every connection but the first.
func (p *Postgres) Run(ctx context.Context, h Handler) error {
	backoff := 100 * time.Millisecond
	first := true
	failing := false
	for ctx.Err() == nil {
		conn, err := p.connect(ctx)
		if err != nil {
			if ctx.Err() != nil {
				break
			}
			if !failing {
				p.log.Warn("signal bus: cannot listen; retrying", "err", err)
				failing = true
			} else {
				p.log.Debug("signal bus: cannot listen; retrying", "err", err, "backoff", backoff)
			}
			tick.Sleep(ctx, backoff/2+rand.N(backoff/2+1))
			backoff = min(2*backoff, p.MaxBackoff)
			continue
		}
		backoff, failing = 100*time.Millisecond, false
		p.up.Store(true)
		if !first {
			p.reconnects.Add(1)
			p.log.Info("signal bus: listening again; resyncing what may have been missed")
			h.Resync()
		}
		first = false
		err = p.receive(ctx, conn, h)
		p.up.Store(false)
		closeCtx, cancel := context.WithTimeout(context.Background(), time.Second)
		conn.Close(closeCtx)
		cancel()
		if ctx.Err() == nil {
			p.log.Warn("signal bus: the listening connection failed; reconnecting", "err", err)
		}
	}
	return nil
}

func (p *Postgres) connect(ctx context.Context) (*pgx.Conn, error) {
	cctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	conn, err := pgx.ConnectConfig(cctx, p.listen.Copy())
	if err != nil {
		return nil, err
	}
	if _, err := conn.Exec(cctx, "LISTEN "+Channel); err != nil {
		conn.Close(context.Background())
		return nil, err
	}
	return conn, nil
}

// receive hands notifications to h until the connection fails; a silent
// connection is probed every p.Probe so that a broken network is noticed.
func (p *Postgres) receive(ctx context.Context, conn *pgx.Conn, h Handler) error {
	for {
		wctx, cancel := context.WithTimeout(ctx, p.Probe)
		n, err := conn.WaitForNotification(wctx)
		cancel()
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if err != nil {
			if wctx.Err() == nil || conn.IsClosed() {
				return err
			}
			pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			err = conn.Ping(pctx)
			cancel()
			if err != nil {
				return err
			}
			continue
		}
		from, rest, ok := strings.Cut(n.Payload, " ")
		if !ok || from == p.id {
			continue
		}
		kind, payload, _ := strings.Cut(rest, " ")
		h.Signal(Signal{From: from, Kind: kind, Payload: payload})
	}
}
