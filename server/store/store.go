// Package store holds the server's domain types (agents, pipes and their
// versions, manifests, runs, tokens, the audit log, fleet events) and the
// interfaces through which the server reaches its database, one small
// interface per consumer. A store returns errors wrapping the kinds of
// package errs (errs.ErrNotFound, errs.ErrConflict, errs.ErrTokenUsed,
// errs.ErrTokenExpired) where the caller must tell them apart; anything else
// is internal. Implementations live in subpackages (sqlite) and must pass
// the conformance suite in storetest. Any server package may import it.
package store

import (
	"context"
	"time"

	"github.com/drover/drover/api"
)

// Store is everything the server needs from its database.
type Store interface {
	TokenStore
	AgentStore
	PipeStore
	ManifestStore
	SecretStore
	RunStore
	IngestStore
	AuthStore
	AuditStore
	MonitorStore
	NotifyStore
	PresenceStore
	SessionStore
	KeyStore
	PlacementStore
	Close() error
}

// TokenStore is used by enrollment.
type TokenStore interface {
	CreateToken(ctx context.Context, t *EnrollmentToken) error
	GetToken(ctx context.Context, id string) (*EnrollmentToken, error)
	// EnrollAgent consumes the token and creates the agent in one
	// transaction; it fails with ErrTokenUsed or ErrTokenExpired when the
	// token can no longer be used at now.
	EnrollAgent(ctx context.Context, tokenID string, now time.Time, a *Agent) error
	// EnrollAgents commits several enrollments in one transaction (group
	// commit). Each one consumes its token, creates its agent and writes
	// its audit entry, or does none of that: failed[i] is ErrTokenUsed,
	// ErrTokenExpired, ErrInvalidToken or another error for an enrollment
	// that was not applied, and the others are applied all the same. err
	// is the transaction's: when it is not nil nothing was applied (or, for
	// a failed commit, the caller cannot know; it answers as if not).
	EnrollAgents(ctx context.Context, es []Enrollment) (failed []error, err error)
	// ListTokens lists every token, newest first (secrets are only hashes).
	ListTokens(ctx context.Context) ([]*EnrollmentToken, error)
	DeleteToken(ctx context.Context, id string) error
}

// AgentStore is used by the agent and admin APIs and by certificate checks.
type AgentStore interface {
	GetAgent(ctx context.Context, id string) (*Agent, error)
	ListAgents(ctx context.Context) ([]*Agent, error)
	// AgentsTagged lists the agents whose tags have key (revoked ones
	// too), as ListAgents orders them: a few among a fleet, without reading
	// the fleet (the privileged-spec check looks for internal agents at
	// every pipe write).
	AgentsTagged(ctx context.Context, key string) ([]*Agent, error)
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

// PipeStore is used by the pipe API and the compiler.
type PipeStore interface {
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

// ManifestStore is used by the compiler and the manifest endpoint.
type ManifestStore interface {
	// CompileInputs returns every live pipe's current version and the
	// targeting data of the given agents (all non-revoked agents when ids
	// is nil), with the metadata of their stored manifests.
	CompileInputs(ctx context.Context, ids []string) ([]*PipeVersion, []*CompileAgent, error)
	// SaveManifests stores each manifest whose PrevSerial is still the
	// agent's stored serial (0: none stored) and whose Serial is higher.
	// The others are not saved: stale lists their agents, whose manifests
	// another writer replaced since they were compiled (compile again).
	SaveManifests(ctx context.Context, ms []*StoredManifest) (stale []string, err error)
	GetManifest(ctx context.Context, agentID string) (*StoredManifest, error)
	// ManifestsDue lists agents whose manifests were issued before t.
	ManifestsDue(ctx context.Context, issuedBefore time.Time) ([]string, error)
	// AgentsUsingSecret lists agents whose manifests reference a secret.
	AgentsUsingSecret(ctx context.Context, name string) ([]string, error)
}

// SecretStore is used by the secrets API; values are sealed by the caller.
type SecretStore interface {
	PutSecret(ctx context.Context, name string, sealed []byte, now time.Time) error
	// ListSecrets lists secrets by name, those after the name after ("":
	// from the first), at most limit of them (0: all).
	ListSecrets(ctx context.Context, after string, limit int) ([]api.Secret, error)
	DeleteSecret(ctx context.Context, name string) error
	GetSecrets(ctx context.Context, names []string) (map[string][]byte, error)
}

// RunStore is used by the runs API and retention.
type RunStore interface {
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

// AuthStore is used by API-token authentication and the api-tokens API.
type AuthStore interface {
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

// AuditStore is used by the audit log.
type AuditStore interface {
	AddAudit(ctx context.Context, e *AuditEntry) error
	// ListAudit lists entries newest first.
	ListAudit(ctx context.Context, f AuditFilter) ([]*AuditEntry, error)
}

// IngestStore is used by the stream ingester.
type IngestStore interface {
	// ApplyRecords commits a batch of agent records in one transaction.
	ApplyRecords(ctx context.Context, recs []*Record, lim IngestLimits) error
}

// MonitorStore is used by fleet monitoring: missed-run detection, the
// fire-time view and the event log.
type MonitorStore interface {
	// MonitorInputs returns every live pipe's current version and every
	// non-revoked agent (with its last pipe status when withStatus), from
	// one snapshot.
	MonitorInputs(ctx context.Context, withStatus bool) ([]*PipeVersion, []*MonitorAgent, error)
	// ScheduledRuns lists the runs serving a fire time in [since, until),
	// of one pipe or (pipe "") of all.
	ScheduledRuns(ctx context.Context, pipe string, since, until time.Time) ([]ScheduledRun, error)
	// InsertMissed stores missed runs, each unless a run of the same
	// agent, pipe and fire time (to the second) exists; it returns those
	// it stored.
	InsertMissed(ctx context.Context, runs []*Run) ([]*Run, error)
	// AddEvents stores events; an event whose Dedupe key is stored is
	// dropped.
	AddEvents(ctx context.Context, evs []*Event) error
	// ListEvents lists events newest first.
	ListEvents(ctx context.Context, f EventFilter) ([]*Event, error)
	// MonitorState returns the durable monitoring state; SetMonitorState
	// writes some keys of it (an empty value deletes the key).
	// PruneEvents deletes events older than before.
	PruneEvents(ctx context.Context, before time.Time) (int, error)
	MonitorState(ctx context.Context) (map[string]string, error)
	SetMonitorState(ctx context.Context, kv map[string]string, now time.Time) error
}

// PresenceStore records which replica holds each agent's live stream, for
// several replicas on one database. A claim is refreshed by its replica
// and counts only while it is fresh (seen at or after a cut-off the caller
// picks), so the claims of a replica that died expire by themselves.
type PresenceStore interface {
	// PutStreams records that replica holds the live streams of agentIDs
	// as of now, taking them over from any other replica.
	PutStreams(ctx context.Context, replica string, agentIDs []string, now time.Time) error
	// DropStream forgets the agent's stream if replica holds it.
	DropStream(ctx context.Context, agentID, replica string) error
	// TouchStreams marks every stream replica holds seen at now, and
	// deletes the claims (of any replica) seen before expired; it returns
	// how many claims replica holds.
	TouchStreams(ctx context.Context, replica string, now, expired time.Time) (int, error)
	// StreamReplicas returns the replica holding the stream of each of
	// agentIDs (every agent when nil) whose claim was seen at or after
	// since; agents without one are absent.
	StreamReplicas(ctx context.Context, agentIDs []string, since time.Time) (map[string]string, error)
}

// SessionStore keeps the web console's sessions, by the SHA-256 of their
// cookie value (the value itself is never stored).
type SessionStore interface {
	// CreateSession stores a session, first deleting the expired ones and,
	// past lim.Max sessions, the oldest.
	CreateSession(ctx context.Context, s *ConsoleSession, lim SessionLimits) error
	// GetSession returns a session; ErrNotFound when there is none or it
	// expired by lim (an expired one is deleted).
	GetSession(ctx context.Context, idHash []byte, lim SessionLimits) (*ConsoleSession, error)
	// TouchSession records a use of the session at now.
	TouchSession(ctx context.Context, idHash []byte, now time.Time) error
	// DeleteSession ends a session (none is not an error).
	DeleteSession(ctx context.Context, idHash []byte) error
	// DeleteTokenSessions ends every session of an API token.
	DeleteTokenSessions(ctx context.Context, tokenID string) error
}

// KeyStore holds the server's own key material (CA, signing keys, the
// secrets key, the bootstrap admin token) when it lives in the store
// rather than in the data dir. Values are sealed by the caller with the
// key-encryption key; the store never sees them in the clear.
type KeyStore interface {
	// ServerKeys returns the stored keys with the given ids, by id (every
	// key when no id is given).
	ServerKeys(ctx context.Context, ids ...string) (map[string]*ServerKey, error)
	// InitServerKeys stores keys unless any server key is stored, in one
	// transaction, and reports whether it stored them: of several callers
	// at once exactly one does.
	InitServerKeys(ctx context.Context, keys []*ServerKey) (bool, error)
	// UpdateServerKeys writes put and deletes del in one transaction if
	// the key ifID is stored at version ifVersion; otherwise it changes
	// nothing and fails with ErrConflict.
	UpdateServerKeys(ctx context.Context, ifID string, ifVersion uint64, put []*ServerKey, del []string) error
}

// PlacementStore keeps the holders of placement: one pipes; the compiler
// is its only writer (under its lock).
type PlacementStore interface {
	// Holders lists every pipe's holder state, by pipe name.
	Holders(ctx context.Context) ([]*Holder, error)
	// SaveHolders writes the given holder states (replacing those of the
	// same pipes) and deletes those of the pipes in remove, in one
	// transaction.
	SaveHolders(ctx context.Context, hs []*Holder, remove []string) error
	// LastFiresServed returns, for each of the pipes, the latest fire time
	// a run record of any agent serves (missed runs do not serve); a pipe
	// without one is left out.
	LastFiresServed(ctx context.Context, pipes []string) (map[string]time.Time, error)
}
