package testkit

import (
	"errors"
	"net"
	"os"
	"path/filepath"
	"testing"
)

// ShortTempDir is a temporary directory with a short path (below os.TempDir,
// named prefix*), removed when the test ends: unix socket paths are limited
// to about 100 bytes, which t.TempDir's long names can exceed.
func ShortTempDir(t testing.TB, prefix string) string {
	t.Helper()
	d, err := os.MkdirTemp("", prefix)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	return d
}

// ModuleRoot is the directory holding go.mod, found from the working
// directory upwards (a test's working directory is its package's).
func ModuleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("no go.mod above " + dir)
		}
		dir = parent
	}
}

// FreePort returns a TCP port free on 127.0.0.1 right now (for a process
// that must be told its port rather than report one it chose).
func FreePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}
