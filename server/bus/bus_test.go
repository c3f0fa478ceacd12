package bus_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/drover/drover/server/bus"
	"github.com/drover/drover/server/store/postgres"
	"github.com/drover/drover/server/store/postgres/pgtest"
)

type handler struct {
	got    chan bus.Signal
	resync chan struct{}
}

func (h *handler) Signal(s bus.Signal) { h.got <- s }
func (h *handler) Resync()             { h.resync <- struct{}{} }

func newHandler() *handler {
	return &handler{got: make(chan bus.Signal, 100), resync: make(chan struct{}, 10)}
}

func next(t *testing.T, h *handler) bus.Signal {
	t.Helper()
	select {
	case s := <-h.got:
		return s
	case <-time.After(5 * time.Second):
		t.Fatal("no signal within 5s")
	}
	return bus.Signal{}
}

func waitUp(t *testing.T, b bus.Bus, up bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for b.Up() != up {
		if time.Now().After(deadline) {
			t.Fatalf("the bus is not up=%v within 10s", up)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// Two buses on one database: each receives the other's signals in order,
// never its own; a payload over the limit is refused; a killed listening
// connection is replaced and Resync called.
func TestPostgresBus(t *testing.T) {
	c := pgtest.Start(t)
	dsn := c.NewDatabase(t)
	db, err := postgres.Open(t.Context(), dsn, postgres.Pool{MaxConns: 4})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	a := bus.NewPostgres(db.ListenConfig(), db.SQL(), nil)
	b := bus.NewPostgres(db.ListenConfig(), db.SQL(), nil)
	ha, hb := newHandler(), newHandler()
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	go a.Run(ctx, ha)
	go b.Run(ctx, hb)
	waitUp(t, a, true)
	waitUp(t, b, true)

	for _, k := range []string{"one", "two", "three"} {
		if err := a.Publish(ctx, k, `{"i":["x y"]}`); err != nil {
			t.Fatal(err)
		}
	}
	for _, k := range []string{"one", "two", "three"} {
		if s := next(t, hb); s.Kind != k || s.From != a.Replica() || s.Payload != `{"i":["x y"]}` {
			t.Fatalf("got %+v, want %s from %s", s, k, a.Replica())
		}
	}
	select {
	case s := <-ha.got:
		t.Fatalf("a received its own signal %+v", s)
	case <-time.After(100 * time.Millisecond):
	}
	if err := a.Publish(ctx, "big", strings.Repeat("x", bus.MaxPayload)); err != nil {
		t.Fatalf("a payload of exactly MaxPayload: %v", err)
	}
	if s := next(t, hb); len(s.Payload) != bus.MaxPayload {
		t.Fatalf("payload of %d bytes", len(s.Payload))
	}
	if err := a.Publish(ctx, "big", strings.Repeat("x", bus.MaxPayload+1)); err != bus.ErrTooLarge {
		t.Fatalf("an oversized payload: %v", err)
	}

	// Kill every listening connection: both reconnect and resync.
	c.Exec(t, "postgres", `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE query LIKE 'LISTEN %'`)
	for _, h := range []*handler{ha, hb} {
		select {
		case <-h.resync:
		case <-time.After(10 * time.Second):
			t.Fatal("no resync within 10s of the connection being killed")
		}
	}
	if a.Reconnects() != 1 || b.Reconnects() != 1 {
		t.Fatalf("reconnects: %d, %d", a.Reconnects(), b.Reconnects())
	}
	if err := b.Publish(ctx, "after", "{}"); err != nil {
		t.Fatal(err)
	}
	if s := next(t, ha); s.Kind != "after" {
		t.Fatalf("after the reconnect: %+v", s)
	}
}
