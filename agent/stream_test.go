package agent

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/drover/drover/agent/apply"
	"github.com/drover/drover/agent/spool"
	"github.com/drover/drover/internal/testkit"
	"github.com/drover/drover/manifest"
	agentpb "github.com/drover/drover/proto"
)

// spoolRuns writes n runs (RunStarted, LogChunk, RunFinished each) into
// the spool of pipe, as the runner does, and returns their run ids.
func spoolRuns(t *testing.T, dataDir, pipe string, from, n int) []string {
	t.Helper()
	w, err := spool.NewWriter(filepath.Join(dataDir, "runs", pipe, "spool"))
	must(t, err)
	var ids []string
	for i := from; i < from+n; i++ {
		id := fmt.Sprintf("run-%05d", i)
		ids = append(ids, id)
		now := timestamppb.Now()
		for _, m := range []*agentpb.AgentMessage{
			{Body: &agentpb.AgentMessage_RunStarted{RunStarted: &agentpb.RunStarted{RunId: id, Pipe: pipe, PipeVersion: 1, Trigger: agentpb.Trigger_TRIGGER_SCHEDULE, StartedAt: now}}},
			{Body: &agentpb.AgentMessage_LogChunk{LogChunk: &agentpb.LogChunk{RunId: id, ChunkSeq: 0, Stream: agentpb.LogStream_LOG_STREAM_STDOUT, Data: []byte("out " + id + "\n"), At: now}}},
			{Body: &agentpb.AgentMessage_RunFinished{RunFinished: &agentpb.RunFinished{RunId: id, Pipe: pipe, PipeVersion: 1, Status: agentpb.RunStatus_RUN_STATUS_SUCCEEDED, StartedAt: now, FinishedAt: now, LogChunks: 1}}},
		} {
			if _, err := w.Write(m); err != nil {
				t.Fatal(err)
			}
		}
	}
	return ids
}

// checkDelivered checks that the server committed exactly the records of
// runs, each once, in order, with sequence numbers without gaps.
func checkDelivered(t *testing.T, srv *fakeServer, runs []string) {
	t.Helper()
	srv.mu.Lock()
	defer srv.mu.Unlock()
	for i, seq := range srv.order {
		if seq != uint64(i+1) {
			t.Fatalf("commit %d has seq %d: a gap or reordering", i, seq)
		}
	}
	var got []string
	seen := map[string]int{}
	for _, seq := range srv.order {
		m := srv.committed[seq]
		switch b := m.GetBody().(type) {
		case *agentpb.AgentMessage_RunStarted:
			got = append(got, b.RunStarted.GetRunId())
			seen[b.RunStarted.GetRunId()]++
		case *agentpb.AgentMessage_RunFinished:
			seen[b.RunFinished.GetRunId()] += 10
		case *agentpb.AgentMessage_LogChunk:
			seen[b.LogChunk.GetRunId()] += 100
		}
	}
	if len(got) != len(runs) {
		t.Fatalf("%d runs committed, want %d", len(got), len(runs))
	}
	for i := range runs {
		if got[i] != runs[i] {
			t.Fatalf("run %d is %s, want %s (order)", i, got[i], runs[i])
		}
		if seen[runs[i]] != 111 {
			t.Fatalf("run %s: records seen %d times (code %d), want each once", runs[i], seen[runs[i]], seen[runs[i]])
		}
	}
}

// TestOutboxReplay: runner records flow from the spool through the outbox
// to the server; a stream that drops mid-way and an agent restarted with
// unacknowledged records both end with every record committed exactly
// once, in order, and an empty outbox.
func TestOutboxReplay(t *testing.T) {
	srv := newFakeServer(t)
	cfg := testConfig(t, srv)
	cfg.MaxBackoff = time.Second
	tok := srv.token(time.Hour)
	ta := startAgent(t, cfg, nil, WithEnrollToken(tok))
	ta.enrolled(10 * time.Second)

	// 1. The stream drops after 100 records; the agent reconnects and resends
	// what was not acknowledged.
	srv.mu.Lock()
	srv.dropAfter = 100
	srv.mu.Unlock()
	runs := spoolRuns(t, cfg.DataDir, "replay", 0, 100)
	testkit.WaitFor(t, 20*time.Second, "300 records", func() bool {
		srv.mu.Lock()
		defer srv.mu.Unlock()
		return len(srv.order) == 300
	})
	testkit.WaitFor(t, 10*time.Second, "an empty outbox", func() bool {
		n, _, _ := ta.store.OutboxStats()
		return n == 0
	})
	checkDelivered(t, srv, runs)
	if names, _ := spool.List(filepath.Join(cfg.DataDir, "runs", "replay", "spool")); len(names) != 0 {
		t.Fatalf("%d spool files left", len(names))
	}

	// 2. The server receives but does not acknowledge; the agent stops;
	// more runs happen while it is down; it starts again and replays.
	srv.mu.Lock()
	srv.holdAcks = true
	srv.mu.Unlock()
	runs = append(runs, spoolRuns(t, cfg.DataDir, "replay", 100, 50)...)
	testkit.WaitFor(t, 20*time.Second, "450 records", func() bool {
		srv.mu.Lock()
		defer srv.mu.Unlock()
		return len(srv.order) == 450
	})
	ta.stop()
	runs = append(runs, spoolRuns(t, cfg.DataDir, "replay", 150, 50)...)
	srv.mu.Lock()
	srv.holdAcks = false
	srv.mu.Unlock()
	ta2 := startAgent(t, cfg, nil)
	ta2.enrolled(10 * time.Second)
	testkit.WaitFor(t, 20*time.Second, "600 records and an empty outbox", func() bool {
		n, _, _ := ta2.store.OutboxStats()
		srv.mu.Lock()
		defer srv.mu.Unlock()
		return len(srv.order) == 600 && n == 0
	})
	checkDelivered(t, srv, runs)
	srv.mu.Lock()
	dupes := srv.dupes
	srv.mu.Unlock()
	if dupes < 150 {
		t.Fatalf("%d records re-sent; the 150 unacknowledged ones must be", dupes)
	}
	srv.mu.Lock()
	hellos := len(srv.hellos)
	srv.mu.Unlock()
	if hellos < 3 {
		t.Fatalf("%d Hellos: want one per stream", hellos)
	}
}

// TestStreamCommands: RunNow and CancelRun from the server reach the
// backend; Hello describes the agent.
func TestStreamCommands(t *testing.T) {
	srv := newFakeServer(t)
	ta, agentID := enrolledAgent(t, srv)
	srv.mu.Lock()
	h := srv.hellos[0]
	srv.mu.Unlock()
	if h.GetBackend() != "cron" || h.GetScope() != "user" || h.GetHostname() == "" || h.GetOs() == "" || h.GetArch() == "" || h.GetAgentVersion() == "" {
		t.Fatalf("hello %+v", h)
	}
	spoolRuns(t, ta.cfg.DataDir, "cmd", 0, 1) // run-00000 of pipe cmd
	testkit.WaitFor(t, 10*time.Second, "the run records", func() bool { return ta.a.pipeOfRun("run-00000") == "" && len(ta.a.Status(t.Context()).Pipes) == 1 })
	srv.send(agentID, &agentpb.ServerMessage{Body: &agentpb.ServerMessage_RunNow{RunNow: &agentpb.RunNow{Pipe: "cmd", RequestId: "req-1"}}})
	testkit.WaitFor(t, 5*time.Second, "RunNow", func() bool {
		ta.fake.mu.Lock()
		defer ta.fake.mu.Unlock()
		return len(ta.fake.runNows) == 1 && ta.fake.runNows[0] == "cmd/req-1"
	})
	ta.fake.mu.Lock()
	ta.fake.states = append(ta.fake.states, applyPipeRunning("cmd", "run-77"))
	ta.fake.mu.Unlock()
	srv.send(agentID, &agentpb.ServerMessage{Body: &agentpb.ServerMessage_CancelRun{CancelRun: &agentpb.CancelRun{RunId: "run-77"}}})
	testkit.WaitFor(t, 5*time.Second, "CancelRun", func() bool {
		ta.fake.mu.Lock()
		defer ta.fake.mu.Unlock()
		return len(ta.fake.cancels) == 1 && ta.fake.cancels[0] == "cmd/run-77"
	})
	st := ta.a.Status(t.Context())
	if st.Pipes[0].LastRun == nil || st.Pipes[0].LastRun.Status != "succeeded" {
		t.Fatalf("status pipes %+v", st.Pipes)
	}
}

// TestRunNowRefused: a RunNow the backend cannot carry out still ends in a
// run record on the server with the request id — failed with the reason
// after one sync when the pipe is unknown, skipped when a run is in
// progress — so an operator never waits for a run that will not come.
func TestRunNowRefused(t *testing.T) {
	srv := newFakeServer(t)
	ta, agentID := enrolledAgent(t, srv)
	ta.fake.mu.Lock()
	ta.fake.runNowErr = map[string]error{
		"ghost": fmt.Errorf("%w: %q", apply.ErrUnknownPipe, "ghost"),
		"busy":  apply.ErrAlreadyRunning,
	}
	ta.fake.mu.Unlock()
	syncs := srv.count("GET " + pathManifest)
	srv.send(agentID, &agentpb.ServerMessage{Body: &agentpb.ServerMessage_RunNow{RunNow: &agentpb.RunNow{Pipe: "ghost", RequestId: "req-ghost"}}})
	srv.send(agentID, &agentpb.ServerMessage{Body: &agentpb.ServerMessage_RunNow{RunNow: &agentpb.RunNow{Pipe: "busy", RequestId: "req-busy"}}})
	finished := func(req string) *agentpb.RunFinished {
		srv.mu.Lock()
		defer srv.mu.Unlock()
		for _, seq := range srv.order {
			if f := srv.committed[seq].GetRunFinished(); f != nil && f.GetRequestId() == req {
				return f
			}
		}
		return nil
	}
	testkit.WaitFor(t, 10*time.Second, "both run records", func() bool { return finished("req-ghost") != nil && finished("req-busy") != nil })
	g, b := finished("req-ghost"), finished("req-busy")
	if g.GetStatus() != agentpb.RunStatus_RUN_STATUS_FAILED || g.GetPipe() != "ghost" || g.GetTrigger() != agentpb.Trigger_TRIGGER_API ||
		!strings.Contains(g.GetError(), "not installed") || g.GetRunId() == "" || g.GetExitCode() != -1 {
		t.Errorf("unknown pipe: %v", g)
	}
	if b.GetStatus() != agentpb.RunStatus_RUN_STATUS_SKIPPED || b.GetPipe() != "busy" || !strings.Contains(b.GetError(), "in progress") || b.GetRunId() == g.GetRunId() {
		t.Errorf("pipe already running: %v", b)
	}
	ta.fake.mu.Lock()
	tries := map[string]int{}
	for _, r := range ta.fake.runNows {
		tries[r]++
	}
	ta.fake.mu.Unlock()
	if tries["ghost/req-ghost"] != 2 || tries["busy/req-busy"] != 1 {
		t.Errorf("RunNow attempts %v: want ghost twice (before and after a sync), busy once", tries)
	}
	if srv.count("GET "+pathManifest) <= syncs {
		t.Error("no sync for the unknown pipe")
	}
}

// TestHeartbeatCarriesAcceptedSerial: the heartbeat says which manifest
// the agent accepted (0 before any), for the server to nudge an agent left
// behind.
func TestHeartbeatCarriesAcceptedSerial(t *testing.T) {
	srv := newFakeServer(t)
	ta, agentID := enrolledAgent(t, srv, func(c *Config) { c.HeartbeatInterval = time.Second })
	testkit.WaitFor(t, 10*time.Second, "a heartbeat", func() bool { return srv.lastHeartbeat() != nil })
	if s := srv.lastHeartbeat().GetManifestSerial(); s != 0 {
		t.Fatalf("heartbeat before any manifest says serial %d", s)
	}
	p, b := testPipe(t, "hb-serial", "0 * * * *", "echo hb", 1)
	serial := srv.publish(agentID, []manifest.Pipe{p}, b)
	testkit.WaitFor(t, 10*time.Second, "the apply", func() bool { return ta.fake.applyCount() == 1 })
	testkit.WaitFor(t, 10*time.Second, "a heartbeat with the serial", func() bool {
		return srv.lastHeartbeat().GetManifestSerial() == serial
	})
}
