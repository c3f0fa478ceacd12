package sqlstore

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/drover/drover/server/store"
)

func (s *DB) PutPipe(ctx context.Context, p *store.PipeVersion, payload []byte, now time.Time) (version uint64, created bool, err error) {
	err = s.writeTx(ctx, func(tx Tx) error {
		var cur uint64
		var deleted int64
		err := tx.QueryRowContext(ctx, `SELECT current_version, deleted_at FROM pipes WHERE name=?`, p.Name).Scan(&cur, &deleted)
		if err != nil && !errors.Is(err, sql.ErrNoRows) {
			return err
		}
		if err == nil && deleted == 0 {
			var spec, digest string
			if err := tx.QueryRowContext(ctx, `SELECT spec, payload_digest FROM pipe_versions WHERE name=? AND version=?`, p.Name, cur).Scan(&spec, &digest); err != nil {
				return err
			}
			if spec == string(p.SpecJSON) && digest == p.PayloadDigest {
				version = cur
				return nil
			}
		}
		version, created = cur+1, true
		if _, err := tx.ExecContext(ctx, `INSERT INTO payloads(digest, size, data, created_at) VALUES(?,?,?,?) ON CONFLICT(digest) DO NOTHING`,
			p.PayloadDigest, len(payload), payload, ns(now)); err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO pipe_versions(name, version, spec, payload_digest, payload_size, created_at) VALUES(?,?,?,?,?,?)`,
			p.Name, version, string(p.SpecJSON), p.PayloadDigest, p.PayloadSize, ns(now)); err != nil {
			return err
		}
		_, err = tx.ExecContext(ctx, `INSERT INTO pipes(name, current_version, deleted_at, created_at, updated_at) VALUES(?,?,0,?,?)
			ON CONFLICT(name) DO UPDATE SET current_version=excluded.current_version, deleted_at=0, updated_at=excluded.updated_at,
			created_at=CASE WHEN pipes.deleted_at<>0 THEN excluded.created_at ELSE pipes.created_at END`,
			p.Name, version, ns(now), ns(now))
		return err
	})
	if err != nil {
		return 0, false, fmt.Errorf("put pipe: %w", err)
	}
	return version, created, nil
}

func scanPipeVersion(row rowScanner, extra ...any) (*store.PipeVersion, error) {
	var v store.PipeVersion
	var spec string
	var created int64
	if err := row.Scan(append([]any{&v.Name, &v.Version, &spec, &v.PayloadDigest, &v.PayloadSize, &created}, extra...)...); err != nil {
		return nil, err
	}
	v.SpecJSON = []byte(spec)
	if err := json.Unmarshal(v.SpecJSON, &v.Spec); err != nil {
		return nil, err
	}
	v.CreatedAt = fromNS(created)
	return &v, nil
}

// scanVersion scans a row of pipe_versions' columns alone.
func scanVersion(row rowScanner) (*store.PipeVersion, error) { return scanPipeVersion(row) }

const pipeQuery = `SELECT v.name, v.version, v.spec, v.payload_digest, v.payload_size, v.created_at, p.created_at, p.updated_at
	FROM pipes p JOIN pipe_versions v ON v.name=p.name AND v.version=p.current_version WHERE p.deleted_at=0`

// pipesAndAgents reads the current pipes and then the agents of query,
// each scanned with scan, in one read-only snapshot: the compiler and the
// monitor see agents and pipes of the same moment. Errors are wrapped in
// what.
func pipesAndAgents[A any](ctx context.Context, s *DB, what string, scan func(row rowScanner) (A, error), query string, args ...any) ([]*store.PipeVersion, []A, error) {
	tx, err := s.readTx(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", what, err)
	}
	defer tx.Rollback()
	pipes, err := currentPipes(ctx, tx, what)
	if err != nil {
		return nil, nil, err
	}
	agents, err := queryAll(ctx, tx, what, scan, query, args...)
	if err != nil {
		return nil, nil, err
	}
	return pipes, agents, nil
}

// currentPipes reads the current version of every pipe, by name, in db's
// snapshot.
func currentPipes(ctx context.Context, db Querier, what string) ([]*store.PipeVersion, error) {
	return queryAll(ctx, db, what, func(row rowScanner) (*store.PipeVersion, error) {
		p, err := scanPipe(row)
		if err != nil {
			return nil, err
		}
		return &p.PipeVersion, nil
	}, pipeQuery+` ORDER BY p.name`)
}

func scanPipe(row rowScanner) (*store.Pipe, error) {
	var created, updated int64
	v, err := scanPipeVersion(row, &created, &updated)
	if err != nil {
		return nil, err
	}
	return &store.Pipe{PipeVersion: *v, CreatedAt: fromNS(created), UpdatedAt: fromNS(updated)}, nil
}

func (s *DB) GetPipe(ctx context.Context, name string) (*store.Pipe, error) {
	return queryOne(ctx, s.r, "pipe", "get pipe", scanPipe, pipeQuery+` AND p.name=?`, name)
}

func (s *DB) ListPipes(ctx context.Context) ([]*store.Pipe, error) {
	return queryAll(ctx, s.r, "list pipes", scanPipe, pipeQuery+` ORDER BY p.name`)
}

func (s *DB) ListPipeVersions(ctx context.Context, name string) ([]*store.PipeVersion, error) {
	return queryAll(ctx, s.r, "list pipe versions", scanVersion, `SELECT name, version, spec, payload_digest, payload_size, created_at FROM pipe_versions WHERE name=? ORDER BY version`, name)
}

func (s *DB) DeletePipe(ctx context.Context, name string, now time.Time) error {
	return execOne(ctx, s.w, "pipe", "delete pipe", `UPDATE pipes SET deleted_at=?, updated_at=? WHERE name=? AND deleted_at=0`, ns(now), ns(now), name)
}

func (s *DB) PayloadSize(ctx context.Context, digest string) (int64, error) {
	return queryOne(ctx, s.r, "payload", "payload size", scanOne[int64], `SELECT size FROM payloads WHERE digest=?`, digest)
}

// ReadPayload reads a slice of the payload blob with substr, so that a
// fetch holds one buffer, not the whole payload.
func (s *DB) ReadPayload(ctx context.Context, digest string, offset int64, buf []byte) (int, error) {
	b, err := queryOne(ctx, s.r, "payload", "read payload", scanOne[[]byte], `SELECT substr(data, ?, ?) FROM payloads WHERE digest=?`, offset+1, len(buf), digest)
	if err != nil {
		return 0, err
	}
	return copy(buf, b), nil
}

func (s *DB) GetPayload(ctx context.Context, digest string) ([]byte, error) {
	return queryOne(ctx, s.r, "payload", "get payload", scanOne[[]byte], `SELECT data FROM payloads WHERE digest=?`, digest)
}

func (s *DB) GetPipeVersion(ctx context.Context, name string, version uint64) (*store.PipeVersion, error) {
	return queryOne(ctx, s.r, "pipe version", "get pipe version", scanVersion, `SELECT name, version, spec, payload_digest, payload_size, created_at
		FROM pipe_versions WHERE name=? AND version=?`, name, version)
}

func (s *DB) PipeState(ctx context.Context, name string) (uint64, bool, error) {
	var cur uint64
	var deleted int64
	err := s.r.QueryRowContext(ctx, `SELECT current_version, deleted_at FROM pipes WHERE name=?`, name).Scan(&cur, &deleted)
	if err != nil {
		return 0, false, rowErr(err, "pipe", "pipe state")
	}
	return cur, deleted != 0, nil
}
