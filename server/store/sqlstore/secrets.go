package sqlstore

import (
	"context"
	"fmt"
	"time"

	"github.com/drover/drover/api"
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
		limit = -1 // no limit (Dialect.Limit)
	}
	return queryAll(ctx, s.r, "list secrets", func(row rowScanner) (api.Secret, error) {
		var si api.Secret
		var c, u int64
		err := row.Scan(&si.Name, &c, &u)
		si.CreatedAt, si.UpdatedAt = fromNS(c), fromNS(u)
		return si, err
	}, `SELECT name, created_at, updated_at FROM secrets WHERE name > ? ORDER BY name LIMIT ?`, after, s.d.Limit(limit))
}

func (s *DB) DeleteSecret(ctx context.Context, name string) error {
	return execOne(ctx, s.w, "secret", "delete secret", `DELETE FROM secrets WHERE name=?`, name)
}

func (s *DB) GetSecrets(ctx context.Context, names []string) (map[string][]byte, error) {
	if len(names) == 0 {
		return map[string][]byte{}, nil
	}
	return queryMap[[]byte](ctx, s.r, "get secrets", `SELECT name, sealed FROM secrets WHERE name IN (SELECT value FROM `+s.d.JSONValues("?")+`)`, jsonText(names))
}
