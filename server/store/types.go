package store

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"github.com/drover/drover/api"
	"github.com/drover/drover/manifest"
)

// EnrollmentToken is a stored enrollment token: only a hash of its secret.
type EnrollmentToken struct {
	ID         string
	SecretHash []byte
	Name       string
	Tags       map[string]string
	CreatedAt  time.Time
	ExpiresAt  time.Time
	UsedAt     time.Time
	AgentID    string
}

// Agent is an enrolled agent and what it last reported.
type Agent struct {
	ID            string
	Name          string
	Hostname      string
	OS            string
	Arch          string
	AgentVersion  string
	Tags          map[string]string
	CreatedAt     time.Time
	CertSerial    string
	CertExpiresAt time.Time
	RevokedAt     time.Time
	LastSeenAt    time.Time

	Backend        string
	Scope          string
	SystemdVersion string
	// AcceptedSerial and AcceptedDigest come from Hello: the last manifest
	// the agent accepted.
	AcceptedSerial uint64
	AcceptedDigest string
	// The last ManifestStatus.
	AppliedSerial uint64
	ManifestState string
	ManifestError string
	Pipes         []api.PipeStatus
	StatusAt      time.Time
	// ManifestExpired and ManifestExpiresAt come from the last
	// ManifestStatus: the manifest in force on the host has expired.
	ManifestExpired   bool
	ManifestExpiresAt time.Time

	// MachineID is the host identity bound to the agent at enrollment or at
	// its first stream; ReportedHostname is what its Hello last said (the
	// enrollment-checked Hostname does not change).
	MachineID        string
	ReportedHostname string
	// IdentityConflicts counts streams refused because another machine
	// presented this agent's certificate; the last one's time and machine.
	IdentityConflicts       int64
	IdentityConflictAt      time.Time
	IdentityConflictMachine string
}

// AgentCert is the certificate state of an agent.
type AgentCert struct {
	Serial     string
	NextSerial string
	Revoked    bool
}

// PipeVersion is one immutable version of a pipe.
type PipeVersion struct {
	Name          string
	Version       uint64
	Spec          manifest.Spec // normalized
	SpecJSON      []byte        // canonical JSON of Spec
	PayloadDigest string
	PayloadSize   int64
	CreatedAt     time.Time
}

// Pipe is a pipe with its current version.
type Pipe struct {
	PipeVersion
	CreatedAt time.Time
	UpdatedAt time.Time
}

// CompileAgent is what the compiler needs about one agent.
type CompileAgent struct {
	ID   string
	Tags map[string]string
	// LastSeenAt is when the agent was last heard from (placement health).
	LastSeenAt time.Time
	// Prev is the stored manifest's metadata, nil for none.
	Prev *StoredManifest
}

// StoredManifest is a signed manifest as published to one agent.
type StoredManifest struct {
	AgentID string
	Serial  uint64
	// PrevSerial is the stored serial the manifest was compiled over (0:
	// none); SaveManifests saves it only if that is still the stored one.
	PrevSerial     uint64
	ContentHash    string // sha256 of the content without serial and times
	Digest         string // sha256 of Envelope: the ETag
	Envelope       []byte // nil in CompileInputs' metadata
	IssuedAt       time.Time
	ExpiresAt      time.Time
	KeyListVersion uint64
	Payloads       []string // payload digests the manifest names
	Secrets        []string // secret names its pipes reference
}

// Run is one execution of a pipe on one agent.
type Run struct {
	ID           string
	AgentID      string
	Pipe         string
	PipeVersion  uint64
	Trigger      string
	Status       string
	ExitCode     int
	Signal       string
	Error        string
	RequestID    string
	Reason       string // why, when not succeeded: "exit 1", "systemd: 203/EXEC", "lost", ...
	Attempts     uint32
	WrittenBy    string // "runner", "daemon" or "server" (settled lost)
	ScheduledAt  time.Time
	StartedAt    time.Time
	FinishedAt   time.Time
	DurationMS   int64
	LogChunks    uint64 // as reported by RunFinished
	LogBytes     int64
	LogTruncated bool
	CreatedAt    time.Time
	UpdatedAt    time.Time
	// Pipe telemetry, as RunFinished carried it (checked by server/stream).
	Output         string
	Metrics        []api.MetricSample
	TelemetryNotes []string
}

// RunFilter selects runs; empty fields match everything. Runs are listed
// newest first (created_at, then id, descending); a cursor continues after
// the run (BeforeAt, BeforeID).
type RunFilter struct {
	Pipe      string
	Agent     string
	Status    string
	RequestID string
	Reason    string
	Since     time.Time // created at or after
	Until     time.Time // created before
	// ScheduledSince and ScheduledUntil select by the fire time served.
	ScheduledSince time.Time
	ScheduledUntil time.Time
	BeforeAt       time.Time
	BeforeID       string
	Limit          int
}

// APIToken is an operator API token: only a hash of its secret is stored.
type APIToken struct {
	ID         string
	Name       string
	Role       string
	SecretHash []byte
	CreatedAt  time.Time
	CreatedBy  string
	ExpiresAt  time.Time // zero: never
	LastUsedAt time.Time
	RevokedAt  time.Time
}

// Enrollment is one agent enrolled with a one-time token (EnrollAgents).
type Enrollment struct {
	TokenID string
	Now     time.Time // the token must not have expired at Now
	Agent   *Agent
	// Audit, if not nil, is written in the same transaction; its ID is
	// set.
	Audit *AuditEntry
}

// AuditEntry is one line of the audit log.
type AuditEntry struct {
	ID           int64
	At           time.Time
	ActorID      string
	ActorName    string
	Role         string
	Action       string
	Target       string
	BeforeDigest string
	AfterDigest  string
	Source       string
}

// AuditFilter selects audit entries; empty fields match everything.
// Actor matches the actor's id or name.
type AuditFilter struct {
	Actor    string
	Action   string
	Target   string
	Since    time.Time
	Until    time.Time
	BeforeID int64 // cursor: entries with a smaller id
	Limit    int
}

// LogChunk is one numbered piece of a run's output.
type LogChunk struct {
	RunID  string
	Seq    uint64
	Stream string
	Data   []byte
	At     time.Time
}

// Record is one thing to commit from an agent's stream. Exactly one of the
// pointer fields is set, or none for a plain sign of life.
type Record struct {
	AgentID  string
	Received time.Time
	Seq      uint64

	Hello       *HelloRecord
	Status      *StatusRecord
	RunStarted  *Run
	RunFinished *Run
	Chunk       *LogChunk
	// Settle, set on a heartbeat of an agent whose outbox was drained,
	// settles the agent's runs it no longer runs as failed, reason lost.
	Settle *SettleRecord
}

// SettleRecord is what a drained agent's heartbeat says about its runs.
type SettleRecord struct {
	Running map[string]bool // run ids the agent still runs
	SentAt  time.Time       // the heartbeat's time (agent clock): runs started before it
	// Settled is filled by ApplyRecords with the ids it settled.
	Settled []string
}

// HelloRecord is what a Hello updates on the agent row.
type HelloRecord struct {
	AgentVersion   string
	OS             string
	Arch           string
	Hostname       string
	Backend        string
	Scope          string
	SystemdVersion string
	ManifestSerial uint64
	ManifestDigest string
	MachineID      string
}

// StatusRecord is what a ManifestStatus updates on the agent row.
type StatusRecord struct {
	State         string
	Error         string
	AppliedSerial uint64
	Pipes         []api.PipeStatus
	At            time.Time
	Expired       bool
	ExpiresAt     time.Time
}

// IngestLimits bound what ingestion stores per run: the first log chunk
// that would take a run's log over MaxLogBytes is stored as Marker, a
// system chunk, and later chunks are dropped.
type IngestLimits struct {
	MaxLogBytes int64
	Marker      []byte
}

// ReasonLost is the reason of a run the server settled because its agent no
// longer runs it.
const ReasonLost = "lost"

// MonitorAgent is what missed-run detection needs about one agent. Its
// tags and pipe status come as stored JSON (TagsJSON, PipesJSON), with the
// sequence number of the status, so that a caller can keep what it decoded
// until they change; Tags and Pipes are filled by the caller.
type MonitorAgent struct {
	ID         string
	CreatedAt  time.Time
	LastSeenAt time.Time
	StatusAt   time.Time
	StatusSeq  int64
	TagsJSON   string
	PipesJSON  string

	Tags  map[string]string
	Pipes []api.PipeStatus
}

// ScheduledRun is a run found by the fire time it serves.
type ScheduledRun struct {
	Agent       string
	Pipe        string
	ScheduledAt int64 // Unix seconds
	Status      string
}

// Event is one thing the server noticed about the fleet (docs/monitoring.md,
// "Events").
type Event struct {
	ID      int64
	At      time.Time
	Kind    string
	Pipe    string
	AgentID string
	RunID   string
	Message string
	// Dedupe names the occurrence: the same one recorded twice (a replayed
	// record, a second detection pass) is stored once.
	Dedupe string
}

// EventFilter selects events; empty fields match everything.
type EventFilter struct {
	Kind     string
	Pipe     string
	Agent    string
	Since    time.Time
	BeforeID int64 // cursor: events with a smaller id
	Limit    int
}

// MissedRunID is the id of the missed run of (agent, pipe, fire time): the
// same for every detection pass, so that a missed run is stored once, and
// known to ingestion, which removes it when a real record for that fire
// time arrives.
func MissedRunID(agent, pipe string, fire time.Time) string {
	h := sha256.Sum256([]byte(agent + "\x00" + pipe + "\x00" + strconv.FormatInt(fire.Unix(), 10)))
	return "missed-" + hex.EncodeToString(h[:16])
}

// Decode fills a's Tags and Pipes from their JSON.
func (a *MonitorAgent) Decode(withPipes bool) error {
	if err := json.Unmarshal([]byte(a.TagsJSON), &a.Tags); err != nil {
		return fmt.Errorf("agent %s tags: %w", a.ID, err)
	}
	if withPipes && a.PipesJSON != "" && a.PipesJSON != "[]" {
		if err := json.Unmarshal([]byte(a.PipesJSON), &a.Pipes); err != nil {
			return fmt.Errorf("agent %s pipe status: %w", a.ID, err)
		}
	}
	return nil
}

// SpecJSON returns the canonical JSON of a normalized spec, as stored and as
// compared to decide whether a pipe changed.
func SpecJSON(s *manifest.Spec) ([]byte, error) {
	return json.Marshal(s)
}

// ConsoleSession is a web console login, named by the SHA-256 of its
// cookie value.
type ConsoleSession struct {
	IDHash     []byte
	TokenID    string
	CreatedAt  time.Time
	LastSeenAt time.Time
}

// SessionLimits is what makes a session expire: used last before
// IdleBefore, or created before CreatedBefore; Max bounds how many are
// kept (0: no bound).
type SessionLimits struct {
	IdleBefore, CreatedBefore time.Time
	Max                       int
}

// ServerKey is one sealed item of the server's key material (KeyStore).
type ServerKey struct {
	ID        string // what it is, e.g. "ca.key", "manifest/<key id>"
	Sealed    []byte // AES-256-GCM under the key-encryption key, ID as additional data
	Version   uint64 // raised by the writer on every change
	UpdatedAt time.Time
}

// Holder is the placement state of one placement: one pipe (docs/design.md,
// "Fleet semantics"): which agent holds it under which lease, and while a
// hand-over waits, the lease of the holder before, which fences it.
type Holder struct {
	Pipe string
	// Agent holds the pipe until LeaseUntil; "" while nobody does.
	Agent      string
	LeaseUntil time.Time
	Since      time.Time // when Agent gained the pipe
	// LastFireServed is the latest fire time served when Agent gained the
	// pipe; its manifest entry carries it (catch-up from there).
	LastFireServed time.Time
	// Prev is the holder before Agent, or the last one while nobody holds
	// the pipe: it held it from PrevSince until ReleasedAt, when a manifest
	// without the pipe was published to it, under a lease ending at
	// PrevLeaseUntil. Nobody gains the pipe before PrevLeaseUntil plus the
	// skew margin unless Prev confirmed the manifest without it.
	Prev           string
	PrevSince      time.Time
	PrevLeaseUntil time.Time
	ReleasedAt     time.Time
	// MoveTo is a requested holder ("" for none), by the same lease rules.
	MoveTo          string
	MoveRequestedAt time.Time
	UpdatedAt       time.Time
}

// ServesFire reports whether a run record serves its fire time: every
// record with one does, except a start its agent refused because its lease
// had ended (placement: one), which the next holder owes.
func ServesFire(r *Run) bool {
	return !r.ScheduledAt.IsZero() && !(r.Status == api.StatusSkipped && r.Reason == api.ReasonLeaseEnded)
}
