// Package store is the agent's durable local state: one bbolt file at
// <data dir>/agent.db (0600) holding the accepted manifest, the trust root,
// the applied state of each pipe, the outbox of records waiting for the
// server's Ack, and the cursors. Every change is one bbolt transaction; use
// Store.Update to make several changes atomically (for instance accept a
// manifest, record the applied state and enqueue its ManifestStatus).
//
// Layout (schema version 2):
//
//	meta      "schema" -> uint32 big endian
//	manifest  "envelope" -> DSSE envelope bytes as received, "serial" -> uint64,
//	          "digest" -> "sha256:<hex>", "accepted_at" -> RFC 3339
//	trust     "root" -> trust root bytes, "keylist" -> key list envelope bytes
//	applied   (empty; kept so that the schema stays version 2)
//	outbox    <seq uint64> -> kind byte + proto.AgentMessage (seq set)
//	chunks    <seq uint64> -> uint64 chunk_seq + run id  (index of droppable log chunks)
//	markers   <run id> -> marker state (see outbox.go)
//	spooled   <source> 0x00 <record name> -> seq  (spool de-duplication)
//	cursors   "next_seq", "last_acked", "outbox_bytes", "outbox_count",
//	          "dropped_chunks" -> uint64
//	kv        free-form small values for other agent parts (last sync, ...)
//
// Schema version 1 had no chunks, markers, spooled or kv buckets, no size
// counters, and stored outbox values as bare AgentMessage bytes; Open
// upgrades it (after copying the file to agent.db.bak-v1).
//
// Imported only by the daemon (agent, through BoltStore).
package store

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	bolt "go.etcd.io/bbolt"
)

// SchemaVersion is the layout this package reads and writes.
const SchemaVersion = 2

// FileName is the store's file inside the agent data directory.
const FileName = "agent.db"

// DefaultMaxOutboxBytes bounds the outbox (records plus keys).
const DefaultMaxOutboxBytes int64 = 256 << 20

// ErrNewerSchema is returned by Open for a file written by a newer agent.
var ErrNewerSchema = errors.New("store: the database was written by a newer drover-agent")

var (
	bMeta     = []byte("meta")
	bManifest = []byte("manifest")
	bTrust    = []byte("trust")
	bApplied  = []byte("applied")
	bOutbox   = []byte("outbox")
	bChunks   = []byte("chunks")
	bMarkers  = []byte("markers")
	bSpooled  = []byte("spooled")
	bCursors  = []byte("cursors")
	bKV       = []byte("kv")

	kSchema        = []byte("schema")
	kEnvelope      = []byte("envelope")
	kSerial        = []byte("serial")
	kDigest        = []byte("digest")
	kAcceptedAt    = []byte("accepted_at")
	kRoot          = []byte("root")
	kKeyList       = []byte("keylist")
	kNextSeq       = []byte("next_seq")
	kLastAcked     = []byte("last_acked")
	kOutboxBytes   = []byte("outbox_bytes")
	kOutboxCount   = []byte("outbox_count")
	kDroppedChunks = []byte("dropped_chunks")
)

// allBuckets are the buckets of the current schema.
var allBuckets = [][]byte{bMeta, bManifest, bTrust, bApplied, bOutbox, bChunks, bMarkers, bSpooled, bCursors, bKV}

// Options tune Open. The zero value gives the defaults.
type Options struct {
	// MaxOutboxBytes bounds the outbox (default 256 MiB). When an Enqueue
	// would pass it, the oldest log chunks are dropped (see Tx.Enqueue).
	MaxOutboxBytes int64
	// LockTimeout is how long Open waits for another process holding the
	// file (default 2 s).
	LockTimeout time.Duration
	// Now is the clock (tests).
	Now func() time.Time
}

// Store is an open agent database. It is safe for concurrent use.
type Store struct {
	db   *bolt.DB
	path string
	max  int64
	now  func() time.Time
}

// Open opens or creates the store at path (mode 0600; its directory is
// created 0700 if missing) and upgrades an older schema.
func Open(path string, opts Options) (*Store, error) {
	if opts.MaxOutboxBytes <= 0 {
		opts.MaxOutboxBytes = DefaultMaxOutboxBytes
	}
	if opts.LockTimeout <= 0 {
		opts.LockTimeout = 2 * time.Second
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("store: %w", err)
	}
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: opts.LockTimeout})
	if err != nil {
		return nil, fmt.Errorf("store: open %s: %w", path, err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		db.Close()
		return nil, fmt.Errorf("store: %w", err)
	}
	s := &Store{db: db, path: path, max: opts.MaxOutboxBytes, now: opts.Now}
	if err := s.init(); err != nil {
		db.Close()
		return nil, err
	}
	return s, nil
}

// Close closes the database.
func (s *Store) Close() error { return s.db.Close() }

// Path returns the database file's path.
func (s *Store) Path() string { return s.path }

// MaxOutboxBytes returns the outbox bound in force.
func (s *Store) MaxOutboxBytes() int64 { return s.max }

// Update runs fn in one read-write transaction: all of its changes are
// committed together, or none when fn returns an error.
func (s *Store) Update(fn func(*Tx) error) error {
	return s.db.Update(func(btx *bolt.Tx) error { return fn(&Tx{tx: btx, s: s}) })
}

// View runs fn in a read-only transaction (a consistent snapshot).
func (s *Store) View(fn func(*Tx) error) error {
	return s.db.View(func(btx *bolt.Tx) error { return fn(&Tx{tx: btx, s: s}) })
}

// Tx is a transaction on the store. Byte slices it returns are copies and
// stay valid after the transaction.
type Tx struct {
	tx *bolt.Tx
	s  *Store
}

// SchemaVersion returns the schema version recorded in the file.
func (s *Store) SchemaVersion() (int, error) {
	var v int
	err := s.db.View(func(tx *bolt.Tx) error {
		v = readSchema(tx)
		return nil
	})
	return v, err
}

func readSchema(tx *bolt.Tx) int {
	b := tx.Bucket(bMeta)
	if b == nil {
		return 0
	}
	v := b.Get(kSchema)
	if len(v) != 4 {
		return 0
	}
	return int(binary.BigEndian.Uint32(v))
}

func writeSchema(tx *bolt.Tx, v int) error {
	b, err := tx.CreateBucketIfNotExists(bMeta)
	if err != nil {
		return err
	}
	return b.Put(kSchema, binary.BigEndian.AppendUint32(nil, uint32(v)))
}

// init creates a fresh layout or upgrades an old one.
func (s *Store) init() error {
	var ver int
	var empty bool
	if err := s.db.View(func(tx *bolt.Tx) error {
		ver = readSchema(tx)
		empty = true
		return tx.ForEach(func([]byte, *bolt.Bucket) error { empty = false; return nil })
	}); err != nil {
		return err
	}
	switch {
	case ver == 0 && empty:
		return s.db.Update(func(tx *bolt.Tx) error {
			for _, name := range allBuckets {
				if _, err := tx.CreateBucketIfNotExists(name); err != nil {
					return err
				}
			}
			return writeSchema(tx, SchemaVersion)
		})
	case ver == 0:
		return fmt.Errorf("store: %s has no schema version; not a drover-agent database", s.path)
	case ver > SchemaVersion:
		return fmt.Errorf("%w (schema %d, this agent knows up to %d)", ErrNewerSchema, ver, SchemaVersion)
	case ver == SchemaVersion:
		return nil
	}
	// Keep a copy of the old file before the upgrade changes it.
	backup := fmt.Sprintf("%s.bak-v%d", s.path, ver)
	if err := s.db.View(func(tx *bolt.Tx) error { return tx.CopyFile(backup, 0o600) }); err != nil {
		return fmt.Errorf("store: back up before upgrade: %w", err)
	}
	for v := ver; v < SchemaVersion; v++ {
		up := upgrades[v]
		if err := s.db.Update(func(tx *bolt.Tx) error {
			if err := up(tx); err != nil {
				return err
			}
			return writeSchema(tx, v+1)
		}); err != nil {
			return fmt.Errorf("store: upgrade schema %d to %d: %w", v, v+1, err)
		}
	}
	return nil
}

func u64(v uint64) []byte { return binary.BigEndian.AppendUint64(nil, v) }

func getU64(b *bolt.Bucket, k []byte) uint64 {
	v := b.Get(k)
	if len(v) != 8 {
		return 0
	}
	return binary.BigEndian.Uint64(v)
}

func clone(b []byte) []byte {
	if b == nil {
		return nil
	}
	return append([]byte(nil), b...)
}

// ---- manifest and trust ----

// AcceptedManifest is the last manifest the agent accepted.
type AcceptedManifest struct {
	Envelope   []byte // the DSSE envelope exactly as received
	Serial     uint64
	Digest     string // "sha256:<hex>" of the manifest payload
	AcceptedAt time.Time
}

// Manifest returns the accepted manifest, or nil when there is none.
func (t *Tx) Manifest() *AcceptedManifest {
	b := t.tx.Bucket(bManifest)
	env := b.Get(kEnvelope)
	if env == nil {
		return nil
	}
	m := &AcceptedManifest{Envelope: clone(env), Serial: getU64(b, kSerial), Digest: string(b.Get(kDigest))}
	if at, err := time.Parse(time.RFC3339Nano, string(b.Get(kAcceptedAt))); err == nil {
		m.AcceptedAt = at
	}
	return m
}

// SetManifest records m as the accepted manifest. AcceptedAt defaults to now.
func (t *Tx) SetManifest(m AcceptedManifest) error {
	if len(m.Envelope) == 0 {
		return errors.New("store: empty manifest envelope")
	}
	if m.AcceptedAt.IsZero() {
		m.AcceptedAt = t.s.now()
	}
	b := t.tx.Bucket(bManifest)
	for k, v := range map[string][]byte{
		string(kEnvelope):   m.Envelope,
		string(kSerial):     u64(m.Serial),
		string(kDigest):     []byte(m.Digest),
		string(kAcceptedAt): []byte(m.AcceptedAt.UTC().Format(time.RFC3339Nano)),
	} {
		if err := b.Put([]byte(k), v); err != nil {
			return err
		}
	}
	return nil
}

// TrustRoot returns the stored trust root, or nil.
func (t *Tx) TrustRoot() []byte { return clone(t.tx.Bucket(bTrust).Get(kRoot)) }

// SetTrustRoot stores the trust root pinned at enrollment.
func (t *Tx) SetTrustRoot(b []byte) error { return t.tx.Bucket(bTrust).Put(kRoot, b) }

// KeyList returns the stored root-signed key list envelope, or nil.
func (t *Tx) KeyList() []byte { return clone(t.tx.Bucket(bTrust).Get(kKeyList)) }

// SetKeyList stores the current root-signed key list envelope.
func (t *Tx) SetKeyList(b []byte) error { return t.tx.Bucket(bTrust).Put(kKeyList, b) }

// ---- kv ----

// Get returns a value from the free-form kv bucket, or nil.
func (t *Tx) Get(key string) []byte { return clone(t.tx.Bucket(bKV).Get([]byte(key))) }

// Put sets a value in the free-form kv bucket; nil deletes it.
func (t *Tx) Put(key string, val []byte) error {
	if val == nil {
		return t.tx.Bucket(bKV).Delete([]byte(key))
	}
	return t.tx.Bucket(bKV).Put([]byte(key), val)
}

// ---- one-transaction conveniences ----

// Manifest returns the accepted manifest, or nil.
func (s *Store) Manifest() (m *AcceptedManifest, err error) {
	err = s.View(func(t *Tx) error { m = t.Manifest(); return nil })
	return m, err
}

// SetManifest records the accepted manifest.
func (s *Store) SetManifest(m AcceptedManifest) error {
	return s.Update(func(t *Tx) error { return t.SetManifest(m) })
}

// TrustRoot returns the stored trust root, or nil.
func (s *Store) TrustRoot() (b []byte, err error) {
	err = s.View(func(t *Tx) error { b = t.TrustRoot(); return nil })
	return b, err
}

// SetTrustRoot stores the trust root.
func (s *Store) SetTrustRoot(b []byte) error {
	return s.Update(func(t *Tx) error { return t.SetTrustRoot(b) })
}

// Scan calls fn for every kv entry whose key starts with prefix, in key
// order. fn must not change the store through t.
func (t *Tx) Scan(prefix string, fn func(key string, val []byte) error) error {
	c := t.tx.Bucket(bKV).Cursor()
	p := []byte(prefix)
	for k, v := c.Seek(p); k != nil && len(k) >= len(p) && string(k[:len(p)]) == prefix; k, v = c.Next() {
		if err := fn(string(k), clone(v)); err != nil {
			return err
		}
	}
	return nil
}
