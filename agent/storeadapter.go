package agent

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"path/filepath"
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

// EnqueueSpooled implements Store: the records are enqueued in one
// transaction, each at most once per (source, name).
func (b *BoltStore) EnqueueSpooled(source string, recs []spool.Record) error {
	return b.S.Update(func(t *store.Tx) error {
		for _, r := range recs {
			if _, _, err := t.EnqueueSpooled(source, r.Name, r.Msg); err != nil {
				return err
			}
		}
		return nil
	})
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
