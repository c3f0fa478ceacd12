package server

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"github.com/drover/drover/api"
)

// monitorStore is used by fleet monitoring: missed-run detection, the
// fire-time view and the event log.
type monitorStore interface {
	// MonitorInputs returns every live pipe's current version and every
	// non-revoked agent (with its last pipe status when withStatus), from
	// one snapshot.
	MonitorInputs(ctx context.Context, withStatus bool) ([]*PipeVersion, []*MonitorAgent, error)
	// ScheduledRuns lists the runs serving a fire time in [since, until),
	// of one pipe or (pipe "") of all.
	ScheduledRuns(ctx context.Context, pipe string, since, until time.Time) ([]ScheduledRun, error)
	// InsertMissed stores missed runs, each unless a run of the same
	// agent, pipe and fire time (to the second) exists; it returns those
	// it stored.
	InsertMissed(ctx context.Context, runs []*Run) ([]*Run, error)
	// AddEvents stores events; an event whose Dedupe key is stored is
	// dropped.
	AddEvents(ctx context.Context, evs []*Event) error
	// ListEvents lists events newest first.
	ListEvents(ctx context.Context, f EventFilter) ([]*Event, error)
	// MonitorState returns the durable monitoring state; SetMonitorState
	// writes some keys of it (an empty value deletes the key).
	// PruneEvents deletes events older than before.
	PruneEvents(ctx context.Context, before time.Time) (int, error)
	MonitorState(ctx context.Context) (map[string]string, error)
	SetMonitorState(ctx context.Context, kv map[string]string, now time.Time) error
}

// MonitorAgent is what missed-run detection needs about one agent. Its
// tags and pipe status come as stored JSON (TagsJSON, PipesJSON), with the
// sequence number of the status, so that a caller can keep what it decoded
// until they change; Tags and Pipes are filled by the caller.
type MonitorAgent struct {
	ID         string
	CreatedAt  time.Time
	LastSeenAt time.Time
	StatusAt   time.Time
	StatusSeq  int64
	TagsJSON   string
	PipesJSON  string

	Tags  map[string]string
	Pipes []api.PipeStatus
}

// ScheduledRun is a run found by the fire time it serves.
type ScheduledRun struct {
	Agent       string
	Pipe        string
	ScheduledAt int64 // Unix seconds
	Status      string
}

// Event is one thing the server noticed about the fleet (DESIGN.md,
// "Fleet monitoring").
type Event struct {
	ID      int64
	At      time.Time
	Kind    string
	Pipe    string
	AgentID string
	RunID   string
	Message string
	// Dedupe names the occurrence: the same one recorded twice (a replayed
	// record, a second detection pass) is stored once.
	Dedupe string
}

// EventFilter selects events; empty fields match everything.
type EventFilter struct {
	Kind     string
	Pipe     string
	Agent    string
	Since    time.Time
	BeforeID int64 // cursor: events with a smaller id
	Limit    int
}

// missedRunID is the id of the missed run of (agent, pipe, fire time): the
// same for every detection pass, so that a missed run is stored once, and
// known to ingestion, which removes it when a real record for that fire
// time arrives.
func missedRunID(agent, pipe string, fire time.Time) string {
	h := sha256.Sum256([]byte(agent + "\x00" + pipe + "\x00" + strconv.FormatInt(fire.Unix(), 10)))
	return "missed-" + hex.EncodeToString(h[:16])
}

func (s *SQLiteStore) MonitorInputs(ctx context.Context, withStatus bool) ([]*PipeVersion, []*MonitorAgent, error) {
	tx, err := s.r.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
	if err != nil {
		return nil, nil, fmt.Errorf("monitor inputs: %w", err)
	}
	defer tx.Rollback()
	rows, err := tx.QueryContext(ctx, pipeQuery+` ORDER BY p.name`)
	if err != nil {
		return nil, nil, fmt.Errorf("monitor inputs: %w", err)
	}
	var pipes []*PipeVersion
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
	var agents []*MonitorAgent
	for rows.Next() {
		var a MonitorAgent
		var created, seen, statusAt int64
		if err := rows.Scan(&a.ID, &a.TagsJSON, &created, &seen, &statusAt, &a.StatusSeq, &a.PipesJSON); err != nil {
			return nil, nil, fmt.Errorf("monitor inputs: %w", err)
		}
		a.CreatedAt, a.LastSeenAt, a.StatusAt = fromNS(created), fromNS(seen), fromNS(statusAt)
		agents = append(agents, &a)
	}
	return pipes, agents, rows.Err()
}

func (s *SQLiteStore) ScheduledRuns(ctx context.Context, pipe string, since, until time.Time) ([]ScheduledRun, error) {
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
	var out []ScheduledRun
	for rows.Next() {
		var r ScheduledRun
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
	SELECT ?,?,?,?,'schedule','missed',?,?,?,'server',?,?
	WHERE NOT EXISTS (SELECT 1 FROM runs WHERE agent_id=? AND pipe=? AND scheduled_at>=? AND scheduled_at<? AND scheduled_at<>0)`

func (s *SQLiteStore) InsertMissed(ctx context.Context, runs []*Run) ([]*Run, error) {
	var stored []*Run
	err := withTx(ctx, s.w, func(tx *sql.Tx) error {
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

func (s *SQLiteStore) AddEvents(ctx context.Context, evs []*Event) error {
	if len(evs) == 0 {
		return nil
	}
	err := withTx(ctx, s.w, func(tx *sql.Tx) error {
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

func (s *SQLiteStore) ListEvents(ctx context.Context, f EventFilter) ([]*Event, error) {
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
	args = append(args, f.Limit)
	return queryAll(ctx, s.r, "list events", func(row interface{ Scan(...any) error }) (*Event, error) {
		var e Event
		var at int64
		if err := row.Scan(&e.ID, &at, &e.Kind, &e.Pipe, &e.AgentID, &e.RunID, &e.Message, &e.Dedupe); err != nil {
			return nil, err
		}
		e.At = fromNS(at)
		return &e, nil
	}, q, args...)
}

func (s *SQLiteStore) MonitorState(ctx context.Context) (map[string]string, error) {
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

func (s *SQLiteStore) SetMonitorState(ctx context.Context, kv map[string]string, now time.Time) error {
	if len(kv) == 0 {
		return nil
	}
	err := withTx(ctx, s.w, func(tx *sql.Tx) error {
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

func (s *SQLiteStore) PruneEvents(ctx context.Context, before time.Time) (int, error) {
	res, err := s.w.ExecContext(ctx, `DELETE FROM events WHERE at<?`, ns(before))
	if err != nil {
		return 0, fmt.Errorf("prune events: %w", err)
	}
	n, _ := res.RowsAffected()
	return int(n), nil
}

// decodeMonitorAgent fills a's Tags and Pipes from their JSON.
func decodeMonitorAgent(a *MonitorAgent, withPipes bool) error {
	if err := json.Unmarshal([]byte(a.TagsJSON), &a.Tags); err != nil {
		return fmt.Errorf("agent %s tags: %w", a.ID, err)
	}
	if withPipes && a.PipesJSON != "" && a.PipesJSON != "[]" {
		if err := json.Unmarshal([]byte(a.PipesJSON), &a.Pipes); err != nil {
			return fmt.Errorf("agent %s pipe status: %w", a.ID, err)
		}
	}
	return nil
}
