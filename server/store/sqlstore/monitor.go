package sqlstore

import (
	"context"
	"fmt"
	"time"

	"github.com/drover/drover/server/store"
)

func (s *DB) MonitorInputs(ctx context.Context, withStatus bool) ([]*store.PipeVersion, []*store.MonitorAgent, error) {
	status := `pipe_status`
	if !withStatus {
		status = `''`
	}
	return pipesAndAgents(ctx, s, "monitor inputs", func(row rowScanner) (*store.MonitorAgent, error) {
		var a store.MonitorAgent
		var created, seen, statusAt int64
		if err := row.Scan(&a.ID, &a.TagsJSON, &created, &seen, &statusAt, &a.StatusSeq, &a.PipesJSON); err != nil {
			return nil, err
		}
		a.CreatedAt, a.LastSeenAt, a.StatusAt = fromNS(created), fromNS(seen), fromNS(statusAt)
		return &a, nil
	}, `SELECT id, tags, created_at, last_seen_at, status_at, status_seq, `+status+` FROM agents WHERE revoked_at=0 ORDER BY id`)
}

func (s *DB) ScheduledRuns(ctx context.Context, pipe string, since, until time.Time) ([]store.ScheduledRun, error) {
	q := listQuery{sql: `SELECT agent_id, pipe, scheduled_at, status FROM runs WHERE scheduled_at>=? AND scheduled_at<? AND scheduled_at<>0`, args: []any{ns(since), ns(until)}}
	q.and(pipe != "", `pipe=?`, pipe)
	return queryAll(ctx, s.r, "scheduled runs", func(row rowScanner) (store.ScheduledRun, error) {
		var r store.ScheduledRun
		var at int64
		err := row.Scan(&r.Agent, &r.Pipe, &at, &r.Status)
		r.ScheduledAt = fromNS(at).Unix()
		return r, err
	}, q.sql, q.args...)
}

// sqlMissed stores a missed run unless any run of its agent and pipe
// serves the same fire time (to the second): a real record that arrived
// after the detection pass read the runs wins.
const sqlMissed = `INSERT INTO runs(id, agent_id, pipe, pipe_version, trigger, status, reason, error, scheduled_at, written_by, created_at, updated_at)
	SELECT CAST(? AS TEXT), CAST(? AS TEXT), CAST(? AS TEXT), CAST(? AS BIGINT), 'schedule', 'missed', CAST(? AS TEXT), CAST(? AS TEXT), CAST(? AS BIGINT), 'server', CAST(? AS BIGINT), CAST(? AS BIGINT)
	WHERE NOT EXISTS (SELECT 1 FROM runs WHERE agent_id=? AND pipe=? AND scheduled_at>=? AND scheduled_at<? AND scheduled_at<>0)`

func (s *DB) InsertMissed(ctx context.Context, runs []*store.Run) ([]*store.Run, error) {
	var stored []*store.Run
	err := s.writeTx(ctx, func(tx Tx) error {
		st, err := tx.PrepareContext(ctx, sqlMissed)
		if err != nil {
			return err
		}
		defer st.Close()
		stored = stored[:0]
		for _, r := range runs {
			sec := r.ScheduledAt.Truncate(time.Second)
			res, err := st.ExecContext(ctx, r.ID, r.AgentID, r.Pipe, r.PipeVersion, r.Reason, r.Error, ns(r.ScheduledAt), ns(r.CreatedAt), ns(r.CreatedAt),
				r.AgentID, r.Pipe, ns(sec), ns(sec.Add(time.Second)))
			if err != nil {
				return err
			}
			if n, _ := res.RowsAffected(); n == 1 {
				stored = append(stored, r)
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("insert missed runs: %w", err)
	}
	return stored, nil
}

func (s *DB) AddEvents(ctx context.Context, evs []*store.Event) error {
	if len(evs) == 0 {
		return nil
	}
	err := s.writeTx(ctx, func(tx Tx) error {
		st, err := tx.PrepareContext(ctx, `INSERT INTO events(at, kind, pipe, agent_id, run_id, message, dedupe) VALUES(?,?,?,?,?,?,?) ON CONFLICT(dedupe) DO NOTHING`)
		if err != nil {
			return err
		}
		defer st.Close()
		for _, e := range evs {
			if _, err := st.ExecContext(ctx, ns(e.At), e.Kind, e.Pipe, e.AgentID, e.RunID, e.Message, e.Dedupe); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("add events: %w", err)
	}
	return nil
}

func (s *DB) ListEvents(ctx context.Context, f store.EventFilter) ([]*store.Event, error) {
	q := listQuery{sql: `SELECT ` + eventColumns + ` FROM events WHERE 1=1`}
	q.and(f.Kind != "", `kind=?`, f.Kind)
	q.and(f.Pipe != "", `pipe=?`, f.Pipe)
	q.and(f.Agent != "", `agent_id=?`, f.Agent)
	q.and(!f.Since.IsZero(), `at>=?`, ns(f.Since))
	q.and(f.BeforeID > 0, `id<?`, f.BeforeID)
	q.append(` ORDER BY id DESC LIMIT ?`, s.d.Limit(f.Limit))
	return queryAll(ctx, s.r, "list events", scanEvent, q.sql, q.args...)
}

const eventColumns = `id, at, kind, pipe, agent_id, run_id, message, dedupe`

func scanEvent(row rowScanner) (*store.Event, error) {
	var e store.Event
	var at int64
	if err := row.Scan(&e.ID, &at, &e.Kind, &e.Pipe, &e.AgentID, &e.RunID, &e.Message, &e.Dedupe); err != nil {
		return nil, err
	}
	e.At = fromNS(at)
	return &e, nil
}

func (s *DB) MonitorState(ctx context.Context) (map[string]string, error) {
	return queryMap[string](ctx, s.r, "monitor state", `SELECT key, value FROM monitor_state`)
}

func (s *DB) SetMonitorState(ctx context.Context, kv map[string]string, now time.Time) error {
	if len(kv) == 0 {
		return nil
	}
	err := s.writeTx(ctx, func(tx Tx) error {
		for k, v := range kv {
			if v == "" {
				if _, err := tx.ExecContext(ctx, `DELETE FROM monitor_state WHERE key=?`, k); err != nil {
					return err
				}
				continue
			}
			if _, err := tx.ExecContext(ctx, `INSERT INTO monitor_state(key, value, updated_at) VALUES(?,?,?)
				ON CONFLICT(key) DO UPDATE SET value=excluded.value, updated_at=excluded.updated_at`, k, v, ns(now)); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("set monitor state: %w", err)
	}
	return nil
}

func (s *DB) PruneEvents(ctx context.Context, before time.Time) (int, error) {
	res, err := s.w.ExecContext(ctx, `DELETE FROM events WHERE at<?`, ns(before))
	if err != nil {
		return 0, fmt.Errorf("prune events: %w", err)
	}
	n, _ := res.RowsAffected()
	return int(n), nil
}
