package server

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/drover/drover/api"
	"github.com/drover/drover/internal/testkit"
	"github.com/drover/drover/server/store"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/timestamppb"

	agentpb "github.com/drover/drover/proto"
)

func manifestStatus(state agentpb.ManifestStatus_State, expired bool, fires map[string]time.Time) *agentpb.AgentMessage {
	st := &agentpb.ManifestStatus{State: state, At: timestamppb.Now(), ManifestExpired: expired, Error: "signature: unknown key"}
	if expired {
		st.ExpiresAt = timestamppb.New(time.Now().Add(-time.Hour))
	}
	for name, f := range fires {
		st.Pipes = append(st.Pipes, &agentpb.PipeStatus{Name: name, Version: 1, NextFireTimes: []*timestamppb.Timestamp{timestamppb.New(f)}})
	}
	return &agentpb.AgentMessage{Body: &agentpb.AgentMessage_ManifestStatus{ManifestStatus: st}}
}

// missedOf maps an agent's missed runs of a pipe by fire time to reason.
func (ts *testServer) missedOf(agent, pipe string) map[time.Time]string {
	ts.t.Helper()
	out := map[time.Time]string{}
	for _, r := range ts.runsOf(agent, pipe) {
		if r.Status == api.StatusMissed {
			out[r.ScheduledAt.UTC()] = r.Reason
		}
	}
	return out
}

// The deadline of a fire time is fire + jitter + grace; an online agent's
// reported fire times count (an "@every" pipe's only those), and a missed
// run of an online agent says "not reported"; an offline agent is expected
// to serve the evaluator's fire times ("agent offline"), except for a
// catchup: skip pipe, or an "@every" one, whose fire times only the host
// knows.
func TestMissedRunRules(t *testing.T) {
	ts := startServer(t)
	ctx := context.Background()
	tags := map[string]string{"rules": "yes"}
	on := ts.enrollAgent(tags)
	off := ts.enrollAgent(tags)
	ts.putMonPipe("jittered", tags, map[string]any{"schedule": "*/5 * * * *", "jitter": "2m", "grace": "1m"})
	ts.putMonPipe("skipper", tags, map[string]any{"schedule": "*/5 * * * *", "grace": "1m", "catchup": "skip"})
	ts.putMonPipe("interval", tags, map[string]any{"schedule": "@every 10m", "grace": "1m"})
	st := on.mustStream(t)
	if _, err := ts.s.monitor.pass(ctx); err != nil {
		t.Fatal(err)
	}
	t0 := ts.clock.Now()
	f := t0.UTC().Truncate(5 * time.Minute).Add(5 * time.Minute)
	// The online agent reports its next elapses: F for jittered and for
	// interval; nothing for skipper.
	sendAll(t, st, 1, manifestStatus(agentpb.ManifestStatus_STATE_APPLIED, false, map[string]time.Time{"jittered": f, "interval": f}))

	ts.clock.Advance(f.Add(2*time.Minute + 30*time.Second).Sub(t0))
	if _, err := ts.s.monitor.pass(ctx); err != nil {
		t.Fatal(err)
	}
	if m := ts.missedOf(on.id, "jittered"); len(m) != 0 {
		t.Errorf("jittered missed before fire+jitter+grace: %v", m)
	}
	if m := ts.missedOf(on.id, "skipper"); len(m) != 1 || m[f] != reasonNotReported {
		t.Errorf("skipper on the online agent: %v", m)
	}
	if m := ts.missedOf(on.id, "interval"); len(m) != 1 || m[f] != reasonNotReported {
		t.Errorf("interval on the online agent: %v", m)
	}

	ts.clock.Advance(time.Minute)
	if _, err := ts.s.monitor.pass(ctx); err != nil {
		t.Fatal(err)
	}
	if m := ts.missedOf(on.id, "jittered"); len(m) != 1 || m[f] != reasonNotReported {
		t.Errorf("jittered on the online agent after its deadline: %v", m)
	}
	if m := ts.missedOf(off.id, "jittered"); len(m) != 1 || m[f] != reasonOffline {
		t.Errorf("jittered on the offline agent: %v", m)
	}
	for _, p := range []string{"skipper", "interval"} {
		if m := ts.missedOf(off.id, p); len(m) != 0 {
			t.Errorf("%s expects nothing of the offline agent: %v", p, m)
		}
	}
	// The offline agent never was online: no agent.offline for it.
	if ev := ts.events("kind=agent.offline"); len(ev) != 0 {
		t.Errorf("agent.offline for an agent never seen: %+v", ev)
	}
}

// A missed run is never stored beside a real record of its fire time, and
// a real record that arrives later removes it in the same transaction.
func TestMissedRunReplacedByRealRecord(t *testing.T) {
	ts := startServer(t)
	ctx := context.Background()
	a := ts.jobAgent()
	db := ts.db()
	x := time.Date(2026, 3, 1, 2, 30, 0, 0, time.UTC)
	y := x.Add(time.Hour)
	real := &store.Run{ID: "real-x", Pipe: "job", PipeVersion: 1, Trigger: "schedule", Status: api.StatusSucceeded, ScheduledAt: x.Add(300 * time.Millisecond)}
	if err := db.ApplyRecords(ctx, []*store.Record{{AgentID: a.id, Received: time.Now(), RunFinished: real}}, store.IngestLimits{MaxLogBytes: 1 << 20}); err != nil {
		t.Fatal(err)
	}
	missed := func(f time.Time) *store.Run {
		return &store.Run{ID: store.MissedRunID(a.id, "job", f), AgentID: a.id, Pipe: "job", PipeVersion: 1, Status: api.StatusMissed, Reason: reasonOffline, ScheduledAt: f, CreatedAt: time.Now()}
	}
	stored, err := db.InsertMissed(ctx, []*store.Run{missed(x), missed(y)})
	if err != nil {
		t.Fatal(err)
	}
	if len(stored) != 1 || !stored[0].ScheduledAt.Equal(y) {
		t.Fatalf("stored %+v, want only the fire time without a run", stored)
	}
	// Stored twice: still one.
	if again, err := db.InsertMissed(ctx, []*store.Run{missed(y)}); err != nil || len(again) != 0 {
		t.Fatalf("second insert: %v %v", again, err)
	}
	late := &store.Run{ID: "real-y", Pipe: "job", PipeVersion: 1, Trigger: "catchup", StartedAt: y.Add(3 * time.Hour), ScheduledAt: y}
	if err := db.ApplyRecords(ctx, []*store.Record{{AgentID: a.id, Received: time.Now(), RunStarted: late}}, store.IngestLimits{MaxLogBytes: 1 << 20}); err != nil {
		t.Fatal(err)
	}
	runs := ts.runsOf(a.id, "job")
	if len(runs) != 2 {
		t.Fatalf("runs: %+v", runs)
	}
	for _, r := range runs {
		if r.Status == api.StatusMissed {
			t.Errorf("a missed run sits beside the real one: %+v", r)
		}
	}
	// Another agent's record of the same fire time does not touch it.
	other := ts.enrollAgent(nil)
	if _, err := db.InsertMissed(ctx, []*store.Run{missed(y.Add(time.Hour))}); err != nil {
		t.Fatal(err)
	}
	if err := db.ApplyRecords(ctx, []*store.Record{{AgentID: other.id, Received: time.Now(), RunStarted: &store.Run{ID: "other", Pipe: "job", ScheduledAt: y.Add(time.Hour)}}}, store.IngestLimits{MaxLogBytes: 1 << 20}); err != nil {
		t.Fatal(err)
	}
	if m := ts.missedOf(a.id, "job"); len(m) != 1 {
		t.Errorf("missed runs of the agent after another agent's record: %v", m)
	}
}

// manifest.rejected and manifest.expired once per change of state;
// identity.conflict when another machine presents the certificate.
func TestManifestAndIdentityEvents(t *testing.T) {
	ts := startServer(t)
	a, err := enrollWithMachine(ts, machineA)
	if err != nil {
		t.Fatal(err)
	}
	st, err := a.openStreamAs(machineA, "h")
	if err != nil {
		t.Fatal(err)
	}
	defer st.close()
	seq := sendAll(t, st, 1, manifestStatus(agentpb.ManifestStatus_STATE_REJECTED, false, nil), manifestStatus(agentpb.ManifestStatus_STATE_REJECTED, false, nil))
	seq = sendAll(t, st, seq, manifestStatus(agentpb.ManifestStatus_STATE_APPLIED, true, nil), manifestStatus(agentpb.ManifestStatus_STATE_APPLIED, true, nil))
	if ev := ts.events("kind=manifest.rejected"); len(ev) != 1 || ev[0].Agent != a.id || ev[0].Message == "" {
		t.Errorf("manifest.rejected: %+v", ev)
	}
	if ev := ts.events("kind=manifest.expired"); len(ev) != 1 {
		t.Errorf("manifest.expired: %+v", ev)
	}
	// Rejected again after an applied one: a second event.
	sendAll(t, st, seq, manifestStatus(agentpb.ManifestStatus_STATE_REJECTED, false, nil))
	if ev := ts.events("kind=manifest.rejected"); len(ev) != 2 {
		t.Errorf("manifest.rejected after a change: %+v", ev)
	}
	bad, err := a.clone(t).openStreamAs(machineB, "clone")
	if err != nil {
		t.Fatal(err)
	}
	defer bad.close()
	if s := bad.ended(t, 10*time.Second); s.Code() != codes.PermissionDenied {
		t.Fatalf("clone: %v", s)
	}
	if ev := ts.events("kind=identity.conflict&agent=" + a.id); len(ev) != 1 {
		t.Errorf("identity.conflict: %+v", ev)
	}
}

// The states behind the once-per-change events survive a restart: no
// second agent.offline, a recovery after a failure seen before the restart
// is announced once, and a failure replayed after it is not a second event.
func TestEventStatesSurviveRestart(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	ts := startServer(t, func(c *Config) { c.DataDir = dir })
	a := ts.jobAgent()
	st, err := a.openStream("")
	if err != nil {
		t.Fatal(err)
	}
	fail := finished("r-fail", "job", agentpb.RunStatus_RUN_STATUS_FAILED, "exit 1")
	sendAll(t, st, 1, fail)
	if _, err := ts.s.monitor.pass(ctx); err != nil {
		t.Fatal(err)
	}
	st.close()
	testkit.WaitFor(t, 10*time.Second, "the stream to end", func() bool { return !ts.s.hub.Online(a.id) })
	ts.clock.Advance(3 * time.Minute)
	if _, err := ts.s.monitor.pass(ctx); err != nil {
		t.Fatal(err)
	}
	if ev := ts.events("kind=agent.offline"); len(ev) != 1 {
		t.Fatalf("agent.offline before the restart: %+v", ev)
	}
	ts.stop()

	ts2 := startServer(t, func(c *Config) { c.DataDir = dir })
	ts2.clock.Advance(3 * time.Minute)
	if _, err := ts2.s.monitor.pass(ctx); err != nil {
		t.Fatal(err)
	}
	if ev := ts2.events("kind=agent.offline"); len(ev) != 1 {
		t.Errorf("agent.offline after the restart: %+v", ev)
	}
	st2, err := a.openStream(ts2.s.GRPCAddr())
	if err != nil {
		t.Fatal(err)
	}
	defer st2.close()
	seq := sendAll(t, st2, 1, finished("r-fail", "job", agentpb.RunStatus_RUN_STATUS_FAILED, "exit 1"))
	sendAll(t, st2, seq, finished("r-ok", "job", agentpb.RunStatus_RUN_STATUS_SUCCEEDED, ""), finished("r-ok2", "job", agentpb.RunStatus_RUN_STATUS_SUCCEEDED, ""))
	if ev := ts2.events("kind=run.failed"); len(ev) != 1 {
		t.Errorf("run.failed after the replay: %+v", ev)
	}
	if ev := ts2.events("kind=run.recovered"); len(ev) != 1 || ev[0].RunID != "r-ok" {
		t.Errorf("run.recovered: %+v", ev)
	}
	if _, err := ts2.s.monitor.pass(ctx); err != nil {
		t.Fatal(err)
	}
	if ev := ts2.events("kind=agent.online"); len(ev) != 1 {
		t.Errorf("agent.online: %+v", ev)
	}
}

// The detection loop runs passes on its own (here every 10ms).
func TestMissedLoopRuns(t *testing.T) {
	ts := startServer(t)
	tags := map[string]string{"loop": "yes"}
	a := ts.enrollAgent(tags)
	ts.putMonPipe("looped", tags, map[string]any{"schedule": "* * * * *", "grace": "1m"})
	m := newMonitor(ts.s)
	m.interval = 10 * time.Millisecond
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); ts.s.leader.lead(ctx, "monitor", m.run) }()
	defer func() { cancel(); <-done }()
	testkit.WaitFor(t, 10*time.Second, "the first pass", func() bool {
		st, err := ts.db().MonitorState(context.Background())
		return err == nil && st[stateWatermark] != ""
	})
	ts.clock.Advance(3 * time.Minute)
	testkit.WaitFor(t, 10*time.Second, "a missed run", func() bool { return len(ts.missedOf(a.id, "looped")) >= 1 })
}

// A run settled lost is a run.failed event of its pipe.
func TestLostRunIsFailedEvent(t *testing.T) {
	ts := startServer(t)
	_, st := ts.jobStream()
	t0 := time.Now().Add(-time.Minute)
	seq := sendAll(t, st, 1, started("r-lost", "job", t0))
	for range 2 {
		// A drained heartbeat that does not list r-lost, then a durable
		// record whose ack says the heartbeat was committed before it.
		if err := st.stream.Send(heartbeat(0, time.Now())); err != nil {
			t.Fatal(err)
		}
		seq = sendAll(t, st, seq, started(fmt.Sprintf("r-other-%d", seq), "job", time.Now().Add(time.Hour)))
	}
	testkit.WaitFor(t, 10*time.Second, "the run.failed event", func() bool {
		ev := ts.events("kind=run.failed")
		return len(ev) == 1 && ev[0].RunID == "r-lost" && ev[0].Pipe == "job" && strings.Contains(ev[0].Message, store.ReasonLost)
	})
}

// grace is the server's alone: the manifest an agent gets leaves it out
// (as it leaves out targets), so agents that predate the field accept it.
func TestGraceNotInManifest(t *testing.T) {
	ts := startServer(t)
	tags := map[string]string{"g": "yes"}
	a := ts.enrollAgent(tags)
	ts.putMonPipe("graced", tags, map[string]any{"schedule": "* * * * *", "grace": "5m"})
	acc, err := a.pullManifest()
	if err != nil {
		t.Fatal(err)
	}
	if acc.Manifest.Pipe("graced") == nil || strings.Contains(string(acc.Payload), `"grace":`) {
		t.Fatalf("manifest: %s", acc.Payload)
	}
	var p api.Pipe
	ts.adminOK("GET", "/api/v1/pipes/graced", nil, &p)
	if b, _ := json.Marshal(p); !strings.Contains(string(b), `"grace":"5m"`) {
		t.Fatalf("the pipe as stored: %s", b)
	}
}
