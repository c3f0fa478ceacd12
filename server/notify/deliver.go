package notify

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/drover/drover/api"
	"github.com/drover/drover/server/errs"
	"github.com/drover/drover/server/store"
)

// Config bounds delivery.
type Config struct {
	// Poll is how often the queue is looked at (a Wake looks at once).
	Poll time.Duration `yaml:"poll"`
	// RetryMin and RetryMax bound the exponential backoff between the
	// attempts of one delivery (with jitter: each wait is between half
	// and all of min(RetryMin·2^attempts, RetryMax)).
	RetryMin time.Duration `yaml:"retry_min"`
	RetryMax time.Duration `yaml:"retry_max"`
	// MaxAge is how long a delivery is retried before it is given up.
	MaxAge time.Duration `yaml:"max_age"`
	// Timeout bounds one attempt.
	Timeout time.Duration `yaml:"timeout"`
	// AlertHold is the endsAt of a firing alert (Drover resolves it on
	// recovery); OneOffHold that of an event with no recovery.
	AlertHold  time.Duration `yaml:"alert_hold"`
	OneOffHold time.Duration `yaml:"one_off_hold"`
}

// DefaultConfig is the delivery configuration of a server.
func DefaultConfig() Config {
	return Config{Poll: 2 * time.Second, RetryMin: 5 * time.Second, RetryMax: 5 * time.Minute, MaxAge: 24 * time.Hour,
		Timeout: 10 * time.Second, AlertHold: 7 * 24 * time.Hour, OneOffHold: time.Hour}
}

// Store is what the deliverer needs from the store.
type Store interface {
	store.NotifyStore
	GetAgent(ctx context.Context, id string) (*store.Agent, error)
}

// Opener opens a channel's sealed secret (the server's secrets sealer,
// with the channel's sealing name).
type Opener func(channel string, sealed []byte) ([]byte, error)

// SealName is the name a channel's secret is sealed under.
func SealName(channel string) string { return "notify-channel/" + channel }

// Deliverer routes new events into the queue and sends the queue. Run it
// on the server that holds the fleet-wide loops.
type Deliverer struct {
	st     Store
	open   Opener
	now    func() time.Time
	log    *slog.Logger
	cfg    Config
	client *http.Client
	wake   chan struct{}
}

// NewDeliverer returns a deliverer over st.
func NewDeliverer(st Store, open Opener, now func() time.Time, log *slog.Logger, cfg Config) *Deliverer {
	return &Deliverer{st: st, open: open, now: now, log: log, cfg: cfg, wake: make(chan struct{}, 1),
		client: &http.Client{Timeout: cfg.Timeout, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}}
}

// Wake makes the running loop look at the events and the queue now.
func (d *Deliverer) Wake() {
	select {
	case d.wake <- struct{}{}:
	default:
	}
}

// Run routes and delivers until ctx ends.
func (d *Deliverer) Run(ctx context.Context) {
	t := time.NewTicker(d.cfg.Poll)
	defer t.Stop()
	var pruned time.Time
	for {
		if err := d.Pass(ctx); err != nil && ctx.Err() == nil {
			d.log.Error("notifications", "err", err)
		}
		if now := d.now(); now.Sub(pruned) >= time.Hour {
			pruned = now
			if _, err := d.st.PruneDeliveries(ctx, now.Add(-keepDelivered)); err != nil && ctx.Err() == nil {
				d.log.Error("pruning notification deliveries", "err", err)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-d.wake:
		}
	}
}

// Pass routes the events recorded since the last pass and sends the
// deliveries that are due.
func (d *Deliverer) Pass(ctx context.Context) error {
	if err := d.route(ctx); err != nil {
		return err
	}
	return d.deliver(ctx)
}

const routeBatch = 500

// keepDelivered is how long finished deliveries stay for the status.
const keepDelivered = 7 * 24 * time.Hour

func (d *Deliverer) router(ctx context.Context) (*Router, error) {
	rules, err := d.st.ListRules(ctx)
	if err != nil {
		return nil, err
	}
	chans, err := d.st.ListChannels(ctx)
	if err != nil {
		return nil, err
	}
	rt := &Router{Rules: rules, Channels: map[string]*store.NotifyChannel{}, AlertHold: d.cfg.AlertHold, OneOffHold: d.cfg.OneOffHold}
	for _, c := range chans {
		rt.Channels[c.Name] = c
	}
	tags := map[string]map[string]string{}
	rt.TagsOf = func(id string) map[string]string {
		if t, ok := tags[id]; ok {
			return t
		}
		var t map[string]string
		if a, err := d.st.GetAgent(ctx, id); err == nil {
			t = a.Tags
		}
		tags[id] = t
		return t
	}
	return rt, nil
}

func (d *Deliverer) route(ctx context.Context) error {
	cursor, state, err := d.st.NotifyProgress(ctx)
	if err != nil {
		return err
	}
	for {
		evs, err := d.st.EventsAfter(ctx, cursor, routeBatch)
		if err != nil || len(evs) == 0 {
			return err
		}
		rt, err := d.router(ctx)
		if err != nil {
			return err
		}
		ds, changed, err := rt.Route(evs, state, d.now())
		if err != nil {
			return err
		}
		cursor = evs[len(evs)-1].ID
		if err := d.st.RouteEvents(ctx, cursor, changed, ds); err != nil {
			return err
		}
		if len(evs) < routeBatch {
			return nil
		}
	}
}

const claimBatch = 100

func (d *Deliverer) deliver(ctx context.Context) error {
	for {
		now := d.now()
		ds, err := d.st.ClaimDeliveries(ctx, now, 2*d.cfg.Timeout+time.Minute, claimBatch)
		if err != nil || len(ds) == 0 {
			return err
		}
		chans := map[string]*store.NotifyChannel{}
		for _, x := range ds {
			if ctx.Err() != nil {
				return nil
			}
			ch, ok := chans[x.Channel]
			if !ok {
				if ch, err = d.st.GetChannel(ctx, x.Channel); errors.Is(err, errs.ErrNotFound) {
					ch = nil
				} else if err != nil {
					return err
				}
				chans[x.Channel] = ch
			}
			var serr error
			if ch == nil {
				serr = errors.New("the channel was deleted")
			} else {
				serr = d.send(ctx, ch, x.Body)
			}
			at := d.now()
			if serr == nil {
				if err := d.st.DeliveryDone(ctx, x.ID, at); err != nil {
					return err
				}
				continue
			}
			final := ch == nil || at.Sub(x.CreatedAt) >= d.cfg.MaxAge || errors.Is(serr, errPermanent)
			msg := serr.Error()
			if final {
				msg = "gave up: " + msg
			}
			next := at.Add(d.backoff(x.Attempts))
			if err := d.st.DeliveryFailed(ctx, x.ID, at, msg, next, final); err != nil {
				return err
			}
			d.log.Warn("notification not delivered", "channel", x.Channel, "attempt", x.Attempts+1, "err", msg, "final", final)
		}
	}
}

// backoff is the wait after the attempts-th failed attempt (0: the first).
func (d *Deliverer) backoff(attempts int) time.Duration {
	return Backoff(attempts, d.cfg.RetryMin, d.cfg.RetryMax, rand.Float64())
}

// Backoff is min(lo·2^attempts, hi) scaled by a jitter in [0.5, 1) taken
// from r in [0, 1).
func Backoff(attempts int, lo, hi time.Duration, r float64) time.Duration {
	w := hi
	if attempts < 30 {
		if x := lo << attempts; x > 0 && x < hi {
			w = x
		}
	}
	return time.Duration(float64(w) * (0.5 + r/2))
}

var errPermanent = errors.New("permanent")

type sendError struct {
	msg       string
	permanent bool
}

func (e *sendError) Error() string { return e.msg }
func (e *sendError) Is(target error) bool {
	return target == errPermanent && e.permanent
}

// Sign returns the X-Drover-Signature value of body under secret.
func Sign(secret, body []byte) string {
	m := hmac.New(sha256.New, secret)
	m.Write(body)
	return "sha256=" + hex.EncodeToString(m.Sum(nil))
}

// send posts body to the channel once.
func (d *Deliverer) send(ctx context.Context, ch *store.NotifyChannel, body []byte) error {
	target := ch.URL
	var secret []byte
	switch ch.Kind {
	case api.ChannelAlertmanager:
		target = strings.TrimSuffix(ch.URL, "/") + alertsPath
	case api.ChannelWebhook:
		if len(ch.SealedSecret) > 0 {
			s, err := d.open(SealName(ch.Name), ch.SealedSecret)
			if err != nil {
				return &sendError{msg: "the channel's secret cannot be opened", permanent: true}
			}
			secret = s
		}
	}
	ctx, cancel := context.WithTimeout(ctx, d.cfg.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, target, bytes.NewReader(body))
	if err != nil {
		return &sendError{msg: "bad request", permanent: true}
	}
	req.Header.Set("Content-Type", webhookMediaType)
	req.Header.Set("User-Agent", "drover-server")
	if secret != nil {
		req.Header.Set(signatureHeader, Sign(secret, body))
	}
	resp, err := d.client.Do(req)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) { // the URL may hold a token: keep it out of the error
			err = ue.Err
		}
		return &sendError{msg: err.Error()}
	}
	defer resp.Body.Close()
	head, _ := io.ReadAll(io.LimitReader(resp.Body, 256))
	io.Copy(io.Discard, io.LimitReader(resp.Body, maxResponseDrains))
	if resp.StatusCode >= 200 && resp.StatusCode < 300 {
		return nil
	}
	msg := fmt.Sprintf("HTTP %d", resp.StatusCode)
	if t := strings.TrimSpace(strings.ToValidUTF8(string(head), "")); t != "" {
		msg += ": " + t
	}
	// A request the receiver refuses as such will not pass later either.
	perm := resp.StatusCode >= 400 && resp.StatusCode < 500 && resp.StatusCode != 408 && resp.StatusCode != 429
	return &sendError{msg: msg, permanent: perm}
}

// Test sends a test notification to a channel now, outside the queue.
func (d *Deliverer) Test(ctx context.Context, name string) error {
	ch, err := d.st.GetChannel(ctx, name)
	if err != nil {
		return err
	}
	now := d.now()
	n := &Notification{ID: fmt.Sprintf("test-%d-%s", now.UnixNano(), name), State: "event", Kind: "test", AlertName: "DroverTest",
		Severity: "info", At: now, Message: "a test notification from drover-server", Channel: name, Test: true}
	rt := &Router{AlertHold: d.cfg.AlertHold, OneOffHold: 5 * time.Minute}
	body, err := rt.body(ch.Kind, n)
	if err != nil {
		return err
	}
	return d.send(ctx, ch, body)
}
