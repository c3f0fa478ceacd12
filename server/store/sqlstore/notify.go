package sqlstore

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"time"

	"github.com/drover/drover/api"
	"github.com/drover/drover/server/errs"
	"github.com/drover/drover/server/store"
)

func (s *DB) PutChannel(ctx context.Context, c *store.NotifyChannel) error {
	_, err := s.w.ExecContext(ctx, `INSERT INTO notify_channels(name, kind, url, sealed_secret, created_at, updated_at) VALUES(?,?,?,?,?,?)
		ON CONFLICT(name) DO UPDATE SET kind=excluded.kind, url=excluded.url, sealed_secret=excluded.sealed_secret, updated_at=excluded.updated_at`,
		c.Name, c.Kind, c.URL, c.SealedSecret, ns(c.CreatedAt), ns(c.UpdatedAt))
	if err != nil {
		return fmt.Errorf("put channel: %w", err)
	}
	return nil
}

func scanChannel(row rowScanner) (*store.NotifyChannel, error) {
	var c store.NotifyChannel
	var cr, up int64
	if err := row.Scan(&c.Name, &c.Kind, &c.URL, &c.SealedSecret, &cr, &up); err != nil {
		return nil, err
	}
	c.CreatedAt, c.UpdatedAt = fromNS(cr), fromNS(up)
	return &c, nil
}

const channelCols = `name, kind, url, sealed_secret, created_at, updated_at`

func (s *DB) GetChannel(ctx context.Context, name string) (*store.NotifyChannel, error) {
	c, err := scanChannel(s.r.QueryRowContext(ctx, `SELECT `+channelCols+` FROM notify_channels WHERE name=?`, name))
	if err != nil {
		return nil, rowErr(err, "channel", "get channel")
	}
	return c, nil
}

func (s *DB) ListChannels(ctx context.Context) ([]*store.NotifyChannel, error) {
	return queryAll(ctx, s.r, "list channels", scanChannel, `SELECT `+channelCols+` FROM notify_channels ORDER BY name`)
}

func (s *DB) DeleteChannel(ctx context.Context, name string) error {
	return s.writeTx(ctx, func(tx Tx) error {
		res, err := tx.ExecContext(ctx, `DELETE FROM notify_channels WHERE name=?`, name)
		if err != nil {
			return fmt.Errorf("delete channel: %w", err)
		}
		if n, _ := res.RowsAffected(); n != 1 {
			return errs.NotFound("channel")
		}
		if _, err := tx.ExecContext(ctx, `DELETE FROM notify_deliveries WHERE channel=? AND state='pending'`, name); err != nil {
			return fmt.Errorf("delete channel: %w", err)
		}
		return nil
	})
}

func (s *DB) PutRule(ctx context.Context, r *api.NotifyRule) error {
	spec := *r
	spec.CreatedAt, spec.UpdatedAt = time.Time{}, time.Time{}
	b, err := json.Marshal(spec)
	if err != nil {
		return fmt.Errorf("put rule: %w", err)
	}
	_, err = s.w.ExecContext(ctx, `INSERT INTO notify_rules(name, spec, created_at, updated_at) VALUES(?,?,?,?)
		ON CONFLICT(name) DO UPDATE SET spec=excluded.spec, updated_at=excluded.updated_at`, r.Name, string(b), ns(r.CreatedAt), ns(r.UpdatedAt))
	if err != nil {
		return fmt.Errorf("put rule: %w", err)
	}
	return nil
}

func scanRule(row rowScanner) (*api.NotifyRule, error) {
	var spec string
	var cr, up int64
	if err := row.Scan(&spec, &cr, &up); err != nil {
		return nil, err
	}
	var r api.NotifyRule
	if err := json.Unmarshal([]byte(spec), &r); err != nil {
		return nil, err
	}
	r.CreatedAt, r.UpdatedAt = fromNS(cr), fromNS(up)
	return &r, nil
}

func (s *DB) GetRule(ctx context.Context, name string) (*api.NotifyRule, error) {
	r, err := scanRule(s.r.QueryRowContext(ctx, `SELECT spec, created_at, updated_at FROM notify_rules WHERE name=?`, name))
	if err != nil {
		return nil, rowErr(err, "rule", "get rule")
	}
	return r, nil
}

func (s *DB) ListRules(ctx context.Context) ([]*api.NotifyRule, error) {
	return queryAll(ctx, s.r, "list rules", scanRule, `SELECT spec, created_at, updated_at FROM notify_rules ORDER BY name`)
}

func (s *DB) DeleteRule(ctx context.Context, name string) error {
	res, err := s.w.ExecContext(ctx, `DELETE FROM notify_rules WHERE name=?`, name)
	if err != nil {
		return fmt.Errorf("delete rule: %w", err)
	}
	if n, _ := res.RowsAffected(); n != 1 {
		return errs.NotFound("rule")
	}
	return nil
}

func (s *DB) EventsAfter(ctx context.Context, after int64, limit int) ([]*store.Event, error) {
	return queryAll(ctx, s.r, "events after", scanEvent, `SELECT `+eventColumns+` FROM events WHERE id>? ORDER BY id LIMIT ?`, after, s.d.Limit(limit))
}

func (s *DB) NotifyProgress(ctx context.Context) (int64, map[string]string, error) {
	rows, err := s.r.QueryContext(ctx, `SELECT key, value FROM notify_state`)
	if err != nil {
		return 0, nil, fmt.Errorf("notify progress: %w", err)
	}
	defer rows.Close()
	var cursor int64
	state := map[string]string{}
	for rows.Next() {
		var k, v string
		if err := rows.Scan(&k, &v); err != nil {
			return 0, nil, fmt.Errorf("notify progress: %w", err)
		}
		if k == s.d.NotifyCursorKey {
			fmt.Sscan(v, &cursor)
			continue
		}
		state[k] = v
	}
	return cursor, state, rows.Err()
}

func insertDeliveries(ctx context.Context, tx Tx, ds []*store.Delivery) error {
	for _, d := range ds {
		err := tx.QueryRowContext(ctx, `INSERT INTO notify_deliveries(channel, event_id, body, created_at, next_at) VALUES(?,?,?,?,?) RETURNING id`,
			d.Channel, d.EventID, d.Body, ns(d.CreatedAt), ns(d.NextAt)).Scan(&d.ID)
		if err != nil {
			return fmt.Errorf("queue delivery: %w", err)
		}
	}
	return nil
}

func (s *DB) RouteEvents(ctx context.Context, cursor int64, state map[string]string, ds []*store.Delivery) error {
	return s.writeTx(ctx, func(tx Tx) error {
		if err := insertDeliveries(ctx, tx, ds); err != nil {
			return err
		}
		state[s.d.NotifyCursorKey] = fmt.Sprint(cursor)
		defer delete(state, s.d.NotifyCursorKey)
		for k, v := range state {
			var err error
			if v == "" {
				_, err = tx.ExecContext(ctx, `DELETE FROM notify_state WHERE key=?`, k)
			} else {
				_, err = tx.ExecContext(ctx, `INSERT INTO notify_state(key, value) VALUES(?,?) ON CONFLICT(key) DO UPDATE SET value=excluded.value`, k, v)
			}
			if err != nil {
				return fmt.Errorf("notify state: %w", err)
			}
		}
		return nil
	})
}

func (s *DB) EnqueueDeliveries(ctx context.Context, ds []*store.Delivery) error {
	return s.writeTx(ctx, func(tx Tx) error { return insertDeliveries(ctx, tx, ds) })
}

func (s *DB) ClaimDeliveries(ctx context.Context, now time.Time, lease time.Duration, limit int) ([]*store.Delivery, error) {
	var out []*store.Delivery
	err := s.writeTx(ctx, func(tx Tx) error {
		rows, err := tx.QueryContext(ctx, `SELECT id, channel, event_id, body, created_at, next_at, attempts, last_error FROM notify_deliveries d
			WHERE state='pending' AND next_at<=?
			AND NOT EXISTS (SELECT 1 FROM notify_deliveries o WHERE o.channel=d.channel AND o.state='pending' AND o.id<d.id)
			ORDER BY id LIMIT ?`, ns(now), s.d.Limit(limit))
		if err != nil {
			return err
		}
		out = nil
		for rows.Next() {
			var d store.Delivery
			var cr, nx int64
			if err := rows.Scan(&d.ID, &d.Channel, &d.EventID, &d.Body, &cr, &nx, &d.Attempts, &d.LastError); err != nil {
				rows.Close()
				return err
			}
			d.CreatedAt, d.NextAt = fromNS(cr), fromNS(nx)
			out = append(out, &d)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}
		for _, d := range out {
			if _, err := tx.ExecContext(ctx, `UPDATE notify_deliveries SET next_at=? WHERE id=?`, ns(now.Add(lease)), d.ID); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("claim deliveries: %w", err)
	}
	return out, nil
}

func (s *DB) DeliveryDone(ctx context.Context, id int64, now time.Time) error {
	_, err := s.w.ExecContext(ctx, `UPDATE notify_deliveries SET state='delivered', attempts=attempts+1, last_error='', last_attempt_at=?, done_at=? WHERE id=?`,
		ns(now), ns(now), id)
	if err != nil {
		return fmt.Errorf("delivery done: %w", err)
	}
	return nil
}

func (s *DB) DeliveryFailed(ctx context.Context, id int64, now time.Time, msg string, next time.Time, final bool) error {
	st, done := "pending", int64(0)
	if final {
		st, done = "failed", ns(now)
	}
	_, err := s.w.ExecContext(ctx, `UPDATE notify_deliveries SET state=?, attempts=attempts+1, last_error=?, last_attempt_at=?, next_at=?, done_at=? WHERE id=?`,
		st, msg, ns(now), ns(next), done, id)
	if err != nil {
		return fmt.Errorf("delivery failed: %w", err)
	}
	return nil
}

func (s *DB) DeliveryStatus(ctx context.Context) (map[string]*api.ChannelStatus, error) {
	rows, err := s.r.QueryContext(ctx, `SELECT channel,
		COUNT(*) FILTER (WHERE state='pending'), COUNT(*) FILTER (WHERE state='delivered'), COUNT(*) FILTER (WHERE state='failed'), MAX(last_attempt_at), MAX(CASE WHEN state='delivered' THEN done_at ELSE 0 END),
		(SELECT last_error FROM notify_deliveries e WHERE e.channel=d.channel AND e.last_error<>'' ORDER BY e.last_attempt_at DESC LIMIT 1)
		FROM notify_deliveries d GROUP BY channel`)
	if err != nil {
		return nil, fmt.Errorf("delivery status: %w", err)
	}
	defer rows.Close()
	out := map[string]*api.ChannelStatus{}
	for rows.Next() {
		var c api.ChannelStatus
		var att, del int64
		var last sql.NullString
		if err := rows.Scan(&c.Channel, &c.Pending, &c.Delivered, &c.Failed, &att, &del, &last); err != nil {
			return nil, fmt.Errorf("delivery status: %w", err)
		}
		c.LastAttemptAt, c.LastDeliveredAt, c.LastError = fromNS(att), fromNS(del), last.String
		out[c.Channel] = &c
	}
	return out, rows.Err()
}

func (s *DB) PruneDeliveries(ctx context.Context, before time.Time) (int, error) {
	res, err := s.w.ExecContext(ctx, `DELETE FROM notify_deliveries WHERE state<>'pending' AND done_at<?`, ns(before))
	if err != nil {
		return 0, fmt.Errorf("prune deliveries: %w", err)
	}
	n, _ := res.RowsAffected()
	return int(n), nil
}
