package spool

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/drover/drover/internal/atomicfile"
	agentpb "github.com/drover/drover/proto"
	"google.golang.org/protobuf/proto"
)

// counter makes names unique between writers of one process.
var counter atomic.Uint64

// Writer appends records to a spool directory. It is safe for concurrent use;
// records get names in the order their Write calls were serialised.
type Writer struct {
	dir string
	pid int

	mu    sync.Mutex
	last  int64 // nanos of the last name used or seen
	dirty bool  // renames not yet covered by a directory fsync
	now   func() time.Time
}

// NewWriter opens dir for writing, creating it (0700) if needed. It scans the
// directory once so that its names sort after every record already there.
func NewWriter(dir string) (*Writer, error) {
	if err := EnsureDir(dir); err != nil {
		return nil, err
	}
	w := &Writer{dir: dir, pid: os.Getpid(), now: time.Now}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("spool: read %s: %w", dir, err)
	}
	for _, e := range ents {
		name := strings.TrimPrefix(e.Name(), TempPrefix)
		if v, ok := nameNanos(name); ok && v > w.last {
			w.last = v
		}
	}
	return w, nil
}

// Write stores msg durably: when it returns nil the record survives a crash
// or power loss. The seq field is always written as 0.
func (w *Writer) Write(msg *agentpb.AgentMessage) (string, error) {
	return w.write(msg, true)
}

// WriteDeferred stores msg with its data fsync'd and atomically visible to
// readers, but defers the directory fsync to the next Write or Sync: after a
// power loss the record may be missing but never partial. The runner uses it
// for log chunks.
func (w *Writer) WriteDeferred(msg *agentpb.AgentMessage) (string, error) {
	return w.write(msg, false)
}

// Sync makes every record written so far durable.
func (w *Writer) Sync() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.syncLocked()
}

func (w *Writer) syncLocked() error {
	if !w.dirty {
		return nil
	}
	if err := atomicfile.SyncDir(w.dir); err != nil {
		return fmt.Errorf("spool: sync %s: %w", w.dir, err)
	}
	w.dirty = false
	return nil
}

func encodeRecord(msg *agentpb.AgentMessage) ([]byte, error) {
	if msg == nil || msg.GetBody() == nil {
		return nil, errors.New("spool: empty record")
	}
	if msg.GetSeq() != 0 {
		msg = proto.Clone(msg).(*agentpb.AgentMessage)
		msg.Seq = 0
	}
	data, err := proto.MarshalOptions{Deterministic: true}.Marshal(msg)
	if err != nil {
		return nil, fmt.Errorf("spool: encode record: %w", err)
	}
	if len(data) > MaxRecordBytes {
		return nil, fmt.Errorf("spool: record of %d bytes exceeds %d", len(data), MaxRecordBytes)
	}
	return data, nil
}

// nextName returns the next record name; w.mu is held.
func (w *Writer) nextName() string {
	ts := w.now().UnixNano()
	if ts <= w.last {
		ts = w.last + 1
	}
	w.last = ts
	return recordName(ts, w.pid, int(counter.Add(1)))
}

func (w *Writer) write(msg *agentpb.AgentMessage, durable bool) (string, error) {
	names, err := w.writeAll([]*agentpb.AgentMessage{msg}, durable)
	if len(names) == 1 {
		return names[0], err
	}
	return "", err
}

// WriteBatch stores msgs durably, in order, as one record file each. The
// files are written and fsync'd concurrently (the file system commits them
// together), renamed in order and covered by one directory fsync: much
// cheaper than one Write per record. On an error, a prefix of msgs may have
// been stored; the names of those are returned.
func (w *Writer) WriteBatch(msgs ...*agentpb.AgentMessage) ([]string, error) {
	return w.writeAll(msgs, true)
}

func (w *Writer) writeAll(msgs []*agentpb.AgentMessage, durable bool) ([]string, error) {
	data := make([][]byte, len(msgs))
	for i, m := range msgs {
		var err error
		if data[i], err = encodeRecord(m); err != nil {
			return nil, err
		}
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	names := make([]string, len(msgs))
	errs := make([]error, len(msgs))
	for i := range msgs {
		names[i] = w.nextName()
	}
	tmp := func(i int) string { return filepath.Join(w.dir, TempPrefix+names[i]) }
	if len(msgs) == 1 {
		errs[0] = writeSynced(tmp(0), data[0], FileMode, true)
	} else {
		var wg sync.WaitGroup
		sem := make(chan struct{}, 8)
		for i := range msgs {
			wg.Add(1)
			sem <- struct{}{}
			go func() {
				defer func() { <-sem; wg.Done() }()
				errs[i] = writeSynced(tmp(i), data[i], FileMode, true)
			}()
		}
		wg.Wait()
	}
	var firstErr error
	done := 0
	for i := range msgs {
		if firstErr == nil && errs[i] != nil {
			firstErr = fmt.Errorf("spool: write %s: %w", tmp(i), errs[i])
		}
		if firstErr != nil {
			_ = os.Remove(tmp(i))
			continue
		}
		if err := os.Rename(tmp(i), filepath.Join(w.dir, names[i])); err != nil {
			_ = os.Remove(tmp(i))
			firstErr = fmt.Errorf("spool: rename %s: %w", tmp(i), err)
			continue
		}
		w.dirty = true
		done++
	}
	if durable || firstErr != nil {
		if err := w.syncLocked(); err != nil && firstErr == nil {
			firstErr = err
		}
	}
	return names[:done], firstErr
}
