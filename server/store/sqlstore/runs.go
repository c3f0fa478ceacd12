package sqlstore

import (
	"context"
	"fmt"
	"time"

	"github.com/drover/drover/server/store"
)

const runColumns = `id, agent_id, pipe, pipe_version, trigger, status, exit_code, signal, error, request_id, scheduled_at, started_at, finished_at,
	duration_ms, log_chunks, log_bytes, log_truncated, created_at, updated_at, reason, attempts, written_by,
	output, metrics, telemetry_notes`

func scanRun(row rowScanner) (*store.Run, error) {
	var r store.Run
	var sched, started, finished, created, updated int64
	var metrics, notes string
	if err := row.Scan(&r.ID, &r.AgentID, &r.Pipe, &r.PipeVersion, &r.Trigger, &r.Status, &r.ExitCode, &r.Signal, &r.Error, &r.RequestID,
		&sched, &started, &finished, &r.DurationMS, &r.LogChunks, &r.LogBytes, &r.LogTruncated, &created, &updated, &r.Reason, &r.Attempts, &r.WrittenBy,
		&r.Output, &metrics, &notes); err != nil {
		return nil, err
	}
	r.Metrics, r.TelemetryNotes = store.DecodeTelemetry(metrics, notes)
	r.ScheduledAt, r.StartedAt, r.FinishedAt, r.CreatedAt, r.UpdatedAt = fromNS(sched), fromNS(started), fromNS(finished), fromNS(created), fromNS(updated)
	return &r, nil
}

func (s *DB) GetRun(ctx context.Context, id string) (*store.Run, error) {
	return queryOne(ctx, s.r, "run", "get run", scanRun, `SELECT `+runColumns+` FROM runs WHERE id=?`, id)
}

// scanLogChunk reads run_id, seq, stream, data, at.
func scanLogChunk(row rowScanner) (*store.LogChunk, error) {
	var c store.LogChunk
	var at int64
	if err := row.Scan(&c.RunID, &c.Seq, &c.Stream, &c.Data, &at); err != nil {
		return nil, err
	}
	c.At = fromNS(at)
	return &c, nil
}

func (s *DB) GetLogs(ctx context.Context, runID string) ([]*store.LogChunk, error) {
	return queryAll(ctx, s.r, "get logs", scanLogChunk, `SELECT run_id, seq, stream, data, at FROM log_chunks WHERE run_id=? ORDER BY seq`, runID)
}

func (s *DB) PruneRuns(ctx context.Context, before time.Time, perPipe int) (int, error) {
	var total int
	err := s.writeTx(ctx, func(tx Tx) error {
		if _, err := tx.ExecContext(ctx, `DELETE FROM log_chunks WHERE run_id IN (SELECT id FROM runs WHERE updated_at<?)`, ns(before)); err != nil {
			return err
		}
		res, err := tx.ExecContext(ctx, `DELETE FROM runs WHERE updated_at<?`, ns(before))
		if err != nil {
			return err
		}
		n, _ := res.RowsAffected()
		total += int(n)
		rows, err := tx.QueryContext(ctx, `SELECT pipe FROM runs GROUP BY pipe HAVING COUNT(*)>?`, perPipe)
		if err != nil {
			return err
		}
		var pipes []string
		for rows.Next() {
			var p string
			if err := rows.Scan(&p); err != nil {
				rows.Close()
				return err
			}
			pipes = append(pipes, p)
		}
		rows.Close()
		for _, p := range pipes {
			old := `SELECT id FROM runs WHERE pipe=? ORDER BY created_at DESC, id DESC ` + s.d.OffsetAll
			if _, err := tx.ExecContext(ctx, `DELETE FROM log_chunks WHERE run_id IN (`+old+`)`, p, perPipe); err != nil {
				return err
			}
			res, err := tx.ExecContext(ctx, `DELETE FROM runs WHERE id IN (`+old+`)`, p, perPipe)
			if err != nil {
				return err
			}
			n, _ := res.RowsAffected()
			total += int(n)
		}
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("prune runs: %w", err)
	}
	return total, nil
}

// ListRuns lists runs matching f, newest first, at most f.Limit of them.
func (s *DB) ListRuns(ctx context.Context, f store.RunFilter) ([]*store.Run, error) {
	q := listQuery{sql: `SELECT ` + runColumns + ` FROM runs WHERE 1=1`}
	q.and(f.Pipe != "", `pipe=?`, f.Pipe)
	q.and(f.Agent != "", `agent_id=?`, f.Agent)
	q.and(f.Status != "", `status=?`, f.Status)
	q.and(f.RequestID != "", `request_id=?`, f.RequestID)
	q.and(f.Reason != "", `reason=?`, f.Reason)
	q.and(!f.ScheduledSince.IsZero(), `scheduled_at>=?`, ns(f.ScheduledSince))
	q.and(!f.ScheduledUntil.IsZero(), `scheduled_at<? AND scheduled_at<>0`, ns(f.ScheduledUntil))
	q.and(!f.Since.IsZero(), `created_at>=?`, ns(f.Since))
	q.and(!f.Until.IsZero(), `created_at<?`, ns(f.Until))
	q.and(!f.BeforeAt.IsZero(), `(created_at<? OR (created_at=? AND id<?))`, ns(f.BeforeAt), ns(f.BeforeAt), f.BeforeID)
	q.append(` ORDER BY created_at DESC, id DESC LIMIT ?`, s.d.Limit(f.Limit))
	return queryAll(ctx, s.r, "list runs", scanRun, q.sql, q.args...)
}

func (s *DB) GetLogsAfter(ctx context.Context, runID string, after int64, limit int) ([]*store.LogChunk, error) {
	return queryAll(ctx, s.r, "get logs", scanLogChunk, `SELECT run_id, seq, stream, data, at FROM log_chunks WHERE run_id=? AND seq>? ORDER BY seq LIMIT ?`, runID, after, s.d.Limit(limit))
}

func (s *DB) CountLogChunks(ctx context.Context, runID string) (uint64, error) {
	var n uint64
	if err := s.r.QueryRowContext(ctx, `SELECT COUNT(*) FROM log_chunks WHERE run_id=?`, runID).Scan(&n); err != nil {
		return 0, fmt.Errorf("count log chunks: %w", err)
	}
	return n, nil
}

func (s *DB) RunCounts(ctx context.Context) (map[string]int, error) {
	return queryMap[int](ctx, s.r, "run counts", `SELECT status, COUNT(*) FROM runs GROUP BY status`)
}
