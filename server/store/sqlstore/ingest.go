package sqlstore

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/drover/drover/api"
	"github.com/drover/drover/server/store"
)

// ingestTx is one ApplyRecords transaction. Its statements are prepared
// once per transaction, or, where the store prepared them on its writer
// (DB.PrepareIngest: SQLite's one writer connection), bound to each
// transaction and not parsed again for every batch.
type ingestTx struct {
	ctx   context.Context
	db    *DB
	tx    Tx
	stmts map[string]*sql.Stmt
}

func (t *ingestTx) stmt(query string) (*sql.Stmt, error) {
	if st, ok := t.stmts[query]; ok {
		return st, nil
	}
	var st *sql.Stmt
	if parent := t.db.ingestStmts[query]; parent != nil {
		st = t.tx.StmtContext(t.ctx, parent)
	} else {
		var err error
		if st, err = t.tx.PrepareContext(t.ctx, query); err != nil {
			return nil, err
		}
	}
	t.stmts[query] = st
	return st, nil
}

func (t *ingestTx) exec(query string, args ...any) (sql.Result, error) {
	st, err := t.stmt(query)
	if err != nil {
		return nil, err
	}
	return st.ExecContext(t.ctx, args...)
}

func (t *ingestTx) query(query string, args ...any) (*sql.Rows, error) {
	st, err := t.stmt(query)
	if err != nil {
		return nil, err
	}
	return st.QueryContext(t.ctx, args...)
}

// exists says whether query returns a row.
func (t *ingestTx) exists(query string, args ...any) (bool, error) {
	rows, err := t.query(query, args...)
	if err != nil {
		return false, err
	}
	defer rows.Close()
	return rows.Next(), rows.Err()
}

// Preparer prepares a statement outside any transaction: the SQLite
// store's writer pool.
type Preparer interface {
	PrepareContext(ctx context.Context, query string) (*sql.Stmt, error)
}

// PrepareIngest prepares ApplyRecords' statements once on w, the writer
// pool, for every later transaction to bind: the SQLite store calls it when
// it opens (its one writer connection is free then; later a transaction
// holds it). CloseIngest closes them.
func (s *DB) PrepareIngest(ctx context.Context, w Preparer) error {
	queries := []string{sqlHello, sqlStatus, sqlRunStarted, sqlRunFinished, sqlUnfinished, s.sqlListed, s.sqlUnlisted, sqlSettle,
		sqlRunPlaceholder, sqlChunk, sqlRunLog, sqlRunLogState, sqlSeen, sqlDropMissed, sqlDropMissedOrNoHolder}
	s.ingestStmts = make(map[string]*sql.Stmt, len(queries))
	for _, q := range queries {
		st, err := w.PrepareContext(ctx, q)
		if err != nil {
			return fmt.Errorf("prepare ingest statements: %w", err)
		}
		s.ingestStmts[q] = st
	}
	return nil
}

// CloseIngest closes the statements of PrepareIngest.
func (s *DB) CloseIngest() {
	for _, st := range s.ingestStmts {
		st.Close()
	}
}

const (
	// A Hello's hostname is kept as reported_hostname: the hostname checked
	// at enrollment is not the agent's to change.
	sqlHello = `UPDATE agents SET agent_version=?, os=?, arch=?, reported_hostname=?, backend=?, scope=?, systemd_version=?,
		accepted_serial=?, accepted_digest=?, updated_at=? WHERE id=?`
	sqlStatus = `UPDATE agents SET applied_serial=?, manifest_state=?, manifest_error=?, pipe_status=?, status_seq=?, status_at=?, updated_at=?,
		manifest_expired=?, manifest_expires_at=?
		WHERE id=? AND status_seq<?`
	sqlRunStarted = `INSERT INTO runs(id, agent_id, pipe, pipe_version, trigger, status, started_at, scheduled_at, request_id, attempts, created_at, updated_at)
		VALUES(?,?,?,?,?,'running',?,?,?,?,?,?)
		ON CONFLICT(id) DO UPDATE SET
			pipe=CASE WHEN runs.pipe='' THEN excluded.pipe ELSE runs.pipe END,
			pipe_version=CASE WHEN runs.pipe_version=0 THEN excluded.pipe_version ELSE runs.pipe_version END,
			trigger=CASE WHEN runs.trigger='' THEN excluded.trigger ELSE runs.trigger END,
			started_at=CASE WHEN runs.started_at=0 THEN excluded.started_at ELSE runs.started_at END,
			scheduled_at=CASE WHEN runs.scheduled_at=0 THEN excluded.scheduled_at ELSE runs.scheduled_at END,
			request_id=CASE WHEN runs.request_id='' THEN excluded.request_id ELSE runs.request_id END,
			attempts=CASE WHEN runs.status IN ('pending','running') AND excluded.attempts>runs.attempts THEN excluded.attempts ELSE runs.attempts END,
			status=CASE WHEN runs.status IN ('pending','running') THEN 'running' ELSE runs.status END,
			updated_at=excluded.updated_at
		WHERE runs.agent_id=excluded.agent_id`
	sqlRunFinished = `INSERT INTO runs(id, agent_id, pipe, pipe_version, trigger, status, exit_code, signal, error, request_id, scheduled_at,
			started_at, finished_at, duration_ms, log_chunks, reason, attempts, written_by, created_at, updated_at, output, metrics, telemetry_notes)
		VALUES(?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)
		ON CONFLICT(id) DO UPDATE SET
			pipe=CASE WHEN excluded.pipe<>'' THEN excluded.pipe ELSE runs.pipe END,
			pipe_version=CASE WHEN excluded.pipe_version<>0 THEN excluded.pipe_version ELSE runs.pipe_version END,
			trigger=CASE WHEN excluded.trigger<>'' THEN excluded.trigger ELSE runs.trigger END,
			status=excluded.status, exit_code=excluded.exit_code, signal=excluded.signal, error=excluded.error,
			request_id=CASE WHEN excluded.request_id<>'' THEN excluded.request_id ELSE runs.request_id END,
			scheduled_at=CASE WHEN excluded.scheduled_at<>0 THEN excluded.scheduled_at ELSE runs.scheduled_at END,
			started_at=CASE WHEN excluded.started_at<>0 THEN excluded.started_at ELSE runs.started_at END,
			finished_at=excluded.finished_at, duration_ms=excluded.duration_ms, log_chunks=excluded.log_chunks,
			reason=excluded.reason, attempts=CASE WHEN excluded.attempts<>0 THEN excluded.attempts ELSE runs.attempts END,
			written_by=excluded.written_by, updated_at=excluded.updated_at,
			output=excluded.output, metrics=excluded.metrics, telemetry_notes=excluded.telemetry_notes
		WHERE runs.agent_id=excluded.agent_id`
	// A drained heartbeat clears the strikes of the unfinished runs it
	// lists, adds one to those it does not list that started before it
	// (started_at on the agent's clock, else created_at on the server's),
	// and settles those with lostStrikes strikes.
	// (sqlListed and sqlUnlisted, built with the dialect's JSON list:
	// listedQueries.)
	// sqlUnfinished finds whether the agent has a run the three would touch:
	// most heartbeats come from agents with none, and one indexed read
	// (runs_agent_status) is cheaper than the three statements.
	sqlUnfinished = `SELECT 1 FROM runs WHERE agent_id=? AND status IN ('pending','running') LIMIT 1`
	sqlSettle     = `UPDATE runs SET status='failed', reason='lost', written_by='server', finished_at=?, updated_at=?, unlisted=0,
			error='the agent no longer runs it and every record it had was committed: its end was never reported'
		WHERE agent_id=? AND status IN ('pending','running') AND unlisted>=?
		RETURNING id`
	sqlRunPlaceholder = `INSERT INTO runs(id, agent_id, status, created_at, updated_at) VALUES(?,?,'running',?,?) ON CONFLICT(id) DO NOTHING`
	sqlChunk          = `INSERT INTO log_chunks(run_id, seq, stream, data, at) VALUES(?,?,?,?,?) ON CONFLICT(run_id, seq) DO NOTHING`
	sqlRunLog         = `UPDATE runs SET log_bytes=?, log_truncated=?, updated_at=? WHERE id=?`
	sqlDropMissed     = `DELETE FROM runs WHERE id=? AND agent_id=? AND status='missed'`
	// the agent's own missed run, and the one recorded with no holder
	// (agent "", placement: one)
	sqlDropMissedOrNoHolder = `DELETE FROM runs WHERE status='missed' AND ((id=? AND agent_id=?) OR (id=? AND agent_id=''))`
	sqlRunLogState          = `SELECT agent_id, log_bytes, log_truncated FROM runs WHERE id=?`
	sqlSeen                 = `UPDATE agents SET last_seen_at=? WHERE id=? AND last_seen_at<?`
)

// listedQueries are the statements of a drained heartbeat (see sqlSettle)
// that read its list of run ids, in dialect d.
func listedQueries(d Dialect) (listed, unlisted string) {
	listed = `UPDATE runs SET unlisted=0
		WHERE agent_id=? AND status IN ('pending','running') AND unlisted<>0 AND id IN (SELECT value FROM ` + d.JSONValues("?") + `)`
	unlisted = `UPDATE runs SET unlisted=unlisted+1
		WHERE agent_id=? AND status IN ('pending','running')
			AND ((started_at<>0 AND started_at<?) OR (started_at=0 AND created_at<?))
			AND id NOT IN (SELECT value FROM ` + d.JSONValues("?") + `)`
	return listed, unlisted
}

// runLog tracks one run's log accounting within a batch.
type runLog struct {
	agentID   string
	bytes     int64
	truncated bool
	dirty     bool
	at        time.Time
}

// ApplyRecords commits recs in one transaction. Every statement is an
// idempotent upsert, so a replayed record changes nothing. Runs belong to
// the agent that first reported them: records about another agent's run are
// ignored. Log chunks are counted against the per-run cap only when they are
// new; the first chunk over the cap is replaced by a truncation marker and
// later ones are dropped.
//
// The transaction is the store's write transaction: under SQLite's one
// writer, or SERIALIZABLE and retried whole on a conflict on PostgreSQL, so
// that two servers ingesting for one agent (or a server and the monitor)
// see the behaviour of a single writer.
func (s *DB) ApplyRecords(ctx context.Context, recs []*store.Record, lim store.IngestLimits) error {
	err := s.writeTx(ctx, func(tx Tx) error {
		t := &ingestTx{ctx: ctx, db: s, tx: tx, stmts: map[string]*sql.Stmt{}}
		defer func() {
			for _, st := range t.stmts {
				st.Close()
			}
		}()
		return t.apply(recs, lim)
	})
	if err != nil {
		return fmt.Errorf("apply records: %w", err)
	}
	return nil
}

func (t *ingestTx) apply(recs []*store.Record, lim store.IngestLimits) error {
	seen := map[string]time.Time{}
	runs := map[string]*runLog{}
	for _, r := range recs {
		now := r.Received
		if now.After(seen[r.AgentID]) {
			seen[r.AgentID] = now
		}
		var err error
		switch {
		case r.Hello != nil:
			h := r.Hello
			_, err = t.exec(sqlHello, h.AgentVersion, h.OS, h.Arch, h.Hostname, h.Backend, h.Scope, h.SystemdVersion,
				h.ManifestSerial, h.ManifestDigest, ns(now), r.AgentID)
		case r.Status != nil:
			st := r.Status
			at := st.At
			if at.IsZero() {
				at = now
			}
			_, err = t.exec(sqlStatus, st.AppliedSerial, st.State, st.Error, jsonText(nonNilPipes(st.Pipes)), r.Seq, ns(at), ns(now),
				st.Expired, ns(st.ExpiresAt), r.AgentID, r.Seq)
		case r.RunStarted != nil:
			x := r.RunStarted
			if err = t.dropMissed(r.AgentID, x); err != nil {
				return err
			}
			_, err = t.exec(sqlRunStarted, x.ID, r.AgentID, x.Pipe, x.PipeVersion, x.Trigger, ns(x.StartedAt), ns(x.ScheduledAt), x.RequestID, x.Attempts, ns(now), ns(now))
		case r.RunFinished != nil:
			x := r.RunFinished
			if err = t.dropMissed(r.AgentID, x); err != nil {
				return err
			}
			metricsJSON, notesJSON := store.EncodeTelemetry(x.Metrics, x.TelemetryNotes)
			_, err = t.exec(sqlRunFinished, x.ID, r.AgentID, x.Pipe, x.PipeVersion, x.Trigger, x.Status, x.ExitCode, x.Signal, x.Error, x.RequestID,
				ns(x.ScheduledAt), ns(x.StartedAt), ns(x.FinishedAt), x.DurationMS, x.LogChunks, x.Reason, x.Attempts, x.WrittenBy, ns(now), ns(now),
				x.Output, metricsJSON, notesJSON)
		case r.Chunk != nil:
			err = t.chunk(r, runs, lim)
		case r.Settle != nil:
			err = t.settle(r)
		}
		if err != nil {
			return err
		}
	}
	for id, rl := range runs {
		if rl.dirty {
			if _, err := t.exec(sqlRunLog, rl.bytes, rl.truncated, ns(rl.at), id); err != nil {
				return err
			}
		}
	}
	for id, at := range seen {
		if _, err := t.exec(sqlSeen, ns(at), id, ns(at)); err != nil {
			return err
		}
	}
	return nil
}

// dropMissed removes the missed run that the server recorded for the fire
// time a real record serves, and the one it recorded for that fire time
// with no holder (agent "", placement: one): the truth replaces it.
func (t *ingestTx) dropMissed(agentID string, x *store.Run) error {
	if x.ScheduledAt.IsZero() || x.Pipe == "" {
		return nil
	}
	id := store.MissedRunID(agentID, x.Pipe, x.ScheduledAt)
	if id == x.ID {
		return nil
	}
	if !store.ServesFire(x) {
		// A refused start replaces this agent's own missed run (it is the
		// truth about that agent), not the fire time nobody served.
		_, err := t.exec(sqlDropMissed, id, agentID)
		return err
	}
	_, err := t.exec(sqlDropMissedOrNoHolder, id, agentID, store.MissedRunID("", x.Pipe, x.ScheduledAt))
	return err
}

func (t *ingestTx) chunk(r *store.Record, runs map[string]*runLog, lim store.IngestLimits) error {
	c := r.Chunk
	rl := runs[c.RunID]
	if rl == nil {
		if _, err := t.exec(sqlRunPlaceholder, c.RunID, r.AgentID, ns(r.Received), ns(r.Received)); err != nil {
			return err
		}
		rl = &runLog{}
		st, err := t.stmt(sqlRunLogState)
		if err != nil {
			return err
		}
		if err := st.QueryRowContext(t.ctx, c.RunID).Scan(&rl.agentID, &rl.bytes, &rl.truncated); err != nil {
			return err
		}
		runs[c.RunID] = rl
	}
	if rl.agentID != r.AgentID || rl.truncated {
		return nil
	}
	data, stream, over := c.Data, c.Stream, false
	if rl.bytes+int64(len(data)) > lim.MaxLogBytes {
		data, stream, over = lim.Marker, "system", true
	}
	at := c.At
	if at.IsZero() {
		at = r.Received
	}
	res, err := t.exec(sqlChunk, c.RunID, c.Seq, stream, data, ns(at))
	if err != nil {
		return err
	}
	if n, _ := res.RowsAffected(); n == 1 {
		if over {
			rl.truncated = true
		} else {
			rl.bytes += int64(len(data))
		}
		rl.dirty, rl.at = true, r.Received
	}
	return nil
}

// lostStrikes is how many drained heartbeats in a row must leave a run out
// before it is settled lost: one heartbeat built while the agent could not
// read its scheduler's state must not settle runs that are alive.
const lostStrikes = 2

func (t *ingestTx) settle(r *store.Record) error {
	st := r.Settle
	st.Settled = st.Settled[:0]
	if some, err := t.exists(sqlUnfinished, r.AgentID); err != nil || !some {
		return err
	}
	sent := st.SentAt
	if sent.IsZero() {
		sent = r.Received
	}
	running := make([]string, 0, len(st.Running))
	for id := range st.Running {
		running = append(running, id)
	}
	listed := jsonText(running)
	if _, err := t.exec(t.db.sqlListed, r.AgentID, listed); err != nil {
		return err
	}
	if _, err := t.exec(t.db.sqlUnlisted, r.AgentID, ns(sent), ns(r.Received), listed); err != nil {
		return err
	}
	rows, err := t.query(sqlSettle, ns(r.Received), ns(r.Received), r.AgentID, lostStrikes)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			return err
		}
		st.Settled = append(st.Settled, id)
	}
	return rows.Err()
}

func nonNilPipes(p []api.PipeStatus) []api.PipeStatus {
	if p == nil {
		return []api.PipeStatus{}
	}
	return p
}
