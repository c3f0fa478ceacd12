package server

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"

	"github.com/drover/drover/internal/atomicfile"
)

// ensureDataDir creates dir with mode 0700, or checks that an existing one
// is a directory and tightens it to 0700.
func ensureDataDir(dir string) error {
	if err := atomicfile.PrivateDir(dir); err != nil {
		return fmt.Errorf("data dir: %w", err)
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
