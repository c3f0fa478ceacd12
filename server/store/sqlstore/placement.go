package sqlstore

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/drover/drover/server/store"
)

const holderColumns = `pipe, agent_id, lease_until, since, last_fire_served, prev_agent_id, prev_since, prev_lease_until,
	released_at, move_to, move_requested_at, updated_at`

func (s *DB) Holders(ctx context.Context) ([]*store.Holder, error) {
	rows, err := s.r.QueryContext(ctx, `SELECT `+holderColumns+` FROM pipe_holders ORDER BY pipe`)
	if err != nil {
		return nil, fmt.Errorf("holders: %w", err)
	}
	defer rows.Close()
	var out []*store.Holder
	for rows.Next() {
		var h store.Holder
		var lease, since, served, prevSince, prevLease, released, moveAt, updated int64
		if err := rows.Scan(&h.Pipe, &h.Agent, &lease, &since, &served, &h.Prev, &prevSince, &prevLease, &released, &h.MoveTo, &moveAt, &updated); err != nil {
			return nil, fmt.Errorf("holders: %w", err)
		}
		h.LeaseUntil, h.Since, h.LastFireServed = fromNS(lease), fromNS(since), fromNS(served)
		h.PrevSince, h.PrevLeaseUntil, h.ReleasedAt = fromNS(prevSince), fromNS(prevLease), fromNS(released)
		h.MoveRequestedAt, h.UpdatedAt = fromNS(moveAt), fromNS(updated)
		out = append(out, &h)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("holders: %w", err)
	}
	return out, nil
}

func (s *DB) SaveHolders(ctx context.Context, hs []*store.Holder, remove []string) error {
	if len(hs) == 0 && len(remove) == 0 {
		return nil
	}
	err := s.writeTx(ctx, func(tx Tx) error {
		for _, p := range remove {
			if _, err := tx.ExecContext(ctx, `DELETE FROM pipe_holders WHERE pipe=?`, p); err != nil {
				return err
			}
		}
		for _, h := range hs {
			if _, err := tx.ExecContext(ctx, `INSERT INTO pipe_holders(`+holderColumns+`) VALUES(?,?,?,?,?,?,?,?,?,?,?,?)
				ON CONFLICT(pipe) DO UPDATE SET agent_id=excluded.agent_id, lease_until=excluded.lease_until, since=excluded.since,
				last_fire_served=excluded.last_fire_served, prev_agent_id=excluded.prev_agent_id, prev_since=excluded.prev_since,
				prev_lease_until=excluded.prev_lease_until, released_at=excluded.released_at, move_to=excluded.move_to,
				move_requested_at=excluded.move_requested_at, updated_at=excluded.updated_at`,
				h.Pipe, h.Agent, ns(h.LeaseUntil), ns(h.Since), ns(h.LastFireServed), h.Prev, ns(h.PrevSince), ns(h.PrevLeaseUntil),
				ns(h.ReleasedAt), h.MoveTo, ns(h.MoveRequestedAt), ns(h.UpdatedAt)); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("save holders: %w", err)
	}
	return nil
}

func (s *DB) LastFiresServed(ctx context.Context, pipes []string) (map[string]time.Time, error) {
	out := map[string]time.Time{}
	for _, p := range pipes {
		// Newest first along runs_pipe_scheduled: the first served one wins.
		var at int64
		err := s.r.QueryRowContext(ctx, `SELECT scheduled_at FROM runs WHERE pipe=? AND scheduled_at<>0 AND status<>'missed'
			AND NOT (status='skipped' AND reason='lease_ended')
			ORDER BY scheduled_at DESC LIMIT 1`, p).Scan(&at)
		switch {
		case err == sql.ErrNoRows:
			continue
		case err != nil:
			return nil, fmt.Errorf("last fires served: %w", err)
		}
		out[p] = fromNS(at)
	}
	return out, nil
}
