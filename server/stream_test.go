package server

import (
	"bytes"
	"context"
	crand "crypto/rand"
	"encoding/base64"
	"fmt"
	"math/rand/v2"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/drover/drover/api"
	"github.com/drover/drover/internal/testkit"
	"github.com/drover/drover/server/store"
	"github.com/drover/drover/server/stream"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/drover/drover/manifest"
	agentpb "github.com/drover/drover/proto"
)

// replayRecord returns the record with sequence number seq of a synthetic
// workload: runs of (RunStarted, perRun log chunks, RunFinished).
func replayRecord(prefix string, seq uint64, perRun int) *agentpb.AgentMessage {
	i := int(seq - 1)
	run, k := i/(perRun+2), i%(perRun+2)
	id := fmt.Sprintf("%s-%05d", prefix, run)
	m := &agentpb.AgentMessage{Seq: seq}
	switch {
	case k == 0:
		m.Body = &agentpb.AgentMessage_RunStarted{RunStarted: &agentpb.RunStarted{RunId: id, Pipe: "job", PipeVersion: 1,
			Trigger: agentpb.Trigger_TRIGGER_SCHEDULE, StartedAt: timestamppb.Now()}}
	case k == perRun+1:
		m.Body = &agentpb.AgentMessage_RunFinished{RunFinished: &agentpb.RunFinished{RunId: id, Pipe: "job", PipeVersion: 1,
			Status: agentpb.RunStatus_RUN_STATUS_SUCCEEDED, FinishedAt: timestamppb.Now(), DurationMs: 5, LogChunks: uint64(perRun)}}
	default:
		m.Body = &agentpb.AgentMessage_LogChunk{LogChunk: &agentpb.LogChunk{RunId: id, ChunkSeq: uint64(k - 1),
			Stream: agentpb.LogStream_LOG_STREAM_STDOUT, Data: fmt.Appendf(nil, "%s line %d\n", id, k-1)}}
	}
	return m
}

// expectedLog is what replayRecord's chunks of one run concatenate to.
func expectedLog(id string, perRun int) string {
	var b strings.Builder
	for k := range perRun {
		fmt.Fprintf(&b, "%s line %d\n", id, k)
	}
	return b.String()
}

func TestStreamReplayExactlyOnce(t *testing.T) {
	// Quotas high enough not to slow the replays (they are tested apart).
	ts := startServer(t, func(c *Config) {
		c.Agents.RunRecordsPerSecond, c.Agents.RunRecordsBurst = 1e6, 1e6
		c.Agents.PipeRunRecordsPerSecond, c.Agents.PipeRunRecordsBurst = 1e6, 1e6
	})
	a := ts.jobAgent()
	const total, perRun, drops = 10000, 8, 20
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 1))
	var points []uint64
	for len(points) < drops {
		p := 1 + rng.Uint64N(total-1)
		if !slices.Contains(points, p) {
			points = append(points, p)
		}
	}
	slices.Sort(points)

	var acked uint64
	sentTotal := 0
	for {
		st, err := a.openStream("")
		if err != nil {
			t.Fatal(err)
		}
		from := acked + 1
		next := len(points) // index of the next drop point past from, if any
		for i, p := range points {
			if p >= from {
				next = i
				break
			}
		}
		until := uint64(total)
		if next < len(points) {
			until = points[next]
		}
		for seq := from; seq <= until; seq++ {
			if err := st.stream.Send(replayRecord("replay", seq, perRun)); err != nil {
				t.Fatalf("send %d: %v", seq, err)
			}
			sentTotal++
		}
		if until == total {
			if err := st.waitAck(total, 30*time.Second); err != nil {
				t.Fatal(err)
			}
			st.close()
			break
		}
		// Drop the connection abruptly, without waiting for acks.
		st.close()
		<-st.recvDone
		if l := st.lastAck(); l > acked {
			acked = l
		}
		points = points[next+1:]
	}
	t.Logf("%d records sent for %d: %d re-sent after %d drops", sentTotal, total, sentTotal-total, drops)

	// Exactly the 10,000 records: 1,000 finished runs with 8 chunks each.
	db := ts.db()
	var runs, chunks, bytesLogged int
	if err := db.Reader().QueryRow(`SELECT COUNT(*), COALESCE(SUM(log_bytes),0) FROM runs WHERE agent_id=? AND status='succeeded' AND pipe='job'`, a.id).Scan(&runs, &bytesLogged); err != nil {
		t.Fatal(err)
	}
	if err := db.Reader().QueryRow(`SELECT COUNT(*) FROM log_chunks`).Scan(&chunks); err != nil {
		t.Fatal(err)
	}
	nRuns := total / (perRun + 2)
	if runs != nRuns || chunks != nRuns*perRun {
		t.Fatalf("%d runs and %d chunks stored, want %d and %d", runs, chunks, nRuns, nRuns*perRun)
	}
	want := 0
	for r := range nRuns {
		id := fmt.Sprintf("replay-%05d", r)
		logs, err := ts.s.store.GetLogs(t.Context(), id)
		if err != nil {
			t.Fatal(err)
		}
		var got bytes.Buffer
		for i, c := range logs {
			if c.Seq != uint64(i) {
				t.Fatalf("run %s: chunk %d has seq %d (gap or duplicate)", id, i, c.Seq)
			}
			got.Write(c.Data)
		}
		if exp := expectedLog(id, perRun); got.String() != exp {
			t.Fatalf("run %s log %q, want %q", id, got.String(), exp)
		}
		want += got.Len()
	}
	if bytesLogged != want {
		t.Fatalf("log_bytes total %d, want %d: a replayed chunk was counted twice", bytesLogged, want)
	}
}

// sendAll sends msgs with consecutive seqs starting at first and waits for
// the ack of the last one.
func sendAll(t *testing.T, st *testStream, first uint64, msgs ...*agentpb.AgentMessage) uint64 {
	t.Helper()
	seq := first
	for _, m := range msgs {
		if m.Seq == 0 {
			m.Seq = seq
		}
		seq = m.Seq + 1
		if err := st.stream.Send(m); err != nil {
			t.Fatal(err)
		}
	}
	if err := st.waitAck(seq-1, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	return seq
}

func TestRunUpsertsAndLogCap(t *testing.T) {
	ts := startServer(t, func(c *Config) { c.Runs.MaxLogBytes = 1024 })
	a, st := ts.jobStream()
	chunk := func(run string, seq uint64, n int) *agentpb.AgentMessage {
		return &agentpb.AgentMessage{Body: &agentpb.AgentMessage_LogChunk{LogChunk: &agentpb.LogChunk{RunId: run, ChunkSeq: seq, Data: bytes.Repeat([]byte{'x'}, n)}}}
	}
	started := time.Now().Add(-time.Minute).Truncate(time.Millisecond)
	finished := &agentpb.AgentMessage{Body: &agentpb.AgentMessage_RunFinished{RunFinished: &agentpb.RunFinished{
		RunId: "r1", Pipe: "job", PipeVersion: 3, Trigger: agentpb.Trigger_TRIGGER_API, Status: agentpb.RunStatus_RUN_STATUS_FAILED,
		ExitCode: 2, StartedAt: timestamppb.New(started), FinishedAt: timestamppb.Now(), RequestId: "req-1"}}}
	startedMsg := &agentpb.AgentMessage{Body: &agentpb.AgentMessage_RunStarted{RunStarted: &agentpb.RunStarted{
		RunId: "r1", Pipe: "job", PipeVersion: 3, Trigger: agentpb.Trigger_TRIGGER_API, StartedAt: timestamppb.New(started)}}}
	msgs := []*agentpb.AgentMessage{finished, startedMsg}
	for i := range 6 {
		msgs = append(msgs, chunk("r1", uint64(i), 300))
	}
	next := sendAll(t, st, 1, msgs...)
	// Replaying everything changes nothing.
	for _, m := range msgs {
		m.Seq = 0
	}
	sendAll(t, st, next, msgs...)

	var run api.Run
	ts.adminOK("GET", "/api/v1/runs/r1", nil, &run)
	if run.Status != api.StatusFailed || run.ExitCode != 2 || run.Pipe != "job" || run.Trigger != "api" || run.StartedAt == nil ||
		!run.StartedAt.Equal(started) || run.FinishedAt == nil || !run.LogTruncated || run.LogBytes != 900 {
		t.Fatalf("run after RunFinished before RunStarted and a replay: %+v", run)
	}
	r := ts.adminOK("GET", "/api/v1/runs/r1/logs", nil, nil)
	if want := strings.Repeat("x", 900) + string(truncationMarker(1024)); string(r.body) != want || r.header.Get("X-Drover-Log-Truncated") != "true" {
		t.Fatalf("logs %q", r.body)
	}

	// Another agent cannot touch this agent's run.
	b := ts.jobAgent()
	stb := b.mustStream(t)
	hijack := &agentpb.AgentMessage{Body: &agentpb.AgentMessage_RunFinished{RunFinished: &agentpb.RunFinished{RunId: "r1", Status: agentpb.RunStatus_RUN_STATUS_SUCCEEDED}}}
	sendAll(t, stb, 1, hijack, chunk("r1", 99, 10))
	ts.adminOK("GET", "/api/v1/runs/r1", nil, &run)
	if run.Status != api.StatusFailed || run.AgentID != a.id || run.LogBytes != 900 {
		t.Fatalf("another agent changed the run: %+v", run)
	}
	// An invalid record is acknowledged (so it is not resent forever) but not stored.
	sendAll(t, st, 100, &agentpb.AgentMessage{Body: &agentpb.AgentMessage_RunStarted{RunStarted: &agentpb.RunStarted{RunId: ""}}})

	var list struct{ Runs []api.Run }
	ts.adminOK("GET", "/api/v1/runs?agent="+a.id+"&status=failed", nil, &list)
	if len(list.Runs) != 1 {
		t.Fatalf("runs: %+v", list.Runs)
	}
}

func TestStreamReportsAgentState(t *testing.T) {
	ts := startServer(t)
	a := ts.enrollAgent(map[string]string{"role": "web"})
	ts.putScriptPipe("job", "echo", map[string]string{"role": "web"})
	acc, err := a.pullManifest()
	if err != nil {
		t.Fatal(err)
	}
	st := a.mustStream(t)
	fire := time.Now().Add(time.Hour).Truncate(time.Second).UTC()
	sendAll(t, st, 1, &agentpb.AgentMessage{Body: &agentpb.AgentMessage_ManifestStatus{ManifestStatus: &agentpb.ManifestStatus{
		Serial: acc.Manifest.Serial, State: agentpb.ManifestStatus_STATE_APPLIED, AppliedSerial: acc.Manifest.Serial,
		Pipes: []*agentpb.PipeStatus{{Name: "job", Version: 1, NextFireTimes: []*timestamppb.Timestamp{timestamppb.New(fire)}, ApplyError: "unit failed"}}}}})
	var ag api.Agent
	ts.adminOK("GET", "/api/v1/agents/"+a.id, nil, &ag)
	if !ag.Online || ag.AppliedSerial != acc.Manifest.Serial || ag.ManifestState != "applied" || ag.Backend != "systemd" || ag.LastSeenAt == nil ||
		len(ag.Pipes) != 1 || ag.Pipes[0].ApplyError != "unit failed" || len(ag.Pipes[0].NextFireTimes) != 1 || !ag.Pipes[0].NextFireTimes[0].Equal(fire) {
		t.Fatalf("agent state: %+v", ag)
	}
	// A newer ManifestStatus replaces it; an older one replayed on a new
	// stream does not.
	sendAll(t, st, 5, &agentpb.AgentMessage{Body: &agentpb.AgentMessage_ManifestStatus{ManifestStatus: &agentpb.ManifestStatus{
		Serial: acc.Manifest.Serial + 1, State: agentpb.ManifestStatus_STATE_REJECTED, Error: "bad", AppliedSerial: acc.Manifest.Serial}}})
	st.close()
	st, err = a.openStream("")
	if err != nil {
		t.Fatal(err)
	}
	defer st.close()
	sendAll(t, st, 1, &agentpb.AgentMessage{Body: &agentpb.AgentMessage_ManifestStatus{ManifestStatus: &agentpb.ManifestStatus{
		Serial: 1, State: agentpb.ManifestStatus_STATE_APPLIED, AppliedSerial: 1}}})
	ts.adminOK("GET", "/api/v1/agents/"+a.id, nil, &ag)
	if ag.ManifestState != "rejected" || ag.ManifestError != "bad" || ag.AppliedSerial != acc.Manifest.Serial {
		t.Fatalf("agent state after an old replayed status: %+v", ag)
	}

	// RunNow reaches the connected, targeted agent.
	var rr api.RunPipeResponse
	ts.adminOK("POST", "/api/v1/pipes/job/run", api.RunPipeRequest{}, &rr)
	if !slices.Equal(rr.Sent, []string{a.id}) {
		t.Fatalf("run now: %+v", rr)
	}
	testkit.WaitFor(t, 5*time.Second, "RunNow", func() bool {
		st.mu.Lock()
		defer st.mu.Unlock()
		return len(st.runNows) == 1 && st.runNows[0].GetPipe() == "job" && st.runNows[0].GetRequestId() == rr.RequestID
	})

	st.close()
	testkit.WaitFor(t, 5*time.Second, "the agent to go offline", func() bool { return !ts.s.hub.Online(a.id) })
}

// TestHeartbeatNudgesAgentBehind: an agent whose heartbeats show it behind
// the published manifest for two heartbeats in a row at least stream.NudgeAfter
// apart (the SyncNow that announced it was lost) gets one SyncNow for that
// serial; heartbeats behind for a shorter time, up to date or ahead of
// what was published, or without a serial get none.
func TestHeartbeatNudgesAgentBehind(t *testing.T) {
	ts := startServer(t)
	tags := map[string]string{"nudge": "yes"}
	a := ts.enrollAgent(tags)
	ts.putScriptPipe("nudge", "echo 1", tags)
	ts.putScriptPipe("nudge", "echo 2", tags)
	acc, err := a.pullManifest()
	if err != nil {
		t.Fatal(err)
	}
	published := acc.Manifest.Serial
	if published < 2 {
		t.Fatalf("published serial %d", published)
	}
	st := a.mustStream(t) // Hello with the published serial: no SyncNow
	// The change's own announcement may reach the new stream after its
	// Hello: what came before the heartbeats is not counted.
	testkit.WaitFor(t, 10*time.Second, "the announcements sent", func() bool { return ts.s.syncs.pending() == 0 })
	time.Sleep(100 * time.Millisecond)
	st.mu.Lock()
	announced := len(st.syncs)
	st.mu.Unlock()
	syncs := func() []uint64 {
		st.mu.Lock()
		defer st.mu.Unlock()
		return slices.Clone(st.syncs[announced:])
	}
	seq := uint64(1)
	// beat moves the clock by gap, sends a heartbeat saying serial, then a
	// record, and waits for its ack: the heartbeat was handled by then.
	beat := func(gap time.Duration, serial uint64) {
		t.Helper()
		ts.clock.Advance(gap)
		hb := heartbeat(0, time.Now())
		hb.GetHeartbeat().ManifestSerial = serial
		if err := st.stream.Send(hb); err != nil {
			t.Fatal(err)
		}
		seq = sendAll(t, st, seq, &agentpb.AgentMessage{Body: &agentpb.AgentMessage_ManifestStatus{ManifestStatus: &agentpb.ManifestStatus{
			Serial: published, State: agentpb.ManifestStatus_STATE_APPLIED, AppliedSerial: published}}})
	}
	const hbGap = 30 * time.Second
	beat(hbGap, published)
	beat(hbGap, published+5) // a serial never published: not behind
	beat(hbGap, published+5)
	beat(hbGap, published-1)
	beat(hbGap, 0)
	beat(hbGap, published-1) // not two in a row: the heartbeat without a serial came between
	beat(5*time.Second, published-1)
	beat(5*time.Second, published-1) // behind for 10 s only
	time.Sleep(200 * time.Millisecond)
	if got := syncs(); len(got) != 0 {
		t.Fatalf("SyncNow before heartbeats showed the agent behind for %s: %v", stream.NudgeAfter, got)
	}
	beat(hbGap, published-1)
	testkit.WaitFor(t, 5*time.Second, "the nudge", func() bool { return len(syncs()) == 1 })
	if got := syncs(); got[0] != published {
		t.Fatalf("nudged with serial %d, want %d", got[0], published)
	}
	beat(hbGap, published-1)
	beat(hbGap, published-1)
	time.Sleep(200 * time.Millisecond)
	if got := syncs(); len(got) != 1 {
		t.Fatalf("nudged again for the same serial: %v", got)
	}
	if v := metricValue(ts.scrape(ts.admin), "drover_stream_nudges_total"); v != 1 {
		t.Fatalf("drover_stream_nudges_total %v, want 1", v)
	}
}

func TestRetentionPrunesByAgeAndCount(t *testing.T) {
	ts := startServer(t)
	db := ts.db()
	now := time.Now()
	var recs []*store.Record
	for i := range 10 {
		at := now.Add(-time.Duration(10-i) * time.Minute)
		recs = append(recs, &store.Record{AgentID: "x", Received: at, RunStarted: &store.Run{ID: fmt.Sprintf("r%d", i), Pipe: "p"}},
			&store.Record{AgentID: "x", Received: at, Chunk: &store.LogChunk{RunID: fmt.Sprintf("r%d", i), Data: []byte("x")}})
	}
	recs = append(recs, &store.Record{AgentID: "x", Received: now.Add(-48 * time.Hour), RunStarted: &store.Run{ID: "ancient", Pipe: "q"}})
	if err := db.ApplyRecords(t.Context(), recs, store.IngestLimits{MaxLogBytes: 1 << 20}); err != nil {
		t.Fatal(err)
	}
	n, err := db.PruneRuns(t.Context(), now.Add(-24*time.Hour), 4)
	if err != nil || n != 7 {
		t.Fatalf("pruned %d (%v), want 7", n, err)
	}
	runs, _ := db.ListRuns(t.Context(), store.RunFilter{Limit: 100})
	ids := keysOf(runs, func(r *store.Run) string { return r.ID })
	if !slices.Equal(ids, []string{"r9", "r8", "r7", "r6"}) {
		t.Fatalf("kept %v", ids)
	}
	var chunks int
	db.Reader().QueryRow(`SELECT COUNT(*) FROM log_chunks`).Scan(&chunks)
	if chunks != 4 {
		t.Fatalf("%d log chunks left, want 4", chunks)
	}
}

// jobAgent enrolls an agent whose manifest names the pipe "job" (agents
// may report runs only of pipes their manifest names).
func (ts *testServer) jobAgent() *testAgent {
	ts.t.Helper()
	tags := map[string]string{"job": "yes"}
	a := ts.enrollAgent(tags)
	ts.putScriptPipe("job", "echo job", tags)
	return a
}

// jobStream is jobAgent with its stream open (closed at the test's end).
func (ts *testServer) jobStream() (*testAgent, *testStream) {
	ts.t.Helper()
	a := ts.jobAgent()
	st, err := a.openStream("")
	if err != nil {
		ts.t.Fatal(err)
	}
	ts.t.Cleanup(st.close)
	return a, st
}

const (
	machineA = "0123456789abcdef0123456789abcdef"
	machineB = "fedcba9876543210fedcba9876543210"
)

// openStreamAs opens a stream whose Hello carries machineID and hostname.
func (a *testAgent) openStreamAs(machineID, hostname string) (*testStream, error) {
	return a.openStreamHello("", &agentpb.Hello{AgentVersion: "test", Os: "linux", Arch: "amd64", Hostname: hostname, Backend: "systemd", Scope: "user",
		ManifestSerial: a.state.Serial, MachineId: machineID})
}

// clone is another process holding a copy of the agent's key and certificate.
func (a *testAgent) clone(t *testing.T) *testAgent {
	c := &testAgent{id: a.id, base: a.base, grpcAddr: a.grpcAddr, pool: a.pool, trust: a.trust, state: a.state}
	if err := c.setCert(a.key, a.certPEM); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.close)
	return c
}

// ended waits until the stream is closed by the server and returns its status.
func (s *testStream) ended(t *testing.T, timeout time.Duration) *status.Status {
	t.Helper()
	select {
	case <-s.recvDone:
	case <-time.After(timeout):
		t.Fatalf("the stream was not closed within %s", timeout)
	}
	return status.Convert(s.err())
}

func (s *testStream) runNowCount() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.runNows)
}

func started(id, pipe string, at time.Time) *agentpb.AgentMessage {
	return &agentpb.AgentMessage{Body: &agentpb.AgentMessage_RunStarted{RunStarted: &agentpb.RunStarted{RunId: id, Pipe: pipe, PipeVersion: 1,
		Trigger: agentpb.Trigger_TRIGGER_SCHEDULE, StartedAt: timestamppb.New(at), Attempt: 1}}}
}

func finished(id, pipe string, st agentpb.RunStatus, reason string) *agentpb.AgentMessage {
	return &agentpb.AgentMessage{Body: &agentpb.AgentMessage_RunFinished{RunFinished: &agentpb.RunFinished{RunId: id, Pipe: pipe, PipeVersion: 1,
		Trigger: agentpb.Trigger_TRIGGER_SCHEDULE, Status: st, Reason: reason, FinishedAt: timestamppb.Now(), DurationMs: 10, Attempts: 1, WrittenBy: "runner"}}}
}

func heartbeat(outbox uint64, sent time.Time, running ...string) *agentpb.AgentMessage {
	return &agentpb.AgentMessage{Body: &agentpb.AgentMessage_Heartbeat{Heartbeat: &agentpb.Heartbeat{SentAt: timestamppb.New(sent),
		RunningRunIds: running, OutboxRecords: outbox}}}
}

// metricValue returns the value of the sample line that starts with name
// (labels included), or -1 when there is none.
func metricValue(text, name string) float64 {
	for _, line := range strings.Split(text, "\n") {
		if rest, ok := strings.CutPrefix(line, name+" "); ok {
			var v float64
			fmt.Sscan(rest, &v)
			return v
		}
	}
	return -1
}

// A run record carries reason, scheduled_at, attempts and written_by, and
// the runs API filters on them, refusing bad filters with their fields.
func TestRunRecordFieldsAndFilters(t *testing.T) {
	ts := startServer(t)
	_, st := ts.jobStream()
	fire := time.Date(2026, 3, 1, 2, 0, 0, 0, time.UTC)
	oom := finished("r-oom", "job", agentpb.RunStatus_RUN_STATUS_FAILED, "oom-kill")
	oom.GetRunFinished().ScheduledAt = timestamppb.New(fire)
	oom.GetRunFinished().Attempts = 3
	oom.GetRunFinished().WrittenBy = "daemon"
	oom.GetRunFinished().Trigger = agentpb.Trigger_TRIGGER_CATCHUP
	ok := finished("r-ok", "job", agentpb.RunStatus_RUN_STATUS_SUCCEEDED, "")
	ok.GetRunFinished().ScheduledAt = timestamppb.New(fire.Add(time.Hour))
	sendAll(t, st, 1, started("r-oom", "job", time.Now()), oom, ok)

	var run api.Run
	ts.adminOK("GET", "/api/v1/runs/r-oom", nil, &run)
	if run.Reason != "oom-kill" || run.Attempts != 3 || run.WrittenBy != "daemon" || run.ScheduledAt == nil || !run.ScheduledAt.Equal(fire) ||
		run.Trigger != "catchup" || run.Status != api.StatusFailed {
		t.Fatalf("run: %+v", run)
	}
	ids := func(q string) []string {
		var list api.RunList
		ts.adminOK("GET", "/api/v1/runs?"+q, nil, &list)
		return keysOf(list.Runs, func(r api.Run) string { return r.ID })
	}
	if got := ids("reason=oom-kill"); !slices.Equal(got, []string{"r-oom"}) {
		t.Errorf("reason=oom-kill: %v", got)
	}
	if got := ids("status=succeeded"); !slices.Equal(got, []string{"r-ok"}) {
		t.Errorf("status=succeeded: %v", got)
	}
	since := url.QueryEscape(fire.Add(30 * time.Minute).Format(time.RFC3339))
	if got := ids("scheduled_since=" + since); !slices.Equal(got, []string{"r-ok"}) {
		t.Errorf("scheduled_since: %v", got)
	}
	if got := ids("scheduled_until=" + since); !slices.Equal(got, []string{"r-oom"}) {
		t.Errorf("scheduled_until: %v", got)
	}
	for q, field := range map[string]string{
		"status=weird":                         "status",
		"scheduled_since=yesterday":            "scheduled_since",
		"scheduled_until=2026-13-01":           "scheduled_until",
		"reason=" + url.QueryEscape("\x1b[2J"): "reason",
		"scheduled_since=2026-03-02T00:00:00Z&scheduled_until=2026-03-01T00:00:00Z": "scheduled_until",
	} {
		r := ts.do("GET", "/api/v1/runs?"+q, ts.admin, nil)
		var eb api.ErrorBody
		r.decode(t, &eb)
		if r.code != 400 || len(eb.Error.Details) == 0 || eb.Error.Details[0].Field != field {
			t.Errorf("%s: %d %s", q, r.code, r.body)
		}
	}
}

// A run left running by an agent whose heartbeats no longer list it is
// settled failed, reason lost, once the agent's outbox is drained and two
// such heartbeats in a row left it out — not while records wait, not while
// it is listed, not when it started after the heartbeat. A later real
// RunFinished replaces it; a cancel of it is 409.
func TestLostRunSettledAfterDrain(t *testing.T) {
	ts := startServer(t)
	_, st := ts.jobStream()
	t0 := time.Now().Add(-time.Minute)
	seq := sendAll(t, st, 1, started("r-lost", "job", t0), started("r-alive", "job", t0))
	// barrier sends a heartbeat, then a durable record, and waits for the
	// record's ack: the heartbeat was committed before it.
	barrier := func(hb *agentpb.AgentMessage) {
		t.Helper()
		if err := st.stream.Send(hb); err != nil {
			t.Fatal(err)
		}
		seq = sendAll(t, st, seq, &agentpb.AgentMessage{Body: &agentpb.AgentMessage_LogChunk{LogChunk: &agentpb.LogChunk{RunId: "r-alive", ChunkSeq: seq, Data: []byte("x")}}})
	}
	status := func(id string) api.Run {
		var r api.Run
		ts.adminOK("GET", "/api/v1/runs/"+id, nil, &r)
		return r
	}
	barrier(heartbeat(2, time.Now())) // records still wait in the outbox: nothing is settled
	barrier(heartbeat(2, time.Now()))
	barrier(heartbeat(0, time.Now(), "r-lost", "r-alive"))
	barrier(heartbeat(0, t0.Add(-time.Second), "r-alive")) // sent before r-lost started
	barrier(heartbeat(0, t0.Add(-time.Second), "r-alive"))
	barrier(heartbeat(0, time.Now(), "r-alive"))           // one strike
	barrier(heartbeat(0, time.Now(), "r-lost", "r-alive")) // listed again: strikes cleared
	barrier(heartbeat(0, time.Now(), "r-alive"))           // one strike
	if r := status("r-lost"); r.Status != api.StatusRunning {
		t.Fatalf("settled too early: %+v", r)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	resp, follower := ts.openSSE(ctx, ts.admin, "r-lost", "")
	defer resp.Body.Close()
	barrier(heartbeat(0, time.Now(), "r-alive")) // the second in a row
	if ev := nextEvent(t, follower, 10*time.Second); ev.event != "end" || !strings.Contains(ev.data, `"reason":"lost"`) {
		t.Fatalf("live-log follower of the lost run: %+v", ev)
	}
	r := status("r-lost")
	if r.Status != api.StatusFailed || r.Reason != store.ReasonLost || r.WrittenBy != "server" || r.FinishedAt == nil {
		t.Fatalf("not settled lost: %+v", r)
	}
	if r := status("r-alive"); r.Status != api.StatusRunning {
		t.Fatalf("a listed run was settled: %+v", r)
	}
	if v := metricValue(ts.scrape(ts.admin), "drover_runs_lost_total"); v != 1 {
		t.Errorf("drover_runs_lost_total %v", v)
	}
	var list api.RunList
	ts.adminOK("GET", "/api/v1/runs?reason=lost", nil, &list)
	if len(list.Runs) != 1 || list.Runs[0].ID != "r-lost" {
		t.Errorf("reason=lost: %+v", list.Runs)
	}
	if c := ts.do("POST", "/api/v1/runs/r-lost/cancel", ts.admin, nil); c.code != 409 || c.errorCode() != "conflict" || !strings.Contains(string(c.body), "has ended (failed, reason lost)") {
		t.Fatalf("cancel of a settled run: %d %s", c.code, c.body)
	}
	// The real end arrives after all: it replaces the settlement.
	sendAll(t, st, seq, finished("r-lost", "job", agentpb.RunStatus_RUN_STATUS_SUCCEEDED, ""))
	if r := status("r-lost"); r.Status != api.StatusSucceeded || r.Reason != "" || r.WrittenBy != "runner" {
		t.Fatalf("RunFinished after settlement: %+v", r)
	}
}

// The machine id is bound at the first Hello (or at enrollment); another
// machine presenting the certificate is refused with identity_conflict
// (audited, counted, shown on the agent) while the real agent keeps its
// stream and alone gets RunNow; a reconnect of the same machine replaces
// its old stream.
func TestIdentityBoundToMachine(t *testing.T) {
	ts := startServer(t)
	a := ts.jobAgent()
	real, err := a.openStreamAs(machineA, "real-host")
	if err != nil {
		t.Fatal(err)
	}
	defer real.close()
	sendAll(t, real, 1, finished("r1", "job", agentpb.RunStatus_RUN_STATUS_SUCCEEDED, ""))
	var ag api.Agent
	ts.adminOK("GET", "/api/v1/agents/"+a.id, nil, &ag)
	if ag.MachineID != machineA || ag.IdentityConflicts != 0 {
		t.Fatalf("not bound at the first Hello: %+v", ag)
	}

	cl := a.clone(t)
	for _, mid := range []string{machineB, ""} {
		bad, err := cl.openStreamAs(mid, "clone")
		if err != nil {
			t.Fatal(err)
		}
		s := bad.ended(t, 10*time.Second)
		if s.Code() != codes.PermissionDenied || !strings.Contains(s.Message(), "identity_conflict") {
			t.Fatalf("clone with machine %q: %v", mid, s)
		}
		bad.close()
	}
	ts.adminOK("GET", "/api/v1/agents/"+a.id, nil, &ag)
	if ag.IdentityConflicts != 2 || ag.IdentityConflictAt == nil || ag.IdentityConflictMachine != "(none)" || ag.MachineID != machineA || !ag.Online ||
		ag.ReportedHostname != "real-host" {
		t.Fatalf("agent after conflicts: %+v", ag)
	}
	if v := metricValue(ts.scrape(ts.admin), "drover_identity_conflicts_total"); v != 2 {
		t.Errorf("drover_identity_conflicts_total %v", v)
	}
	var al api.AuditList
	ts.adminOK("GET", "/api/v1/audit?action=agent.identity_conflict", nil, &al)
	if len(al.Entries) == 0 || al.Entries[0].Target != "agent/"+a.id {
		t.Fatalf("audit: %+v", al.Entries)
	}
	// HTTPS requests that name another machine are refused too.
	if r, err := cl.get("/api/v1/agents/self/secrets", api.MachineIDHeader, machineB); err != nil || r.code != 409 || !strings.Contains(string(r.body), "identity_conflict") {
		t.Fatalf("secrets for another machine: %v %v", r, err)
	}
	if r, err := cl.get("/api/v1/agents/self/manifest", api.MachineIDHeader, strings.ToUpper(machineA)); err != nil || r.code != 200 {
		t.Fatalf("manifest for the bound machine: %v %v", r, err)
	}
	// Once bound, a request that does not say which machine it comes from
	// is refused: a clone cannot get in by leaving the header out.
	if r, err := cl.get("/api/v1/agents/self/manifest"); err != nil || r.code != 409 || !strings.Contains(string(r.body), "identity_conflict") {
		t.Fatalf("manifest without a machine id: %v %v", r, err)
	}
	// The real agent's stream still works, and RunNow reaches it alone.
	sendAll(t, real, 2, finished("r2", "job", agentpb.RunStatus_RUN_STATUS_SUCCEEDED, ""))
	var rr api.RunPipeResponse
	ts.adminOK("POST", "/api/v1/pipes/job/run", api.RunPipeRequest{}, &rr)
	testkit.WaitFor(t, 5*time.Second, "RunNow on the real stream", func() bool { return real.runNowCount() == 1 })

	// The same machine reconnects: the new stream replaces the old one.
	again, err := cl.openStreamAs(machineA, "real-host")
	if err != nil {
		t.Fatal(err)
	}
	defer again.close()
	sendAll(t, again, 3, finished("r3", "job", agentpb.RunStatus_RUN_STATUS_SUCCEEDED, ""))
	if s := real.ended(t, 10*time.Second); s.Code() != codes.Unavailable {
		t.Fatalf("old stream ended with %v", s)
	}
	ts.adminOK("POST", "/api/v1/pipes/job/run", api.RunPipeRequest{}, &rr)
	testkit.WaitFor(t, 5*time.Second, "RunNow on the new stream", func() bool { return again.runNowCount() == 1 })
	if n := real.runNowCount(); n != 1 {
		t.Fatalf("the replaced stream got %d RunNows", n)
	}

	// Bound at enrollment: the first Hello must then match.
	b, err := enrollWithMachine(ts, machineB)
	if err != nil {
		t.Fatal(err)
	}
	bs, err := b.openStreamAs(machineA, "h")
	if err != nil {
		t.Fatal(err)
	}
	if s := bs.ended(t, 10*time.Second); s.Code() != codes.PermissionDenied || !strings.Contains(s.Message(), "identity_conflict") {
		t.Fatalf("hello from another machine than enrolled: %v", s)
	}
	bs.close()
	if _, err := enrollWithMachine(ts, "not-hex"); err == nil || !strings.Contains(err.Error(), "machine_id") {
		t.Fatalf("bad machine_id at enrollment: %v", err)
	}
}

// enrollWithMachine enrolls through the HTTP API with a machine id.
func enrollWithMachine(ts *testServer, machineID string) (*testAgent, error) {
	enrollMachineID = machineID
	defer func() { enrollMachineID = "" }()
	a, err := enroll(ts.base, ts.token(nil), "host-m")
	if err == nil {
		ts.t.Cleanup(a.close)
	}
	return a, err
}

// One live stream per identity: an agent that opens many streams holds one
// slot, and another agent still connects under a small global limit.
func TestOneStreamPerIdentity(t *testing.T) {
	ts := startServer(t, func(c *Config) { c.GRPC.MaxStreams = 3 })
	a := ts.jobAgent()
	var streams []*testStream
	for i := range 12 {
		st, err := a.openStreamAs(machineA, "h")
		if err != nil {
			t.Fatal(err)
		}
		defer st.close()
		sendAll(t, st, uint64(i+1), finished(fmt.Sprintf("r%d", i), "job", agentpb.RunStatus_RUN_STATUS_SUCCEEDED, ""))
		streams = append(streams, st)
	}
	for _, st := range streams[:len(streams)-1] {
		st.ended(t, 10*time.Second)
	}
	if n := ts.s.hub.Count(); n != 1 {
		t.Fatalf("%d live streams", n)
	}
	b := ts.enrollAgent(nil)
	testkit.WaitFor(t, 10*time.Second, "the replaced streams to end", func() bool { return ts.s.streams.Streams() == 1 })
	bs, err := b.openStreamAs(machineB, "b")
	if err != nil {
		t.Fatal(err)
	}
	defer bs.close()
	sendAll(t, bs, 1, heartbeat(1, time.Now()), &agentpb.AgentMessage{Body: &agentpb.AgentMessage_LogChunk{LogChunk: &agentpb.LogChunk{RunId: "b1", Data: []byte("x")}}})
	// The last stream of a is still live.
	sendAll(t, streams[len(streams)-1], 100, finished("last", "job", agentpb.RunStatus_RUN_STATUS_SUCCEEDED, ""))
}

// Records are checked against the agent's manifest and the rules: runs of
// pipes it does not run are acknowledged, dropped, counted and audited;
// text is escaped; Hello does not change the enrolled hostname; the pipe
// label of the metrics stays bounded by the manifest.
func TestAgentRecordsValidated(t *testing.T) {
	ts := startServer(t)
	a := ts.jobAgent()
	ts.enrollAgent(map[string]string{"other": "yes"})
	ts.putScriptPipe("other-job", "echo other", map[string]string{"other": "yes"})
	var before api.Agent
	ts.adminOK("GET", "/api/v1/agents/"+a.id, nil, &before)
	st, err := a.openStreamAs(machineA, "evil\x1b[31m\x00host\n")
	if err != nil {
		t.Fatal(err)
	}
	defer st.close()
	msgs := []*agentpb.AgentMessage{
		finished("forged", "other-job", agentpb.RunStatus_RUN_STATUS_SUCCEEDED, ""), // another agent's pipe
		finished("bad\x00id", "job", agentpb.RunStatus_RUN_STATUS_SUCCEEDED, ""),
	}
	for i := range 300 {
		msgs = append(msgs, finished(fmt.Sprintf("m%d", i), fmt.Sprintf("made-up-%d", i), agentpb.RunStatus_RUN_STATUS_SUCCEEDED, ""))
	}
	esc := finished("r-esc", "job", agentpb.RunStatus_RUN_STATUS_FAILED, "exit 1\x1b[2J\nforged line")
	esc.GetRunFinished().Error = "boom\x00\x1b]0;title\x07<b>\u202e"
	esc.GetRunFinished().Signal = "SIG\x1bKILL"
	msgs = append(msgs, esc)
	sendAll(t, st, 1, msgs...)

	var list api.RunList
	ts.adminOK("GET", "/api/v1/runs?limit=100", nil, &list)
	if len(list.Runs) != 1 || list.Runs[0].ID != "r-esc" {
		t.Fatalf("stored runs: %+v", list.Runs)
	}
	r := list.Runs[0]
	if r.Reason != `exit 1\x1b[2J\x0aforged line` || r.Error != `boom\x00\x1b]0;title\x07<b>\u202e` || r.Signal != "invalid" {
		t.Fatalf("not escaped: reason %q error %q signal %q", r.Reason, r.Error, r.Signal)
	}
	var ag api.Agent
	ts.adminOK("GET", "/api/v1/agents/"+a.id, nil, &ag)
	if ag.Hostname != before.Hostname || ag.ReportedHostname != `evil\x1b[31m\x00host\x0a` {
		t.Fatalf("hostname %q, reported %q", ag.Hostname, ag.ReportedHostname)
	}
	m := ts.scrape(ts.admin)
	if v := metricValue(m, `drover_agent_records_refused_total{reason="unknown_pipe"}`); v != 301 {
		t.Errorf("unknown_pipe refusals %v", v)
	}
	if v := metricValue(m, `drover_agent_records_refused_total{reason="invalid"}`); v != 1 {
		t.Errorf("invalid refusals %v", v)
	}
	pipes := map[string]bool{}
	for _, p := range regexp.MustCompile(`drover_run_duration_seconds_count\{pipe="([^"]*)"\}`).FindAllStringSubmatch(m, -1) {
		pipes[p[1]] = true
	}
	if len(pipes) != 1 || !pipes["job"] {
		t.Fatalf("run duration pipe labels: %v", pipes)
	}
	var al api.AuditList
	ts.adminOK("GET", "/api/v1/audit?action=agent.record_refused", nil, &al)
	if len(al.Entries) != 2 { // one per reason, rate-limited
		t.Fatalf("refusal audit entries: %+v", al.Entries)
	}
}

// ManifestStatus is bounded: only the manifest's pipes are kept, too many
// pipes are refused; manifest_expired is stored, shown and counted.
func TestManifestStatusBoundedAndExpiry(t *testing.T) {
	ts := startServer(t)
	a, st := ts.jobStream()
	exp := time.Now().Add(-time.Hour).Truncate(time.Second).UTC()
	pipes := []*agentpb.PipeStatus{{Name: "job", Version: 1, ApplyError: strings.Repeat("e", 5000),
		ElapseMismatch: "systemd next elapse 2027-03-14T08:00:00Z, evaluator 2027-03-14T07:00:00Z"}}
	for i := range 500 {
		pipes = append(pipes, &agentpb.PipeStatus{Name: fmt.Sprintf("junk-%d", i), ApplyError: strings.Repeat("x", 4000)})
	}
	huge := make([]*agentpb.PipeStatus, stream.MaxManifestPipes+1)
	for i := range huge {
		huge[i] = &agentpb.PipeStatus{Name: "job"}
	}
	sendAll(t, st, 1,
		&agentpb.AgentMessage{Body: &agentpb.AgentMessage_ManifestStatus{ManifestStatus: &agentpb.ManifestStatus{Serial: 1, State: agentpb.ManifestStatus_STATE_APPLIED,
			AppliedSerial: 1, Pipes: pipes, ManifestExpired: true, ExpiresAt: timestamppb.New(exp)}}},
		&agentpb.AgentMessage{Body: &agentpb.AgentMessage_ManifestStatus{ManifestStatus: &agentpb.ManifestStatus{Serial: 2, State: agentpb.ManifestStatus_STATE_APPLIED,
			AppliedSerial: 2, Pipes: huge}}})
	var ag api.Agent
	r := ts.adminOK("GET", "/api/v1/agents/"+a.id, nil, &ag)
	if len(ag.Pipes) != 1 || ag.Pipes[0].Name != "job" || len(ag.Pipes[0].ApplyError) != 1024 || !ag.ManifestExpired ||
		ag.ManifestExpiresAt == nil || !ag.ManifestExpiresAt.Equal(exp) || ag.AppliedSerial != 1 || len(r.body) > 8<<10 ||
		!strings.Contains(ag.Pipes[0].ElapseMismatch, "evaluator 2027-03-14T07:00:00Z") {
		t.Fatalf("agent (%d bytes): %+v", len(r.body), ag)
	}
	m := ts.scrape(ts.admin)
	if v := metricValue(m, "drover_agents_manifest_expired"); v != 1 {
		t.Errorf("drover_agents_manifest_expired %v", v)
	}
	if v := metricValue(m, "drover_agent_elapse_mismatches"); v != 1 {
		t.Errorf("drover_agent_elapse_mismatches %v", v)
	}
	if v := metricValue(m, `drover_agent_records_refused_total{reason="too_large"}`); v != 1 {
		t.Errorf("too_large refusals %v", v)
	}
}

// Run records over an agent's quota wait for it: 25 runs at 20/s with a
// burst of 5 take at least a second, and none is lost.
func TestStreamRunQuota(t *testing.T) {
	ts := startServer(t, func(c *Config) {
		c.Agents.RunRecordsPerSecond, c.Agents.RunRecordsBurst = 20, 5
	})
	_, st := ts.jobStream()
	var msgs []*agentpb.AgentMessage
	for i := range 25 {
		msgs = append(msgs, finished(fmt.Sprintf("q%d", i), "job", agentpb.RunStatus_RUN_STATUS_SUCCEEDED, ""))
	}
	start := time.Now()
	sendAll(t, st, 1, msgs...)
	if d := time.Since(start); d < 900*time.Millisecond {
		t.Fatalf("25 run records stored in %s, the quota allows no less than 1s", d)
	}
	var list api.RunList
	ts.adminOK("GET", "/api/v1/runs?limit=100", nil, &list)
	if len(list.Runs) != 25 {
		t.Fatalf("%d runs stored, want 25", len(list.Runs))
	}
	if v := metricValue(ts.scrape(ts.admin), `drover_agent_records_throttled_total{reason="run_records"}`); v < 15 {
		t.Errorf("throttled %v", v)
	}
	// Per pipe too.
	ts2 := startServer(t, func(c *Config) { c.Agents.PipeRunRecordsPerSecond, c.Agents.PipeRunRecordsBurst = 20, 5 })
	a2 := ts2.jobAgent()
	st2 := a2.mustStream(t)
	start = time.Now()
	sendAll(t, st2, 1, msgs...)
	if d := time.Since(start); d < 900*time.Millisecond {
		t.Fatalf("per-pipe quota: 25 run records in %s", d)
	}
}

// Payloads are streamed from the store in slices and fetches are bounded
// per agent (and in all): over the bound, 429 with Retry-After.
func TestPayloadFetchStreamedAndBounded(t *testing.T) {
	ts := startServer(t, func(c *Config) { c.HTTP.MaxBodyBytes = 8 << 20; c.Agents.PayloadFetchesPerAgent = 1 })
	a := ts.enrollAgent(map[string]string{"role": "big"})
	big := make([]byte, 3*payloadSlice+12345)
	crand.Read(big)
	bundle, err := manifest.BuildBundle([]manifest.BundleFile{{Path: "run.sh", Mode: 0o755, Data: []byte("#!/bin/sh\n")}, {Path: "blob", Mode: 0o644, Data: big}})
	if err != nil {
		t.Fatal(err)
	}
	spec := map[string]any{"schedule": "@daily", "command": []string{"./run.sh"}, "files": []string{"run.sh", "blob"},
		"targets": map[string]any{"tags": map[string]string{"role": "big"}}}
	var pr api.PutPipeResponse
	ts.adminOK("PUT", "/api/v1/pipes/big", map[string]any{"spec": spec, "bundle": base64.StdEncoding.EncodeToString(bundle)}, &pr)
	path := "/api/v1/agents/self/payloads/" + pr.Digest

	release, err := ts.s.acquireFetch(a.id) // a download in progress
	if err != nil {
		t.Fatal(err)
	}
	r, err := a.get(path)
	if err != nil || r.code != 429 || r.header.Get("Retry-After") == "" {
		t.Fatalf("second concurrent fetch: %v %v", r, err)
	}
	release()
	// The global bound, while the bundle is not in memory.
	var rels []func()
	for range ts.cfg.Agents.PayloadFetches {
		other := fmt.Sprintf("agent-%d", len(rels))
		rel, err := ts.s.acquireFetch(other)
		if err != nil {
			t.Fatal(err)
		}
		rels = append(rels, rel)
	}
	if r, _ := a.get(path); r.code != 429 {
		t.Fatalf("fetch over the global bound: %d", r.code)
	}
	for _, rel := range rels {
		rel()
	}
	r, err = a.get(path)
	if err != nil || r.code != 200 || manifest.Digest(r.body) != pr.Digest || len(r.body) != len(bundle) {
		t.Fatalf("fetch: %v", err)
	}
	// Now held in memory, it is served without a slot.
	rels = rels[:0]
	for range ts.cfg.Agents.PayloadFetches {
		rel, err := ts.s.acquireFetch(fmt.Sprintf("agent-%d", len(rels)))
		if err != nil {
			t.Fatal(err)
		}
		rels = append(rels, rel)
	}
	if r, err := a.get(path); err != nil || r.code != 200 || manifest.Digest(r.body) != pr.Digest {
		t.Fatalf("fetch from memory with every slot taken: %v %v", r, err)
	}
	for _, rel := range rels {
		rel()
	}
}

// A stream opened with a certificate that a renewal has since retired is
// closed when the renewal is promoted, as revocation closes streams.
func TestRenewalClosesRetiredStream(t *testing.T) {
	ts := startServer(t)
	a := ts.jobAgent()
	old := a.mustStream(t)
	sendAll(t, old, 1, finished("r1", "job", agentpb.RunStatus_RUN_STATUS_SUCCEEDED, ""))
	key, certPEM, err := a.renew()
	if err != nil {
		t.Fatal(err)
	}
	// Until the new certificate is used, the old stream lives on.
	sendAll(t, old, 2, finished("r2", "job", agentpb.RunStatus_RUN_STATUS_SUCCEEDED, ""))
	if err := a.setCert(key, certPEM); err != nil {
		t.Fatal(err)
	}
	if r, err := a.get("/api/v1/agents/self/trust"); err != nil || r.code != 200 { // promotes the new certificate
		t.Fatalf("first use of the new certificate: %v %v", r, err)
	}
	if s := old.ended(t, 10*time.Second); s.Code() != codes.Unauthenticated || !strings.Contains(s.Message(), "superseded") {
		t.Fatalf("old stream ended with %v", s)
	}
	st := a.mustStream(t)
	sendAll(t, st, 3, finished("r3", "job", agentpb.RunStatus_RUN_STATUS_SUCCEEDED, ""))
}

// The gRPC port answers the standard health check (the agents' liveness
// probe of an idle stream) for a client with an agent certificate, and
// says NOT_SERVING once the server begins to stop.
func TestGRPCHealth(t *testing.T) {
	ts := startServer(t)
	a := ts.jobAgent()
	conn, err := a.dial("")
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	hc := healthpb.NewHealthClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r, err := hc.Check(ctx, &healthpb.HealthCheckRequest{})
	if err != nil || r.Status != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health check: %v %v", r, err)
	}
	ts.s.grpcHealth.Shutdown()
	if r, err = hc.Check(ctx, &healthpb.HealthCheckRequest{}); err != nil || r.Status != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Fatalf("health check while stopping: %v %v", r, err)
	}
}
