package postgres

import (
	"context"
	"fmt"
	"time"

	"github.com/drover/drover/server/store"
)

func (s *DB) MonitorInputs(ctx context.Context, withStatus bool) ([]*store.PipeVersion, []*store.MonitorAgent, error) {
	tx, err := s.readTx(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("monitor inputs: %w", err)
	}
	defer tx.Rollback()
	rows, err := tx.QueryContext(ctx, pipeQuery+` ORDER BY p.name`)
	if err != nil {
		return nil, nil, fmt.Errorf("monitor inputs: %w", err)
	}
	var pipes []*store.PipeVersion
	for rows.Next() {
		p, err := scanPipe(rows)
		if err != nil {
			rows.Close()
			return nil, nil, fmt.Errorf("monitor inputs: %w", err)
		}
		pipes = append(pipes, &p.PipeVersion)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, nil, fmt.Errorf("monitor inputs: %w", err)
	}
	status := `pipe_status`
	if !withStatus {
		status = `''`
	}
	rows, err = tx.QueryContext(ctx, `SELECT id, tags, created_at, last_seen_at, status_at, status_seq, `+status+` FROM agents WHERE revoked_at=0 ORDER BY id`)
	if err != nil {
		return nil, nil, fmt.Errorf("monitor inputs: %w", err)
	}
	defer rows.Close()
	var agents []*store.MonitorAgent
	for rows.Next() {
		var a store.MonitorAgent
		var created, seen, statusAt int64
		if err := rows.Scan(&a.ID, &a.TagsJSON, &created, &seen, &statusAt, &a.StatusSeq, &a.PipesJSON); err != nil {
			return nil, nil, fmt.Errorf("monitor inputs: %w", err)
		}
		a.CreatedAt, a.LastSeenAt, a.StatusAt = fromNS(created), fromNS(seen), fromNS(statusAt)
		agents = append(agents, &a)
	}
	return pipes, agents, rows.Err()
}

func (s *DB) ScheduledRuns(ctx context.Context, pipe string, since, until time.Time) ([]store.ScheduledRun, error) {
	q := `SELECT agent_id, pipe, scheduled_at, status FROM runs WHERE scheduled_at>=? AND scheduled_at<? AND scheduled_at<>0`
	args := []any{ns(since), ns(until)}
	if pipe != "" {
		q += ` AND pipe=?`
		args = append(args, pipe)
	}
	rows, err := s.r.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("scheduled runs: %w", err)
	}
	defer rows.Close()
	var out []store.ScheduledRun
	for rows.Next() {
		var r store.ScheduledRun
		var at int64
		if err := rows.Scan(&r.Agent, &r.Pipe, &at, &r.Status); err != nil {
			return nil, fmt.Errorf("scheduled runs: %w", err)
		}
		r.ScheduledAt = fromNS(at).Unix()
		out = append(out, r)
	}
	return out, rows.Err()
}

// sqlMissed stores a missed run unless any run of its agent and pipe
// serves the same fire time (to the second): a real record that arrived
// after the detection pass read the runs wins.
const sqlMissed = `INSERT INTO runs(id, agent_id, pipe, pipe_version, trigger, status, reason, error, scheduled_at, written_by, created_at, updated_at)
	SELECT ?::text, ?::text, ?::text, ?::bigint, 'schedule', 'missed', ?::text, ?::text, ?::bigint, 'server', ?::bigint, ?::bigint
	WHERE NOT EXISTS (SELECT 1 FROM runs WHERE agent_id=? AND pipe=? AND scheduled_at>=? AND scheduled_at<? AND scheduled_at<>0)`

func (s *DB) InsertMissed(ctx context.Context, runs []*store.Run) ([]*store.Run, error) {
	var stored []*store.Run
	err := withTx(ctx, s.w, func(tx *txn) error {
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
	err := withTx(ctx, s.w, func(tx *txn) error {
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
	q := `SELECT id, at, kind, pipe, agent_id, run_id, message, dedupe FROM events WHERE 1=1`
	var args []any
	add := func(cond string, v any) {
		q += ` AND ` + cond
		args = append(args, v)
	}
	if f.Kind != "" {
		add(`kind=?`, f.Kind)
	}
	if f.Pipe != "" {
		add(`pipe=?`, f.Pipe)
	}
	if f.Agent != "" {
		add(`agent_id=?`, f.Agent)
	}
	if !f.Since.IsZero() {
		add(`at>=?`, ns(f.Since))
	}
	if f.BeforeID > 0 {
		add(`id<?`, f.BeforeID)
	}
	q += ` ORDER BY id DESC LIMIT ?`
	args = append(args, limitArg(f.Limit))
	return queryAll(ctx, s.r, "list events", func(row interface{ Scan(...any) error }) (*store.Event, error) {
		var e store.Event
		var at int64
		if err := row.Scan(&e.ID, &at, &e.Kind, &e.Pipe, &e.AgentID, &e.RunID, &e.Message, &e.Dedupe); err != nil {
			return nil, err
		}
		e.At = fromNS(at)
		return &e, nil
	}, q, args...)
}

func (s *DB) MonitorState(ctx context.Context) (map[string]string, error) {
	rows, err := s.r.QueryContext(ctx, `SELECT key, value FROM monitor_state`)
	if err != nil {
		return nil, fmt.Errorf("monitor state: %w", err)
	}
	defer rows.Close()
	out := map[string]string{}
	for rows.Next() {
		var k, v string
		if err := rows.Scan(&k, &v); err != nil {
			return nil, fmt.Errorf("monitor state: %w", err)
		}
		out[k] = v
	}
	return out, rows.Err()
}

func (s *DB) SetMonitorState(ctx context.Context, kv map[string]string, now time.Time) error {
	if len(kv) == 0 {
		return nil
	}
	err := withTx(ctx, s.w, func(tx *txn) error {
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
