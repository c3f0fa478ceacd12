package server

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
)

// ensureDataDir creates dir with mode 0700, or checks that an existing one
// is a directory not writable by group or others, and tightens it to 0700.
func ensureDataDir(dir string) error {
	fi, err := os.Stat(dir)
	if errors.Is(err, fs.ErrNotExist) {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return fmt.Errorf("create data dir: %w", err)
		}
		return os.Chmod(dir, 0o700)
	}
	if err != nil {
		return fmt.Errorf("data dir: %w", err)
	}
	if !fi.IsDir() {
		return fmt.Errorf("data dir %s is not a directory", dir)
	}
	if fi.Mode().Perm() != 0o700 {
		if err := os.Chmod(dir, 0o700); err != nil {
			return fmt.Errorf("data dir: %w", err)
		}
	}
	return nil
}

// dirLock is an exclusive advisory lock on a data dir, held by a running
// server so that two servers never share one, and so that `keys rotate` knows
// whether to go through the API.
type dirLock struct{ f *os.File }

// errLocked: another process holds the data dir lock.
var errLocked = errors.New("data dir is locked by a running server")

func lockDataDir(dir string) (*dirLock, error) {
	f, err := os.OpenFile(filepath.Join(dir, "server.lock"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("lock data dir: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("%s: %w", dir, errLocked)
		}
		return nil, fmt.Errorf("lock data dir: %w", err)
	}
	return &dirLock{f: f}, nil
}

func (l *dirLock) release() {
	if l != nil && l.f != nil {
		syscall.Flock(int(l.f.Fd()), syscall.LOCK_UN)
		l.f.Close()
		l.f = nil
	}
}
