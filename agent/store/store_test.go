package store

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	agentpb "github.com/drover/drover/proto"
	bolt "go.etcd.io/bbolt"
	"google.golang.org/protobuf/proto"
)

func open(t *testing.T, path string, opts Options) *Store {
	t.Helper()
	s, err := Open(path, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func chunk(run string, seq uint64, size int) *agentpb.AgentMessage {
	return &agentpb.AgentMessage{Body: &agentpb.AgentMessage_LogChunk{LogChunk: &agentpb.LogChunk{
		RunId: run, ChunkSeq: seq, Stream: agentpb.LogStream_LOG_STREAM_STDOUT, Data: bytes.Repeat([]byte("x"), size),
	}}}
}

func started(run string) *agentpb.AgentMessage {
	return &agentpb.AgentMessage{Body: &agentpb.AgentMessage_RunStarted{RunStarted: &agentpb.RunStarted{RunId: run, Pipe: "p"}}}
}

func finished(run string) *agentpb.AgentMessage {
	return &agentpb.AgentMessage{Body: &agentpb.AgentMessage_RunFinished{RunFinished: &agentpb.RunFinished{
		RunId: run, Pipe: "p", Status: agentpb.RunStatus_RUN_STATUS_SUCCEEDED}}}
}

func status(serial uint64) *agentpb.AgentMessage {
	return &agentpb.AgentMessage{Body: &agentpb.AgentMessage_ManifestStatus{ManifestStatus: &agentpb.ManifestStatus{
		Serial: serial, State: agentpb.ManifestStatus_STATE_APPLIED}}}
}

// describe renders a record compactly for comparisons.
func describe(m *agentpb.AgentMessage) string {
	switch b := m.Body.(type) {
	case *agentpb.AgentMessage_RunStarted:
		return "start:" + b.RunStarted.RunId
	case *agentpb.AgentMessage_RunFinished:
		return "finish:" + b.RunFinished.RunId
	case *agentpb.AgentMessage_ManifestStatus:
		return fmt.Sprintf("status:%d", b.ManifestStatus.Serial)
	case *agentpb.AgentMessage_LogChunk:
		if b.LogChunk.Stream == agentpb.LogStream_LOG_STREAM_SYSTEM {
			return fmt.Sprintf("marker:%s/%d", b.LogChunk.RunId, b.LogChunk.ChunkSeq)
		}
		return fmt.Sprintf("chunk:%s/%d", b.LogChunk.RunId, b.LogChunk.ChunkSeq)
	}
	return "?"
}

func describeAll(ms []*agentpb.AgentMessage) string {
	var s []string
	for _, m := range ms {
		s = append(s, describe(m))
	}
	return strings.Join(s, " ")
}

func TestFreshStoreAndFileMode(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	path := filepath.Join(dir, FileName)
	s := open(t, path, Options{})
	st, err := os.Stat(path)
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("mode %v %v", st.Mode(), err)
	}
	if st, _ := os.Stat(dir); st.Mode().Perm() != 0o700 {
		t.Fatalf("dir mode %v", st.Mode())
	}
	if v, _ := s.SchemaVersion(); v != SchemaVersion {
		t.Fatalf("schema %d", v)
	}
	if m, _ := s.Manifest(); m != nil {
		t.Fatal("manifest in a fresh store")
	}
	// A second Open of the same file fails instead of hanging.
	if _, err := Open(path, Options{LockTimeout: 100 * time.Millisecond}); err == nil {
		t.Fatal("second open succeeded")
	}
}

func TestManifestTrustKV(t *testing.T) {
	path := filepath.Join(t.TempDir(), FileName)
	s := open(t, path, Options{})
	env := []byte(`{"payloadType":"x","payload":"e30=","signatures":[]}`)
	at := time.Date(2026, 1, 2, 3, 4, 5, 6, time.UTC)
	// One transaction: manifest, applied serial (kv) and its status, or nothing.
	boom := errors.New("boom")
	err := s.Update(func(tx *Tx) error {
		tx.SetManifest(AcceptedManifest{Envelope: env, Serial: 7, Digest: "sha256:ab", AcceptedAt: at})
		tx.Put("applied_serial", []byte("v1"))
		tx.Enqueue(status(7))
		return boom
	})
	if !errors.Is(err, boom) {
		t.Fatal(err)
	}
	if m, _ := s.Manifest(); m != nil {
		t.Fatal("rolled back manifest visible")
	}
	s.View(func(tx *Tx) error {
		if tx.Get("applied_serial") != nil {
			t.Error("rolled back kv value visible")
		}
		return nil
	})
	if st, _ := s.OutboxStats(); st.Records != 0 {
		t.Fatal("rolled back record visible")
	}
	err = s.Update(func(tx *Tx) error {
		if err := tx.SetManifest(AcceptedManifest{Envelope: env, Serial: 7, Digest: "sha256:ab", AcceptedAt: at}); err != nil {
			return err
		}
		if err := tx.SetTrustRoot([]byte("root")); err != nil {
			return err
		}
		if err := tx.SetKeyList([]byte("keys")); err != nil {
			return err
		}
		if err := tx.Put("applied_serial", []byte("v1")); err != nil {
			return err
		}
		if err := tx.Put("applied_digest", []byte("v2")); err != nil {
			return err
		}
		if err := tx.Put("last_sync", []byte("now")); err != nil {
			return err
		}
		_, err := tx.Enqueue(status(7))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	s = open(t, path, Options{})
	m, _ := s.Manifest()
	if m == nil || !bytes.Equal(m.Envelope, env) || m.Serial != 7 || m.Digest != "sha256:ab" || !m.AcceptedAt.Equal(at) {
		t.Fatalf("manifest %+v", m)
	}
	s.View(func(tx *Tx) error {
		if string(tx.TrustRoot()) != "root" || string(tx.KeyList()) != "keys" || string(tx.Get("last_sync")) != "now" {
			t.Error("trust or kv lost")
		}
		if string(tx.Get("applied_serial")) != "v1" || string(tx.Get("applied_digest")) != "v2" {
			t.Errorf("applied %q %q", tx.Get("applied_serial"), tx.Get("applied_digest"))
		}
		return nil
	})
	s.Update(func(tx *Tx) error { return tx.Put("applied_digest", nil) })
	s.View(func(tx *Tx) error {
		if tx.Get("applied_digest") != nil {
			t.Error("deleted kv value still there")
		}
		return nil
	})
}

func TestOutboxOrderAndAck(t *testing.T) {
	path := filepath.Join(t.TempDir(), FileName)
	s := open(t, path, Options{})
	if _, err := s.Enqueue(&agentpb.AgentMessage{Body: &agentpb.AgentMessage_Heartbeat{Heartbeat: &agentpb.Heartbeat{}}}); err == nil {
		t.Fatal("heartbeat enqueued")
	}
	seqs, err := s.Enqueue(started("a"), chunk("a", 0, 10), chunk("a", 1, 10), finished("a"))
	if err != nil || fmt.Sprint(seqs) != "[1 2 3 4]" {
		t.Fatalf("seqs %v %v", seqs, err)
	}
	seqs, _ = s.Enqueue(status(3))
	if seqs[0] != 5 {
		t.Fatalf("seq %v", seqs)
	}
	all, _ := s.Pending(0, 0)
	if got := describeAll(all); got != "start:a chunk:a/0 chunk:a/1 finish:a status:3" {
		t.Fatalf("pending %s", got)
	}
	for i, m := range all {
		if m.Seq != uint64(i+1) {
			t.Fatalf("record %d has seq %d", i, m.Seq)
		}
	}
	page, _ := s.Pending(2, 2)
	if got := describeAll(page); got != "chunk:a/1 finish:a" {
		t.Fatalf("page %s", got)
	}
	n, err := s.Ack(3)
	if err != nil || n != 3 {
		t.Fatalf("ack %d %v", n, err)
	}
	left, _ := s.Pending(0, 0)
	if got := describeAll(left); got != "finish:a status:3" {
		t.Fatalf("after ack %s", got)
	}
	st, _ := s.OutboxStats()
	if st.Records != 2 || st.LastAcked != 3 || st.NextSeq != 6 {
		t.Fatalf("stats %+v", st)
	}
	// Sequence numbers survive a restart and are never reused after acks.
	s.Ack(5)
	s.Close()
	s = open(t, path, Options{})
	seqs, _ = s.Enqueue(started("b"))
	if seqs[0] != 6 {
		t.Fatalf("seq after restart %v", seqs)
	}
	st, _ = s.OutboxStats()
	if st.Records != 1 || st.LastAcked != 5 {
		t.Fatalf("stats %+v", st)
	}
	// A stale (lower) ack changes nothing.
	if n, _ := s.Ack(2); n != 0 {
		t.Fatalf("stale ack deleted %d", n)
	}
	if st, _ := s.OutboxStats(); st.LastAcked != 5 {
		t.Fatalf("last acked went back: %+v", st)
	}
}

func TestOutboxBytesMatchContent(t *testing.T) {
	s := open(t, filepath.Join(t.TempDir(), FileName), Options{})
	s.Enqueue(started("a"), chunk("a", 0, 100), chunk("a", 1, 1000), finished("a"))
	s.Ack(2)
	var sum uint64
	s.View(func(tx *Tx) error {
		return tx.tx.Bucket(bOutbox).ForEach(func(k, v []byte) error { sum += uint64(len(k) + len(v)); return nil })
	})
	st, _ := s.OutboxStats()
	if st.Bytes != sum || st.Records != 2 {
		t.Fatalf("counted %d bytes, have %d (%+v)", st.Bytes, sum, st)
	}
}

// TestDropStatuses: only the ManifestStatus records go; the counters
// follow the content and sequence numbers go on.
func TestDropStatuses(t *testing.T) {
	s := open(t, filepath.Join(t.TempDir(), FileName), Options{})
	s.Enqueue(status(3), started("a"), chunk("a", 0, 100), status(4), finished("a"), status(5))
	s.Ack(1)
	n, err := s.DropStatuses()
	if err != nil || n != 2 {
		t.Fatalf("dropped %d %v, want 2", n, err)
	}
	left, _ := s.Pending(0, 0)
	if got := describeAll(left); got != "start:a chunk:a/0 finish:a" {
		t.Fatalf("after the drop %s", got)
	}
	var sum uint64
	s.View(func(tx *Tx) error {
		return tx.tx.Bucket(bOutbox).ForEach(func(k, v []byte) error { sum += uint64(len(k) + len(v)); return nil })
	})
	st, _ := s.OutboxStats()
	if st.Bytes != sum || st.Records != 3 || st.NextSeq != 7 || st.LastAcked != 1 {
		t.Fatalf("stats %+v (content %d bytes)", st, sum)
	}
	if n, err := s.DropStatuses(); err != nil || n != 0 {
		t.Fatalf("second drop %d %v", n, err)
	}
}

func TestOutboxBoundDropsOldestChunks(t *testing.T) {
	const limit = 4096
	s := open(t, filepath.Join(t.TempDir(), FileName), Options{MaxOutboxBytes: limit})
	if _, err := s.Enqueue(status(1), started("a")); err != nil {
		t.Fatal(err)
	}
	for i := range 10 {
		if _, err := s.Enqueue(chunk("a", uint64(i), 500)); err != nil {
			t.Fatal(err)
		}
	}
	s.Enqueue(finished("a"), started("b"))
	for i := range 3 {
		s.Enqueue(chunk("b", uint64(i), 500))
	}
	s.Enqueue(finished("b"))
	all, _ := s.Pending(0, 0)
	got := describeAll(all)
	t.Log(got)
	st, _ := s.OutboxStats()
	if st.Bytes > limit+512 { // markers may take it slightly past the bound
		t.Fatalf("outbox at %d bytes, bound %d", st.Bytes, limit)
	}
	// Every run record and the status are still there, in order.
	var runRecs []string
	var chunks []string
	var markers []*agentpb.LogChunk
	for _, m := range all {
		d := describe(m)
		switch {
		case strings.HasPrefix(d, "chunk:"):
			chunks = append(chunks, d)
		case strings.HasPrefix(d, "marker:"):
			markers = append(markers, m.GetLogChunk())
		default:
			runRecs = append(runRecs, d)
		}
	}
	if strings.Join(runRecs, " ") != "status:1 start:a finish:a start:b finish:b" {
		t.Fatalf("run records %v", runRecs)
	}
	// The newest chunks survive; the oldest went first.
	if len(chunks) == 0 || chunks[len(chunks)-1] != "chunk:b/2" {
		t.Fatalf("chunks %v", chunks)
	}
	if strings.Contains(strings.Join(chunks, " "), "chunk:a/0 ") {
		t.Fatalf("oldest chunk kept: %v", chunks)
	}
	// One marker for run a, counting every dropped chunk, at its first seq.
	keptA := 0
	for _, c := range chunks {
		if strings.HasPrefix(c, "chunk:a/") {
			keptA++
		}
	}
	if len(markers) != 1 || markers[0].RunId != "a" || markers[0].ChunkSeq != 0 {
		t.Fatalf("markers %v", markers)
	}
	want := fmt.Sprintf("%d log chunks of this run were dropped (chunks 0-%d)", 10-keptA, 9-keptA)
	if !strings.Contains(string(markers[0].Data), want) {
		t.Fatalf("marker %q, want %q", markers[0].Data, want)
	}
	if st.DroppedChunks != uint64(10-keptA) {
		t.Fatalf("dropped %d", st.DroppedChunks)
	}

	// With nothing droppable left, run records still go in (past the bound),
	// and new chunks are dropped on arrival.
	s2 := open(t, filepath.Join(t.TempDir(), FileName), Options{MaxOutboxBytes: 300})
	for i := range 20 {
		if _, err := s2.Enqueue(started(fmt.Sprint("r", i))); err != nil {
			t.Fatal(err)
		}
	}
	seqs, err := s2.Enqueue(chunk("r0", 0, 100), chunk("r0", 1, 100))
	if err != nil || seqs[0] != 0 || seqs[1] != 0 {
		t.Fatalf("chunks not dropped on arrival: %v %v", seqs, err)
	}
	all, _ = s2.Pending(0, 0)
	if n := len(all); n != 21 || describe(all[20]) != "marker:r0/0" {
		t.Fatalf("%d records: %s", n, describeAll(all))
	}
	if !strings.Contains(string(all[20].GetLogChunk().Data), "2 log chunks") {
		t.Fatalf("marker %q", all[20].GetLogChunk().Data)
	}
	// More drops for the same run update the one marker.
	s2.Enqueue(chunk("r0", 2, 100))
	all, _ = s2.Pending(0, 0)
	if n := len(all); n != 21 || !strings.Contains(string(all[20].GetLogChunk().Data), "3 log chunks") {
		t.Fatalf("%d records, last %q", n, all[len(all)-1].GetLogChunk().GetData())
	}
}

func TestSpooledDedup(t *testing.T) {
	s := open(t, filepath.Join(t.TempDir(), FileName), Options{})
	var seq1 uint64
	s.Update(func(tx *Tx) error {
		seq, dup, err := tx.EnqueueSpooled("backup", "0001.pb", started("a"))
		if err != nil || dup {
			t.Fatalf("first: %v %v", dup, err)
		}
		seq1 = seq
		return nil
	})
	// The daemon crashed before deleting the file: the same record again.
	s.Update(func(tx *Tx) error {
		seq, dup, err := tx.EnqueueSpooled("backup", "0001.pb", started("a"))
		if err != nil || !dup || seq != seq1 {
			t.Fatalf("again: %d %v %v", seq, dup, err)
		}
		_, dup, _ = tx.EnqueueSpooled("other", "0001.pb", started("b"))
		if dup {
			t.Fatal("other source deduplicated")
		}
		return nil
	})
	if st, _ := s.OutboxStats(); st.Records != 2 {
		t.Fatalf("records %d", st.Records)
	}
	s.Update(func(tx *Tx) error {
		n, err := tx.PruneSpooled("backup", func(string) bool { return false })
		if n != 1 || err != nil {
			t.Fatalf("prune %d %v", n, err)
		}
		return nil
	})
	s.Update(func(tx *Tx) error {
		if _, dup, _ := tx.EnqueueSpooled("other", "0001.pb", started("b")); !dup {
			t.Fatal("pruned the wrong source")
		}
		return nil
	})
}

// writeV1 builds a schema-1 file the way agents of that version did.
func writeV1(t *testing.T, path string) {
	t.Helper()
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	err = db.Update(func(tx *bolt.Tx) error {
		for _, name := range []string{"meta", "manifest", "trust", "applied", "outbox", "cursors"} {
			if _, err := tx.CreateBucket([]byte(name)); err != nil {
				return err
			}
		}
		tx.Bucket([]byte("meta")).Put([]byte("schema"), binary.BigEndian.AppendUint32(nil, 1))
		m := tx.Bucket([]byte("manifest"))
		m.Put([]byte("envelope"), []byte("ENV"))
		m.Put([]byte("serial"), binary.BigEndian.AppendUint64(nil, 42))
		m.Put([]byte("digest"), []byte("sha256:00"))
		tx.Bucket([]byte("trust")).Put([]byte("root"), []byte("ROOT"))
		tx.Bucket([]byte("applied")).Put([]byte("backup"), []byte("state"))
		out := tx.Bucket([]byte("outbox"))
		recs := []*agentpb.AgentMessage{started("a"), chunk("a", 0, 300), chunk("a", 1, 300), finished("a")}
		for i, r := range recs {
			r.Seq = uint64(10 + i) // records 1-9 were acked long ago
			b, _ := proto.Marshal(r)
			out.Put(binary.BigEndian.AppendUint64(nil, r.Seq), b)
		}
		c := tx.Bucket([]byte("cursors"))
		c.Put([]byte("next_seq"), binary.BigEndian.AppendUint64(nil, 14))
		c.Put([]byte("last_acked"), binary.BigEndian.AppendUint64(nil, 9))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func TestUpgradeFromV1(t *testing.T) {
	path := filepath.Join(t.TempDir(), FileName)
	writeV1(t, path)
	s := open(t, path, Options{MaxOutboxBytes: 1 << 20})
	if v, _ := s.SchemaVersion(); v != SchemaVersion {
		t.Fatalf("schema %d after upgrade", v)
	}
	if _, err := os.Stat(path + ".bak-v1"); err != nil {
		t.Fatalf("no backup: %v", err)
	}
	m, _ := s.Manifest()
	if m == nil || string(m.Envelope) != "ENV" || m.Serial != 42 || m.Digest != "sha256:00" {
		t.Fatalf("manifest %+v", m)
	}
	if b, _ := s.TrustRoot(); string(b) != "ROOT" {
		t.Fatal("trust root lost")
	}
	s.View(func(tx *Tx) error {
		if b := tx.tx.Bucket(bApplied).Get([]byte("backup")); string(b) != "state" {
			t.Error("the applied bucket lost its content")
		}
		return nil
	})
	all, _ := s.Pending(9, 0)
	if got := describeAll(all); got != "start:a chunk:a/0 chunk:a/1 finish:a" || all[0].Seq != 10 {
		t.Fatalf("pending %s (first seq %d)", got, all[0].GetSeq())
	}
	st, _ := s.OutboxStats()
	if st.Records != 4 || st.NextSeq != 14 || st.LastAcked != 9 || st.Bytes == 0 {
		t.Fatalf("stats %+v", st)
	}
	seqs, _ := s.Enqueue(status(43))
	if seqs[0] != 14 {
		t.Fatalf("next seq %v", seqs)
	}
	s.Close()

	// The upgraded chunk index works: a tiny bound drops the old chunks.
	s = open(t, path, Options{MaxOutboxBytes: 200})
	s.Enqueue(started("b"))
	all, _ = s.Pending(0, 0)
	if got := describeAll(all); got != "start:a finish:a status:43 start:b marker:a/0" {
		t.Fatalf("after drop: %s", got)
	}
	s.Ack(12)
	if st, _ := s.OutboxStats(); st.Records != 4 || st.DroppedChunks != 2 {
		t.Fatalf("stats %+v", st)
	}
}

func TestRefusesNewerAndForeignFiles(t *testing.T) {
	path := filepath.Join(t.TempDir(), FileName)
	db, _ := bolt.Open(path, 0o600, nil)
	db.Update(func(tx *bolt.Tx) error {
		b, _ := tx.CreateBucket([]byte("meta"))
		return b.Put([]byte("schema"), binary.BigEndian.AppendUint32(nil, SchemaVersion+1))
	})
	db.Close()
	if _, err := Open(path, Options{}); !errors.Is(err, ErrNewerSchema) {
		t.Fatalf("newer schema: %v", err)
	}
	path2 := filepath.Join(t.TempDir(), FileName)
	db, _ = bolt.Open(path2, 0o600, nil)
	db.Update(func(tx *bolt.Tx) error { _, err := tx.CreateBucket([]byte("other")); return err })
	db.Close()
	if _, err := Open(path2, Options{}); err == nil {
		t.Fatal("foreign bbolt file opened")
	}
}
