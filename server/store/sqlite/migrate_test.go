package sqlite

import (
	"bytes"
	"database/sql"
	"io/fs"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/drover/drover/api"
	"github.com/drover/drover/server/store"
)

// A database made by an earlier schema version is migrated in place.
func TestMigrationsUpgradeExistingDatabase(t *testing.T) {
	const machineA = "0123456789abcdef0123456789abcdef"
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
		VALUES('agt-1', 3, 'h', 'sha256:x', x'7b7d', 1, 2, 1);
		INSERT INTO agents(id, hostname, created_at, updated_at, cert_serial) VALUES('agt-1', 'h1', 1, 1, 's1');
		INSERT INTO runs(id, agent_id, pipe, status, created_at, updated_at) VALUES('run-1', 'agt-1', 'job', 'running', 1, 1)`); err != nil {
		t.Fatal(err)
	}
	db.Close()

	st, err := Open(t.Context(), path, "full")
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
	last, _ := strconv.Atoi(strings.SplitN(strings.TrimPrefix(files[len(files)-1], "migrations/"), "_", 2)[0])
	if v != last || v < 3 {
		t.Fatalf("user_version %d, want %d (the last migration)", v, len(files))
	}
	// 0004: old runs and agents read with the new fields empty, and
	// binding works.
	if r, err := st.GetRun(t.Context(), "run-1"); err != nil || r.Reason != "" || r.Attempts != 0 || r.Status != api.StatusRunning {
		t.Fatalf("old run after migrating: %+v %v", r, err)
	}
	if mid, err := st.BindMachine(t.Context(), "agt-1", machineA, time.Now()); err != nil || mid != machineA {
		t.Fatalf("bind on a migrated agent: %q %v", mid, err)
	}
	if a, err := st.GetAgent(t.Context(), "agt-1"); err != nil || a.MachineID != machineA || a.Hostname != "h1" || a.ManifestExpired {
		t.Fatalf("old agent after migrating: %+v %v", a, err)
	}
	// 0003: API tokens and the audit log work on the migrated database.
	if err := st.AddAudit(t.Context(), &store.AuditEntry{ActorID: "a", ActorName: "a", Role: "admin", Action: "x", Target: "y"}); err != nil {
		t.Fatal(err)
	}
}
