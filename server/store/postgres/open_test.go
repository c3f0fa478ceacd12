package postgres_test

import (
	"errors"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/drover/drover/server/store/postgres"
	"github.com/drover/drover/server/store/postgres/pgtest"
)

// Open migrates a fresh database to the last migration (numbered like
// SQLite's), opens a migrated one again, and refuses a newer schema.
func TestOpenMigratesAndRefusesNewerSchema(t *testing.T) {
	c := pgtest.Start(t)
	dsn := c.NewDatabase(t)
	st, err := postgres.Open(t.Context(), dsn, postgres.Pool{MaxConns: 2})
	if err != nil {
		t.Fatal(err)
	}
	v, err := st.SchemaVersion(t.Context())
	st.Close()
	pgFiles, _ := filepath.Glob("migrations/*.sql")
	sqliteFiles, _ := filepath.Glob("../sqlite/migrations/*.sql")
	last, _ := strconv.Atoi(strings.SplitN(filepath.Base(pgFiles[len(pgFiles)-1]), "_", 2)[0])
	if err != nil || v != last || len(pgFiles) != len(sqliteFiles) {
		t.Fatalf("schema version %d %v; %d migrations here, %d in SQLite", v, err, len(pgFiles), len(sqliteFiles))
	}
	for i := range pgFiles {
		if filepath.Base(pgFiles[i]) != filepath.Base(sqliteFiles[i]) {
			t.Errorf("migration %s here, %s in SQLite", pgFiles[i], sqliteFiles[i])
		}
	}
	st, err = postgres.Open(t.Context(), dsn, postgres.Pool{})
	if err != nil {
		t.Fatalf("reopen: %v", err)
	}
	st.Close()

	db := strings.TrimSuffix(dsn[strings.LastIndex(dsn, "/")+1:], "?sslmode=disable")
	c.Exec(t, db, `UPDATE drover_schema SET version=99`)
	_, err = postgres.Open(t.Context(), dsn, postgres.Pool{})
	if !errors.Is(err, postgres.ErrSchemaNewer) || !strings.Contains(err.Error(), "version 99") {
		t.Fatalf("open a newer schema: %v", err)
	}
}

// A bad DSN and an unreachable server are named in the error, without the
// password.
func TestOpenErrorsHideThePassword(t *testing.T) {
	for _, dsn := range []string{
		"postgres://drover:s3cretpw@127.0.0.1:1/drover?sslmode=disable&connect_timeout=2",
		"host=127.0.0.1 port=1 user=drover password=s3cretpw dbname=drover sslmode=disable connect_timeout=2",
		"postgres://drover:s3cretpw@127.0.0.1:notaport/drover",
		"host=127.0.0.1 password='s3cretpw",
	} {
		_, err := postgres.Open(t.Context(), dsn, postgres.Pool{})
		if err == nil {
			t.Fatalf("%s: opened", dsn)
		}
		msg := err.Error()
		t.Log(msg)
		if strings.Contains(msg, "s3cretpw") {
			t.Errorf("error shows the password: %s", msg)
		}
		if !strings.Contains(msg, "cannot reach PostgreSQL at 127.0.0.1:1") && !strings.Contains(msg, "not a valid PostgreSQL connection string") {
			t.Errorf("error does not say what is wrong: %s", msg)
		}
	}
}
