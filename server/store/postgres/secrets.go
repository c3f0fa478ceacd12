package postgres

import (
	"context"
	"fmt"
	"time"

	"github.com/drover/drover/api"
	"github.com/drover/drover/server/errs"
)

func (s *DB) PutSecret(ctx context.Context, name string, sealed []byte, now time.Time) error {
	_, err := s.w.ExecContext(ctx, `INSERT INTO secrets(name, sealed, created_at, updated_at) VALUES(?,?,?,?)
		ON CONFLICT(name) DO UPDATE SET sealed=excluded.sealed, updated_at=excluded.updated_at`, name, sealed, ns(now), ns(now))
	if err != nil {
		return fmt.Errorf("put secret: %w", err)
	}
	return nil
}

func (s *DB) ListSecrets(ctx context.Context, after string, limit int) ([]api.Secret, error) {
	if limit <= 0 {
		limit = -1 // SQLite: no limit
	}
	rows, err := s.r.QueryContext(ctx, `SELECT name, created_at, updated_at FROM secrets WHERE name > ? ORDER BY name LIMIT ?`, after, limitArg(limit))
	if err != nil {
		return nil, fmt.Errorf("list secrets: %w", err)
	}
	defer rows.Close()
	out := []api.Secret{}
	for rows.Next() {
		var si api.Secret
		var c, u int64
		if err := rows.Scan(&si.Name, &c, &u); err != nil {
			return nil, fmt.Errorf("list secrets: %w", err)
		}
		si.CreatedAt, si.UpdatedAt = fromNS(c), fromNS(u)
		out = append(out, si)
	}
	return out, rows.Err()
}

func (s *DB) DeleteSecret(ctx context.Context, name string) error {
	res, err := s.w.ExecContext(ctx, `DELETE FROM secrets WHERE name=?`, name)
	if err != nil {
		return fmt.Errorf("delete secret: %w", err)
	}
	if n, _ := res.RowsAffected(); n != 1 {
		return errs.NotFound("secret")
	}
	return nil
}

func (s *DB) GetSecrets(ctx context.Context, names []string) (map[string][]byte, error) {
	out := map[string][]byte{}
	if len(names) == 0 {
		return out, nil
	}
	rows, err := s.r.QueryContext(ctx, `SELECT name, sealed FROM secrets WHERE name IN (SELECT value FROM json_array_elements_text(?::json))`, jsonText(names))
	if err != nil {
		return nil, fmt.Errorf("get secrets: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var name string
		var sealed []byte
		if err := rows.Scan(&name, &sealed); err != nil {
			return nil, fmt.Errorf("get secrets: %w", err)
		}
		out[name] = sealed
	}
	return out, rows.Err()
}
