// Package spool is the on-disk hand-over between `drover-agent run` (the
// runner, a short-lived process that may run as a dynamic or unprivileged
// user) and the agent daemon (root, or the agent's own user in user scope).
//
// Format. A spool is one directory. Every record is one file holding the
// protobuf encoding of one proto.AgentMessage with seq 0 (the daemon assigns
// sequence numbers when it moves the record into its outbox). Record files
// are named
//
//	<unix-nanos, 19 digits>-<pid, 10 digits>-<counter, 6 digits>.pb
//
// so that the lexical order of the names is the order one writer wrote them
// in (a writer never reuses or goes below a name already in the directory,
// even when the clock steps back). A record file is written as
// ".tmp-<name>" (0600, O_EXCL), fsync'd, renamed to <name>, and the directory
// is fsync'd; so a name that matches the pattern always holds a complete
// record. Everything else in the directory (temp files of a writer that
// crashed, the runner's lock and state files) is ignored by the reader;
// temp files older than StaleTemp are removed by it.
//
// The reader deletes a record file only after its callback returned nil,
// i.e. after the daemon committed the record to its own store. A crash
// between the commit and the delete yields the record again on the next
// Drain; the daemon de-duplicates by record name (see store.EnqueueSpooled)
// and the server upserts runs by run id and chunks by (run id, seq), so a
// record is reported exactly once.
//
// Imported by agent/runner (the writer) and the daemon (agent, the reader).
package spool

import (
	"fmt"
	"github.com/drover/drover/internal/atomicfile"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"syscall"
)

// DirMode and FileMode are the modes of spool directories and record files:
// only their owner (the runner's user) may read them; the daemon reads them
// as root or as that same user.
const (
	DirMode  os.FileMode = 0o700
	FileMode os.FileMode = 0o600
)

// TempPrefix starts the name of a record file that is still being written.
const TempPrefix = ".tmp-"

// Ext is the extension of record files.
const Ext = ".pb"

// MaxRecordBytes caps one record file; larger files are not records.
const MaxRecordBytes = 4 << 20

var nameRE = regexp.MustCompile(`^[0-9]{19}-[0-9]{10}-[0-9]{6}\.pb$`)

// IsRecordName reports whether name (a base name) is a complete record file.
func IsRecordName(name string) bool { return nameRE.MatchString(name) }

func recordName(nanos int64, pid int, n int) string {
	return fmt.Sprintf("%019d-%010d-%06d%s", nanos, pid, n%1000000, Ext)
}

// nameNanos returns the timestamp part of a record name.
func nameNanos(name string) (int64, bool) {
	if !IsRecordName(name) {
		return 0, false
	}
	v, err := strconv.ParseInt(name[:19], 10, 64)
	return v, err == nil
}

// EnsureDir creates dir (and its parents) with mode 0700 if it does not
// exist. An existing directory is left as it is.
func EnsureDir(dir string) error {
	if err := os.MkdirAll(dir, DirMode); err != nil {
		return fmt.Errorf("spool: create %s: %w", dir, err)
	}
	return nil
}

// WriteFileAtomic replaces path with data (see internal/atomicfile); its
// temporary file starts with TempPrefix, so a reader sweeps it if a crash
// leaves it behind.
func WriteFileAtomic(path string, data []byte, perm os.FileMode) error {
	return atomicfile.Options{Perm: perm, TempPrefix: TempPrefix + filepath.Base(path) + "."}.Write(path, data)
}

// writeSynced writes a new file and fsyncs it. With excl the file must not
// exist; otherwise an existing file is truncated.
func writeSynced(path string, data []byte, perm os.FileMode, excl bool) (err error) {
	flags := os.O_WRONLY | os.O_CREATE | os.O_TRUNC | syscall.O_NOFOLLOW
	if excl {
		flags |= os.O_EXCL
	}
	f, err := os.OpenFile(path, flags, perm)
	if err != nil {
		return err
	}
	defer func() {
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			_ = os.Remove(path)
		}
	}()
	if _, err = f.Write(data); err != nil {
		return err
	}
	return f.Sync()
}
