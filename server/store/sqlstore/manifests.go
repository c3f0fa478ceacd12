package sqlstore

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"time"

	"github.com/drover/drover/server/store"
)

func (s *DB) CompileInputs(ctx context.Context, ids []string) ([]*store.PipeVersion, []*store.CompileAgent, error) {
	q := `SELECT a.id, a.tags, a.last_seen_at, m.serial, m.content_hash, m.digest, m.issued_at, m.expires_at, m.key_list_version
		FROM agents a LEFT JOIN manifests m ON m.agent_id=a.id WHERE a.revoked_at=0`
	var args []any
	if ids != nil {
		q += ` AND a.id IN (SELECT value FROM ` + s.d.JSONValues("?") + `)`
		args = append(args, jsonText(ids))
	}
	return pipesAndAgents(ctx, s, "compile inputs", func(row rowScanner) (*store.CompileAgent, error) {
		var a store.CompileAgent
		var tags string
		var seen int64
		var serial, issued, expires, klv sql.NullInt64
		var hash, digest sql.NullString
		if err := row.Scan(&a.ID, &tags, &seen, &serial, &hash, &digest, &issued, &expires, &klv); err != nil {
			return nil, err
		}
		a.LastSeenAt = fromNS(seen)
		if err := json.Unmarshal([]byte(tags), &a.Tags); err != nil {
			return nil, err
		}
		if serial.Valid {
			a.Prev = &store.StoredManifest{AgentID: a.ID, Serial: uint64(serial.Int64), ContentHash: hash.String, Digest: digest.String,
				IssuedAt: fromNS(issued.Int64), ExpiresAt: fromNS(expires.Int64), KeyListVersion: uint64(klv.Int64)}
		}
		return &a, nil
	}, q+` ORDER BY a.id`, args...)
}

func (s *DB) SaveManifests(ctx context.Context, ms []*store.StoredManifest) ([]string, error) {
	var stale []string
	err := s.writeTx(ctx, func(tx Tx) error {
		stale = stale[:0]
		meta, err := tx.PrepareContext(ctx, `INSERT INTO manifests(agent_id, serial, content_hash, digest, issued_at, expires_at, key_list_version, payloads, secrets)
			VALUES(?,?,?,?,?,?,?,?,?)
			ON CONFLICT(agent_id) DO UPDATE SET serial=excluded.serial, content_hash=excluded.content_hash, digest=excluded.digest,
			issued_at=excluded.issued_at, expires_at=excluded.expires_at, key_list_version=excluded.key_list_version,
			payloads=excluded.payloads, secrets=excluded.secrets
			WHERE excluded.serial > manifests.serial AND manifests.serial = ?`)
		if err != nil {
			return err
		}
		defer meta.Close()
		env, err := tx.PrepareContext(ctx, `INSERT INTO manifest_envelopes(agent_id, envelope) VALUES(?,?)
			ON CONFLICT(agent_id) DO UPDATE SET envelope=excluded.envelope`)
		if err != nil {
			return err
		}
		defer env.Close()
		for _, m := range ms {
			res, err := meta.ExecContext(ctx, m.AgentID, m.Serial, m.ContentHash, m.Digest, ns(m.IssuedAt), ns(m.ExpiresAt),
				m.KeyListVersion, jsonText(nonNil(m.Payloads)), jsonText(nonNil(m.Secrets)), m.PrevSerial)
			if err != nil {
				return err
			}
			if n, _ := res.RowsAffected(); n == 0 {
				stale = append(stale, m.AgentID) // another writer saved since m was compiled
				continue
			}
			if _, err := env.ExecContext(ctx, m.AgentID, m.Envelope); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("save manifests: %w", err)
	}
	return stale, nil
}

func (s *DB) GetManifest(ctx context.Context, agentID string) (*store.StoredManifest, error) {
	var m store.StoredManifest
	var issued, expires int64
	var payloads, secrets string
	err := s.r.QueryRowContext(ctx, `SELECT m.agent_id, m.serial, m.content_hash, m.digest, e.envelope, m.issued_at, m.expires_at, m.key_list_version,
		m.payloads, m.secrets FROM manifests m JOIN manifest_envelopes e ON e.agent_id=m.agent_id WHERE m.agent_id=?`, agentID).
		Scan(&m.AgentID, &m.Serial, &m.ContentHash, &m.Digest, &m.Envelope, &issued, &expires, &m.KeyListVersion, &payloads, &secrets)
	if err != nil {
		return nil, rowErr(err, "manifest", "get manifest")
	}
	if err := json.Unmarshal([]byte(payloads), &m.Payloads); err != nil {
		return nil, fmt.Errorf("get manifest: %w", err)
	}
	if err := json.Unmarshal([]byte(secrets), &m.Secrets); err != nil {
		return nil, fmt.Errorf("get manifest: %w", err)
	}
	m.IssuedAt, m.ExpiresAt = fromNS(issued), fromNS(expires)
	return &m, nil
}

func (s *DB) ManifestsDue(ctx context.Context, issuedBefore time.Time) ([]string, error) {
	return queryAll(ctx, s.r, "manifests due", scanOne[string], `SELECT m.agent_id FROM manifests m JOIN agents a ON a.id=m.agent_id WHERE a.revoked_at=0 AND m.issued_at<?`, ns(issuedBefore))
}

func (s *DB) AgentsUsingSecret(ctx context.Context, name string) ([]string, error) {
	return queryAll(ctx, s.r, "agents using secret", scanOne[string], `SELECT m.agent_id FROM manifests m JOIN agents a ON a.id=m.agent_id
		WHERE a.revoked_at=0 AND EXISTS (SELECT 1 FROM `+s.d.JSONValues("m.secrets")+` WHERE value=?)`, name)
}
