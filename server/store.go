package server

import (
	"context"
	"strconv"
	"time"

	"github.com/drover/drover/api"

	"github.com/drover/drover/manifest"
)

// The store is reached only through the small interfaces below, each named
// for its consumer, so that a PostgreSQL store can follow without touching
// handlers. SQLiteStore implements all of them. Methods return errors
// wrapping ErrNotFound, ErrConflict, ErrTokenUsed or ErrTokenExpired where
// the caller must tell them apart; anything else is internal.

// Store is everything the server needs from its database.
type Store interface {
	tokenStore
	agentStore
	pipeStore
	manifestStore
	secretStore
	runStore
	ingestStore
	authStore
	auditStore
	monitorStore // sqlite_monitor.go
	Close() error
}

// tokenStore is used by enrollment.
type tokenStore interface {
	CreateToken(ctx context.Context, t *EnrollmentToken) error
	GetToken(ctx context.Context, id string) (*EnrollmentToken, error)
	// EnrollAgent consumes the token and creates the agent in one
	// transaction; it fails with ErrTokenUsed or ErrTokenExpired when the
	// token can no longer be used at now.
	EnrollAgent(ctx context.Context, tokenID string, now time.Time, a *Agent) error
	// ListTokens lists every token, newest first (secrets are only hashes).
	ListTokens(ctx context.Context) ([]*EnrollmentToken, error)
	DeleteToken(ctx context.Context, id string) error
}

// agentStore is used by the agent and admin APIs and by certificate checks.
type agentStore interface {
	GetAgent(ctx context.Context, id string) (*Agent, error)
	ListAgents(ctx context.Context) ([]*Agent, error)
	// AgentCert returns what a client-certificate check needs.
	AgentCert(ctx context.Context, id string) (*AgentCert, error)
	// SetNextCert records a certificate issued by renewal.
	SetNextCert(ctx context.Context, id, serial string, expires time.Time) error
	// PromoteCert makes the next certificate the current one, if serial is
	// still the next one.
	PromoteCert(ctx context.Context, id, serial string) error
	SetAgentTags(ctx context.Context, id string, tags map[string]string, now time.Time) error
	RevokeAgent(ctx context.Context, id string, now time.Time) error
	// BindMachine binds machineID to the agent unless one is bound; it
	// returns the machine id bound after the call.
	BindMachine(ctx context.Context, id, machineID string, now time.Time) (string, error)
	// NoteIdentityConflict counts a refused stream from another machine.
	NoteIdentityConflict(ctx context.Context, id, machineID string, now time.Time) error
	// DeleteAgent removes the agent and its manifest (its runs stay).
	DeleteAgent(ctx context.Context, id string) error
}

// pipeStore is used by the pipe API and the compiler.
type pipeStore interface {
	// PutPipe stores a new version of a pipe unless its current version has
	// the same spec and payload; it reports the version in force and
	// whether it was created.
	PutPipe(ctx context.Context, p *PipeVersion, payload []byte, now time.Time) (version uint64, created bool, err error)
	GetPipe(ctx context.Context, name string) (*Pipe, error)
	ListPipes(ctx context.Context) ([]*Pipe, error)
	ListPipeVersions(ctx context.Context, name string) ([]*PipeVersion, error)
	DeletePipe(ctx context.Context, name string, now time.Time) error
	GetPayload(ctx context.Context, digest string) ([]byte, error)
	// PayloadSize returns a stored payload's size; ReadPayload reads up to
	// len(buf) bytes of it at offset (the payload is streamed, not loaded).
	PayloadSize(ctx context.Context, digest string) (int64, error)
	ReadPayload(ctx context.Context, digest string, offset int64, buf []byte) (int, error)
	// GetPipeVersion returns one version of a pipe, deleted or not.
	GetPipeVersion(ctx context.Context, name string, version uint64) (*PipeVersion, error)
	// PipeState returns a pipe's current version and whether it is
	// deleted; ErrNotFound when it never existed.
	PipeState(ctx context.Context, name string) (current uint64, deleted bool, err error)
}

// manifestStore is used by the compiler and the manifest endpoint.
type manifestStore interface {
	// CompileInputs returns every live pipe's current version and the
	// targeting data of the given agents (all non-revoked agents when ids
	// is nil), with the metadata of their stored manifests.
	CompileInputs(ctx context.Context, ids []string) ([]*PipeVersion, []*CompileAgent, error)
	SaveManifests(ctx context.Context, ms []*StoredManifest) error
	GetManifest(ctx context.Context, agentID string) (*StoredManifest, error)
	// ManifestsDue lists agents whose manifests were issued before t.
	ManifestsDue(ctx context.Context, issuedBefore time.Time) ([]string, error)
	// AgentsUsingSecret lists agents whose manifests reference a secret.
	AgentsUsingSecret(ctx context.Context, name string) ([]string, error)
}

// secretStore is used by the secrets API; values are sealed by the caller.
type secretStore interface {
	PutSecret(ctx context.Context, name string, sealed []byte, now time.Time) error
	ListSecrets(ctx context.Context) ([]api.Secret, error)
	DeleteSecret(ctx context.Context, name string) error
	GetSecrets(ctx context.Context, names []string) (map[string][]byte, error)
}

// runStore is used by the runs API and retention.
type runStore interface {
	ListRuns(ctx context.Context, f RunFilter) ([]*Run, error)
	GetRun(ctx context.Context, id string) (*Run, error)
	GetLogs(ctx context.Context, runID string) ([]*LogChunk, error)
	// GetLogsAfter returns up to limit chunks with seq > after (after -1:
	// from the first), in seq order.
	GetLogsAfter(ctx context.Context, runID string, after int64, limit int) ([]*LogChunk, error)
	// CountLogChunks counts the chunks stored for a run.
	CountLogChunks(ctx context.Context, runID string) (uint64, error)
	// RunCounts counts stored runs by status.
	RunCounts(ctx context.Context) (map[string]int, error)
	PruneRuns(ctx context.Context, before time.Time, perPipe int) (int, error)
}

// authStore is used by API-token authentication and the api-tokens API.
type authStore interface {
	CreateAPIToken(ctx context.Context, t *APIToken) error
	// EnsureAPIToken inserts t unless a token with its id exists; an
	// existing token that is not revoked takes t's secret hash.
	EnsureAPIToken(ctx context.Context, t *APIToken) error
	GetAPIToken(ctx context.Context, id string) (*APIToken, error)
	// ListAPITokens lists every token, oldest first.
	ListAPITokens(ctx context.Context) ([]*APIToken, error)
	// RevokeAPIToken revokes a token (a revoked one stays revoked, with its
	// first revocation time); ErrNotFound for an unknown id.
	RevokeAPIToken(ctx context.Context, id string, now time.Time) error
	TouchAPIToken(ctx context.Context, id string, now time.Time) error
}

// auditStore is used by the audit log.
type auditStore interface {
	AddAudit(ctx context.Context, e *AuditEntry) error
	// ListAudit lists entries newest first.
	ListAudit(ctx context.Context, f AuditFilter) ([]*AuditEntry, error)
}

// ingestStore is used by the stream ingester.
type ingestStore interface {
	// ApplyRecords commits a batch of agent records in one transaction.
	ApplyRecords(ctx context.Context, recs []*Record, lim IngestLimits) error
}

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
	// Prev is the stored manifest's metadata, nil for none.
	Prev *StoredManifest
}

// StoredManifest is a signed manifest as published to one agent.
type StoredManifest struct {
	AgentID        string
	Serial         uint64
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

// IngestLimits bound what ingestion stores per run.
type IngestLimits struct {
	MaxLogBytes int64
}

// ReasonLost is the reason of a run the server settled because its agent no
// longer runs it.
const ReasonLost = "lost"

// truncationMarker is stored as a system log chunk in place of the first
// chunk that would take a run's log over the cap; later chunks are dropped.
func truncationMarker(limit int64) []byte {
	return []byte("\n[drover: log truncated: this run's output exceeded the server's cap of " + byteSize(limit) + "]\n")
}

func byteSize(n int64) string {
	switch {
	case n >= 1<<20 && n%(1<<20) == 0:
		return strconv.FormatInt(n>>20, 10) + " MiB"
	case n >= 1<<10 && n%(1<<10) == 0:
		return strconv.FormatInt(n>>10, 10) + " KiB"
	}
	return strconv.FormatInt(n, 10) + " bytes"
}
