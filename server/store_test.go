package server

import (
	"bytes"
	"database/sql"
	"io/fs"
	"path/filepath"
	"testing"
)

// A database made by an earlier schema version is migrated in place.
func TestMigrationsUpgradeExistingDatabase(t *testing.T) {
	path := filepath.Join(t.TempDir(), "server.db")
	db, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	v1, err := migrations.ReadFile("migrations/0001_init.sql")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(string(v1) + `; PRAGMA user_version = 1;
		INSERT INTO manifests(agent_id, serial, content_hash, digest, envelope, issued_at, expires_at, key_list_version)
		VALUES('agt-1', 3, 'h', 'sha256:x', x'7b7d', 1, 2, 1)`); err != nil {
		t.Fatal(err)
	}
	db.Close()

	st, err := OpenSQLite(t.Context(), path, "full")
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	m, err := st.GetManifest(t.Context(), "agt-1")
	if err != nil || m.Serial != 3 || !bytes.Equal(m.Envelope, []byte("{}")) {
		t.Fatalf("after migrating: %+v %v", m, err)
	}
	var v int
	st.r.QueryRow("PRAGMA user_version").Scan(&v)
	files, _ := fs.Glob(migrations, "migrations/*.sql")
	if v != len(files) || v < 3 {
		t.Fatalf("user_version %d, want %d (the last migration)", v, len(files))
	}
	// 0003: API tokens and the audit log work on the migrated database.
	if err := st.AddAudit(t.Context(), &AuditEntry{ActorID: "a", ActorName: "a", Role: "admin", Action: "x", Target: "y"}); err != nil {
		t.Fatal(err)
	}
}
