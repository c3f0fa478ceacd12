// Package atomicfile replaces files so that a reader, or the next start
// after a crash, sees either the old content or the new one, complete:
// a temporary file in the same directory is written with its final mode
// (and owner), synced, renamed over the target, then the directory is
// synced. PrivateDir makes the 0700 data directories such files live in.
//
// Any package of this module may import it; it imports only the standard
// library.
package atomicfile

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
)

// Owner is a file's numeric owner and group.
type Owner struct{ UID, GID int }

// Options say how Options.Write writes. The zero value writes mode 0600.
type Options struct {
	// Perm is the file's exact mode, whatever the umask.
	Perm fs.FileMode
	// Owner, when set, is given to the file before it takes the target's
	// name (needs the privilege to chown).
	Owner *Owner
	// TempPrefix starts the temporary file's name (a random suffix
	// follows); the default is "." + the target's name + ".tmp-". A
	// caller that cleans up after a crash, or a reader that skips
	// half-written files, chooses its own.
	TempPrefix string
	// NoDirSync leaves the directory unsynced, for a caller that replaces
	// several files of one directory and calls SyncDir once.
	NoDirSync bool
}

// Write replaces path with data, mode perm (see the package comment).
func Write(path string, data []byte, perm fs.FileMode) error {
	return Options{Perm: perm}.Write(path, data)
}

// Write replaces path with data as o says. On error the target is
// untouched (unless only the directory sync failed) and no temporary file
// remains.
func (o Options) Write(path string, data []byte) (err error) {
	dir, base := filepath.Split(path)
	if dir == "" {
		dir = "."
	}
	prefix := o.TempPrefix
	if prefix == "" {
		prefix = "." + base + ".tmp-"
	}
	tmp, err := os.CreateTemp(dir, prefix+"*")
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	perm := o.Perm
	if perm == 0 {
		perm = 0o600
	}
	if err = tmp.Chmod(perm); err != nil {
		return err
	}
	if o.Owner != nil {
		if err = tmp.Chown(o.Owner.UID, o.Owner.GID); err != nil {
			return err
		}
	}
	if _, err = tmp.Write(data); err != nil {
		return err
	}
	if err = tmp.Sync(); err != nil {
		return err
	}
	if err = tmp.Close(); err != nil {
		return err
	}
	if err = os.Rename(tmp.Name(), path); err != nil {
		return err
	}
	if o.NoDirSync {
		return nil
	}
	return SyncDir(dir)
}

// SyncDir fsyncs a directory, making the renames and removals in it
// durable. A file system that cannot fsync directories (EINVAL, ENOTSUP)
// is not an error: nothing more can be done there.
func SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("sync %s: %w", dir, err)
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	if err == nil || errors.Is(err, syscall.EINVAL) || errors.Is(err, syscall.ENOTSUP) {
		return nil
	}
	return fmt.Errorf("sync %s: %w", dir, err)
}

// PrivateDir creates dir (and its parents) with mode 0700, or checks that
// an existing dir is a directory and tightens it to 0700: the data
// directories of the agent and the server hold keys.
func PrivateDir(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	st, err := os.Stat(dir)
	if err != nil {
		return err
	}
	if !st.IsDir() {
		return fmt.Errorf("%s is not a directory", dir)
	}
	if st.Mode().Perm() != 0o700 {
		return os.Chmod(dir, 0o700)
	}
	return nil
}
