package sqlstore

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"time"

	"github.com/drover/drover/server/errs"
	"github.com/drover/drover/server/store"
)

// inChunk bounds the ids of one IN (...) list.
const inChunk = 500

func (s *DB) PutStreams(ctx context.Context, replica string, ids []string, now time.Time) error {
	if len(ids) == 0 {
		return nil
	}
	return s.writeTx(ctx, func(tx Tx) error {
		st, err := tx.PrepareContext(ctx, `INSERT INTO agent_streams(agent_id, replica, seen_at) VALUES(?,?,?)
			ON CONFLICT(agent_id) DO UPDATE SET replica=excluded.replica, seen_at=excluded.seen_at`)
		if err != nil {
			return fmt.Errorf("put streams: %w", err)
		}
		defer st.Close()
		for _, id := range ids {
			if _, err := st.ExecContext(ctx, id, replica, ns(now)); err != nil {
				return fmt.Errorf("put streams: %w", err)
			}
		}
		return nil
	})
}

func (s *DB) DropStream(ctx context.Context, agentID, replica string) error {
	if _, err := s.w.ExecContext(ctx, `DELETE FROM agent_streams WHERE agent_id=? AND replica=?`, agentID, replica); err != nil {
		return fmt.Errorf("drop stream: %w", err)
	}
	return nil
}

func (s *DB) TouchStreams(ctx context.Context, replica string, now, expired time.Time) (int, error) {
	var n int64
	err := s.writeTx(ctx, func(tx Tx) error {
		res, err := tx.ExecContext(ctx, `UPDATE agent_streams SET seen_at=? WHERE replica=?`, ns(now), replica)
		if err != nil {
			return err
		}
		n, _ = res.RowsAffected()
		_, err = tx.ExecContext(ctx, `DELETE FROM agent_streams WHERE seen_at<?`, ns(expired))
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("touch streams: %w", err)
	}
	return int(n), nil
}

func (s *DB) StreamReplicas(ctx context.Context, ids []string, since time.Time) (map[string]string, error) {
	out := map[string]string{}
	scan := func(q string, args ...any) error {
		rows, err := s.r.QueryContext(ctx, q, args...)
		if err != nil {
			return fmt.Errorf("stream replicas: %w", err)
		}
		defer rows.Close()
		for rows.Next() {
			var id, r string
			if err := rows.Scan(&id, &r); err != nil {
				return fmt.Errorf("stream replicas: %w", err)
			}
			out[id] = r
		}
		return rows.Err()
	}
	if ids == nil {
		return out, scan(`SELECT agent_id, replica FROM agent_streams WHERE seen_at>=?`, ns(since))
	}
	for len(ids) > 0 {
		n := min(len(ids), inChunk)
		args := []any{ns(since)}
		for _, id := range ids[:n] {
			args = append(args, id)
		}
		if err := scan(`SELECT agent_id, replica FROM agent_streams WHERE seen_at>=? AND agent_id IN (?`+strings.Repeat(",?", n-1)+`)`, args...); err != nil {
			return nil, err
		}
		ids = ids[n:]
	}
	return out, nil
}

func (s *DB) CreateSession(ctx context.Context, cs *store.ConsoleSession, lim store.SessionLimits) error {
	err := s.writeTx(ctx, func(tx Tx) error {
		if _, err := tx.ExecContext(ctx, `DELETE FROM console_sessions WHERE last_seen_at<? OR created_at<?`, ns(lim.IdleBefore), ns(lim.CreatedBefore)); err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO console_sessions(id_hash, token_id, created_at, last_seen_at) VALUES(?,?,?,?)`,
			cs.IDHash, cs.TokenID, ns(cs.CreatedAt), ns(cs.LastSeenAt)); err != nil {
			return err
		}
		if lim.Max > 0 {
			_, err := tx.ExecContext(ctx, `DELETE FROM console_sessions WHERE created_at <
				(SELECT created_at FROM console_sessions ORDER BY created_at DESC LIMIT 1 OFFSET ?)`, lim.Max-1)
			return err
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("create session: %w", err)
	}
	return nil
}

func (s *DB) GetSession(ctx context.Context, idHash []byte, lim store.SessionLimits) (*store.ConsoleSession, error) {
	cs := store.ConsoleSession{IDHash: idHash}
	var created, seen int64
	err := s.r.QueryRowContext(ctx, `SELECT token_id, created_at, last_seen_at FROM console_sessions WHERE id_hash=?`, idHash).Scan(&cs.TokenID, &created, &seen)
	if err == sql.ErrNoRows {
		return nil, errs.NotFound("console session")
	}
	if err != nil {
		return nil, fmt.Errorf("get session: %w", err)
	}
	cs.CreatedAt, cs.LastSeenAt = fromNS(created), fromNS(seen)
	if seen < ns(lim.IdleBefore) || created < ns(lim.CreatedBefore) {
		_ = s.DeleteSession(ctx, idHash)
		return nil, errs.NotFound("console session")
	}
	return &cs, nil
}

func (s *DB) TouchSession(ctx context.Context, idHash []byte, now time.Time) error {
	if _, err := s.w.ExecContext(ctx, `UPDATE console_sessions SET last_seen_at=? WHERE id_hash=? AND last_seen_at<?`, ns(now), idHash, ns(now)); err != nil {
		return fmt.Errorf("touch session: %w", err)
	}
	return nil
}

func (s *DB) DeleteSession(ctx context.Context, idHash []byte) error {
	if _, err := s.w.ExecContext(ctx, `DELETE FROM console_sessions WHERE id_hash=?`, idHash); err != nil {
		return fmt.Errorf("delete session: %w", err)
	}
	return nil
}

func (s *DB) DeleteTokenSessions(ctx context.Context, tokenID string) error {
	if _, err := s.w.ExecContext(ctx, `DELETE FROM console_sessions WHERE token_id=?`, tokenID); err != nil {
		return fmt.Errorf("delete token sessions: %w", err)
	}
	return nil
}
