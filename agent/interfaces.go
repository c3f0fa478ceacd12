package agent

import (
	"github.com/drover/drover/agent/spool"
	agentpb "github.com/drover/drover/proto"
	"github.com/drover/drover/signing"
)

// The daemon consumes two interfaces: Store (the CLI adapts agent/store to
// it, BoltStore) and Backend (agent/apply's). Tests use fakes.

// ManifestState is what the store remembers of manifests.
type ManifestState struct {
	Envelope      []byte // the last accepted envelope, exact bytes; nil: none
	Serial        uint64 // its serial; 0: none
	Digest        string // "sha256:<hex>" of its payload
	AppliedSerial uint64 // the serial last applied successfully
	AppliedDigest string
	AgentID       string // whose manifest it is; "" in stores from before re-enrollment existed
}

// Store is the agent's durable state (agent/store, bbolt at D/agent.db).
// Every method is one transaction.
type Store interface {
	// ManifestState returns the accepted and applied manifest state.
	ManifestState() (ManifestState, error)
	// TrustRoot returns the trust root pinned at enrollment (nil if none).
	TrustRoot() (*signing.TrustRoot, error)
	// SetTrustRoot replaces the trust root (enrollment, key list refresh).
	SetTrustRoot(tr *signing.TrustRoot) error
	// AcceptManifest records an accepted envelope of agent agentID with its
	// serial and digest, and tr too when it is not nil, in one transaction.
	AcceptManifest(agentID string, env []byte, serial uint64, digest string, tr *signing.TrustRoot) error
	// SetApplied records the serial and digest in force on the host.
	SetApplied(serial uint64, digest string) error

	// Enqueue appends records to the outbox, giving each the next sequence
	// number.
	Enqueue(msgs ...*agentpb.AgentMessage) error
	// EnqueueSpooled appends spool records in one transaction, once each: a
	// record whose (source, name) was enqueued before is skipped.
	EnqueueSpooled(source string, recs []spool.Record) error
	// PruneSpooled forgets the de-duplication entries of source whose
	// record files are gone.
	PruneSpooled(source string, present func(name string) bool) error
	// Pending returns up to limit unacknowledged records with seq > after,
	// in order.
	Pending(after uint64, limit int) ([]*agentpb.AgentMessage, error)
	// Ack deletes every record with seq <= seq.
	Ack(seq uint64) error
	// DropStatuses deletes the ManifestStatus records waiting in the outbox
	// and says how many (reenroll.go).
	DropStatuses() (int, error)
	// OutboxStats returns the number and total size of unacknowledged records.
	OutboxStats() (records, bytes uint64, err error)

	// RunBook returns what is known of pipe's runs (account.go).
	RunBook(pipe string) (RunBook, error)
	// Settle enqueues records the daemon writes and marks invocation keys
	// of pipe settled, in one transaction.
	Settle(pipe string, keys []string, msgs ...*agentpb.AgentMessage) error
	// AccountBaseline reports whether run accounting had started before
	// (and marks it started).
	AccountBaseline() (bool, error)
}

// systemdVersioner is implemented by backends that know their manager's
// version.
type systemdVersioner interface {
	SystemdVersion() string
}
