package postgres_test

import (
	"testing"

	"github.com/drover/drover/server/store"
	"github.com/drover/drover/server/store/postgres"
	"github.com/drover/drover/server/store/postgres/pgtest"
	"github.com/drover/drover/server/store/storetest"
)

// The PostgreSQL store passes the store conformance suite.
func TestConformance(t *testing.T) {
	c := pgtest.Start(t)
	storetest.Run(t, func(t *testing.T) store.Store {
		st, err := postgres.Open(t.Context(), c.NewDatabase(t), postgres.Pool{})
		if err != nil {
			t.Fatal(err)
		}
		return st
	})
}
