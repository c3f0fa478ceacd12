package postgres

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/drover/drover/server/errs"
	"github.com/drover/drover/server/store"
)

func (s *DB) PutPipe(ctx context.Context, p *store.PipeVersion, payload []byte, now time.Time) (version uint64, created bool, err error) {
	err = withTx(ctx, s.w, func(tx *txn) error {
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

func scanPipeVersion(row interface{ Scan(...any) error }, extra ...any) (*store.PipeVersion, error) {
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

const pipeQuery = `SELECT v.name, v.version, v.spec, v.payload_digest, v.payload_size, v.created_at, p.created_at, p.updated_at
	FROM pipes p JOIN pipe_versions v ON v.name=p.name AND v.version=p.current_version WHERE p.deleted_at=0`

func scanPipe(row interface{ Scan(...any) error }) (*store.Pipe, error) {
	var created, updated int64
	v, err := scanPipeVersion(row, &created, &updated)
	if err != nil {
		return nil, err
	}
	return &store.Pipe{PipeVersion: *v, CreatedAt: fromNS(created), UpdatedAt: fromNS(updated)}, nil
}

func (s *DB) GetPipe(ctx context.Context, name string) (*store.Pipe, error) {
	p, err := scanPipe(s.r.QueryRowContext(ctx, pipeQuery+` AND p.name=?`, name))
	if err != nil {
		return nil, rowErr(err, "pipe", "get pipe")
	}
	return p, nil
}

func (s *DB) ListPipes(ctx context.Context) ([]*store.Pipe, error) {
	return queryAll(ctx, s.r, "list pipes", scanPipe, pipeQuery+` ORDER BY p.name`)
}

func (s *DB) ListPipeVersions(ctx context.Context, name string) ([]*store.PipeVersion, error) {
	return queryAll(ctx, s.r, "list pipe versions", func(r interface{ Scan(...any) error }) (*store.PipeVersion, error) { return scanPipeVersion(r) }, `SELECT name, version, spec, payload_digest, payload_size, created_at FROM pipe_versions WHERE name=? ORDER BY version`, name)
}

func (s *DB) DeletePipe(ctx context.Context, name string, now time.Time) error {
	res, err := s.w.ExecContext(ctx, `UPDATE pipes SET deleted_at=?, updated_at=? WHERE name=? AND deleted_at=0`, ns(now), ns(now), name)
	if err != nil {
		return fmt.Errorf("delete pipe: %w", err)
	}
	if n, _ := res.RowsAffected(); n != 1 {
		return errs.NotFound("pipe")
	}
	return nil
}

func (s *DB) PayloadSize(ctx context.Context, digest string) (int64, error) {
	var n int64
	err := s.r.QueryRowContext(ctx, `SELECT size FROM payloads WHERE digest=?`, digest).Scan(&n)
	if err != nil {
		return 0, rowErr(err, "payload", "payload size")
	}
	return n, nil
}

// ReadPayload reads a slice of the payload blob with substr, so that a
// fetch holds one buffer, not the whole payload.
func (s *DB) ReadPayload(ctx context.Context, digest string, offset int64, buf []byte) (int, error) {
	var b []byte
	err := s.r.QueryRowContext(ctx, `SELECT substr(data, ?, ?) FROM payloads WHERE digest=?`, offset+1, len(buf), digest).Scan(&b)
	if err != nil {
		return 0, rowErr(err, "payload", "read payload")
	}
	return copy(buf, b), nil
}

func (s *DB) GetPayload(ctx context.Context, digest string) ([]byte, error) {
	var b []byte
	err := s.r.QueryRowContext(ctx, `SELECT data FROM payloads WHERE digest=?`, digest).Scan(&b)
	if err != nil {
		return nil, rowErr(err, "payload", "get payload")
	}
	return b, nil
}

func (s *DB) GetPipeVersion(ctx context.Context, name string, version uint64) (*store.PipeVersion, error) {
	v, err := scanPipeVersion(s.r.QueryRowContext(ctx, `SELECT name, version, spec, payload_digest, payload_size, created_at
		FROM pipe_versions WHERE name=? AND version=?`, name, version))
	if err != nil {
		return nil, rowErr(err, "pipe version", "get pipe version")
	}
	return v, nil
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
