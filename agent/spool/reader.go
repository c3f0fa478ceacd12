package spool

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/drover/drover/internal/atomicfile"
	agentpb "github.com/drover/drover/proto"
	"google.golang.org/protobuf/proto"
)

// Record is one complete record read from a spool.
type Record struct {
	Name string                // file name inside the spool directory, unique and ordered
	Msg  *agentpb.AgentMessage // seq 0
}

// BadPrefix starts the name a reader gives a file that has a record name but
// does not hold a valid run record (it is kept for inspection and ignored).
const BadPrefix = ".bad-"

// DefaultStaleTemp is how old a temp file must be before a reader removes it
// as left over by a writer that crashed.
const DefaultStaleTemp = time.Hour

// Reader drains a spool directory in order. The zero value of every field
// but Dir is a sensible default.
type Reader struct {
	Dir string
	// Pipe, when set, is the only pipe name RunStarted and RunFinished
	// records may carry; others are set aside as bad (a runner may write only
	// for its own pipe).
	Pipe string
	// Batch is the most records handed to one DrainBatch callback (default 256).
	Batch int
	// StaleTemp is the age after which a temp file is removed (default 1 h).
	StaleTemp time.Duration
	// OnBad is told about each file set aside as bad. Optional.
	OnBad func(name string, err error)
}

// Drain hands every complete record in dir to fn, oldest first, and deletes
// each record's file after fn returned nil for it. It stops at the first
// error from fn (that record and later ones stay) and returns how many
// records were committed.
func Drain(dir string, fn func(Record) error) (int, error) {
	r := Reader{Dir: dir, Batch: 1}
	return r.DrainBatch(func(recs []Record) error { return fn(recs[0]) })
}

// List returns the names of the complete records in dir, in order.
func List(dir string) ([]string, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, nil
		}
		return nil, err
	}
	var names []string
	for _, e := range ents {
		if IsRecordName(e.Name()) {
			names = append(names, e.Name())
		}
	}
	sort.Strings(names)
	return names, nil
}

// DrainBatch is Drain with up to r.Batch records per callback, so that the
// daemon can commit them in one transaction. Records of one batch are
// deleted together after fn returned nil.
func (r *Reader) DrainBatch(fn func([]Record) error) (int, error) {
	batch := r.Batch
	if batch <= 0 {
		batch = 256
	}
	r.removeStaleTemps()
	names, err := List(r.Dir)
	if err != nil {
		return 0, fmt.Errorf("spool: list %s: %w", r.Dir, err)
	}
	done := 0
	for len(names) > 0 {
		var recs []Record
		for len(names) > 0 && len(recs) < batch {
			name := names[0]
			names = names[1:]
			msg, err := r.read(name)
			switch {
			case errors.Is(err, fs.ErrNotExist):
				continue // drained concurrently
			case err != nil:
				r.setAside(name, err)
				continue
			}
			recs = append(recs, Record{Name: name, Msg: msg})
		}
		if len(recs) == 0 {
			continue
		}
		if err := fn(recs); err != nil {
			return done, err
		}
		for _, rec := range recs {
			if err := os.Remove(filepath.Join(r.Dir, rec.Name)); err != nil && !errors.Is(err, fs.ErrNotExist) {
				return done, fmt.Errorf("spool: remove %s: %w", rec.Name, err)
			}
			done++
		}
		if err := atomicfile.SyncDir(r.Dir); err != nil {
			return done, fmt.Errorf("spool: sync %s: %w", r.Dir, err)
		}
	}
	return done, nil
}

// read loads and checks one record file. It never follows a symlink and
// never blocks on a FIFO a hostile writer may have put there.
func (r *Reader) read(name string) (*agentpb.AgentMessage, error) {
	f, err := os.OpenFile(filepath.Join(r.Dir, name), os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if err != nil {
		if errors.Is(err, syscall.ELOOP) {
			return nil, errors.New("a symlink, not a record file")
		}
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !st.Mode().IsRegular() {
		return nil, errors.New("not a regular file")
	}
	if st.Size() > MaxRecordBytes {
		return nil, fmt.Errorf("%d bytes, more than %d", st.Size(), MaxRecordBytes)
	}
	data, err := io.ReadAll(io.LimitReader(f, MaxRecordBytes+1))
	if err != nil {
		return nil, err
	}
	msg := &agentpb.AgentMessage{}
	if err := proto.Unmarshal(data, msg); err != nil {
		return nil, fmt.Errorf("decode: %w", err)
	}
	msg.Seq = 0
	switch b := msg.GetBody().(type) {
	case *agentpb.AgentMessage_RunStarted:
		if b.RunStarted.GetRunId() == "" {
			return nil, errors.New("RunStarted without run id")
		}
		if r.Pipe != "" && b.RunStarted.GetPipe() != r.Pipe {
			return nil, fmt.Errorf("RunStarted for pipe %q in the spool of %q", b.RunStarted.GetPipe(), r.Pipe)
		}
	case *agentpb.AgentMessage_RunFinished:
		if b.RunFinished.GetRunId() == "" {
			return nil, errors.New("RunFinished without run id")
		}
		if r.Pipe != "" && b.RunFinished.GetPipe() != r.Pipe {
			return nil, fmt.Errorf("RunFinished for pipe %q in the spool of %q", b.RunFinished.GetPipe(), r.Pipe)
		}
	case *agentpb.AgentMessage_LogChunk:
		if b.LogChunk.GetRunId() == "" {
			return nil, errors.New("LogChunk without run id")
		}
	default:
		return nil, fmt.Errorf("not a run record (%T)", b)
	}
	return msg, nil
}

func (r *Reader) setAside(name string, cause error) {
	_ = os.Rename(filepath.Join(r.Dir, name), filepath.Join(r.Dir, BadPrefix+name))
	if r.OnBad != nil {
		r.OnBad(name, cause)
	}
}

func (r *Reader) removeStaleTemps() {
	stale := r.StaleTemp
	if stale <= 0 {
		stale = DefaultStaleTemp
	}
	ents, err := os.ReadDir(r.Dir)
	if err != nil {
		return
	}
	for _, e := range ents {
		if !strings.HasPrefix(e.Name(), TempPrefix) {
			continue
		}
		info, err := e.Info()
		if err != nil || time.Since(info.ModTime()) < stale {
			continue
		}
		_ = os.Remove(filepath.Join(r.Dir, e.Name()))
	}
}
