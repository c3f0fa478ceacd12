package server

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/drover/drover/internal/testkit"
	"github.com/drover/drover/server/pki"
	"github.com/drover/drover/server/store/postgres"
	"github.com/drover/drover/server/store/postgres/pgtest"
	"github.com/drover/drover/signing"
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

// replicaConfig is the configuration of one replica on dsn: a data dir of
// its own, the shared KEK.
func replicaConfig(t testing.TB, dsn, kek string) Config {
	cfg := testConfig(t.TempDir())
	cfg.Store.Driver, cfg.Store.DSN, cfg.KEKFile = "postgres", dsn, kek
	cfg.Store.MaxConns = 4
	return cfg
}

// newReplicas makes n servers on dsn at once (as replicas started together
// do) and returns them unstarted; prepare, if not nil, sees each before
// it runs.
func newReplicas(t *testing.T, n int, dsn, kek string, prepare func(i int, s *Server)) []*testServer {
	t.Helper()
	servers := make([]*Server, n)
	cfgs := make([]Config, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		cfgs[i] = replicaConfig(t, dsn, kek)
		wg.Add(1)
		go func() {
			defer wg.Done()
			servers[i], errs[i] = New(cfgs[i], testLogger(t), nil)
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("replica %d: %v", i, err)
		}
	}
	out := make([]*testServer, n)
	for i, s := range servers {
		if prepare != nil {
			prepare(i, s)
		}
		out[i] = runTestServer(t, s, cfgs[i], &testkit.Clock{})
	}
	return out
}

// Three replicas started at once on one database share one set of keys;
// a replica with another KEK is refused; an agent enrolled through A pulls
// and verifies its manifest from B and streams to C; a key rotation on A
// reaches the others.
func TestReplicasShareKeys(t *testing.T) {
	c := pgtest.Start(t)
	dsn := c.NewDatabase(t)
	kek := testKEKFile(t)
	rs := newReplicas(t, 3, dsn, kek, nil)
	a, b, cc := rs[0], rs[1], rs[2]
	s0, v0 := a.s.keys.Signer()
	for i, r := range rs {
		s, v := r.s.keys.Signer()
		if r.s.ca.Pin() != a.s.ca.Pin() || s.KeyID() != s0.KeyID() || v != v0 || r.admin != a.admin {
			t.Fatalf("replica %d has keys of its own: CA %s key %s v%d admin token equal %v", i, r.s.ca.Pin(), s.KeyID(), v, r.admin == a.admin)
		}
	}

	// Another KEK does not open the stored keys: refused, without key bytes.
	wrong := testKEKFile(t)
	_, err := New(replicaConfig(t, dsn, wrong), testLogger(t), nil)
	kekText, _ := os.ReadFile(kek)
	wrongText, _ := os.ReadFile(wrong)
	if err == nil || !strings.Contains(err.Error(), "does not open the server keys stored in the database") ||
		strings.Contains(err.Error(), strings.TrimSpace(string(kekText))) || strings.Contains(err.Error(), strings.TrimSpace(string(wrongText))) {
		t.Fatalf("a replica with another KEK: %v", err)
	}
	t.Logf("refused: %v", err)

	agent := a.jobAgent()
	agent.base = b.base
	acc, err := agent.pullManifest()
	if err != nil || len(acc.Manifest.Pipes) != 1 {
		t.Fatalf("the manifest from B of an agent enrolled through A: %v", err)
	}
	st, err := agent.openStream(cc.s.GRPCAddr())
	if err != nil {
		t.Fatal(err)
	}
	defer st.close()
	for seq := uint64(1); seq <= 4; seq++ {
		if err := st.stream.Send(replayRecord("rep", seq, 2)); err != nil {
			t.Fatal(err)
		}
	}
	if err := st.waitAck(4, 10*time.Second); err != nil {
		t.Fatalf("the stream to C: %v", err)
	}

	// Rotation on A: B and C sign with the new key within keySyncInterval.
	var rot struct {
		KeyID          string `json:"key_id"`
		KeyListVersion uint64 `json:"key_list_version"`
	}
	// drover-server keys rotate on A's host goes through A's API.
	env := []string{"DROVER_STORE_DRIVER=postgres", "DROVER_STORE_DSN=" + dsn, "DROVER_KEK_FILE=" + kek}
	var out, errOut bytes.Buffer
	if code := Main("test", []string{"keys", "rotate", "--data-dir", a.cfg.DataDir, "--http-addr", a.s.HTTPAddr()}, env, &out, &errOut); code != 0 {
		t.Fatalf("keys rotate: exit %d: %s", code, errOut.String())
	}
	rotated := time.Now()
	if _, err := fmt.Sscanf(out.String(), "manifest key %s now signs manifests (key list version %d)", &rot.KeyID, &rot.KeyListVersion); err != nil {
		t.Fatalf("keys rotate said %q: %v", out.String(), err)
	}
	if s, v := a.s.keys.Signer(); s.KeyID() != rot.KeyID || v != rot.KeyListVersion {
		t.Fatalf("A signs with %s v%d after keys rotate said %+v", s.KeyID(), v, rot)
	}
	for _, r := range []*testServer{b, cc} {
		testkit.WaitFor(t, 2*keySyncInterval, "the rotation on the other replicas", func() bool {
			s, v := r.s.keys.Signer()
			return s.KeyID() == rot.KeyID && v == rot.KeyListVersion
		})
	}
	t.Logf("key rotation on A seen by B and C after %v (sync every %v)", time.Since(rotated).Round(time.Millisecond), keySyncInterval)
	// drover-server tokens create on C's host writes to the database; an
	// agent enrolls with it through B.
	out.Reset()
	errOut.Reset()
	if code := Main("test", []string{"tokens", "create", "--data-dir", cc.cfg.DataDir}, env, &out, &errOut); code != 0 {
		t.Fatalf("tokens create: exit %d: %s", code, errOut.String())
	}
	if _, err := enroll(b.base, strings.TrimSpace(out.String()), "host-offline-token"); err != nil {
		t.Fatalf("enroll through B with a token made on C's host: %v", err)
	}
	// A change on B is compiled with the new key and verifies at the agent.
	b.putScriptPipe("job2", "echo two", map[string]string{"job": "yes"})
	acc, err = agent.pullManifest()
	if err != nil || len(acc.Manifest.Pipes) != 2 || acc.Manifest.KeyListVersion != rot.KeyListVersion {
		t.Fatalf("the manifest from B after the rotation on A: %+v %v", acc, err)
	}
}

// Two replicas compiling the same agents at once: every (agent, serial)
// is published once, serials never go back, and no change is lost (each
// manifest ends with every pipe's last version).
func TestReplicasManifestSerials(t *testing.T) {
	c := pgtest.Start(t)
	dsn := c.NewDatabase(t)
	var mu sync.Mutex
	published := map[string]map[uint64]int{} // agent -> serial -> times
	rs := newReplicas(t, 2, dsn, testKEKFile(t), func(_ int, s *Server) {
		comp := s.compiler.(compilerSeam).c
		orig := comp.published
		comp.published = func(id string, serial uint64) {
			mu.Lock()
			if published[id] == nil {
				published[id] = map[uint64]int{}
			}
			published[id][serial]++
			mu.Unlock()
			orig(id, serial)
		}
	})
	a := rs[0]
	tags := map[string]string{"fleet": "x"}
	var agents []*testAgent
	for range 6 {
		agents = append(agents, a.enrollAgent(tags))
	}
	db, err := postgres.Open(t.Context(), dsn, postgres.Pool{MaxConns: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()

	ctx, cancel := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	errc := make(chan error, 16)
	// Both replicas change pipes (each change compiles on its replica) and
	// force re-signing every agent, as secret changes do.
	for i, r := range rs {
		wg.Add(2)
		go func() {
			defer wg.Done()
			for v := range 8 {
				r.putScriptPipe(fmt.Sprintf("pipe-%d", i), fmt.Sprintf("echo %d", v), tags)
			}
		}()
		go func() {
			defer wg.Done()
			comp := r.s.compiler.(compilerSeam).c
			for range 15 {
				ids := make([]string, len(agents))
				for k, ag := range agents {
					ids[k] = ag.id
				}
				if _, err := comp.resign(ctx, ids); err != nil {
					errc <- err
					return
				}
			}
		}()
	}
	// A watcher reads the stored manifests all along.
	seen := map[string]map[uint64]string{} // agent -> serial -> digest
	last := map[string]uint64{}
	watchDone := make(chan struct{})
	go func() {
		defer close(watchDone)
		for ctx.Err() == nil {
			for _, ag := range agents {
				m, err := db.GetManifest(ctx, ag.id)
				if err != nil {
					continue
				}
				if m.Serial < last[ag.id] {
					errc <- fmt.Errorf("agent %s: serial %d after %d", ag.id, m.Serial, last[ag.id])
					return
				}
				last[ag.id] = m.Serial
				if seen[ag.id] == nil {
					seen[ag.id] = map[uint64]string{}
				}
				if d, ok := seen[ag.id][m.Serial]; ok && d != m.Digest {
					errc <- fmt.Errorf("agent %s: two manifests with serial %d", ag.id, m.Serial)
					return
				}
				seen[ag.id][m.Serial] = m.Digest
			}
		}
	}()
	wg.Wait()
	cancel()
	<-watchDone
	close(errc)
	for err := range errc {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	total := 0
	for id, serials := range published {
		for serial, n := range serials {
			if n != 1 {
				t.Errorf("agent %s: serial %d published %d times", id, serial, n)
			}
			total++
		}
	}
	// No change lost: without compiling again, each stored manifest holds
	// both pipes at their last version, and verifies.
	for _, ag := range agents {
		m, err := db.GetManifest(t.Context(), ag.id)
		if err != nil {
			t.Fatal(err)
		}
		acc, err := signing.AcceptManifest(m.Envelope, ag.trust, signing.State{AgentID: ag.id}, time.Now(), 0)
		if err != nil {
			t.Fatalf("agent %s: %v", ag.id, err)
		}
		if uint64(len(published[ag.id])) > m.Serial {
			t.Errorf("agent %s: %d serials published, the last is %d", ag.id, len(published[ag.id]), m.Serial)
		}
		for i := range rs {
			name := fmt.Sprintf("pipe-%d", i)
			p, err := db.GetPipe(t.Context(), name)
			if err != nil {
				t.Fatal(err)
			}
			found := false
			for _, mp := range acc.Manifest.Pipes {
				if mp.Name == name && mp.Version == p.Version {
					found = true
				}
			}
			if !found {
				t.Errorf("agent %s: serial %d lacks %s v%d: %+v", ag.id, m.Serial, name, p.Version, acc.Manifest.Pipes)
			}
		}
	}
	t.Logf("%d manifests published by two replicas compiling at once, each serial once; final serials %v", total, last)
}

// span is one stretch during which a replica ran a singleton.
type span struct {
	replica    int
	name       string
	start, end time.Time
}

// spans records singleton spans of several replicas.
type spans struct {
	mu   sync.Mutex
	open map[string]*span // replica/name -> running
	done []span
}

func (sp *spans) hook(replica int) func(name string, running bool) {
	return func(name string, running bool) {
		sp.mu.Lock()
		defer sp.mu.Unlock()
		key := fmt.Sprint(replica, "/", name)
		if running {
			sp.open[key] = &span{replica: replica, name: name, start: time.Now()}
			return
		}
		if s := sp.open[key]; s != nil {
			s.end = time.Now()
			sp.done = append(sp.done, *s)
			delete(sp.open, key)
		}
	}
}

// check fails on two replicas running the same singleton at once.
func (sp *spans) check(t *testing.T) map[string]int {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	all := append([]span(nil), sp.done...)
	for _, s := range sp.open {
		all = append(all, span{replica: s.replica, name: s.name, start: s.start, end: time.Now()})
	}
	count := map[string]int{}
	for i, x := range all {
		count[x.name]++
		for _, y := range all[i+1:] {
			if x.name == y.name && x.replica != y.replica && x.start.Before(y.end) && y.start.Before(x.end) {
				t.Errorf("%s ran on replicas %d (%v–%v) and %d (%v–%v) at once", x.name, x.replica, x.start.Format("15:04:05.000"), x.end.Format("15:04:05.000"),
					y.replica, y.start.Format("15:04:05.000"), y.end.Format("15:04:05.000"))
			}
		}
	}
	return count
}

// leaderOf waits until exactly one of rs (those not stopped) leads and
// returns its index.
func leaderOf(t *testing.T, rs []*testServer, stopped map[int]bool, timeout time.Duration) int {
	t.Helper()
	who := -1
	testkit.WaitFor(t, timeout, "one leader", func() bool {
		who = -1
		for i, r := range rs {
			if stopped[i] || !r.s.leader.leading() {
				continue
			}
			if who >= 0 {
				t.Fatalf("replicas %d and %d both lead", who, i)
			}
			who = i
		}
		return who >= 0
	})
	return who
}

// Three replicas: one runs the singletons; when its lock session is cut
// (the holder loses its connection) and when it stops, another takes over
// within 15 s, and no singleton ever runs on two replicas at once.
func TestReplicasLeaderTakeover(t *testing.T) {
	c := pgtest.Start(t)
	dsn := c.NewDatabase(t)
	sp := &spans{open: map[string]*span{}}
	started := time.Now()
	rs := newReplicas(t, 3, dsn, testKEKFile(t), func(i int, s *Server) { s.singletonHook = sp.hook(i) })
	stopped := map[int]bool{}
	holder := leaderOf(t, rs, stopped, 15*time.Second)
	t.Logf("replica %d leads %v after the start (grace %v)", holder, time.Since(started).Round(time.Millisecond), leaderGrace)
	// It stays the only one.
	for range 4 {
		time.Sleep(500 * time.Millisecond)
		if got := leaderOf(t, rs, stopped, time.Second); got != holder {
			t.Fatalf("leader moved from %d to %d without a fault", holder, got)
		}
	}
	var leaderMetric float64
	for _, r := range rs {
		var h struct{ Leader bool }
		r.adminOK("GET", "/healthz", nil, &h)
		if h.Leader != r.s.leader.leading() {
			t.Fatalf("/healthz says leader %v", h.Leader)
		}
		if h.Leader {
			leaderMetric++
		}
		m := r.doCT("GET", "/metrics", r.admin, "", nil)
		if want := fmt.Sprintf("\ndrover_leader %d\n", map[bool]int{false: 0, true: 1}[h.Leader]); m.code != 200 || !strings.Contains(string(m.body), want) {
			t.Fatalf("/metrics lacks %q", want)
		}
	}
	if leaderMetric != 1 {
		t.Fatalf("%v replicas report leading", leaderMetric)
	}

	// Fault: PostgreSQL ends the holder's lock session.
	pid := rs[holder].s.elector.session.(*postgres.SessionLock).BackendPID()
	if pid == 0 {
		t.Fatal("the holder has no lock session")
	}
	db, err := postgres.Open(t.Context(), dsn, postgres.Pool{MaxConns: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	cut := time.Now()
	if _, err := db.SQL().Exec(`SELECT pg_terminate_backend($1)`, int(pid)); err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(t, 5*time.Second, "the holder to stop its singletons", func() bool { return !rs[holder].s.leader.leading() })
	stoppedAfter := time.Since(cut)
	next := leaderOf(t, rs, stopped, 15*time.Second)
	took := time.Since(cut)
	t.Logf("lock session of replica %d ended: it stopped its singletons after %v; replica %d leads after %v", holder, stoppedAfter.Round(time.Millisecond), next, took.Round(time.Millisecond))
	if took > 15*time.Second {
		t.Fatalf("takeover after %v", took)
	}

	// Fault: the holder stops.
	down := time.Now()
	rs[next].stop()
	stopped[next] = true
	third := leaderOf(t, rs, stopped, 15*time.Second)
	took = time.Since(down)
	t.Logf("replica %d stopped; replica %d leads after %v", next, third, took.Round(time.Millisecond))
	if took > 15*time.Second {
		t.Fatalf("takeover after %v", took)
	}
	time.Sleep(time.Second)
	counts := sp.check(t)
	for _, name := range []string{"resign", "retention", "monitor", "notify"} {
		if counts[name] < 3 {
			t.Errorf("%s ran %d times, want once per term (3)", name, counts[name])
		}
	}
	t.Logf("singleton spans: %v", counts)
}

// drover-server kek rewrap seals the stored keys with a new KEK while no
// replica runs: afterwards the new KEK opens the same keys and the old one
// is refused.
func TestReplicasKEKRewrap(t *testing.T) {
	c := pgtest.Start(t)
	dsn := c.NewDatabase(t)
	oldKEK, newKEK := testKEKFile(t), testKEKFile(t)
	cfg := replicaConfig(t, dsn, oldKEK)
	ts := startServer(t, func(c *Config) { *c = cfg })
	pin := ts.s.ca.Pin()
	signer, _ := ts.s.keys.Signer()
	agent := ts.jobAgent()
	env := []string{"DROVER_STORE_DRIVER=postgres", "DROVER_STORE_DSN=" + dsn, "DROVER_KEK_FILE=" + oldKEK}
	rewrap := func(env []string) (int, string) {
		var out, errOut bytes.Buffer
		code := Main("test", []string{"kek", "rewrap", "--data-dir", t.TempDir(), "--new", newKEK}, env, &out, &errOut)
		return code, out.String() + errOut.String()
	}
	testkit.WaitFor(t, 10*time.Second, "the replica's lock session", func() bool {
		return ts.s.elector.session.(*postgres.SessionLock).BackendPID() != 0
	})
	if code, out := rewrap(env); code != 1 || !strings.Contains(out, "replicas are running on this database") {
		t.Fatalf("rewrap with a replica running: exit %d: %s", code, out)
	}
	ts.stop()
	if code, out := rewrap([]string{"DROVER_STORE_DRIVER=postgres", "DROVER_STORE_DSN=" + dsn, "DROVER_KEK_FILE=" + testKEKFile(t)}); code != 1 || !strings.Contains(out, "does not open the stored keys") {
		t.Fatalf("rewrap with a wrong current KEK: exit %d: %s", code, out)
	}
	if code, out := rewrap(env); code != 0 || !strings.Contains(out, "server keys sealed with KEK") {
		t.Fatalf("rewrap: exit %d: %s", code, out)
	}
	if _, err := New(replicaConfig(t, dsn, oldKEK), testLogger(t), nil); err == nil || !strings.Contains(err.Error(), "does not open the server keys") {
		t.Fatalf("the old KEK after rewrap: %v", err)
	}
	cfg.KEKFile = newKEK
	ts = startServer(t, func(c *Config) { *c = cfg })
	if s, _ := ts.s.keys.Signer(); ts.s.ca.Pin() != pin || s.KeyID() != signer.KeyID() {
		t.Fatal("the keys changed with the KEK")
	}
	agent.base = ts.base
	if _, err := agent.pullManifest(); err != nil {
		t.Fatalf("the agent after the rewrap: %v", err)
	}
}

// With several replicas only the leader decides placement: a placement:
// one pipe put through a replica that does not lead gets no holder from
// that replica's compile, the leader's leases loop chooses one, and from
// then on every compile on either replica keeps exactly that holder.
func TestReplicasPlacementOnLeader(t *testing.T) {
	c := pgtest.Start(t)
	dsn, kek := c.NewDatabase(t), testKEKFile(t)
	var rs []*testServer
	for range 2 {
		cfg := replicaConfig(t, dsn, kek)
		cfg.Placement.Lease, cfg.Placement.SkewMargin = 20*time.Second, 5*time.Second
		s, err := New(cfg, testLogger(t), nil)
		if err != nil {
			t.Fatal(err)
		}
		rs = append(rs, runTestServer(t, s, cfg, &testkit.Clock{}))
	}
	testkit.WaitFor(t, 30*time.Second, "a leader", func() bool { return rs[0].s.leader.leading() || rs[1].s.leader.leading() })
	lead, follow := rs[0], rs[1]
	if !lead.s.leader.leading() {
		lead, follow = follow, lead
	}
	f := &placementFleet{ts: follow, agents: map[string]*testAgent{}, streams: map[string]*testStream{}}
	for range 3 {
		a := follow.enrollAgent(map[string]string{"role": "db"})
		f.agents[a.id] = a
		f.streams[a.id] = a.mustStream(t)
	}
	f.putOne("nightly")
	if hs, _ := f.holders("nightly"); len(hs) != 0 {
		t.Fatalf("the replica that does not lead placed the pipe itself: held by %v", hs)
	}
	var holder string
	testkit.WaitFor(t, 30*time.Second, "the leader to choose a holder", func() bool {
		hs, _ := f.holders("nightly")
		if len(hs) > 1 {
			t.Fatalf("two holders: %v", hs)
		}
		if len(hs) == 1 {
			holder = hs[0]
		}
		return holder != ""
	})
	// Changes through either replica keep the one holder.
	for i := range 6 {
		via := []*testServer{follow, lead}[i%2]
		spec := map[string]any{"schedule": "*/5 * * * *", "script": fmt.Sprintf("echo %d\n", i), "placement": "one",
			"targets": map[string]any{"tags": map[string]string{"role": "db"}}}
		via.adminOK("PUT", "/api/v1/pipes/nightly", map[string]any{"spec": spec}, nil)
		if hs, _ := f.holders("nightly"); len(hs) != 1 || hs[0] != holder {
			t.Fatalf("after change %d through replica %d: held by %v, want only %s", i, i%2, hs, holder)
		}
	}
}
