package cli

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/drover/drover/api"
	"github.com/drover/drover/internal/pemutil"
	"github.com/drover/drover/internal/testkit"
	agentpb "github.com/drover/drover/proto"
	"github.com/drover/drover/server/servertest"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/golden")

// testNow is the clock droverctl sees in tests.
var testNow = time.Date(2030, 1, 15, 12, 0, 0, 0, time.UTC)

// ---- a real drover-server in process

type testServer struct {
	t      *testing.T
	dir    string
	base   string
	admin  string
	caFile string
	http   *http.Client
	stop   func()
	srv    *servertest.Server
}

// startServer starts drover-server on 127.0.0.1:0 with a fresh data dir.
func startServer(t *testing.T) *testServer {
	t.Helper()
	ss := servertest.Start(t)
	return &testServer{t: t, dir: ss.Dir, base: ss.URL, admin: ss.AdminToken, caFile: ss.CAFile, http: ss.Client, stop: ss.Stop, srv: ss}
}

// env is the environment droverctl sees: the server, its admin token and CA.
func (ts *testServer) env(extra ...string) map[string]string {
	m := map[string]string{"DROVER_SERVER": ts.base, "DROVER_TOKEN": ts.admin, "DROVER_CA": ts.caFile}
	for i := 0; i+1 < len(extra); i += 2 {
		m[extra[i]] = extra[i+1]
	}
	return m
}

// result is one droverctl invocation.
type result struct {
	code           int
	stdout, stderr string
}

func (r result) String() string {
	return fmt.Sprintf("exit %d\nstdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
}

// runCtl runs droverctl in process with env and stdin.
func runCtl(ctx context.Context, env map[string]string, stdin string, args ...string) result {
	var out, errb bytes.Buffer
	code := Run(ctx, args, Env{Stdout: &out, Stderr: &errb, Stdin: strings.NewReader(stdin),
		Getenv: func(k string) string { return env[k] }, Now: func() time.Time { return testNow }})
	return result{code, out.String(), errb.String()}
}

// ctl runs droverctl against ts.
func (ts *testServer) ctl(args ...string) result {
	return runCtl(context.Background(), ts.env(), "", args...)
}

// ctlOK runs droverctl and fails the test unless it exits 0.
func (ts *testServer) ctlOK(args ...string) result {
	ts.t.Helper()
	r := ts.ctl(args...)
	if r.code != 0 {
		ts.t.Fatalf("droverctl %s: %s", strings.Join(args, " "), r)
	}
	return r
}

// api calls the admin API directly; it returns the status and body.
func (ts *testServer) api(method, path string, body any) (int, []byte) {
	ts.t.Helper()
	return ts.srv.API(method, path, body)
}

// hasEndpoint reports whether the server routes method+path (anything but
// the mux's own 404 "no such endpoint" or a 405).
func (ts *testServer) hasEndpoint(method, path string, body any) bool {
	code, b := ts.api(method, path, body)
	if code == http.StatusMethodNotAllowed {
		return false
	}
	return !(code == http.StatusNotFound && strings.Contains(string(b), "no such endpoint"))
}

// requireEndpoint skips the test when the server lacks an endpoint that
// droverctl already uses (droverctl also works with an older server).
func (ts *testServer) requireEndpoint(method, path string, body any, what string) {
	ts.t.Helper()
	if !ts.hasEndpoint(method, path, body) {
		ts.t.Skipf("server lacks %s (%s %s); droverctl's side is ready", what, method, path)
	}
}

// pipesSnapshot is the server's pipes as JSON, to prove nothing changed.
func (ts *testServer) pipesSnapshot() string {
	ts.t.Helper()
	code, b := ts.api("GET", "/api/v1/pipes", nil)
	if code != 200 {
		ts.t.Fatalf("GET /api/v1/pipes: %d %s", code, b)
	}
	return string(b)
}

// ---- a fake agent: enrollment and the telemetry stream

type fakeAgent struct {
	t        *testing.T
	id       string
	hostname string
	conn     *grpc.ClientConn
	stream   agentpb.Agent_AgentStreamClient
	ctx      context.Context // the stream's; ends with close
	cancel   context.CancelFunc

	sendMu sync.Mutex // one sender at a time, seqs in order

	mu       sync.Mutex
	seq      uint64
	acked    uint64
	ackCh    chan struct{}
	runNows  []*agentpb.RunNow
	onRunNow func(*agentpb.RunNow) // see serveRunNow
}

// enroll enrolls an agent with a fresh token carrying tags; connect opens
// its stream (the agent is then online).
func (ts *testServer) enroll(hostname string, tags map[string]string, connect bool) *fakeAgent {
	ts.t.Helper()
	code, b := ts.api("POST", "/api/v1/enrollment-tokens", api.EnrollmentTokenRequest{Tags: tags})
	if code != 201 {
		ts.t.Fatalf("create token: %d %s", code, b)
	}
	var tok api.EnrollmentTokenCreated
	json.Unmarshal(b, &tok)
	return ts.enrollWith(tok.Token, hostname, connect)
}

func (ts *testServer) enrollWith(token, hostname string, connect bool) *fakeAgent {
	t := ts.t
	t.Helper()
	key, csr, err := pemutil.NewKeyAndCSR(hostname)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := json.Marshal(api.EnrollRequest{Token: token, Hostname: hostname, OS: "linux", Arch: "amd64", AgentVersion: "1.0.0-test", CSR: csr})
	resp, err := ts.http.Post(ts.base+"/api/v1/agents/enroll", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	rb, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("enroll: %d %s", resp.StatusCode, rb)
	}
	var er api.EnrollResponse
	if err := json.Unmarshal(rb, &er); err != nil {
		t.Fatal(err)
	}
	fa := &fakeAgent{t: t, id: er.AgentID, hostname: hostname, ackCh: make(chan struct{}, 1)}
	if !connect {
		return fa
	}
	keyPEM, err := pemutil.ECKey(key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := tls.X509KeyPair([]byte(er.Certificate), keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM([]byte(er.CABundle))
	fa.conn, err = grpc.NewClient(er.GRPCAddr, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: pool, Certificates: []tls.Certificate{cert}})))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	fa.ctx, fa.cancel = ctx, cancel
	if fa.stream, err = agentpb.NewAgentClient(fa.conn).AgentStream(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(fa.close)
	go fa.recv()
	fa.send(&agentpb.AgentMessage{Body: &agentpb.AgentMessage_Hello{Hello: &agentpb.Hello{
		AgentVersion: "1.0.0-test", Os: "linux", Arch: "amd64", Hostname: hostname, Backend: "systemd", Scope: "system", SystemdVersion: "252"}}})
	// Online once the server has seen the Hello.
	testkit.WaitFor(t, 10*time.Second, "agent "+hostname+" online", func() bool {
		_, b := ts.api("GET", "/api/v1/agents/"+fa.id, nil)
		return strings.Contains(string(b), `"online":true`)
	})
	return fa
}

func (fa *fakeAgent) close() {
	if fa.cancel != nil {
		fa.cancel()
		fa.conn.Close()
		fa.cancel = nil
	}
}

func (fa *fakeAgent) recv() {
	for {
		m, err := fa.stream.Recv()
		if err != nil {
			return
		}
		fa.mu.Lock()
		switch b := m.GetBody().(type) {
		case *agentpb.ServerMessage_Ack:
			if b.Ack.GetSeq() > fa.acked {
				fa.acked = b.Ack.GetSeq()
			}
		case *agentpb.ServerMessage_RunNow:
			fa.runNows = append(fa.runNows, b.RunNow)
			if fa.onRunNow != nil {
				go fa.onRunNow(b.RunNow)
			}
		}
		fa.mu.Unlock()
		select {
		case fa.ackCh <- struct{}{}:
		default:
		}
	}
}

// send sends a message; durable ones get the next seq, and send waits
// until the server acknowledged (committed) them.
func (fa *fakeAgent) send(msgs ...*agentpb.AgentMessage) {
	fa.t.Helper()
	if err := fa.trySend(msgs...); err != nil {
		fa.t.Fatal(err)
	}
}

// trySend is send for goroutines other than the test's: it returns the
// error instead of failing the test.
func (fa *fakeAgent) trySend(msgs ...*agentpb.AgentMessage) error {
	var last uint64
	fa.sendMu.Lock()
	for _, m := range msgs {
		if m.GetHello() == nil && m.GetHeartbeat() == nil {
			fa.mu.Lock()
			fa.seq++
			m.Seq = fa.seq
			last = fa.seq
			fa.mu.Unlock()
		}
		if err := fa.stream.Send(m); err != nil {
			fa.sendMu.Unlock()
			return fmt.Errorf("send: %v", err)
		}
	}
	fa.sendMu.Unlock()
	if last == 0 {
		return nil
	}
	deadline := time.After(15 * time.Second)
	for {
		fa.mu.Lock()
		acked := fa.acked
		fa.mu.Unlock()
		if acked >= last {
			return nil
		}
		select {
		case <-fa.ackCh:
		case <-time.After(20 * time.Millisecond):
		case <-deadline:
			return fmt.Errorf("no ack for seq %d", last)
		}
	}
}

func (fa *fakeAgent) runNowCount() int {
	fa.mu.Lock()
	defer fa.mu.Unlock()
	return len(fa.runNows)
}

// runStarted reports a run as started at a fixed time.
func (fa *fakeAgent) runStarted(id, pipe string, version uint64, at time.Time) {
	fa.send(&agentpb.AgentMessage{Body: &agentpb.AgentMessage_RunStarted{RunStarted: &agentpb.RunStarted{
		RunId: id, Pipe: pipe, PipeVersion: version, Trigger: agentpb.Trigger_TRIGGER_SCHEDULE,
		StartedAt: timestamppb.New(at), ScheduledAt: timestamppb.New(at)}}})
}

// logChunks reports output chunks seq from, from+1, ...
func (fa *fakeAgent) logChunks(id string, from uint64, at time.Time, data ...string) {
	var msgs []*agentpb.AgentMessage
	for i, d := range data {
		msgs = append(msgs, &agentpb.AgentMessage{Body: &agentpb.AgentMessage_LogChunk{LogChunk: &agentpb.LogChunk{
			RunId: id, ChunkSeq: from + uint64(i), Stream: agentpb.LogStream_LOG_STREAM_STDOUT, Data: []byte(d), At: timestamppb.New(at)}}})
	}
	fa.send(msgs...)
}

// runFinished reports a run's end.
func (fa *fakeAgent) runFinished(id, pipe string, version uint64, status agentpb.RunStatus, exit int32, started time.Time, dur time.Duration, chunks uint64) {
	reason := ""
	if exit != 0 {
		reason = fmt.Sprintf("exit %d", exit) // as the runner words it
	}
	fa.send(&agentpb.AgentMessage{Body: &agentpb.AgentMessage_RunFinished{RunFinished: &agentpb.RunFinished{
		RunId: id, Pipe: pipe, PipeVersion: version, Trigger: agentpb.Trigger_TRIGGER_SCHEDULE, Status: status, ExitCode: exit,
		StartedAt: timestamppb.New(started), FinishedAt: timestamppb.New(started.Add(dur)), DurationMs: dur.Milliseconds(),
		LogChunks: chunks, ScheduledAt: timestamppb.New(started), Reason: reason, Attempts: 1, WrittenBy: "runner"}}})
}

// manifestApplied reports that the agent applied pipes at the given versions.
func (fa *fakeAgent) manifestApplied(serial uint64, pipes map[string]uint64, next time.Time) {
	st := &agentpb.ManifestStatus{Serial: serial, Digest: "sha256:" + strings.Repeat("0", 64), State: agentpb.ManifestStatus_STATE_APPLIED,
		At: timestamppb.New(testNow), AppliedSerial: serial}
	for _, name := range slices.Sorted(maps.Keys(pipes)) {
		st.Pipes = append(st.Pipes, &agentpb.PipeStatus{Name: name, Version: pipes[name], NextFireTimes: []*timestamppb.Timestamp{timestamppb.New(next)}})
	}
	fa.send(&agentpb.AgentMessage{Body: &agentpb.AgentMessage_ManifestStatus{ManifestStatus: st}})
}

// ---- golden files

// masker replaces volatile values (ids, times) with fixed-width stand-ins,
// so tabwriter columns keep their widths.
type masker struct {
	pairs []string
}

func (m *masker) add(value, stand string) {
	if value == "" {
		return
	}
	if len(stand) < len(value) {
		stand += strings.Repeat("_", len(value)-len(stand))
	} else if len(stand) > len(value) {
		stand = stand[:len(value)]
	}
	m.pairs = append(m.pairs, value, stand)
}

var (
	timeRE      = regexp.MustCompile(`\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:\d{2})`)
	requestIDRE = regexp.MustCompile(`req-[a-z2-7]{16}`)
	// A manifest's digest covers its issue time.
	manifestDigestRE = regexp.MustCompile(`(Manifest: +serial \d+, )sha256:[0-9a-f]{12}`)
)

// fixedTimes are times the tests chose; they are kept in goldens.
var fixedTimes = regexp.MustCompile(`^203\d-`)

func (m *masker) apply(s string) string {
	s = strings.NewReplacer(m.pairs...).Replace(s)
	s = timeRE.ReplaceAllStringFunc(s, func(t string) string {
		if fixedTimes.MatchString(t) {
			return t
		}
		if len(t) == 20 {
			return "YYYY-MM-DDTHH:MM:SSZ"
		}
		return "<time>"
	})
	s = manifestDigestRE.ReplaceAllString(s, "${1}sha256:MMMMMMMMMMMM")
	return requestIDRE.ReplaceAllString(s, "req-RRRRRRRRRRRRRRRR")
}

// goldenDir is absolute: tests change directory.
var goldenDir, _ = filepath.Abs(filepath.Join("testdata", "golden"))

// golden compares got with testdata/golden/name (rewritten with -update).
func golden(t *testing.T, name, got string) {
	t.Helper()
	p := filepath.Join(goldenDir, name)
	if *update {
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(p)
	if err != nil {
		t.Fatalf("%v (run go test ./cmd/droverctl/cli -run %s -update)", err, t.Name())
	}
	if string(want) != got {
		t.Errorf("%s differs from the golden file (-update rewrites it):\n--- want\n%s\n--- got\n%s", p, want, got)
	}
}

// writeFiles creates files under dir (paths slash-separated); a name
// ending in "*" is made executable.
func writeFiles(t *testing.T, dir string, files map[string]string) {
	t.Helper()
	for name, content := range files {
		mode := os.FileMode(0o644)
		if n, ok := strings.CutSuffix(name, "*"); ok {
			name, mode = n, 0o755
		}
		p := filepath.Join(dir, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
	}
}

// ---- runs on request: the fake agent as drover-agent answers RunNow

// serveRunNow makes the agent answer RunNow as drover-agent does: every
// request ends in exactly one run that carries its request id. The agent
// runs the pipe's script, as the server holds it, with sh -c and reports
// the run (RunStarted, its output, RunFinished
// with the real exit status and duration). When a run of the pipe is in
// progress it reports a skipped run instead, and when it cannot start one,
// a failed run with the reason. Scripts still running when the test ends
// are killed with their process group.
func (fa *fakeAgent) serveRunNow(ts *testServer) {
	var (
		runMu   sync.Mutex
		running = map[string]bool{}
		n       int
	)
	handle := func(rn *agentpb.RunNow) {
		pipe, req := rn.GetPipe(), rn.GetRequestId()
		runMu.Lock()
		n++
		id := fmt.Sprintf("run-%s-%03d", fa.hostname, n)
		busy := running[pipe]
		running[pipe] = true
		runMu.Unlock()
		finish := func(status agentpb.RunStatus, exit int32, version uint64, started time.Time, why string, chunks uint64) {
			now := time.Now()
			fa.trySend(&agentpb.AgentMessage{Body: &agentpb.AgentMessage_RunFinished{RunFinished: &agentpb.RunFinished{
				RunId: id, Pipe: pipe, PipeVersion: version, Trigger: agentpb.Trigger_TRIGGER_API, Status: status, ExitCode: exit,
				StartedAt: timestamppb.New(started), FinishedAt: timestamppb.New(now), DurationMs: now.Sub(started).Milliseconds(),
				Error: why, LogChunks: chunks, RequestId: req}}})
		}
		if busy {
			finish(agentpb.RunStatus_RUN_STATUS_SKIPPED, 0, 0, time.Now(), "run now: a run of this pipe is in progress (runs never overlap)", 0)
			return
		}
		defer func() {
			runMu.Lock()
			delete(running, pipe)
			runMu.Unlock()
		}()
		script, version, err := ts.pipeScript(pipe)
		if err != nil {
			finish(agentpb.RunStatus_RUN_STATUS_FAILED, -1, 0, time.Now(), "run now: "+err.Error(), 0)
			return
		}
		started := time.Now()
		if fa.trySend(&agentpb.AgentMessage{Body: &agentpb.AgentMessage_RunStarted{RunStarted: &agentpb.RunStarted{
			RunId: id, Pipe: pipe, PipeVersion: version, Trigger: agentpb.Trigger_TRIGGER_API,
			StartedAt: timestamppb.New(started), RequestId: req}}}) != nil {
			return
		}
		cmd := exec.CommandContext(fa.ctx, "sh", "-c", script)
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
		cmd.WaitDelay = time.Second
		out, err := cmd.CombinedOutput()
		status, exit := agentpb.RunStatus_RUN_STATUS_SUCCEEDED, int32(0)
		var ee *exec.ExitError
		switch {
		case errors.As(err, &ee):
			status, exit = agentpb.RunStatus_RUN_STATUS_FAILED, int32(ee.ExitCode())
		case err != nil:
			finish(agentpb.RunStatus_RUN_STATUS_FAILED, -1, version, started, "run now: "+err.Error(), 0)
			return
		}
		var chunks uint64
		if len(out) > 0 {
			if fa.trySend(&agentpb.AgentMessage{Body: &agentpb.AgentMessage_LogChunk{LogChunk: &agentpb.LogChunk{
				RunId: id, Stream: agentpb.LogStream_LOG_STREAM_STDOUT, Data: out, At: timestamppb.Now()}}}) != nil {
				return
			}
			chunks = 1
		}
		finish(status, exit, version, started, "", chunks)
	}
	fa.mu.Lock()
	fa.onRunNow = handle
	fa.mu.Unlock()
}

// pipeScript is a pipe's script and version as the server holds them; it
// does not fail the test (the fake agent calls it from its own goroutine).
func (ts *testServer) pipeScript(name string) (string, uint64, error) {
	code, b, err := ts.srv.Admin().Call("GET", "/api/v1/pipes/"+name, nil)
	if err != nil {
		return "", 0, err
	}
	var p api.Pipe
	if code != 200 {
		return "", 0, fmt.Errorf("GET pipe %s: HTTP %d", name, code)
	}
	if err := json.Unmarshal(b, &p); err != nil {
		return "", 0, err
	}
	if p.Spec.Script == "" {
		return "", 0, fmt.Errorf("pipe %s has no script (the test agent runs scripts only)", name)
	}
	return p.Spec.Script, p.Version, nil
}
