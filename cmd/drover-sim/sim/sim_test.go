package sim

import (
	"bytes"
	"net"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/drover/drover/api"
	"github.com/drover/drover/server"
	"github.com/drover/drover/server/servertest"
)

// TestMain lets the test binary serve as the simulator's worker process:
// Run re-executes this binary with WorkerEnv set, as the real command
// re-executes itself.
func TestMain(m *testing.M) {
	if os.Getenv(WorkerEnv) == "1" {
		os.Exit(Main(os.Args[1:], os.Stdout, os.Stderr))
	}
	os.Exit(m.Run())
}

// startServer runs drover-server in process on 127.0.0.1 with its real
// TLS listeners and a real SQLite file.
func startServer(t *testing.T) (*server.Server, string, *admin) {
	t.Helper()
	ss := servertest.Start(t)
	adm, err := newAdmin(ss.URL, ss.AdminToken, ss.CAPEM)
	if err != nil {
		t.Fatal(err)
	}
	return ss.Server, ss.AdminToken, adm
}

// serverConfig is the simulator's default configuration pointed at the
// test server s, as the admin token tok, for the fleet named fleet.
func serverConfig(s *server.Server, tok, fleet string) Config {
	cfg := DefaultConfig()
	cfg.Server = "https://" + s.HTTPAddr()
	cfg.CAPEM = s.CACertPEM()
	cfg.AdminToken = tok
	cfg.Fleet = fleet
	return cfg
}

// runSim runs the simulator with cfg, logs what it printed, and fails t
// when the run fails.
func runSim(t *testing.T, cfg Config) *Report {
	t.Helper()
	var out, errout bytes.Buffer
	cfg.Out, cfg.Errout = &out, &errout
	rep, err := Run(t.Context(), cfg)
	t.Logf("drover-sim output:\n%s%s", out.String(), errout.String())
	if err != nil {
		t.Fatal(err)
	}
	return rep
}

// TestEnvChangeOnStream: a change that keeps the payload (--change-kind
// env) reaches every agent on the stream with no manifest poll and no
// payload fetch.
func TestEnvChangeOnStream(t *testing.T) {
	s, tok, _ := startServer(t)
	cfg := serverConfig(s, tok, "env")
	cfg.Steps = []int{20}
	cfg.Changes = 2
	cfg.ChangeKind = ChangeEnv
	cfg.ServerPID = os.Getpid()
	cfg.Agent.PollInterval = 10 * time.Minute // no interval poll in the test
	cfg.Warmup = 500 * time.Millisecond
	cfg.Window = time.Second
	cfg.Settle = time.Minute
	cfg.ChangeTimeout = time.Minute
	cfg.MaxDuration = 2 * time.Minute
	rep := runSim(t, cfg)
	if n := rep.ErrorCount(); n != 0 || len(rep.Steps) != 1 || len(rep.Steps[0].Changes) != 2 {
		t.Fatalf("%d errors %v, %d steps", n, rep.Errors, len(rep.Steps))
	}
	for _, c := range rep.Steps[0].Changes {
		if c.Fetched.Count != 20 || c.ByStream != 20 || c.ByPoll != 0 || c.PayloadsFetch != 0 {
			t.Fatalf("change v%d: fetched by %d, by stream %d, by poll %d, %d payload fetches", c.Version, c.Fetched.Count, c.ByStream, c.ByPoll, c.PayloadsFetch)
		}
	}
}

// TestFleetAgainstRealServer runs 150 simulated agents in two worker
// processes against a real server, in two steps with a pipe change each:
// every agent enrolls, every agent fetches and applies every change, the
// runs the simulator reports are exactly the runs the server stored, and
// nothing fails. No timing is asserted.
func TestFleetAgainstRealServer(t *testing.T) {
	s, tok, adm := startServer(t)
	cfg := serverConfig(s, tok, "test")
	cfg.Steps = []int{60, 150}
	cfg.PerWorker = 80 // two worker processes
	cfg.ServerPID = os.Getpid()
	cfg.Agent.PollInterval = 3 * time.Second
	cfg.Agent.Heartbeat = time.Second
	cfg.Agent.RunEvery = 2 * time.Second
	cfg.Agent.LogChunks = 2
	cfg.Agent.LogBytes = 512
	cfg.Warmup = time.Second
	cfg.Window = 3 * time.Second
	cfg.Settle = time.Minute
	cfg.ChangeTimeout = time.Minute
	cfg.MaxDuration = 4 * time.Minute
	rep := runSim(t, cfg)
	if n := rep.ErrorCount(); n != 0 {
		t.Fatalf("%d errors: %v", n, rep.Errors)
	}
	if len(rep.Steps) != 2 {
		t.Fatalf("%d steps reported", len(rep.Steps))
	}
	for _, st := range rep.Steps {
		if st.Enrolled != int64(st.Agents) || len(st.Changes) != 1 {
			t.Fatalf("step %d: %d enrolled, %d changes", st.Agents, st.Enrolled, len(st.Changes))
		}
		c := st.Changes[0]
		if c.Fetched.Count != int64(st.Agents) || c.Applied.Count != int64(st.Agents) || c.NotFetched != 0 || c.NotApplied != 0 {
			t.Fatalf("step %d: change v%d fetched by %d, applied by %d", st.Agents, c.Version, c.Fetched.Count, c.Applied.Count)
		}
		// The change came on the stream with its SyncNow (an agent whose
		// interval poll came first saw it by poll).
		if c.ByStream+c.ByPoll != int64(st.Agents) || c.ByStream < int64(st.Agents)/2 {
			t.Fatalf("step %d: change v%d seen by stream %d, by poll %d", st.Agents, c.Version, c.ByStream, c.ByPoll)
		}
		if st.Server == nil || st.Server.RSSBytes == 0 || st.PollsPerSec == 0 || st.HeartbeatsSec == 0 {
			t.Fatalf("step %d: figures missing: %+v", st.Agents, st)
		}
		if st.StealPercent < 0 || st.StealPercent > 100 {
			t.Fatalf("step %d: steal %.2f%%", st.Agents, st.StealPercent)
		}
	}
	f := rep.Final
	if f.Enrolled != 150 || f.RecordsSent != f.RecordsAcked || f.RunsAcked != f.RunsFinished || f.RunsAcked == 0 ||
		f.StreamManifests == 0 || f.StreamRefused != 0 {
		t.Fatalf("final counts: %+v", f)
	}

	// The server's view: every agent of the fleet with the last version
	// applied, and exactly the runs the simulator had acknowledged.
	ctx := t.Context()
	var agents []api.Agent
	for cursor := ""; ; {
		var page api.AgentList
		if err := adm.call(ctx, "GET", "/api/v1/agents?limit=1000&tag="+url.QueryEscape(fleetTag+"=test")+"&cursor="+url.QueryEscape(cursor), nil, &page); err != nil {
			t.Fatal(err)
		}
		agents = append(agents, page.Agents...)
		if cursor = page.NextCursor; cursor == "" {
			break
		}
	}
	if len(agents) != 150 {
		t.Fatalf("the server lists %d agents of the fleet", len(agents))
	}
	for _, listed := range agents {
		var a api.Agent
		if err := adm.call(ctx, "GET", "/api/v1/agents/"+listed.ID, nil, &a); err != nil {
			t.Fatal(err)
		}
		if a.ManifestState != "applied" || a.Manifest == nil || a.AppliedSerial != a.Manifest.Serial {
			t.Fatalf("agent %s on the server: state %q, applied serial %d, manifest %+v", a.ID, a.ManifestState, a.AppliedSerial, a.Manifest)
		}
	}
	var runs []api.Run
	for cursor := ""; ; {
		var page api.RunList
		if err := adm.call(ctx, "GET", "/api/v1/runs?limit=1000&pipe="+rep.Pipe+"&cursor="+url.QueryEscape(cursor), nil, &page); err != nil {
			t.Fatal(err)
		}
		runs = append(runs, page.Runs...)
		if cursor = page.NextCursor; cursor == "" {
			break
		}
	}
	if int64(len(runs)) != f.RunsAcked {
		t.Fatalf("the server holds %d runs of %s, the simulator had %d acknowledged", len(runs), rep.Pipe, f.RunsAcked)
	}
	var chunks int64
	for _, r := range runs {
		if r.Status != "succeeded" || r.LogChunks != 2 || r.LogBytes != 1024 {
			t.Fatalf("run on the server: %+v", r)
		}
		chunks += int64(r.LogChunks)
	}
	if chunks != f.LogChunksAcked {
		t.Fatalf("the server holds %d log chunks, the simulator had %d acknowledged", chunks, f.LogChunksAcked)
	}
}

// TestRefusesRemote: a server that is not on a loopback address is refused
// before anything is sent, unless --allow-remote.
func TestRefusesRemote(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Server = "https://192.0.2.1:8443"
	cfg.CAPEM, cfg.AdminToken = []byte("x"), "x"
	_, err := Run(t.Context(), cfg)
	if err == nil || !strings.Contains(err.Error(), "not a loopback address") {
		t.Fatalf("remote server: %v", err)
	}
	var stderr bytes.Buffer
	if code := Main([]string{"--agents", "5,3"}, &stderr, &stderr); code != 2 || !strings.Contains(stderr.String(), "ascending") {
		t.Fatalf("descending steps: exit %d, %s", code, stderr.String())
	}
}

// TestHist: quantiles land in the right bucket and windows subtract.
func TestHist(t *testing.T) {
	var h Hist
	for i := 1; i <= 1000; i++ {
		h.add(time.Duration(i) * time.Millisecond)
	}
	if q := h.Quantile(0.5); q < 480_000 || q > 540_000 {
		t.Fatalf("p50 %d us", q)
	}
	if q := h.Quantile(0.99); q < 960_000 || q > 1_000_000 {
		t.Fatalf("p99 %d us", q)
	}
	before := h.clone()
	h.add(5 * time.Second)
	w := h.sub(before)
	if w.Count != 1 || w.Max != 5_000_000 || w.Quantile(0.5) < 4_500_000 {
		t.Fatalf("window %+v p50 %d", w, w.Quantile(0.5))
	}
	for us := int64(0); us < 1<<30; us = us*3/2 + 1 {
		if b := bucketOf(us); bucketHigh(b) < us || (b > 0 && bucketHigh(b-1) >= us) {
			t.Fatalf("value %d in bucket %d [.., %d]", us, b, bucketHigh(b))
		}
	}
}

// TestPIDListening finds this process by a port it listens on, as the
// simulator finds a local server without --server-pid.
func TestPIDListening(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	pid, err := pidListening(ln.Addr().(*net.TCPAddr).Port)
	if err != nil || pid != os.Getpid() {
		t.Fatalf("pid %d, %v; want %d", pid, err, os.Getpid())
	}
	s, err := readProc(pid)
	if err != nil || s.rssBytes == 0 || s.threads == 0 || s.fds == 0 {
		t.Fatalf("readProc: %+v %v", s, err)
	}
}

// TestStealPercent: the host's CPU time is read from /proc/stat, and the
// stolen share between two readings is the steal ticks over all ticks.
func TestStealPercent(t *testing.T) {
	a, ok := readCPUTimes()
	if !ok || a.total == 0 || a.steal > a.total {
		t.Fatalf("readCPUTimes: %+v %v", a, ok)
	}
	if got := stealPercent(cpuTimes{total: 1000, steal: 10}, cpuTimes{total: 3000, steal: 110}); got != 5 {
		t.Fatalf("stealPercent = %v, want 5", got)
	}
	for _, b := range []cpuTimes{{total: 1000, steal: 10}, {total: 900, steal: 20}, {total: 2000, steal: 5}} {
		if got := stealPercent(cpuTimes{total: 1000, steal: 10}, b); got != -1 {
			t.Fatalf("stealPercent(%+v) = %v, want -1 (unknown)", b, got)
		}
	}
}
