package store

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"

	agentpb "github.com/drover/drover/proto"
	bolt "go.etcd.io/bbolt"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// The outbox holds the agent's durable records (ManifestStatus, RunStarted,
// LogChunk, RunFinished) until the server acknowledges them. Each record gets
// the next sequence number (strictly increasing, never reused, starting at 1)
// in the transaction that stores it. Ack(seq) deletes every record <= seq.
//
// The outbox is bounded (Options.MaxOutboxBytes; a record counts its value
// plus its 8-byte key). When storing a record would pass the bound, the
// oldest log chunks are dropped until it fits; a log chunk that still does
// not fit is dropped itself. For each run that lost chunks the outbox holds
// one LOG_STREAM_SYSTEM marker chunk saying how many, with the chunk_seq of
// the first chunk dropped (a later drop for the same run replaces the marker
// with an updated one at the end of the outbox). Run records, ManifestStatus
// and markers are never dropped: they may take the outbox past its bound.

// Record kinds, the first byte of an outbox value.
const (
	kindManifestStatus byte = 1
	kindRunStarted     byte = 2
	kindLogChunk       byte = 3
	kindRunFinished    byte = 4
	kindMarker         byte = 5
)

func kindOf(m *agentpb.AgentMessage) (byte, error) {
	switch m.GetBody().(type) {
	case *agentpb.AgentMessage_ManifestStatus:
		return kindManifestStatus, nil
	case *agentpb.AgentMessage_RunStarted:
		return kindRunStarted, nil
	case *agentpb.AgentMessage_LogChunk:
		return kindLogChunk, nil
	case *agentpb.AgentMessage_RunFinished:
		return kindRunFinished, nil
	case nil:
		return 0, errors.New("store: empty record")
	default:
		return 0, fmt.Errorf("store: %T is not a durable record", m.GetBody())
	}
}

// OutboxStats describes the outbox.
type OutboxStats struct {
	Records       uint64 // records waiting for an ack
	Bytes         uint64 // their size as counted against the bound
	NextSeq       uint64 // the seq the next record gets
	LastAcked     uint64 // the highest seq acknowledged
	DroppedChunks uint64 // log chunks dropped because the outbox was full, ever
}

type dropped struct {
	count       uint64
	first, last uint64 // chunk seqs
}

// dropSet collects dropped chunks per run, in the order runs were first seen.
type dropSet struct {
	order []string
	runs  map[string]*dropped
}

func (d *dropSet) add(run string, chunkSeq uint64) {
	if d.runs == nil {
		d.runs = map[string]*dropped{}
	}
	r := d.runs[run]
	if r == nil {
		r = &dropped{first: chunkSeq, last: chunkSeq}
		d.runs[run] = r
		d.order = append(d.order, run)
	}
	r.count++
	r.first = min(r.first, chunkSeq)
	r.last = max(r.last, chunkSeq)
}

// outboxTx bundles the buckets and counters one outbox change touches.
type outboxTx struct {
	t                          *Tx
	outbox, chunks, markers, c *bolt.Bucket
	next, bytes, count, drops  uint64
}

func (t *Tx) outboxTx() *outboxTx {
	o := &outboxTx{
		t:       t,
		outbox:  t.tx.Bucket(bOutbox),
		chunks:  t.tx.Bucket(bChunks),
		markers: t.tx.Bucket(bMarkers),
		c:       t.tx.Bucket(bCursors),
	}
	o.next = max(getU64(o.c, kNextSeq), 1)
	o.bytes = getU64(o.c, kOutboxBytes)
	o.count = getU64(o.c, kOutboxCount)
	o.drops = getU64(o.c, kDroppedChunks)
	return o
}

func (o *outboxTx) save() error {
	for k, v := range map[string]uint64{
		string(kNextSeq): o.next, string(kOutboxBytes): o.bytes,
		string(kOutboxCount): o.count, string(kDroppedChunks): o.drops,
	} {
		if err := o.c.Put([]byte(k), u64(v)); err != nil {
			return err
		}
	}
	return nil
}

// encode stamps msg with seq and returns the outbox value.
func encode(kind byte, msg *agentpb.AgentMessage, seq uint64) ([]byte, error) {
	m := proto.Clone(msg).(*agentpb.AgentMessage)
	m.Seq = seq
	data, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
	if err != nil {
		return nil, fmt.Errorf("store: encode record: %w", err)
	}
	return append([]byte{kind}, data...), nil
}

func (o *outboxTx) put(kind byte, msg *agentpb.AgentMessage) (uint64, error) {
	seq := o.next
	val, err := encode(kind, msg, seq)
	if err != nil {
		return 0, err
	}
	if err := o.outbox.Put(u64(seq), val); err != nil {
		return 0, err
	}
	if kind == kindLogChunk {
		c := msg.GetLogChunk()
		idx := append(u64(c.GetChunkSeq()), c.GetRunId()...)
		if err := o.chunks.Put(u64(seq), idx); err != nil {
			return 0, err
		}
	}
	o.next++
	o.bytes += uint64(8 + len(val))
	o.count++
	return seq, nil
}

func (o *outboxTx) del(seq uint64) error {
	k := u64(seq)
	v := o.outbox.Get(k)
	if v == nil {
		return nil
	}
	o.bytes -= min(o.bytes, uint64(8+len(v)))
	o.count -= min(o.count, 1)
	if err := o.outbox.Delete(k); err != nil {
		return err
	}
	return o.chunks.Delete(k)
}

// makeRoom drops the oldest log chunks until need more bytes fit.
func (o *outboxTx) makeRoom(need uint64, d *dropSet) error {
	limit := uint64(o.t.s.max)
	c := o.chunks.Cursor()
	for k, v := c.First(); k != nil && o.bytes+need > limit; k, v = c.First() {
		if len(v) < 8 {
			return fmt.Errorf("store: corrupt chunk index entry %x", k)
		}
		d.add(string(v[8:]), binary.BigEndian.Uint64(v))
		o.drops++
		if err := o.del(binary.BigEndian.Uint64(k)); err != nil {
			return err
		}
	}
	return nil
}

// putMarker stores (or replaces) the drop marker of one run.
func (o *outboxTx) putMarker(run string, d *dropped) error {
	if old := o.markers.Get([]byte(run)); len(old) == 32 {
		if err := o.del(binary.BigEndian.Uint64(old)); err != nil {
			return err
		}
		d.count += binary.BigEndian.Uint64(old[8:])
		d.first = min(d.first, binary.BigEndian.Uint64(old[16:]))
		d.last = max(d.last, binary.BigEndian.Uint64(old[24:]))
	}
	text := fmt.Sprintf("drover-agent: the outbox was full: %d log chunks of this run were dropped (chunks %d-%d)\n", d.count, d.first, d.last)
	msg := &agentpb.AgentMessage{Body: &agentpb.AgentMessage_LogChunk{LogChunk: &agentpb.LogChunk{
		RunId: run, ChunkSeq: d.first, Stream: agentpb.LogStream_LOG_STREAM_SYSTEM,
		Data: []byte(text), At: timestamppb.New(o.t.s.now()),
	}}}
	seq, err := o.put(kindMarker, msg)
	if err != nil {
		return err
	}
	state := append(u64(seq), u64(d.count)...)
	state = append(state, u64(d.first)...)
	state = append(state, u64(d.last)...)
	return o.markers.Put([]byte(run), state)
}

// Enqueue appends records to the outbox in order and returns the seq each
// got; a log chunk dropped on arrival because the outbox is full gets 0.
func (t *Tx) Enqueue(msgs ...*agentpb.AgentMessage) ([]uint64, error) {
	o := t.outboxTx()
	seqs := make([]uint64, len(msgs))
	var drops dropSet
	for i, m := range msgs {
		kind, err := kindOf(m)
		if err != nil {
			return nil, err
		}
		size := uint64(8 + 1 + proto.Size(m) + 10) // upper bound: seq adds at most 10 bytes
		if o.bytes+size > uint64(t.s.max) {
			if err := o.makeRoom(size, &drops); err != nil {
				return nil, err
			}
			if kind == kindLogChunk && o.bytes+size > uint64(t.s.max) {
				c := m.GetLogChunk()
				drops.add(c.GetRunId(), c.GetChunkSeq())
				o.drops++
				continue
			}
		}
		if seqs[i], err = o.put(kind, m); err != nil {
			return nil, err
		}
	}
	for _, run := range drops.order {
		if err := o.putMarker(run, drops.runs[run]); err != nil {
			return nil, err
		}
	}
	return seqs, o.save()
}

// EnqueueSpooled enqueues a record read from a spool, at most once: source
// names the spool (e.g. the pipe) and name is the record's file name. If this
// record was enqueued before (the daemon crashed between committing it and
// deleting its file), it is not enqueued again and dup is true.
func (t *Tx) EnqueueSpooled(source, name string, msg *agentpb.AgentMessage) (seq uint64, dup bool, err error) {
	key := spooledKey(source, name)
	b := t.tx.Bucket(bSpooled)
	if v := b.Get(key); v != nil {
		return binary.BigEndian.Uint64(v), true, nil
	}
	seqs, err := t.Enqueue(msg)
	if err != nil {
		return 0, false, err
	}
	return seqs[0], false, b.Put(key, u64(seqs[0]))
}

// PruneSpooled forgets the de-duplication entries of source whose record
// files are gone (present reports whether a file still exists). Call it with
// a listing taken after the files were deleted.
func (t *Tx) PruneSpooled(source string, present func(name string) bool) (int, error) {
	prefix := spooledKey(source, "")
	c := t.tx.Bucket(bSpooled).Cursor()
	var gone [][]byte
	for k, _ := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, _ = c.Next() {
		if !present(string(k[len(prefix):])) {
			gone = append(gone, clone(k))
		}
	}
	for _, k := range gone {
		if err := t.tx.Bucket(bSpooled).Delete(k); err != nil {
			return 0, err
		}
	}
	return len(gone), nil
}

func spooledKey(source, name string) []byte {
	k := append([]byte(source), 0)
	return append(k, name...)
}

// Pending returns up to limit records with seq > after, in order, each with
// its seq set. limit <= 0 means no limit.
func (t *Tx) Pending(after uint64, limit int) ([]*agentpb.AgentMessage, error) {
	var out []*agentpb.AgentMessage
	c := t.tx.Bucket(bOutbox).Cursor()
	for k, v := c.Seek(u64(after + 1)); k != nil && (limit <= 0 || len(out) < limit); k, v = c.Next() {
		if len(v) < 1 {
			return nil, fmt.Errorf("store: corrupt outbox record %x", k)
		}
		m := &agentpb.AgentMessage{}
		if err := proto.Unmarshal(v[1:], m); err != nil {
			return nil, fmt.Errorf("store: outbox record %d: %w", binary.BigEndian.Uint64(k), err)
		}
		m.Seq = binary.BigEndian.Uint64(k)
		out = append(out, m)
	}
	return out, nil
}

// Ack deletes every record with seq <= seq (a cumulative acknowledgement)
// and returns how many it deleted.
func (t *Tx) Ack(seq uint64) (int, error) {
	o := t.outboxTx()
	n := 0
	c := o.outbox.Cursor()
	for k, _ := c.First(); k != nil && binary.BigEndian.Uint64(k) <= seq; k, _ = c.First() {
		if err := o.del(binary.BigEndian.Uint64(k)); err != nil {
			return n, err
		}
		n++
	}
	// A marker that was acknowledged is done: later drops start a new one.
	var doneRuns [][]byte
	_ = o.markers.ForEach(func(k, v []byte) error {
		if len(v) != 32 || binary.BigEndian.Uint64(v) <= seq {
			doneRuns = append(doneRuns, clone(k))
		}
		return nil
	})
	for _, k := range doneRuns {
		if err := o.markers.Delete(k); err != nil {
			return n, err
		}
	}
	if seq > getU64(o.c, kLastAcked) {
		if err := o.c.Put(kLastAcked, u64(seq)); err != nil {
			return n, err
		}
	}
	return n, o.save()
}

// DropStatuses deletes every ManifestStatus waiting in the outbox and
// returns how many it deleted. A status describes one identity's manifest:
// after the agent enrolls again as a new agent, none that was waiting may
// be delivered under the new id. Run records and log chunks stay.
func (t *Tx) DropStatuses() (int, error) {
	o := t.outboxTx()
	var seqs []uint64
	c := o.outbox.Cursor()
	for k, v := c.First(); k != nil; k, v = c.Next() {
		if len(v) > 0 && v[0] == kindManifestStatus {
			seqs = append(seqs, binary.BigEndian.Uint64(k))
		}
	}
	for _, seq := range seqs {
		if err := o.del(seq); err != nil {
			return 0, err
		}
	}
	if len(seqs) == 0 {
		return 0, nil
	}
	return len(seqs), o.save()
}

// OutboxStats returns the outbox's counters.
func (t *Tx) OutboxStats() OutboxStats {
	c := t.tx.Bucket(bCursors)
	return OutboxStats{
		Records:       getU64(c, kOutboxCount),
		Bytes:         getU64(c, kOutboxBytes),
		NextSeq:       max(getU64(c, kNextSeq), 1),
		LastAcked:     getU64(c, kLastAcked),
		DroppedChunks: getU64(c, kDroppedChunks),
	}
}

// Enqueue appends records to the outbox in one transaction.
func (s *Store) Enqueue(msgs ...*agentpb.AgentMessage) (seqs []uint64, err error) {
	err = s.Update(func(t *Tx) error { seqs, err = t.Enqueue(msgs...); return err })
	return seqs, err
}

// Pending returns up to limit records after seq, in order.
func (s *Store) Pending(after uint64, limit int) (msgs []*agentpb.AgentMessage, err error) {
	err = s.View(func(t *Tx) error { msgs, err = t.Pending(after, limit); return err })
	return msgs, err
}

// Ack deletes every record with seq <= seq.
func (s *Store) Ack(seq uint64) (n int, err error) {
	err = s.Update(func(t *Tx) error { n, err = t.Ack(seq); return err })
	return n, err
}

// DropStatuses deletes every ManifestStatus waiting in the outbox.
func (s *Store) DropStatuses() (n int, err error) {
	err = s.Update(func(t *Tx) error { n, err = t.DropStatuses(); return err })
	return n, err
}

// OutboxStats returns the outbox's counters.
func (s *Store) OutboxStats() (st OutboxStats, err error) {
	err = s.View(func(t *Tx) error { st = t.OutboxStats(); return nil })
	return st, err
}
