// Package bus carries signals between the server's replicas: short
// messages (a kind and a payload of ids, never bodies) that tell the other
// replicas something changed, so that the one holding an agent's stream or
// a live-log follower can act on it. Local connects the members of one
// process (one server on SQLite, or tests); Postgres uses LISTEN/NOTIFY on
// a dedicated connection and reconnects after the database comes back.
// The server's signals (what each kind means) live in package server.
package bus

import (
	"context"
	"crypto/rand"
	"encoding/base32"
	"errors"
	"fmt"
	"strings"
	"sync"
)

// MaxPayload bounds a signal's payload. PostgreSQL refuses a NOTIFY
// payload of 8000 bytes or more; the replica id and kind take the rest.
const MaxPayload = 7900

// ErrTooLarge: the payload is over MaxPayload (the caller splits it).
var ErrTooLarge = errors.New("bus: signal payload over 7900 bytes")

// Signal is one message from another replica.
type Signal struct {
	From    string // the replica that published it
	Kind    string
	Payload string
}

// Handler receives the signals of a bus.
type Handler interface {
	// Signal is called for each signal from another replica, one at a
	// time, in the order they were published.
	Signal(Signal)
	// Resync is called each time the bus is (re)connected after it was
	// down, once it receives again: signals published meanwhile may be
	// lost, so the handler re-reads what they would have told it.
	Resync()
}

// Bus publishes signals to the other replicas and receives theirs.
type Bus interface {
	// Replica is this replica's id on the bus.
	Replica() string
	// Publish sends a signal to every other replica. Signals of one
	// publisher arrive in order; a replica does not receive its own.
	Publish(ctx context.Context, kind, payload string) error
	// Run receives signals for h until ctx is done.
	Run(ctx context.Context, h Handler) error
	// Up reports whether signals are being received now (while it is
	// false, others' signals may be missed).
	Up() bool
	// Shared reports whether other replicas may exist (false for the
	// single member of a local network of one).
	Shared() bool
}

// NewReplicaID returns a fresh replica id: "r-" and 16 base32 characters.
func NewReplicaID() string {
	b := make([]byte, 10)
	_, _ = rand.Read(b)
	return "r-" + strings.ToLower(base32.StdEncoding.WithPadding(base32.NoPadding).EncodeToString(b))
}

func checkKind(kind, payload string) error {
	if kind == "" || strings.ContainsAny(kind, " \x00") || len(kind) > 32 {
		return fmt.Errorf("bus: bad signal kind %q", kind)
	}
	if len(payload) > MaxPayload {
		return ErrTooLarge
	}
	if strings.IndexByte(payload, 0) >= 0 {
		return errors.New("bus: a signal payload cannot hold NUL")
	}
	return nil
}

// Network connects the Local members of one process.
type Network struct {
	mu      sync.Mutex
	members []*Local
}

// NewNetwork returns a network with no members.
func NewNetwork() *Network { return &Network{} }

// Join adds a member.
func (n *Network) Join() *Local {
	l := &Local{net: n, id: NewReplicaID(), in: make(chan Signal, localQueue), wake: make(chan struct{}, 1)}
	n.mu.Lock()
	n.members = append(n.members, l)
	n.mu.Unlock()
	return l
}

// localQueue bounds the signals queued for one member.
const localQueue = 4096

// Local is a member of an in-process Network: the bus of a single server
// (a network of one, where Publish has no one to reach) or of several
// servers in one process.
type Local struct {
	net  *Network
	id   string
	in   chan Signal
	wake chan struct{}

	mu   sync.Mutex
	lost bool // a signal was dropped on a full queue: resync
}

func (l *Local) Replica() string { return l.id }
func (l *Local) Up() bool        { return true }

func (l *Local) Shared() bool {
	l.net.mu.Lock()
	defer l.net.mu.Unlock()
	return len(l.net.members) > 1
}

// Publish queues the signal for every other member; a member whose queue
// is full resyncs instead.
func (l *Local) Publish(_ context.Context, kind, payload string) error {
	if err := checkKind(kind, payload); err != nil {
		return err
	}
	l.net.mu.Lock()
	members := append([]*Local(nil), l.net.members...)
	l.net.mu.Unlock()
	for _, m := range members {
		if m == l {
			continue
		}
		select {
		case m.in <- Signal{From: l.id, Kind: kind, Payload: payload}:
		default:
			m.mu.Lock()
			m.lost = true
			m.mu.Unlock()
			select {
			case m.wake <- struct{}{}:
			default:
			}
		}
	}
	return nil
}

// Run delivers the queued signals until ctx is done.
func (l *Local) Run(ctx context.Context, h Handler) error {
	for {
		select {
		case <-ctx.Done():
			return nil
		case s := <-l.in:
			h.Signal(s)
		case <-l.wake:
			l.mu.Lock()
			lost := l.lost
			l.lost = false
			l.mu.Unlock()
			if lost {
				h.Resync()
			}
		}
	}
}
