package sqlite_test

import (
	"path/filepath"
	"testing"

	"github.com/drover/drover/server/store"
	"github.com/drover/drover/server/store/sqlite"
	"github.com/drover/drover/server/store/storetest"
)

// The SQLite store passes the store conformance suite.
func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) store.Store {
		st, err := sqlite.Open(t.Context(), filepath.Join(t.TempDir(), "server.db"), "normal")
		if err != nil {
			t.Fatal(err)
		}
		return st
	})
}
