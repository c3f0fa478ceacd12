package store

import (
	"context"
	"time"

	"github.com/drover/drover/api"
)

// NotifyChannel is a stored notification channel; its secret is sealed by
// the caller.
type NotifyChannel struct {
	Name, Kind, URL      string
	SealedSecret         []byte
	CreatedAt, UpdatedAt time.Time
}

// Delivery is one notification to one channel in the delivery queue. Body
// is the exact request body, fixed when the notification is queued.
type Delivery struct {
	ID        int64
	Channel   string
	EventID   int64
	Body      []byte
	CreatedAt time.Time
	NextAt    time.Time
	Attempts  int
	LastError string
}

// NotifyStore is used by notifications: channels, rules, the routing of
// events into the delivery queue and the queue itself.
type NotifyStore interface {
	// PutChannel creates or replaces a channel (keeping its creation time).
	PutChannel(ctx context.Context, c *NotifyChannel) error
	GetChannel(ctx context.Context, name string) (*NotifyChannel, error)
	ListChannels(ctx context.Context) ([]*NotifyChannel, error)
	// DeleteChannel removes a channel and its queued deliveries.
	DeleteChannel(ctx context.Context, name string) error
	// PutRule creates or replaces a rule (keeping its creation time).
	PutRule(ctx context.Context, r *api.NotifyRule) error
	GetRule(ctx context.Context, name string) (*api.NotifyRule, error)
	ListRules(ctx context.Context) ([]*api.NotifyRule, error)
	DeleteRule(ctx context.Context, name string) error

	// EventsAfter lists up to limit events with an id above after, oldest
	// first.
	EventsAfter(ctx context.Context, after int64, limit int) ([]*Event, error)
	// NotifyProgress returns the id of the last routed event and the
	// notification states (one per alerting subject).
	NotifyProgress(ctx context.Context) (cursor int64, state map[string]string, err error)
	// RouteEvents, in one transaction, queues ds, writes the state keys
	// (an empty value deletes one) and sets the cursor.
	RouteEvents(ctx context.Context, cursor int64, state map[string]string, ds []*Delivery) error
	// EnqueueDeliveries queues deliveries outside routing (a channel test).
	EnqueueDeliveries(ctx context.Context, ds []*Delivery) error
	// ClaimDeliveries returns, for up to limit channels, the channel's
	// oldest pending delivery if it is due at now (so a channel receives
	// its notifications in order), and moves their next attempt to
	// now+lease, so that a crash before the outcome is recorded retries
	// them.
	ClaimDeliveries(ctx context.Context, now time.Time, lease time.Duration, limit int) ([]*Delivery, error)
	// DeliveryDone records a delivery as delivered.
	DeliveryDone(ctx context.Context, id int64, now time.Time) error
	// DeliveryFailed records a failed attempt: retried at next, or given
	// up (final) with msg as its last error.
	DeliveryFailed(ctx context.Context, id int64, now time.Time, msg string, next time.Time, final bool) error
	// DeliveryStatus counts deliveries per channel with the last error.
	DeliveryStatus(ctx context.Context) (map[string]*api.ChannelStatus, error)
	// PruneDeliveries deletes finished deliveries older than before.
	PruneDeliveries(ctx context.Context, before time.Time) (int, error)
}
