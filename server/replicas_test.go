package server

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/drover/drover/api"
	"github.com/drover/drover/internal/testkit"
	"github.com/drover/drover/server/bus"
	"github.com/drover/drover/server/store/postgres/pgtest"

	agentpb "github.com/drover/drover/proto"
)

// startReplicas starts n servers on one fresh PostgreSQL database, each
// with a data dir of its own and the same KEK: the first stores the keys,
// the others load them.
func startReplicas(t *testing.T, c *pgtest.Cluster, n int) []*testServer {
	t.Helper()
	dsn, kek := c.NewDatabase(t), testKEKFile(t)
	pg := func(cfg *Config) {
		cfg.Store.Driver, cfg.Store.DSN, cfg.Store.MaxConns, cfg.KEKFile = "postgres", dsn, 6, kek
	}
	var reps []*testServer
	for range n {
		reps = append(reps, startServer(t, pg))
	}
	for _, r := range reps {
		testkit.WaitFor(t, 10*time.Second, "the signal bus to listen", func() bool { return r.s.fleet.bus.Up() })
	}
	return reps
}

func (s *testStream) syncCount() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.syncs)
}

// waitSync waits for a SyncNow of at least serial after the first skip.
func (s *testStream) waitSync(t *testing.T, skip int, serial uint64, timeout time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	testkit.WaitFor(t, timeout, "a SyncNow", func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return slices.ContainsFunc(s.syncs[min(skip, len(s.syncs)):], func(v uint64) bool { return v >= serial })
	})
	return time.Since(start)
}

// Three replicas on one PostgreSQL: an agent streams to C while the
// operator uses A (and follows logs on B). Apply, run now, cancel, the
// agent list, live logs, revocation (within 1 s) and console sessions all
// cross replicas.
func TestReplicasSignals(t *testing.T) {
	c := pgtest.Start(t)
	reps := startReplicas(t, c, 3)
	a, b, cc := reps[0], reps[1], reps[2]

	tags := map[string]string{"job": "yes"}
	ag := a.enrollAgent(tags)
	a.putScriptPipe("job", "echo job", tags)
	ag.base, ag.grpcAddr = cc.base, cc.s.GRPCAddr()
	if _, err := ag.pullManifest(); err != nil { // C caches its manifest
		t.Fatal(err)
	}
	st := ag.mustStream(t)
	testkit.WaitFor(t, 5*time.Second, "the stream on C", func() bool { return cc.s.fleet.hub.Online(ag.id) })

	// The agent list on A says online: C claims the stream.
	testkit.WaitFor(t, 5*time.Second, "agent online on A", func() bool {
		var out api.Agent
		a.adminOK("GET", "/api/v1/agents/"+ag.id, nil, &out)
		return out.Online
	})

	// Apply on A: SyncNow reaches the agent on C, and C serves the new
	// manifest (its cache was invalidated).
	before := st.syncCount()
	applied := time.Now()
	a.putScriptPipe("job", "echo changed", tags)
	var m api.Agent
	a.adminOK("GET", "/api/v1/agents/"+ag.id, nil, &m)
	st.waitSync(t, before, m.Manifest.Serial, 5*time.Second)
	t.Logf("apply on A -> SyncNow on C: %v (from the PUT)", time.Since(applied))
	// C attached the manifest from its own store: what C serves, byte for
	// byte, never older than announced.
	checkCarried(t, ag, st.lastSyncAtLeast(t, m.Manifest.Serial, time.Second))
	acc, err := ag.pullManifest()
	if err != nil || acc.Manifest.Serial != m.Manifest.Serial {
		t.Fatalf("manifest pulled from C after the apply: %v, %v (want serial %d)", acc, err, m.Manifest.Serial)
	}

	// Run now on A reaches the agents on B and C; an agent with no stream
	// is offline.
	idle := a.enrollAgent(tags)
	onB := a.enrollAgent(tags)
	onB.base, onB.grpcAddr = b.base, b.s.GRPCAddr()
	stB := onB.mustStream(t)
	// B claims the stream a few milliseconds after it opens (claims are
	// written in batches); A sees it from then on.
	testkit.WaitFor(t, 5*time.Second, "the stream on B, seen from A", func() bool { return a.s.hub.Online(onB.id) })
	var rr api.RunPipeResponse
	a.adminOK("POST", "/api/v1/pipes/job/run", api.RunPipeRequest{}, &rr)
	wantSent := []string{ag.id, onB.id}
	slices.Sort(wantSent)
	slices.Sort(rr.Sent)
	if !slices.Equal(rr.Sent, wantSent) || !slices.Equal(rr.Offline, []string{idle.id}) {
		t.Fatalf("run now on A: sent %v, offline %v (agents on B and C %v, idle %s)", rr.Sent, rr.Offline, wantSent, idle.id)
	}
	testkit.WaitFor(t, 5*time.Second, "RunNow on B's stream", func() bool {
		stB.mu.Lock()
		defer stB.mu.Unlock()
		return len(stB.runNows) == 1 && stB.runNows[0].GetRequestId() == rr.RequestID
	})

	// A renewal promoted on A retires the stream B holds with the old
	// certificate.
	key, certPEM, err := onB.renew()
	if err != nil {
		t.Fatal(err)
	}
	if err := onB.setCert(key, certPEM); err != nil {
		t.Fatal(err)
	}
	onB.base = a.base
	promoted := time.Now()
	if _, err := onB.pullManifest(); err != nil { // the new certificate's first use promotes it
		t.Fatal(err)
	}
	select {
	case <-stB.recvDone:
	case <-time.After(5 * time.Second):
		t.Fatal("the stream on B with the old certificate is still open 5s after the promotion on A")
	}
	t.Logf("renewal promoted on A -> old stream on B closed: %v", time.Since(promoted))
	if e := stB.err(); e == nil || !strings.Contains(e.Error(), "superseded") {
		t.Fatalf("the old stream ended with %v", e)
	}
	testkit.WaitFor(t, 5*time.Second, "RunNow on the stream", func() bool {
		st.mu.Lock()
		defer st.mu.Unlock()
		return len(st.runNows) == 1 && st.runNows[0].GetRequestId() == rr.RequestID && st.runNows[0].GetPipe() == "job"
	})

	// Cancel on A of a run the agent runs on C.
	if err := st.stream.Send(&agentpb.AgentMessage{Seq: 1, Body: replayRecord("x", 1, 1).Body}); err != nil {
		t.Fatal(err)
	}
	if err := st.waitAck(1, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	var cr api.CancelResponse
	a.adminOK("POST", "/api/v1/runs/x-00000/cancel", nil, &cr)
	if !cr.Sent {
		t.Fatalf("cancel: %+v", cr)
	}
	testkit.WaitFor(t, 5*time.Second, "CancelRun on the stream", func() bool {
		st.mu.Lock()
		defer st.mu.Unlock()
		return slices.Equal(st.cancels, []string{"x-00000"})
	})

	// Live logs followed on B while the agent streams to C.
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	resp, events := b.openSSE(ctx, b.admin, "x-00000", "")
	defer resp.Body.Close()
	time.Sleep(1500 * time.Millisecond) // past the follower's catch-up read: only a signal wakes it now
	sent := time.Now()
	chunk := &agentpb.AgentMessage{Seq: 2, Body: &agentpb.AgentMessage_LogChunk{LogChunk: &agentpb.LogChunk{RunId: "x-00000", ChunkSeq: 0,
		Stream: agentpb.LogStream_LOG_STREAM_STDOUT, Data: []byte("hello from C\n")}}}
	if err := st.stream.Send(chunk); err != nil {
		t.Fatal(err)
	}
	ev := nextEvent(t, events, 5*time.Second)
	var ch api.LogChunk
	if err := json.Unmarshal([]byte(ev.data), &ch); ev.event != "chunk" || err != nil || string(ch.Data) != "hello from C\n" {
		t.Fatalf("SSE on B: %+v (%v)", ev, err)
	}
	logLatency := ev.at.Sub(sent)
	t.Logf("chunk sent to C -> SSE event on B: %v", logLatency)
	if logLatency > time.Second {
		t.Errorf("the chunk reached the follower on B after %v, want under 1s", logLatency)
	}

	// Console: log in on A, use the cookie on B, log out on B, refused on A.
	cookie, csrf := a.consoleLogin(a.admin)
	if r := b.consoleDo("GET", "/api/v1/agents", cookie, nil, "Sec-Fetch-Site", "same-origin"); r.code != 200 {
		t.Fatalf("A's session on B: %d %s", r.code, r.body)
	}
	if r := b.consoleDo("POST", "/ui/logout", cookie, nil, "X-CSRF-Token", csrf, "Origin", "https://"+b.s.HTTPAddr()); r.code != 204 {
		t.Fatalf("logout on B: %d %s", r.code, r.body)
	}
	if r := a.consoleDo("GET", "/api/v1/agents", cookie, nil); r.code != 401 {
		t.Fatalf("the session on A after logging out on B: %d %s", r.code, r.body)
	}

	// Revoke on A: the stream on C closes within 1 s.
	start := time.Now()
	a.adminOK("POST", "/api/v1/agents/"+ag.id+"/revoke", nil, nil)
	select {
	case <-st.recvDone:
	case <-time.After(5 * time.Second):
		t.Fatal("the stream on C is still open 5s after the revocation on A")
	}
	closed := time.Since(start)
	t.Logf("revoke on A -> stream on C closed: %v", closed)
	if closed >= time.Second {
		t.Errorf("the stream closed %v after the revocation, want under 1s", closed)
	}
	if code := errorCodeOf(st.err()); code != "agent_revoked" {
		t.Errorf("the stream ended with %v", st.err())
	}
	// C no longer accepts the agent's certificate (its cache was told).
	if r, err := ag.get("/api/v1/agents/self/manifest"); err == nil && r.code == 200 {
		t.Fatalf("C still serves the revoked agent")
	}

	// A replica that stops drops its claims: run now on A at once says
	// offline for an agent that streamed to it.
	idle.base, idle.grpcAddr = cc.base, cc.s.GRPCAddr()
	ist := idle.mustStream(t)
	testkit.WaitFor(t, 5*time.Second, "the idle agent online on A", func() bool { return a.s.hub.Online(idle.id) })
	cc.stop()
	<-ist.recvDone
	asked := time.Now()
	a.adminOK("POST", "/api/v1/pipes/job/run", api.RunPipeRequest{Agent: idle.id}, &rr)
	if len(rr.Sent) != 0 || !slices.Equal(rr.Offline, []string{idle.id}) || time.Since(asked) > time.Second {
		t.Fatalf("run now after C stopped: sent %v, offline %v, in %v", rr.Sent, rr.Offline, time.Since(asked))
	}

	// A claim of a replica that died without dropping it (a fault an
	// in-process server cannot show, so the claim is written directly):
	// A waits for an answer that never comes, then says offline.
	if err := a.s.store.PutStreams(t.Context(), "r-gone", []string{idle.id}, time.Now()); err != nil {
		t.Fatal(err)
	}
	asked = time.Now()
	a.adminOK("POST", "/api/v1/pipes/job/run", api.RunPipeRequest{Agent: idle.id}, &rr)
	waited := time.Since(asked)
	if len(rr.Sent) != 0 || !slices.Equal(rr.Offline, []string{idle.id}) || waited < cmdTimeout || waited > cmdTimeout+time.Second {
		t.Fatalf("run now with a dead replica's claim: sent %v, offline %v, in %v", rr.Sent, rr.Offline, waited)
	}
	if r := a.do("POST", "/api/v1/runs/x-00000/cancel", a.admin, nil); r.code != 409 {
		t.Fatalf("cancel with no stream anywhere: %d %s", r.code, r.body)
	}
}

// Console sessions are in the store: a restart logs no one out, and a
// session outlives it until logout.
func TestConsoleSessionSurvivesRestart(t *testing.T) {
	ts := startServer(t)
	cookie, csrf := ts.consoleLogin(ts.admin)
	dir := ts.cfg.DataDir
	ts.stop()
	ts = startServer(t, func(cfg *Config) { cfg.DataDir = dir })
	if r := ts.consoleDo("GET", "/api/v1/agents", cookie, nil); r.code != 200 {
		t.Fatalf("the session after a restart: %d %s", r.code, r.body)
	}
	var n int
	if err := ts.db().Reader().QueryRow(`SELECT COUNT(*) FROM console_sessions WHERE id_hash=?`, []byte(cookie)).Scan(&n); err != nil || n != 0 {
		t.Fatalf("the cookie value is stored as it is (%d rows, %v)", n, err)
	}
	if r := ts.consoleDo("POST", "/ui/logout", cookie, nil, "X-CSRF-Token", csrf, "Origin", "https://"+ts.s.HTTPAddr()); r.code != 204 {
		t.Fatalf("logout: %d %s", r.code, r.body)
	}
	if err := ts.db().Reader().QueryRow(`SELECT COUNT(*) FROM console_sessions`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("%d sessions stored after logout (%v)", n, err)
	}
	if r := ts.consoleDo("GET", "/api/v1/agents", cookie, nil); r.code != 401 {
		t.Fatalf("the session after logout: %d %s", r.code, r.body)
	}
}

// errorCodeOf is the API error code carried by a gRPC status's message.
func errorCodeOf(err error) string {
	if err == nil {
		return ""
	}
	if strings.Contains(err.Error(), "revoked") {
		return "agent_revoked"
	}
	return err.Error()
}

// PostgreSQL restarted under two replicas: the bus reconnects (and
// resyncs), and a later apply on A still reaches the agent streaming to B.
func TestReplicasBusReconnects(t *testing.T) {
	c := pgtest.Start(t)
	reps := startReplicas(t, c, 2)
	a, b := reps[0], reps[1]
	tags := map[string]string{"job": "yes"}
	ag := a.enrollAgent(tags)
	a.putScriptPipe("job", "echo job", tags)
	// The agent streams to A, then (A's stream still open, as when the
	// network to A broke) to B: A ends the older stream.
	old := ag.mustStream(t)
	testkit.WaitFor(t, 5*time.Second, "the stream on A", func() bool { return a.s.fleet.hub.Online(ag.id) })
	ag.base, ag.grpcAddr = b.base, b.s.GRPCAddr()
	if _, err := ag.pullManifest(); err != nil {
		t.Fatal(err)
	}
	st := ag.mustStream(t)
	testkit.WaitFor(t, 5*time.Second, "the stream on B", func() bool { return b.s.fleet.hub.Online(ag.id) })
	select {
	case <-old.recvDone:
	case <-time.After(5 * time.Second):
		t.Fatal("A still holds the agent's older stream 5s after it opened one on B")
	}
	if e := old.err(); e == nil || !strings.Contains(e.Error(), "newer stream") {
		t.Fatalf("the older stream ended with %v", e)
	}
	if a.s.fleet.hub.Online(ag.id) || !b.s.fleet.hub.Online(ag.id) {
		t.Fatal("the agent's stream is not on B alone")
	}

	down := time.Now()
	c.Stop(t)
	testkit.WaitFor(t, 15*time.Second, "B's bus to notice", func() bool { return !b.s.fleet.bus.Up() })
	time.Sleep(time.Second)
	c.StartAgain(t)
	testkit.WaitFor(t, 30*time.Second, "both buses to listen again", func() bool { return a.s.fleet.bus.Up() && b.s.fleet.bus.Up() })
	t.Logf("database down -> both buses listening again: %v", time.Since(down))
	if n := b.s.fleet.bus.(*bus.Postgres).Reconnects(); n < 1 {
		t.Fatalf("B reconnected %d times", n)
	}
	// A stream whose records could not be committed while the database
	// was down was closed (the agent resends on a new one): reconnect as
	// the agent does.
	select {
	case <-st.recvDone:
		st = ag.mustStream(t)
		testkit.WaitFor(t, 10*time.Second, "the stream on B again", func() bool { return b.s.fleet.hub.Online(ag.id) })
	default:
	}

	before := st.syncCount()
	// The pool may need a moment to replace its broken connections.
	var out api.PutPipeResponse
	testkit.WaitFor(t, 15*time.Second, "an apply on A", func() bool {
		r := a.do("PUT", "/api/v1/pipes/job", a.admin, map[string]any{"spec": map[string]any{"schedule": "*/5 * * * *", "script": "echo after", "targets": map[string]any{"tags": tags}}})
		if r.code/100 == 2 {
			r.decode(t, &out)
			return true
		}
		return false
	})
	var m api.Agent
	a.adminOK("GET", "/api/v1/agents/"+ag.id, nil, &m)
	st.waitSync(t, before, m.Manifest.Serial, 15*time.Second) // the bus may still be reconnecting (backoff up to 5 s)
	acc, err := ag.pullManifest()
	if err != nil || acc.Manifest.Serial != m.Manifest.Serial {
		t.Fatalf("manifest from B after the restart: %v (want serial %d)", err, m.Manifest.Serial)
	}

	// A signal that never arrives: the agent is revoked in the store
	// behind the servers' backs, then the listening connections are
	// killed. B's resync after reconnecting finds the revocation and
	// closes the stream.
	ctx := t.Context()
	if err := a.s.store.(*cachedStore).Store.RevokeAgent(ctx, ag.id, time.Now()); err != nil {
		t.Fatal(err)
	}
	reconnects := b.s.fleet.bus.(*bus.Postgres).Reconnects()
	c.Exec(t, "postgres", `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE query LIKE 'LISTEN %'`)
	select {
	case <-st.recvDone:
	case <-time.After(10 * time.Second):
		t.Fatal("the revoked agent's stream on B is still open 10s after B's bus was cut")
	}
	if n := b.s.fleet.bus.(*bus.Postgres).Reconnects(); n <= reconnects || !strings.Contains(st.err().Error(), "revoked") {
		t.Fatalf("B reconnected %d times (%d before), the stream ended with %v", n, reconnects, st.err())
	}
}

// A signal's payload stays under the NOTIFY limit however many agents it
// names, and its chunks carry every id with its serial, in order.
func TestSignalChunks(t *testing.T) {
	var b sigBody
	for i := range 10000 {
		b.IDs = append(b.IDs, newAgentID())
		b.Serials = append(b.Serials, uint64(1e12+i))
	}
	chunks := b.chunks()
	var got sigBody
	for _, c := range chunks {
		if len(c) > bus.MaxPayload {
			t.Fatalf("a chunk of %d bytes", len(c))
		}
		var part sigBody
		if err := json.Unmarshal([]byte(c), &part); err != nil || len(part.IDs) != len(part.Serials) {
			t.Fatalf("chunk %q: %v", c[:80], err)
		}
		got.IDs, got.Serials = append(got.IDs, part.IDs...), append(got.Serials, part.Serials...)
	}
	if !slices.Equal(got.IDs, b.IDs) || !slices.Equal(got.Serials, b.Serials) {
		t.Fatal("the chunks do not add up to the signal")
	}
	t.Logf("10000 agents: %d signals", len(chunks))
}

// Two servers on one in-process bus: signals reach the other member only,
// in order, and a member whose queue overflowed resyncs.
func TestLocalBus(t *testing.T) {
	n := bus.NewNetwork()
	a, b := n.Join(), n.Join()
	if !a.Shared() || bus.NewNetwork().Join().Shared() {
		t.Fatal("Shared")
	}
	h := &recordingHandler{got: make(chan bus.Signal, 10)}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	go b.Run(ctx, h)
	for _, k := range []string{"one", "two"} {
		if err := a.Publish(ctx, k, `{"i":["x"]}`); err != nil {
			t.Fatal(err)
		}
	}
	for _, k := range []string{"one", "two"} {
		if s := <-h.got; s.Kind != k || s.From != a.Replica() {
			t.Fatalf("got %+v, want %s from %s", s, k, a.Replica())
		}
	}
	if err := a.Publish(ctx, "big", strings.Repeat("x", bus.MaxPayload+1)); err == nil {
		t.Fatal("an oversized payload was published")
	}
}

type recordingHandler struct{ got chan bus.Signal }

func (h *recordingHandler) Signal(s bus.Signal) { h.got <- s }
func (h *recordingHandler) Resync()             {}
