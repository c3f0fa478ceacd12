package server

import (
	"path/filepath"
	"testing"

	"github.com/drover/drover/server/pki"
)

// testKEKFile writes a new KEK file and returns its path.
func testKEKFile(t testing.TB) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "kek")
	if _, err := pki.GenerateKEK(path); err != nil {
		t.Fatal(err)
	}
	return path
}
