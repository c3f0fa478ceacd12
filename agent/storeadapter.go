package agent

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"path/filepath"
	"slices"
	"time"

	"github.com/drover/drover/agent/spool"
	"github.com/drover/drover/agent/store"
	agentpb "github.com/drover/drover/proto"
	"github.com/drover/drover/signing"
)

// BoltStore adapts agent/store (bbolt at D/agent.db) to Store.
type BoltStore struct {
	S *store.Store
}

var _ Store = (*BoltStore)(nil)

// kv keys this package owns in the store's free-form bucket.
const (
	kvAppliedSerial = "agent.applied_serial"
	kvAppliedDigest = "agent.applied_digest"
	// kvManifestAgent is the agent id the accepted manifest was for. A
	// re-enrolled agent has a new id whose serials start anew: the state of
	// the old id must not judge them (stores written before this key have
	// none, and their state stands).
	kvManifestAgent = "agent.manifest_agent"
)

// OpenStore opens D/agent.db.
func OpenStore(dataDir string, maxOutboxBytes int64, now func() time.Time) (*BoltStore, error) {
	s, err := store.Open(filepath.Join(dataDir, store.FileName), store.Options{MaxOutboxBytes: maxOutboxBytes, Now: now})
	if err != nil {
		return nil, err
	}
	return &BoltStore{S: s}, nil
}

// Close closes the database.
func (b *BoltStore) Close() error { return b.S.Close() }

// ManifestState implements Store.
func (b *BoltStore) ManifestState() (ms ManifestState, err error) {
	err = b.S.View(func(t *store.Tx) error {
		if m := t.Manifest(); m != nil {
			ms.Envelope, ms.Serial, ms.Digest = m.Envelope, m.Serial, m.Digest
		}
		if v := t.Get(kvAppliedSerial); len(v) == 8 {
			ms.AppliedSerial = binary.BigEndian.Uint64(v)
		}
		ms.AppliedDigest = string(t.Get(kvAppliedDigest))
		ms.AgentID = string(t.Get(kvManifestAgent))
		return nil
	})
	return ms, err
}

// trustRootRecord is the stored form of the root keys.
type trustRootRecord struct {
	RootKeys []signing.PublicKey `json:"root_keys"`
}

func readTrust(t *store.Tx) (*signing.TrustRoot, error) {
	root := t.TrustRoot()
	if root == nil {
		return nil, nil
	}
	var rec trustRootRecord
	if err := json.Unmarshal(root, &rec); err != nil {
		return nil, fmt.Errorf("stored trust root: %w", err)
	}
	return &signing.TrustRoot{RootKeys: rec.RootKeys, KeyList: t.KeyList()}, nil
}

func writeTrust(t *store.Tx, tr *signing.TrustRoot) error {
	root, err := json.Marshal(trustRootRecord{RootKeys: tr.RootKeys})
	if err != nil {
		return err
	}
	if err := t.SetTrustRoot(root); err != nil {
		return err
	}
	return t.SetKeyList(tr.KeyList)
}

// TrustRoot implements Store.
func (b *BoltStore) TrustRoot() (tr *signing.TrustRoot, err error) {
	err = b.S.View(func(t *store.Tx) error {
		tr, err = readTrust(t)
		return err
	})
	return tr, err
}

// SetTrustRoot implements Store.
func (b *BoltStore) SetTrustRoot(tr *signing.TrustRoot) error {
	return b.S.Update(func(t *store.Tx) error { return writeTrust(t, tr) })
}

// AcceptManifest implements Store.
func (b *BoltStore) AcceptManifest(agentID string, env []byte, serial uint64, digest string, tr *signing.TrustRoot) error {
	return b.S.Update(func(t *store.Tx) error {
		if tr != nil {
			if err := writeTrust(t, tr); err != nil {
				return err
			}
		}
		if err := t.Put(kvManifestAgent, []byte(agentID)); err != nil {
			return err
		}
		return t.SetManifest(store.AcceptedManifest{Envelope: env, Serial: serial, Digest: digest})
	})
}

// SetApplied implements Store.
func (b *BoltStore) SetApplied(serial uint64, digest string) error {
	return b.S.Update(func(t *store.Tx) error {
		if err := t.Put(kvAppliedSerial, binary.BigEndian.AppendUint64(nil, serial)); err != nil {
			return err
		}
		return t.Put(kvAppliedDigest, []byte(digest))
	})
}

// Enqueue implements Store.
func (b *BoltStore) Enqueue(msgs ...*agentpb.AgentMessage) error {
	_, err := b.S.Enqueue(msgs...)
	return err
}

// DropStatuses implements Store.
func (b *BoltStore) DropStatuses() (int, error) { return b.S.DropStatuses() }

// EnqueueSpooled implements Store: the records are enqueued in one
// transaction, each at most once per (source, name).
func (b *BoltStore) EnqueueSpooled(source string, recs []spool.Record) error {
	return b.S.Update(func(t *store.Tx) error {
		books := map[string]*RunBook{}
		for _, r := range recs {
			if _, _, err := t.EnqueueSpooled(source, r.Name, r.Msg); err != nil {
				return err
			}
			noteInBook(t, books, r.Msg, "")
		}
		return saveBooks(t, books)
	})
}

// RunBook is what the agent remembers of one pipe's runs, to account for
// every invocation exactly once (account.go): the runs whose final record
// is in the outbox (or was sent), the invocations already settled, and the
// runs started and not finished. Each list is bounded (runBookMax).
type RunBook struct {
	Finals    []string             `json:"finals,omitempty"`
	Accounted []string             `json:"accounted,omitempty"`
	Open      map[string]time.Time `json:"open,omitempty"`
	// Attempts is the latest attempt an open run reported past its first
	// (RunStarted.attempt, with retries), for the record the daemon writes
	// when the runner could not.
	Attempts map[string]uint32 `json:"attempts,omitempty"`
}

// AttemptsOf is how many attempts run id is known to have started (1 when
// only its first, or nothing, was reported).
func (rb *RunBook) AttemptsOf(runID string) uint32 { return max(1, rb.Attempts[runID]) }

const (
	kvRunBook  = "agent.runs/" // + pipe
	runBookMax = 64
)

// HasFinal reports whether a final record of runID is known.
func (rb *RunBook) HasFinal(runID string) bool { return slices.Contains(rb.Finals, runID) }

// IsAccounted reports whether key (an invocation) was settled.
func (rb *RunBook) IsAccounted(key string) bool { return slices.Contains(rb.Accounted, key) }

func pushBounded(list []string, v string) []string {
	if slices.Contains(list, v) {
		return list
	}
	list = append(list, v)
	if len(list) > runBookMax {
		list = list[len(list)-runBookMax:]
	}
	return list
}

func loadBook(t *store.Tx, books map[string]*RunBook, pipe string) *RunBook {
	if rb := books[pipe]; rb != nil {
		return rb
	}
	rb := &RunBook{}
	if v := t.Get(kvRunBook + pipe); v != nil {
		_ = json.Unmarshal(v, rb)
	}
	books[pipe] = rb
	return rb
}

// noteInBook records a run record in its pipe's book; accounted, when not
// "", marks an invocation settled.
func noteInBook(t *store.Tx, books map[string]*RunBook, msg *agentpb.AgentMessage, accounted string) {
	switch body := msg.GetBody().(type) {
	case *agentpb.AgentMessage_RunStarted:
		rs := body.RunStarted
		rb := loadBook(t, books, rs.GetPipe())
		if rb.HasFinal(rs.GetRunId()) {
			return
		}
		if rb.Open == nil {
			rb.Open = map[string]time.Time{}
		}
		rb.Open[rs.GetRunId()] = rs.GetStartedAt().AsTime()
		if n := rs.GetAttempt(); n > 1 {
			if rb.Attempts == nil {
				rb.Attempts = map[string]uint32{}
			}
			rb.Attempts[rs.GetRunId()] = max(n, rb.Attempts[rs.GetRunId()])
		}
		for len(rb.Open) > runBookMax {
			oldest, at := "", time.Time{}
			for id, t := range rb.Open {
				if oldest == "" || t.Before(at) {
					oldest, at = id, t
				}
			}
			delete(rb.Open, oldest)
			delete(rb.Attempts, oldest)
		}
	case *agentpb.AgentMessage_RunFinished:
		rf := body.RunFinished
		rb := loadBook(t, books, rf.GetPipe())
		delete(rb.Open, rf.GetRunId())
		delete(rb.Attempts, rf.GetRunId())
		rb.Finals = pushBounded(rb.Finals, rf.GetRunId())
	}
}

func saveBooks(t *store.Tx, books map[string]*RunBook) error {
	for pipe, rb := range books {
		b, err := json.Marshal(rb)
		if err != nil {
			return err
		}
		if err := t.Put(kvRunBook+pipe, b); err != nil {
			return err
		}
	}
	return nil
}

// RunBook implements Store.
func (b *BoltStore) RunBook(pipe string) (rb RunBook, err error) {
	err = b.S.View(func(t *store.Tx) error {
		rb = *loadBook(t, map[string]*RunBook{}, pipe)
		return nil
	})
	return rb, err
}

// Settle implements Store: in one transaction, msgs (records the daemon
// writes) go into the outbox and the invocations keys of pipe are marked
// settled.
func (b *BoltStore) Settle(pipe string, keys []string, msgs ...*agentpb.AgentMessage) error {
	return b.S.Update(func(t *store.Tx) error {
		if len(msgs) > 0 {
			if _, err := t.Enqueue(msgs...); err != nil {
				return err
			}
		}
		books := map[string]*RunBook{}
		for _, m := range msgs {
			noteInBook(t, books, m, "")
		}
		rb := loadBook(t, books, pipe)
		for _, k := range keys {
			rb.Accounted = pushBounded(rb.Accounted, k)
		}
		return saveBooks(t, books)
	})
}

// kvAccountBaseline marks a store whose run books were started: an agent
// upgraded from a version without them does not judge the invocations
// systemd still remembers from before (their records were sent already).
const kvAccountBaseline = "agent.runs.baseline"

// AccountBaseline implements Store.
func (b *BoltStore) AccountBaseline() (done bool, err error) {
	err = b.S.Update(func(t *store.Tx) error {
		done = t.Get(kvAccountBaseline) != nil
		if done {
			return nil
		}
		return t.Put(kvAccountBaseline, []byte(time.Now().UTC().Format(time.RFC3339)))
	})
	return done, err
}

// PruneSpooled implements Store.
func (b *BoltStore) PruneSpooled(source string, present func(string) bool) error {
	return b.S.Update(func(t *store.Tx) error {
		_, err := t.PruneSpooled(source, present)
		return err
	})
}

// Pending implements Store.
func (b *BoltStore) Pending(after uint64, limit int) ([]*agentpb.AgentMessage, error) {
	return b.S.Pending(after, limit)
}

// Ack implements Store.
func (b *BoltStore) Ack(seq uint64) error {
	_, err := b.S.Ack(seq)
	return err
}

// OutboxStats implements Store.
func (b *BoltStore) OutboxStats() (records, bytes uint64, err error) {
	st, err := b.S.OutboxStats()
	return st.Records, st.Bytes, err
}
