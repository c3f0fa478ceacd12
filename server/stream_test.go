package server

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/drover/drover/api"
	"github.com/drover/drover/internal/testkit"
	"github.com/drover/drover/server/store"
	"google.golang.org/protobuf/types/known/timestamppb"

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
	stb, err := b.openStream("")
	if err != nil {
		t.Fatal(err)
	}
	defer stb.close()
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
	st, err := a.openStream("")
	if err != nil {
		t.Fatal(err)
	}
	defer st.close()
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
	var ids []string
	for _, r := range runs {
		ids = append(ids, r.ID)
	}
	if !slices.Equal(ids, []string{"r9", "r8", "r7", "r6"}) {
		t.Fatalf("kept %v", ids)
	}
	var chunks int
	db.Reader().QueryRow(`SELECT COUNT(*) FROM log_chunks`).Scan(&chunks)
	if chunks != 4 {
		t.Fatalf("%d log chunks left, want 4", chunks)
	}
}
