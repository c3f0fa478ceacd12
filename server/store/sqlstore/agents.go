package sqlstore

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/drover/drover/server/store"
)

const agentColumns = `id, name, hostname, os, arch, agent_version, tags, created_at, cert_serial, cert_expires_at, revoked_at, last_seen_at,
	backend, scope, systemd_version, accepted_serial, accepted_digest, applied_serial, manifest_state, manifest_error, pipe_status, status_at,
	manifest_expired, manifest_expires_at, machine_id, reported_hostname, identity_conflicts, identity_conflict_at, identity_conflict_machine`

func scanAgent(row rowScanner) (*store.Agent, error) {
	var a store.Agent
	var tags, pipes string
	var created, certExp, revoked, seen, statusAt, expiresAt, conflictAt int64
	err := row.Scan(&a.ID, &a.Name, &a.Hostname, &a.OS, &a.Arch, &a.AgentVersion, &tags, &created, &a.CertSerial, &certExp, &revoked, &seen,
		&a.Backend, &a.Scope, &a.SystemdVersion, &a.AcceptedSerial, &a.AcceptedDigest, &a.AppliedSerial, &a.ManifestState, &a.ManifestError, &pipes, &statusAt,
		&a.ManifestExpired, &expiresAt, &a.MachineID, &a.ReportedHostname, &a.IdentityConflicts, &conflictAt, &a.IdentityConflictMachine)
	if err != nil {
		return nil, err
	}
	if err := json.Unmarshal([]byte(tags), &a.Tags); err != nil {
		return nil, err
	}
	if err := json.Unmarshal([]byte(pipes), &a.Pipes); err != nil {
		return nil, err
	}
	a.CreatedAt, a.CertExpiresAt, a.RevokedAt, a.LastSeenAt, a.StatusAt = fromNS(created), fromNS(certExp), fromNS(revoked), fromNS(seen), fromNS(statusAt)
	a.ManifestExpiresAt, a.IdentityConflictAt = fromNS(expiresAt), fromNS(conflictAt)
	return &a, nil
}

func (s *DB) GetAgent(ctx context.Context, id string) (*store.Agent, error) {
	return queryOne(ctx, s.r, "agent", "get agent", scanAgent, `SELECT `+agentColumns+` FROM agents WHERE id=?`, id)
}

func (s *DB) ListAgents(ctx context.Context) ([]*store.Agent, error) {
	return queryAll(ctx, s.r, "list agents", scanAgent, `SELECT `+agentColumns+` FROM agents ORDER BY created_at, id`)
}

func (s *DB) AgentsTagged(ctx context.Context, key string) ([]*store.Agent, error) {
	// Tags are stored as a JSON object's text: the key, quoted and followed
	// by its colon, is in the text of every agent that has it; the SQL
	// narrows by that, the check below is exact.
	quoted, err := json.Marshal(key)
	if err != nil {
		return nil, fmt.Errorf("agents tagged: %w", err)
	}
	pattern := "%" + likeEscaper.Replace(string(quoted)) + ":%"
	as, err := queryAll(ctx, s.r, "agents tagged", scanAgent, `SELECT `+agentColumns+` FROM agents WHERE tags LIKE ? ESCAPE '\' ORDER BY created_at, id`, pattern)
	if err != nil {
		return nil, err
	}
	out := as[:0]
	for _, a := range as {
		if _, ok := a.Tags[key]; ok {
			out = append(out, a)
		}
	}
	return out, nil
}

// likeEscaper escapes LIKE's wildcards and its escape character.
var likeEscaper = strings.NewReplacer(`\`, `\\`, `%`, `\%`, `_`, `\_`)

func (s *DB) AgentCert(ctx context.Context, id string) (*store.AgentCert, error) {
	var c store.AgentCert
	var revoked int64
	err := s.r.QueryRowContext(ctx, `SELECT cert_serial, next_cert_serial, revoked_at FROM agents WHERE id=?`, id).Scan(&c.Serial, &c.NextSerial, &revoked)
	if err != nil {
		return nil, rowErr(err, "agent", "agent cert")
	}
	c.Revoked = revoked != 0
	return &c, nil
}

func (s *DB) SetNextCert(ctx context.Context, id, serial string, expires time.Time) error {
	return execOne(ctx, s.w, "agent", "set next cert", `UPDATE agents SET next_cert_serial=?, next_cert_expires_at=? WHERE id=? AND revoked_at=0`, serial, ns(expires), id)
}

func (s *DB) PromoteCert(ctx context.Context, id, serial string) error {
	_, err := s.w.ExecContext(ctx, `UPDATE agents SET cert_serial=next_cert_serial, cert_expires_at=next_cert_expires_at, next_cert_serial='', next_cert_expires_at=0
		WHERE id=? AND next_cert_serial=? AND revoked_at=0`, id, serial)
	if err != nil {
		return fmt.Errorf("promote cert: %w", err)
	}
	return nil
}

func (s *DB) SetAgentTags(ctx context.Context, id string, tags map[string]string, now time.Time) error {
	return execOne(ctx, s.w, "agent", "set tags", `UPDATE agents SET tags=?, updated_at=? WHERE id=?`, jsonText(tags), ns(now), id)
}

func (s *DB) RevokeAgent(ctx context.Context, id string, now time.Time) error {
	return execOne(ctx, s.w, "agent", "revoke agent", `UPDATE agents SET revoked_at=CASE WHEN revoked_at=0 THEN ? ELSE revoked_at END, next_cert_serial='', updated_at=? WHERE id=?`, ns(now), ns(now), id)
}

func (s *DB) BindMachine(ctx context.Context, id, machineID string, now time.Time) (string, error) {
	if _, err := s.w.ExecContext(ctx, `UPDATE agents SET machine_id=?, updated_at=? WHERE id=? AND machine_id=''`, machineID, ns(now), id); err != nil {
		return "", fmt.Errorf("bind machine: %w", err)
	}
	var bound string
	err := s.w.QueryRowContext(ctx, `SELECT machine_id FROM agents WHERE id=?`, id).Scan(&bound)
	if err != nil {
		return "", rowErr(err, "agent", "bind machine")
	}
	return bound, nil
}

func (s *DB) NoteIdentityConflict(ctx context.Context, id, machineID string, now time.Time) error {
	_, err := s.w.ExecContext(ctx, `UPDATE agents SET identity_conflicts=identity_conflicts+1, identity_conflict_at=?, identity_conflict_machine=? WHERE id=?`,
		ns(now), machineID, id)
	if err != nil {
		return fmt.Errorf("note identity conflict: %w", err)
	}
	return nil
}

func (s *DB) DeleteAgent(ctx context.Context, id string) error {
	return s.writeTx(ctx, func(tx Tx) error {
		if err := execOne(ctx, tx, "agent", "delete agent", `DELETE FROM agents WHERE id=?`, id); err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, `DELETE FROM manifests WHERE agent_id=?`, id); err != nil {
			return fmt.Errorf("delete agent: %w", err)
		}
		if _, err := tx.ExecContext(ctx, `DELETE FROM manifest_envelopes WHERE agent_id=?`, id); err != nil {
			return fmt.Errorf("delete agent: %w", err)
		}
		return nil
	})
}
