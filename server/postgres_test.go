package server

import (
	"bytes"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/drover/drover/api"
	"github.com/drover/drover/manifest"
	"github.com/drover/drover/server/store"
	"github.com/drover/drover/server/store/postgres"
	"github.com/drover/drover/server/store/postgres/pgtest"
)

// The whole server on PostgreSQL (store.driver postgres): enroll an agent,
// apply a pipe, pull its manifest, ingest runs over the stream (replaying
// part of it after a dropped connection), and read runs and logs back
// through the API.
func TestPostgresServerFlow(t *testing.T) {
	c := pgtest.Start(t)
	dsn := c.NewDatabase(t)
	kek := testKEKFile(t)
	ts := startServer(t, func(cfg *Config) {
		cfg.Store.Driver, cfg.Store.DSN = "postgres", dsn
		cfg.Store.MaxConns = 4
		cfg.KEKFile = kek
	})
	if _, ok := ts.s.store.(*cachedStore).Store.(*postgres.DB); !ok {
		t.Fatalf("the server's store is %T, want the PostgreSQL store", ts.s.store.(*cachedStore).Store)
	}
	a := ts.jobAgent()
	acc, err := a.pullManifest()
	if err != nil {
		t.Fatal(err)
	}
	if acc.Manifest.Serial == 0 || len(acc.Manifest.Pipes) != 1 {
		t.Fatalf("manifest: serial %d, %d pipes", acc.Manifest.Serial, len(acc.Manifest.Pipes))
	}

	const perRun, nRuns = 3, 4
	total := uint64(nRuns * (perRun + 2))
	st, err := a.openStream("")
	if err != nil {
		t.Fatal(err)
	}
	half := total / 2
	for seq := uint64(1); seq <= half; seq++ {
		if err := st.stream.Send(replayRecord("pg", seq, perRun)); err != nil {
			t.Fatal(err)
		}
	}
	if err := st.waitAck(half, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	st.close()
	// The agent replays everything after a reconnect: nothing is stored twice.
	st, err = a.openStream("")
	if err != nil {
		t.Fatal(err)
	}
	defer st.close()
	for seq := uint64(1); seq <= total; seq++ {
		if err := st.stream.Send(replayRecord("pg", seq, perRun)); err != nil {
			t.Fatal(err)
		}
	}
	if err := st.waitAck(total, 10*time.Second); err != nil {
		t.Fatal(err)
	}

	var runs api.RunList
	ts.adminOK("GET", "/api/v1/runs?pipe=job&agent="+a.id, nil, &runs)
	if len(runs.Runs) != nRuns {
		t.Fatalf("%d runs listed, want %d: %+v", len(runs.Runs), nRuns, runs.Runs)
	}
	for _, r := range runs.Runs {
		if r.Status != api.StatusSucceeded || r.AgentID != a.id || r.Pipe != "job" {
			t.Errorf("run %+v", r)
		}
	}
	ts.adminOK("GET", "/api/v1/runs?limit=2", nil, &runs)
	if len(runs.Runs) != 2 || runs.NextCursor == "" {
		t.Fatalf("a page of 2: %d runs, cursor %q", len(runs.Runs), runs.NextCursor)
	}
	id := "pg-00001"
	r := ts.doCT("GET", "/api/v1/runs/"+id+"/logs", ts.admin, "", nil, "Accept", "text/plain")
	if r.code != 200 || string(r.body) != expectedLog(id, perRun) {
		t.Fatalf("logs of %s: %d %q, want %q", id, r.code, r.body, expectedLog(id, perRun))
	}
	var bytesLogged int
	if err := ts.s.store.(*cachedStore).Store.(*postgres.DB).SQL().QueryRow(
		`SELECT COALESCE(SUM(log_bytes),0) FROM runs WHERE agent_id=$1`, a.id).Scan(&bytesLogged); err != nil {
		t.Fatal(err)
	}
	if want := nRuns * len(expectedLog(id, perRun)); bytesLogged != want {
		t.Fatalf("log_bytes total %d, want %d: a replayed chunk was counted twice", bytesLogged, want)
	}

	// The command-line token commands write into the configured store, not
	// into a SQLite file of the data dir.
	env := []string{"DROVER_STORE_DRIVER=postgres", "DROVER_STORE_DSN=" + dsn}
	var out, errOut bytes.Buffer
	if code := Main("test", []string{"api-tokens", "create", "--data-dir", ts.cfg.DataDir, "--name", "pg-rescue", "--role", "admin"}, env, &out, &errOut); code != 0 {
		t.Fatalf("api-tokens create on PostgreSQL: %d %s", code, errOut.String())
	}
	var who api.WhoAmI
	ts.as(strings.TrimSpace(out.String()), 200, "GET", "/api/v1/whoami", nil, &who)
	if who.Name != "pg-rescue" {
		t.Fatalf("whoami with a CLI token made on PostgreSQL: %+v", who)
	}
	out.Reset()
	if code := Main("test", []string{"tokens", "create", "--data-dir", ts.cfg.DataDir, "--ttl", "10m"}, env, &out, &errOut); code != 0 {
		t.Fatalf("tokens create on PostgreSQL: %d %s", code, errOut.String())
	}
	b, err := enroll(ts.base, strings.TrimSpace(out.String()), "pg-cli-host")
	if err != nil {
		t.Fatalf("enroll with a CLI token made on PostgreSQL: %v", err)
	}
	b.close()
}

// The PostgreSQL settings are validated with their field paths, and a
// server whose database is unreachable says so without the password.
func TestPostgresConfig(t *testing.T) {
	cfg, err := LoadConfig("", false, []string{"DROVER_STORE_DRIVER=postgres", "DROVER_STORE_DSN=postgres://drover:pw@db/drover",
		"DROVER_STORE_MAX_CONNS=8", "DROVER_STORE_MAX_CONN_IDLE_TIME=5m"})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Store.Driver != "postgres" || cfg.Store.DSN != "postgres://drover:pw@db/drover" || cfg.Store.MaxConns != 8 ||
		cfg.Store.MaxConnIdleTime != 5*time.Minute || cfg.Store.MaxConnLifetime != time.Hour {
		t.Fatalf("store config from the environment: %+v", cfg.Store)
	}
	for _, tc := range []struct {
		set  func(*StoreConfig)
		want string
	}{
		{func(s *StoreConfig) { s.Driver = "mysql" }, `store.driver: "mysql" is not one of sqlite, postgres`},
		{func(s *StoreConfig) { s.Driver = "postgres" }, "store.dsn: is required with store.driver postgres"},
		{func(s *StoreConfig) { s.DSN = "postgres://x@y/z" }, "store.dsn: is only used with store.driver postgres"},
		{func(s *StoreConfig) { s.MaxConns = 0 }, "store.max_conns: must be at least 1"},
		{func(s *StoreConfig) { s.MinConns = 20 }, "store.min_conns: 20 is more than store.max_conns (16)"},
		{func(s *StoreConfig) { s.MaxConnLifetime = 0 }, "store.max_conn_lifetime: must be at least 1s"},
		{func(s *StoreConfig) { s.MaxConnIdleTime = time.Millisecond }, "store.max_conn_idle_time: must be at least 1s"},
	} {
		bad := DefaultConfig()
		tc.set(&bad.Store)
		var ve *manifest.ValidationError
		if err := bad.Validate(); !errors.As(err, &ve) || len(ve.Problems) != 1 || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want %q", bad.Store, err, tc.want)
		}
	}

	kc, err := LoadConfig("", false, []string{"DROVER_KEK_FILE=/srv/kek"})
	if err != nil || kc.KEKFile != "/srv/kek" || DefaultConfig().KEKFile != "/etc/drover-server/kek" {
		t.Fatalf("kek_file from the environment: %q %v", kc.KEKFile, err)
	}
	for kek, want := range map[string]string{"kek": `kek_file: "kek" must be an absolute path`, "": "kek_file: required"} {
		bad := DefaultConfig()
		bad.KEKFile = kek
		if err := bad.Validate(); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("kek_file %q: %v, want %q", kek, err, want)
		}
	}

	cfg = testConfig(t.TempDir())
	cfg.Store.Driver = "postgres"
	cfg.Store.DSN = fmt.Sprintf("postgres://drover:s3cretpw@127.0.0.1:%d/drover?connect_timeout=2", 1)
	cfg.KEKFile = filepath.Join(t.TempDir(), "kek")
	if _, err := New(cfg, testLogger(t), nil); err == nil || !strings.Contains(err.Error(), "kek_file "+cfg.KEKFile+" does not exist") {
		t.Fatalf("New without a KEK file: %v", err)
	}
	cfg.KEKFile = testKEKFile(t)
	_, err = New(cfg, testLogger(t), nil)
	if err == nil || strings.Contains(err.Error(), "s3cretpw") || !strings.Contains(err.Error(), "cannot reach PostgreSQL at 127.0.0.1:1") {
		t.Fatalf("New on an unreachable database: %v", err)
	}
}

// drover-server migrate --to copies a SQLite data dir's database into
// PostgreSQL: a server started on it with the same data dir serves the same
// agents, pipes, runs, logs, audit log and notification progress, and its
// agents keep working.
func TestPostgresMigrateFromSQLite(t *testing.T) {
	c := pgtest.Start(t)
	dsn := c.NewDatabase(t)
	ts := startServer(t)
	a := ts.jobAgent()
	st, err := a.openStream("")
	if err != nil {
		t.Fatal(err)
	}
	const perRun = 2
	for seq := uint64(1); seq <= 3*(perRun+2); seq++ {
		if err := st.stream.Send(replayRecord("mig", seq, perRun)); err != nil {
			t.Fatal(err)
		}
	}
	if err := st.waitAck(3*(perRun+2), 10*time.Second); err != nil {
		t.Fatal(err)
	}
	st.close()
	ctx := t.Context()
	if err := ts.s.store.RouteEvents(ctx, 42, map[string]string{"run/x/job": "failing"}, nil); err != nil {
		t.Fatal(err)
	}
	var runsBefore api.RunList
	ts.adminOK("GET", "/api/v1/runs", nil, &runsBefore)
	audit, err := ts.s.store.ListAudit(ctx, store.AuditFilter{Limit: 1000})
	if err != nil || len(audit) == 0 {
		t.Fatalf("audit before: %d entries, %v", len(audit), err)
	}
	dir := ts.cfg.DataDir
	kek := filepath.Join(t.TempDir(), "kek")
	env := []string{"DROVER_KEK_FILE=" + kek}

	// Refused without the KEK, then while the server runs (it holds the
	// data dir).
	var out, errOut bytes.Buffer
	if code := Main("test", []string{"migrate", "--data-dir", dir, "--to", dsn}, env, &out, &errOut); code != 1 || !strings.Contains(errOut.String(), "kek generate") {
		t.Fatalf("migrate without a KEK: exit %d: %s", code, errOut.String())
	}
	out.Reset()
	errOut.Reset()
	if code := Main("test", []string{"kek", "generate"}, env, &out, &errOut); code != 0 || !strings.Contains(out.String(), "wrote a new key-encryption key to "+kek) {
		t.Fatalf("kek generate: exit %d: %s %s", code, out.String(), errOut.String())
	}
	if code := Main("test", []string{"kek", "generate", "--out", kek}, nil, &out, &errOut); code != 1 || !strings.Contains(errOut.String(), "exists") {
		t.Fatalf("kek generate over the file: exit %d: %s", code, errOut.String())
	}
	out.Reset()
	errOut.Reset()
	if code := Main("test", []string{"migrate", "--data-dir", dir, "--to", dsn}, env, &out, &errOut); code != 1 || !strings.Contains(errOut.String(), "stop drover-server first") {
		t.Fatalf("migrate while serving: exit %d: %s", code, errOut.String())
	}
	ts.stop()
	out.Reset()
	errOut.Reset()
	if code := Main("test", []string{"migrate", "--data-dir", dir, "--to", dsn}, env, &out, &errOut); code != 0 {
		t.Fatalf("migrate: exit %d: %s", code, errOut.String())
	}
	if !strings.Contains(out.String(), "log_chunks") || !strings.Contains(out.String(), "store.driver: postgres") || !strings.Contains(out.String(), "keys sealed with the KEK") {
		t.Fatalf("migrate output: %s", out.String())
	}
	// A second copy into the now non-empty database is refused.
	out.Reset()
	errOut.Reset()
	if code := Main("test", []string{"migrate", "--data-dir", dir, "--to", dsn}, env, &out, &errOut); code != 1 || !strings.Contains(errOut.String(), "not empty") {
		t.Fatalf("migrate into a full database: exit %d: %s", code, errOut.String())
	}

	// The keys are in the database, sealed: nothing private in the clear.
	pgdb, err := postgres.Open(ctx, dsn, postgres.Pool{MaxConns: 1})
	if err != nil {
		t.Fatal(err)
	}
	keys, err := pgdb.ServerKeys(ctx)
	pgdb.Close()
	if err != nil || len(keys) < 7 {
		t.Fatalf("server keys after migrating: %d, %v", len(keys), err)
	}
	for id, k := range keys {
		if bytes.Contains(k.Sealed, []byte("PRIVATE KEY")) {
			t.Fatalf("server key %s is stored in the clear", id)
		}
	}
	oldSigner, oldVersion := ts.s.keys.Signer()
	oldPin := ts.s.ca.Pin()
	// The replica on the migrated host uses a data dir of its own.
	pg := startServer(t, func(cfg *Config) {
		cfg.Store.Driver, cfg.Store.DSN = "postgres", dsn
		cfg.KEKFile = kek
	})
	if s, v := pg.s.keys.Signer(); pg.s.ca.Pin() != oldPin || s.KeyID() != oldSigner.KeyID() || v < oldVersion {
		t.Fatalf("keys after migrating: CA %s key %s v%d, before CA %s key %s v%d", pg.s.ca.Pin(), s.KeyID(), v, oldPin, oldSigner.KeyID(), oldVersion)
	}
	var runsAfter api.RunList
	pg.adminOK("GET", "/api/v1/runs", nil, &runsAfter)
	if len(runsAfter.Runs) != 3 || fmt.Sprint(runsAfter.Runs) != fmt.Sprint(runsBefore.Runs) {
		t.Fatalf("runs after migrating:\n%v\nbefore:\n%v", runsAfter.Runs, runsBefore.Runs)
	}
	r := pg.doCT("GET", "/api/v1/runs/mig-00002/logs", pg.admin, "", nil, "Accept", "text/plain")
	if r.code != 200 || string(r.body) != expectedLog("mig-00002", perRun) {
		t.Fatalf("logs after migrating: %d %q", r.code, r.body)
	}
	cursor, state, err := pg.s.store.NotifyProgress(ctx)
	if err != nil || cursor != 42 || state["run/x/job"] != "failing" {
		t.Fatalf("notify progress after migrating: %d %v %v", cursor, state, err)
	}
	after, err := pg.s.store.ListAudit(ctx, store.AuditFilter{Limit: 1000})
	if err != nil || len(after) < len(audit) {
		t.Fatalf("audit after: %d entries (had %d), %v", len(after), len(audit), err)
	}
	e := &store.AuditEntry{ActorID: "t", ActorName: "t", Role: "admin", Action: "test", Target: "x"}
	if err := pg.s.store.AddAudit(ctx, e); err != nil || e.ID <= audit[0].ID {
		t.Fatalf("a new audit entry after migrating has id %d (last copied %d): %v", e.ID, audit[0].ID, err)
	}
	// The agent, its certificate and its manifest state carry over.
	a.base, a.grpcAddr = pg.base, pg.s.GRPCAddr()
	if _, err := a.pullManifest(); err != nil {
		t.Fatalf("the agent after migrating: %v", err)
	}
	st, err = a.openStream("")
	if err != nil {
		t.Fatal(err)
	}
	defer st.close()
	if err := st.stream.Send(replayRecord("mig", 1, perRun)); err != nil {
		t.Fatal(err)
	}
	if err := st.waitAck(1, 10*time.Second); err != nil {
		t.Fatal(err)
	}
}
