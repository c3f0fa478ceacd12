package sqlstore

import (
	"context"
	"fmt"
	"time"

	"github.com/drover/drover/server/errs"
	"github.com/drover/drover/server/store"
)

func (s *DB) ServerKeys(ctx context.Context, ids ...string) (map[string]*store.ServerKey, error) {
	q, args := `SELECT id, sealed, version, updated_at FROM server_keys`, []any{}
	if len(ids) > 0 {
		q += ` WHERE id IN (SELECT value FROM ` + s.d.JSONValues("?") + `)`
		args = append(args, jsonText(ids))
	}
	rows, err := s.r.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("server keys: %w", err)
	}
	defer rows.Close()
	out := map[string]*store.ServerKey{}
	for rows.Next() {
		var k store.ServerKey
		var at int64
		if err := rows.Scan(&k.ID, &k.Sealed, &k.Version, &at); err != nil {
			return nil, fmt.Errorf("server keys: %w", err)
		}
		k.UpdatedAt = fromNS(at)
		out[k.ID] = &k
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("server keys: %w", err)
	}
	return out, nil
}

func (s *DB) InitServerKeys(ctx context.Context, keys []*store.ServerKey) (bool, error) {
	stored := false
	// Under the one writer, or, with several servers starting together, a
	// lock whose later holders find the first one's keys.
	err := s.initTx(ctx, keysLock, func(tx Tx) error {
		var any bool
		if err := tx.QueryRowContext(ctx, `SELECT EXISTS (SELECT 1 FROM server_keys)`).Scan(&any); err != nil {
			return err
		}
		if any {
			return nil
		}
		stored = true
		return putKeys(ctx, tx, keys)
	})
	if err != nil {
		return false, fmt.Errorf("init server keys: %w", err)
	}
	return stored, nil
}

func (s *DB) UpdateServerKeys(ctx context.Context, ifID string, ifVersion uint64, put []*store.ServerKey, del []string) error {
	err := s.writeTx(ctx, func(tx Tx) error {
		var v uint64
		err := tx.QueryRowContext(ctx, `SELECT version FROM server_keys WHERE id=?`+s.d.ForUpdate, ifID).Scan(&v)
		if err != nil {
			return rowErr(err, "server key "+ifID, "read version")
		}
		if v != ifVersion {
			return errs.New(errs.ErrConflict, fmt.Sprintf("server key %s is at version %d, not %d", ifID, v, ifVersion))
		}
		if len(del) > 0 {
			if _, err := tx.ExecContext(ctx, `DELETE FROM server_keys WHERE id IN (SELECT value FROM `+s.d.JSONValues("?")+`)`, jsonText(del)); err != nil {
				return err
			}
		}
		return putKeys(ctx, tx, put)
	})
	if err != nil {
		return fmt.Errorf("update server keys: %w", err)
	}
	return nil
}

func putKeys(ctx context.Context, tx Tx, keys []*store.ServerKey) error {
	for _, k := range keys {
		at := k.UpdatedAt
		if at.IsZero() {
			at = time.Now()
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO server_keys(id, sealed, version, updated_at) VALUES(?,?,?,?)
			ON CONFLICT(id) DO UPDATE SET sealed=excluded.sealed, version=excluded.version, updated_at=excluded.updated_at`,
			k.ID, k.Sealed, k.Version, ns(at)); err != nil {
			return err
		}
	}
	return nil
}
