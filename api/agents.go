package api

import (
	"time"
)

// Agent is an agent as the API shows it.
type Agent struct {
	ID             string            `json:"id"`
	Name           string            `json:"name"`
	Hostname       string            `json:"hostname"`
	OS             string            `json:"os"`
	Arch           string            `json:"arch"`
	AgentVersion   string            `json:"agent_version"`
	Tags           map[string]string `json:"tags"`
	CreatedAt      time.Time         `json:"created_at"`
	CertExpiresAt  time.Time         `json:"cert_expires_at"`
	Revoked        bool              `json:"revoked"`
	RevokedAt      *time.Time        `json:"revoked_at,omitempty"`
	Online         bool              `json:"online"`
	LastSeenAt     *time.Time        `json:"last_seen_at,omitempty"`
	Backend        string            `json:"backend,omitempty"`
	Scope          string            `json:"scope,omitempty"`
	SystemdVersion string            `json:"systemd_version,omitempty"`
	Manifest       *ManifestInfo     `json:"manifest,omitempty"`
	AcceptedSerial uint64            `json:"accepted_serial"`
	AppliedSerial  uint64            `json:"applied_serial"`
	ManifestState  string            `json:"manifest_state,omitempty"`
	ManifestError  string            `json:"manifest_error,omitempty"`
	StatusAt       *time.Time        `json:"status_at,omitempty"`
	Pipes          []PipeStatus      `json:"pipes"` // per pipe: apply_error, next_fire_times
	// ManifestExpired: the manifest in force on the host has expired (its
	// pipes keep running; the agent retries hard).
	ManifestExpired   bool       `json:"manifest_expired"`
	ManifestExpiresAt *time.Time `json:"manifest_expires_at,omitempty"`
	// MachineID is the host identity the agent is bound to;
	// ReportedHostname what its last Hello said (Hostname is the one
	// checked at enrollment).
	MachineID        string `json:"machine_id,omitempty"`
	ReportedHostname string `json:"reported_hostname,omitempty"`
	// IdentityConflicts counts streams refused because another machine
	// presented this agent's certificate.
	IdentityConflicts       int64      `json:"identity_conflicts"`
	IdentityConflictAt      *time.Time `json:"identity_conflict_at,omitempty"`
	IdentityConflictMachine string     `json:"identity_conflict_machine,omitempty"`
}

// ManifestInfo describes the manifest published to an agent.
type ManifestInfo struct {
	Serial         uint64    `json:"serial"`
	Digest         string    `json:"digest"`
	IssuedAt       time.Time `json:"issued_at"`
	ExpiresAt      time.Time `json:"expires_at"`
	KeyListVersion uint64    `json:"key_list_version"`
}

// AgentList is a page of agents, oldest first.
type AgentList struct {
	Agents     []Agent `json:"agents"`
	NextCursor string  `json:"next_cursor,omitempty"`
}

// TagsRequest is the body of PUT /api/v1/agents/{id}/tags.
type TagsRequest struct {
	Tags map[string]string `json:"tags"`
}

// PipeStatus is what an agent reported about one pipe.
type PipeStatus struct {
	Name          string      `json:"name"`
	Version       uint64      `json:"version"`
	ApplyError    string      `json:"apply_error,omitempty"`
	NextFireTimes []time.Time `json:"next_fire_times,omitempty"`
	DriftRestored bool        `json:"drift_restored,omitempty"`
	// ElapseMismatch: the scheduler's next elapse disagrees with the
	// evaluator's; DropInsRemoved: drop-ins found beside the units.
	ElapseMismatch string   `json:"elapse_mismatch,omitempty"`
	DropInsRemoved []string `json:"drop_ins_removed,omitempty"`
	// LeaseUntil is the placement: one lease the agent holds for the pipe;
	// LeaseEnded says it passed unrenewed and the agent stopped the timer.
	LeaseUntil time.Time `json:"lease_until,omitzero"`
	LeaseEnded bool      `json:"lease_ended,omitempty"`
}

// State is how droverctl and the agent list show an agent: revoked, online
// or offline.
func (a *Agent) State() string {
	switch {
	case a.Revoked:
		return "revoked"
	case a.Online:
		return "online"
	}
	return "offline"
}
