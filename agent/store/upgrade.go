package store

import (
	"encoding/binary"
	"fmt"

	agentpb "github.com/drover/drover/proto"
	bolt "go.etcd.io/bbolt"
	"google.golang.org/protobuf/proto"
)

// upgrades[v] moves a file from schema v to v+1 inside one transaction (Open
// writes the new version in the same transaction).
var upgrades = map[int]func(*bolt.Tx) error{
	1: upgrade1to2,
}

// upgrade1to2: schema 1 stored outbox values as bare AgentMessage bytes and
// kept no size counters. Prefix each value with its kind, build the chunk
// index and the counters, and create the buckets added in 2.
func upgrade1to2(tx *bolt.Tx) error {
	for _, name := range allBuckets {
		if _, err := tx.CreateBucketIfNotExists(name); err != nil {
			return err
		}
	}
	outbox, chunks, cursors := tx.Bucket(bOutbox), tx.Bucket(bChunks), tx.Bucket(bCursors)
	type rec struct {
		key, val []byte
		idx      []byte
	}
	var recs []rec
	var bytes, count, maxSeq uint64
	err := outbox.ForEach(func(k, v []byte) error {
		if len(k) != 8 {
			return fmt.Errorf("outbox key %x is not a sequence number", k)
		}
		m := &agentpb.AgentMessage{}
		if err := proto.Unmarshal(v, m); err != nil {
			return fmt.Errorf("outbox record %x: %w", k, err)
		}
		kind, err := kindOf(m)
		if err != nil {
			return fmt.Errorf("outbox record %x: %w", k, err)
		}
		seq := binary.BigEndian.Uint64(k)
		val, err := encode(kind, m, seq)
		if err != nil {
			return err
		}
		r := rec{key: clone(k), val: val}
		if kind == kindLogChunk {
			r.idx = append(u64(m.GetLogChunk().GetChunkSeq()), m.GetLogChunk().GetRunId()...)
		}
		recs = append(recs, r)
		bytes += uint64(8 + len(val))
		count++
		maxSeq = max(maxSeq, seq)
		return nil
	})
	if err != nil {
		return err
	}
	for _, r := range recs {
		if err := outbox.Put(r.key, r.val); err != nil {
			return err
		}
		if r.idx != nil {
			if err := chunks.Put(r.key, r.idx); err != nil {
				return err
			}
		}
	}
	next := max(getU64(cursors, kNextSeq), maxSeq+1, 1)
	for k, v := range map[string]uint64{
		string(kNextSeq): next, string(kOutboxBytes): bytes,
		string(kOutboxCount): count, string(kDroppedChunks): 0,
	} {
		if err := cursors.Put([]byte(k), u64(v)); err != nil {
			return err
		}
	}
	return nil
}
