package cli

import (
	"time"

	"github.com/drover/drover/manifest"
)

// The API's objects, as far as the tables need them. -o json and -o yaml
// print what the server sent, unchanged, so fields added to the API show
// there without a change here.

type pipeObj struct {
	Name      string           `json:"name"`
	Version   uint64           `json:"version"`
	Spec      manifest.Spec    `json:"spec"`
	Payload   manifest.Payload `json:"payload"`
	CreatedAt time.Time        `json:"created_at"`
	UpdatedAt time.Time        `json:"updated_at"`
	Versions  []pipeVersionRef `json:"versions,omitempty"`
}

type pipeVersionRef struct {
	Version   uint64    `json:"version"`
	Digest    string    `json:"digest"`
	CreatedAt time.Time `json:"created_at"`
}

// pipeVersionObj is one entry of GET /api/v1/pipes/{name}/versions, and
// the answer of GET /api/v1/pipes/{name}/versions/{version}.
type pipeVersionObj struct {
	Name      string           `json:"name"`
	Version   uint64           `json:"version"`
	Spec      manifest.Spec    `json:"spec"`
	Payload   manifest.Payload `json:"payload"`
	CreatedAt time.Time        `json:"created_at"`
	Current   bool             `json:"current"` // false for every version of a deleted pipe
}

type agentObj struct {
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
	RevokedAt      *time.Time        `json:"revoked_at"`
	Online         bool              `json:"online"`
	LastSeenAt     *time.Time        `json:"last_seen_at"`
	Backend        string            `json:"backend"`
	Scope          string            `json:"scope"`
	SystemdVersion string            `json:"systemd_version"`
	Manifest       *struct {
		Serial         uint64    `json:"serial"`
		Digest         string    `json:"digest"`
		IssuedAt       time.Time `json:"issued_at"`
		ExpiresAt      time.Time `json:"expires_at"`
		KeyListVersion uint64    `json:"key_list_version"`
	} `json:"manifest"`
	AcceptedSerial uint64     `json:"accepted_serial"`
	AppliedSerial  uint64     `json:"applied_serial"`
	ManifestState  string     `json:"manifest_state"`
	ManifestError  string     `json:"manifest_error"`
	StatusAt       *time.Time `json:"status_at"`
	Pipes          []struct {
		Name          string      `json:"name"`
		Version       uint64      `json:"version"`
		ApplyError    string      `json:"apply_error"`
		NextFireTimes []time.Time `json:"next_fire_times"`
		DriftRestored bool        `json:"drift_restored"`
		// ElapseMismatch: the host's scheduler disagrees with the evaluator.
		ElapseMismatch string   `json:"elapse_mismatch"`
		DropInsRemoved []string `json:"drop_ins_removed"`
	} `json:"pipes"`
	ManifestExpired         bool       `json:"manifest_expired"`
	ManifestExpiresAt       *time.Time `json:"manifest_expires_at"`
	MachineID               string     `json:"machine_id"`
	ReportedHostname        string     `json:"reported_hostname"`
	IdentityConflicts       int64      `json:"identity_conflicts"`
	IdentityConflictAt      *time.Time `json:"identity_conflict_at"`
	IdentityConflictMachine string     `json:"identity_conflict_machine"`
}

func (a *agentObj) state() string {
	switch {
	case a.Revoked:
		return "revoked"
	case a.Online:
		return "online"
	}
	return "offline"
}

// applyErrors counts the agent's problems: a manifest error and pipe apply errors.
func (a *agentObj) applyErrors() int {
	n := 0
	if a.ManifestError != "" {
		n++
	}
	for _, p := range a.Pipes {
		if p.ApplyError != "" {
			n++
		}
	}
	return n
}

type runObj struct {
	ID           string     `json:"id"`
	AgentID      string     `json:"agent_id"`
	Pipe         string     `json:"pipe"`
	PipeVersion  uint64     `json:"pipe_version"`
	Trigger      string     `json:"trigger"`
	Status       string     `json:"status"`
	ExitCode     int        `json:"exit_code"`
	Signal       string     `json:"signal"`
	Error        string     `json:"error"`
	RequestID    string     `json:"request_id"`
	Reason       string     `json:"reason"`
	Attempts     uint32     `json:"attempts"`
	WrittenBy    string     `json:"written_by"`
	ScheduledAt  *time.Time `json:"scheduled_at"`
	StartedAt    *time.Time `json:"started_at"`
	FinishedAt   *time.Time `json:"finished_at"`
	DurationMS   int64      `json:"duration_ms"`
	LogChunks    uint64     `json:"log_chunks"`
	LogBytes     int64      `json:"log_bytes"`
	LogTruncated bool       `json:"log_truncated"`
	CreatedAt    time.Time  `json:"created_at"`
	UpdatedAt    time.Time  `json:"updated_at"`
}

// terminal reports whether the run has ended.
func (r *runObj) terminal() bool {
	switch r.Status {
	case "succeeded", "failed", "timed_out", "canceled", "skipped", "missed":
		return true
	}
	return false
}

func (r *runObj) exit() string {
	switch {
	case r.Signal != "":
		return r.Signal
	case r.FinishedAt == nil && !r.terminal():
		return ""
	}
	return itoa(r.ExitCode)
}

type secretObj struct {
	Name      string    `json:"name"`
	CreatedAt time.Time `json:"created_at"`
	UpdatedAt time.Time `json:"updated_at"`
}

// enrollTokenObj is an enrollment token in a list (never its secret).
type enrollTokenObj struct {
	ID        string            `json:"id"`
	Name      string            `json:"name"`
	Tags      map[string]string `json:"tags"`
	CreatedAt time.Time         `json:"created_at"`
	ExpiresAt time.Time         `json:"expires_at"`
	UsedAt    *time.Time        `json:"used_at"`
	AgentID   string            `json:"agent_id"`
	State     string            `json:"state"`
}

type apiTokenObj struct {
	ID         string     `json:"id"`
	Name       string     `json:"name"`
	Role       string     `json:"role"`
	CreatedAt  time.Time  `json:"created_at"`
	CreatedBy  string     `json:"created_by"`
	ExpiresAt  *time.Time `json:"expires_at"`
	LastUsedAt *time.Time `json:"last_used_at"`
	RevokedAt  *time.Time `json:"revoked_at"`
}

type auditObj struct {
	ID           string    `json:"id"`
	At           time.Time `json:"at"`
	Actor        string    `json:"actor"`
	ActorID      string    `json:"actor_id"`
	Role         string    `json:"role"`
	Action       string    `json:"action"`
	Target       string    `json:"target"`
	BeforeDigest string    `json:"before_digest"`
	AfterDigest  string    `json:"after_digest"`
}

type logChunk struct {
	Seq    uint64    `json:"seq"`
	Stream string    `json:"stream"`
	At     time.Time `json:"at"`
	Data   []byte    `json:"data"`
}

// targetsAgent reports whether targets select an agent: listed by id, or
// carrying every tag of a non-empty tag selector (the server's rule).
func targetsAgent(t *manifest.Targets, a *agentObj) bool {
	if t == nil || a.Revoked {
		return false
	}
	for _, id := range t.Agents {
		if id == a.ID {
			return true
		}
	}
	if len(t.Tags) == 0 {
		return false
	}
	for k, v := range t.Tags {
		if got, ok := a.Tags[k]; !ok || got != v {
			return false
		}
	}
	return true
}
