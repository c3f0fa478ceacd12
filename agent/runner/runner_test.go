package runner

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/drover/drover/agent/spool"
	"github.com/drover/drover/internal/testkit"
	"github.com/drover/drover/manifest"
	agentpb "github.com/drover/drover/proto"
	"github.com/google/uuid"
	"google.golang.org/protobuf/proto"
)

// TestMain doubles as `drover-agent run` for the tests that signal it.
func TestMain(m *testing.M) {
	if os.Getenv("RUNNER_TEST_MAIN") == "1" {
		os.Exit(Main(os.Args[1:]))
	}
	os.Exit(m.Run())
}

type fixture struct {
	t        *testing.T
	pipeDir  string
	spoolDir string
	secrets  string
	stdout   *testkit.Buffer
	stderr   *testkit.Buffer
}

// newPipe lays out a pipe directory as the agent does: pipe.json and
// payload/script (the inline script).
func newPipe(t *testing.T, spec manifest.Spec) *fixture {
	t.Helper()
	root := t.TempDir()
	f := &fixture{t: t, pipeDir: filepath.Join(root, "pipe"), spoolDir: filepath.Join(root, "runs", "spool"),
		secrets: filepath.Join(root, "secrets"), stdout: &testkit.Buffer{}, stderr: &testkit.Buffer{}}
	if spec.Name == "" {
		spec.Name = "demo"
	}
	if spec.Schedule == "" {
		spec.Schedule = "* * * * *"
	}
	layoutPipe(t, f, spec)
	return f
}

func layoutPipe(t testing.TB, f *fixture, spec manifest.Spec) {
	os.MkdirAll(filepath.Join(f.pipeDir, "payload"), 0o755)
	os.MkdirAll(f.secrets, 0o700)
	if spec.Script != "" {
		os.WriteFile(filepath.Join(f.pipeDir, "payload", manifest.ScriptFile), []byte(spec.Script), 0o755)
	}
	b, _ := json.Marshal(manifest.Pipe{Name: spec.Name, Version: 3, Spec: spec, Payload: manifest.Payload{Digest: "sha256:" + strings.Repeat("0", 64)}})
	os.WriteFile(filepath.Join(f.pipeDir, "pipe.json"), b, 0o644)
	sealPipe(t, f.pipeDir)
}

// seal records the payload's sum as the agent does after unpacking it
// (tests lay payloads out by hand, after newPipe).
func (f *fixture) seal() { sealPipe(f.t, f.pipeDir) }

func sealPipe(t testing.TB, dir string) {
	t.Helper()
	var p manifest.Pipe
	if b, err := os.ReadFile(filepath.Join(dir, "pipe.json")); err == nil && json.Unmarshal(b, &p) == nil {
		if err := WritePayloadSum(dir, p.Payload.Digest); err != nil {
			t.Fatal(err)
		}
	}
}

func (f *fixture) opts(env ...string) Options {
	f.seal()
	o := Options{
		Pipe: "demo", PipeDir: f.pipeDir, SpoolDir: f.spoolDir,
		Env:        append([]string{"PATH=" + os.Getenv("PATH"), "DROVER_SECRETS_DIR=" + f.secrets, "DROVER_REQUEST_DIR=" + filepath.Join(f.pipeDir, "requests")}, env...),
		Stdout:     f.stdout,
		Stderr:     f.stderr,
		KillGrace:  2 * time.Second,
		FlushEvery: 100 * time.Millisecond,
	}
	// A timer-started runner starts right after the elapse it is given:
	// its clock reads the elapse plus a start latency.
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "TRIGGER_TIMER_REALTIME_USEC="); ok {
			if usec, err := strconv.ParseInt(v, 10, 64); err == nil {
				elapse := time.UnixMicro(usec)
				o.Now = func() time.Time { return elapse.Add(300 * time.Millisecond) }
			}
		}
	}
	return o
}

func (f *fixture) run(opts Options) Result {
	f.t.Helper()
	res, err := Run(context.Background(), opts)
	if err != nil {
		f.t.Fatal(err)
	}
	return res
}

// records drains the spool.
func (f *fixture) records() []*agentpb.AgentMessage {
	f.t.Helper()
	var out []*agentpb.AgentMessage
	if _, err := spool.Drain(f.spoolDir, func(r spool.Record) error { out = append(out, r.Msg); return nil }); err != nil {
		f.t.Fatal(err)
	}
	return out
}

type runRecs struct {
	started  *agentpb.RunStarted
	attempts []*agentpb.RunStarted // every RunStarted: one per attempt
	finished *agentpb.RunFinished
	chunks   []*agentpb.LogChunk
}

// log is the run's whole log, every stream in chunk order.
func (r runRecs) log() string {
	var b strings.Builder
	for _, c := range r.chunks {
		b.Write(c.Data)
	}
	return b.String()
}

func (r runRecs) text(s agentpb.LogStream) string {
	var b strings.Builder
	for _, c := range r.chunks {
		if c.Stream == s {
			b.Write(c.Data)
		}
	}
	return b.String()
}

// byRun groups records by run, checking the order inside each run:
// RunStarted, chunks numbered 0..n-1, RunFinished counting them.
func byRun(t *testing.T, msgs []*agentpb.AgentMessage) ([]string, map[string]*runRecs) {
	t.Helper()
	var order []string
	runs := map[string]*runRecs{}
	get := func(id string) *runRecs {
		if runs[id] == nil {
			runs[id] = &runRecs{}
			order = append(order, id)
		}
		return runs[id]
	}
	for _, m := range msgs {
		switch b := m.Body.(type) {
		case *agentpb.AgentMessage_RunStarted:
			r := get(b.RunStarted.RunId)
			if r.finished != nil || b.RunStarted.Attempt != uint32(len(r.attempts)+1) {
				t.Fatalf("run %s: RunStarted of attempt %d after %d attempts (finished %v)", b.RunStarted.RunId, b.RunStarted.Attempt, len(r.attempts), r.finished != nil)
			}
			if r.started == nil {
				r.started = b.RunStarted
			} else if !proto.Equal(b.RunStarted.StartedAt, r.started.StartedAt) || b.RunStarted.Trigger != r.started.Trigger {
				t.Fatalf("run %s: attempt %d's RunStarted differs from the run's: %v, %v", b.RunStarted.RunId, b.RunStarted.Attempt, b.RunStarted, r.started)
			}
			r.attempts = append(r.attempts, b.RunStarted)
		case *agentpb.AgentMessage_LogChunk:
			r := get(b.LogChunk.RunId)
			if r.started == nil || r.finished != nil {
				t.Fatalf("chunk outside its run")
			}
			if b.LogChunk.ChunkSeq != uint64(len(r.chunks)) {
				t.Fatalf("chunk %d where %d expected", b.LogChunk.ChunkSeq, len(r.chunks))
			}
			r.chunks = append(r.chunks, b.LogChunk)
		case *agentpb.AgentMessage_RunFinished:
			r := get(b.RunFinished.RunId)
			if r.started == nil || r.finished != nil {
				t.Fatalf("RunFinished without RunStarted")
			}
			r.finished = b.RunFinished
			if b.RunFinished.Attempts != uint32(len(r.attempts)) && !(b.RunFinished.Reason == ReasonPayloadMismatch && b.RunFinished.Attempts == uint32(len(r.attempts)+1)) {
				t.Fatalf("RunFinished counts %d attempts, %d started", b.RunFinished.Attempts, len(r.attempts))
			}
			if b.RunFinished.LogChunks != uint64(len(r.chunks)) {
				t.Fatalf("RunFinished counts %d chunks, spool has %d", b.RunFinished.LogChunks, len(r.chunks))
			}
		}
	}
	for id, r := range runs {
		if r.finished == nil {
			t.Fatalf("run %s never finished", id)
		}
	}
	return order, runs
}

func only(t *testing.T, f *fixture) *runRecs {
	t.Helper()
	order, runs := byRun(t, f.records())
	if len(order) != 1 {
		t.Fatalf("%d runs recorded, want 1", len(order))
	}
	return runs[order[0]]
}

func TestSuccess(t *testing.T) {
	f := newPipe(t, manifest.Spec{Script: "echo hello\necho oops >&2\n"})
	res := f.run(f.opts())
	if res.ExitCode != 0 || len(res.Runs) != 1 || res.Runs[0].Status != agentpb.RunStatus_RUN_STATUS_SUCCEEDED {
		t.Fatalf("result %+v", res)
	}
	r := only(t, f)
	if r.finished.Status != agentpb.RunStatus_RUN_STATUS_SUCCEEDED || r.finished.ExitCode != 0 || r.finished.Pipe != "demo" || r.finished.PipeVersion != 3 {
		t.Fatalf("finished %v", r.finished)
	}
	if r.started.Trigger != agentpb.Trigger_TRIGGER_MANUAL || r.finished.Trigger != agentpb.Trigger_TRIGGER_MANUAL {
		t.Fatalf("trigger %v", r.started.Trigger)
	}
	if id, err := uuid.Parse(r.started.RunId); err != nil || id.Version() != 7 {
		t.Fatalf("run id %q is not a UUIDv7", r.started.RunId)
	}
	if got := r.text(agentpb.LogStream_LOG_STREAM_STDOUT); got != "hello\n" {
		t.Fatalf("stdout chunks %q", got)
	}
	if got := r.text(agentpb.LogStream_LOG_STREAM_STDERR); got != "oops\n" {
		t.Fatalf("stderr chunks %q", got)
	}
	// Tee: the same output on the runner's own stdout and stderr.
	if f.stdout.String() != "hello\n" || f.stderr.String() != "oops\n" {
		t.Fatalf("tee: %q %q", f.stdout, f.stderr)
	}
	if r.finished.StartedAt == nil || r.finished.FinishedAt == nil || r.finished.DurationMs < 0 {
		t.Fatalf("times %v", r.finished)
	}
	// Spool files are private to the runner's user.
	st, _ := os.Stat(f.spoolDir)
	if st.Mode().Perm() != 0o700 {
		t.Fatalf("spool mode %v", st.Mode())
	}
}

func TestFailureExitCode(t *testing.T) {
	f := newPipe(t, manifest.Spec{Script: "echo failing\nexit 3\n"})
	res := f.run(f.opts())
	if res.ExitCode != 3 {
		t.Fatalf("exit code %d, want 3", res.ExitCode)
	}
	r := only(t, f)
	if r.finished.Status != agentpb.RunStatus_RUN_STATUS_FAILED || r.finished.ExitCode != 3 || r.finished.Signal != "" {
		t.Fatalf("finished %v", r.finished)
	}

	f = newPipe(t, manifest.Spec{Script: "kill -KILL $$\n"})
	res = f.run(f.opts())
	r = only(t, f)
	if res.ExitCode != 128+9 || r.finished.Signal != "SIGKILL" || r.finished.Status != agentpb.RunStatus_RUN_STATUS_FAILED {
		t.Fatalf("killed: exit %d, %v", res.ExitCode, r.finished)
	}
}

func TestCommandAndNotFound(t *testing.T) {
	f := newPipe(t, manifest.Spec{Command: []string{"./bin/run.sh", "arg one"}})
	os.MkdirAll(filepath.Join(f.pipeDir, "payload", "bin"), 0o755)
	os.WriteFile(filepath.Join(f.pipeDir, "payload", "bin", "run.sh"), []byte("#!/bin/sh\necho \"$1\" from $(pwd)\n"), 0o755)
	res := f.run(f.opts())
	r := only(t, f)
	want := "arg one from " + filepath.Join(f.pipeDir, "payload") + "\n"
	if res.ExitCode != 0 || r.text(agentpb.LogStream_LOG_STREAM_STDOUT) != want {
		t.Fatalf("exit %d, output %q, want %q", res.ExitCode, r.text(agentpb.LogStream_LOG_STREAM_STDOUT), want)
	}

	f = newPipe(t, manifest.Spec{Command: []string{"echo", "via PATH"}})
	f.run(f.opts())
	if got := only(t, f).text(agentpb.LogStream_LOG_STREAM_STDOUT); got != "via PATH\n" {
		t.Fatalf("PATH command output %q", got)
	}

	f = newPipe(t, manifest.Spec{Command: []string{"no-such-program-drover"}})
	res = f.run(f.opts())
	r = only(t, f)
	if res.ExitCode != ExitNotFound || r.finished.Status != agentpb.RunStatus_RUN_STATUS_FAILED || !strings.Contains(r.finished.Error, "not found") {
		t.Fatalf("exit %d, %v", res.ExitCode, r.finished)
	}
	if !strings.Contains(r.text(agentpb.LogStream_LOG_STREAM_SYSTEM), "cannot start the payload") {
		t.Fatalf("no system note: %q", r.text(agentpb.LogStream_LOG_STREAM_SYSTEM))
	}
}

func TestBadPipeIsRecorded(t *testing.T) {
	f := newPipe(t, manifest.Spec{Script: "true"})
	os.WriteFile(filepath.Join(f.pipeDir, "pipe.json"), []byte("{"), 0o644)
	res := f.run(f.opts())
	r := only(t, f)
	if res.ExitCode != ExitRunnerFailed || r.finished.Status != agentpb.RunStatus_RUN_STATUS_FAILED || r.finished.Error == "" {
		t.Fatalf("exit %d, %v", res.ExitCode, r.finished)
	}
}

func TestEnvAndSecrets(t *testing.T) {
	f := newPipe(t, manifest.Spec{
		Script:  "env > \"$OUT\"\n",
		Env:     map[string]string{"GREETING": "hi there", "OUT": ""},
		Secrets: []string{"DB_PASSWORD", "API_TOKEN"},
	})
	out := filepath.Join(t.TempDir(), "env")
	// Rewrite the spec's OUT now that the path is known.
	var p manifest.Pipe
	b, _ := os.ReadFile(filepath.Join(f.pipeDir, "pipe.json"))
	json.Unmarshal(b, &p)
	p.Spec.Env["OUT"] = out
	b, _ = json.Marshal(p)
	os.WriteFile(filepath.Join(f.pipeDir, "pipe.json"), b, 0o644)

	os.WriteFile(filepath.Join(f.secrets, "DB_PASSWORD"), []byte("from-drover-dir\n"), 0o600)
	os.WriteFile(filepath.Join(f.secrets, "API_TOKEN"), []byte("tok-drover-dir"), 0o600)
	creds := t.TempDir()
	os.WriteFile(filepath.Join(creds, "API_TOKEN"), []byte("tok-from-credentials"), 0o600)

	res := f.run(f.opts("CREDENTIALS_DIRECTORY="+creds, "INVOCATION_ID=0123456789abcdef0123456789abcdef", "DROVER_SPOOL_DIR=/nope", "KEEP=me"))
	if res.ExitCode != 0 {
		t.Fatalf("exit %d: %s", res.ExitCode, f.stderr)
	}
	envb, _ := os.ReadFile(out)
	env := envMap(strings.Split(strings.TrimSpace(string(envb)), "\n"))
	want := map[string]string{
		"GREETING":       "hi there",
		"DB_PASSWORD":    "from-drover-dir", // trailing newline removed
		"API_TOKEN":      "tok-from-credentials",
		"DROVER_RUN_ID":  "0123456789abcdef0123456789abcdef",
		"DROVER_PIPE":    "demo",
		"DROVER_TRIGGER": "manual",
		"KEEP":           "me",
	}
	for k, v := range want {
		if env[k] != v {
			t.Errorf("%s=%q, want %q", k, env[k], v)
		}
	}
	for _, k := range []string{"DROVER_SECRETS_DIR", "DROVER_SPOOL_DIR", "DROVER_REQUEST_DIR"} {
		if _, ok := env[k]; ok {
			t.Errorf("runner variable %s leaked to the payload", k)
		}
	}
	if r := only(t, f); r.started.RunId != "0123456789abcdef0123456789abcdef" {
		t.Fatalf("run id %q, want $INVOCATION_ID", r.started.RunId)
	}

	// A secret that is not there fails the run before the payload starts.
	os.Remove(filepath.Join(f.secrets, "DB_PASSWORD"))
	os.Remove(out)
	res = f.run(f.opts())
	r := only(t, f)
	if res.ExitCode != ExitRunnerFailed || !strings.Contains(r.finished.Error, "DB_PASSWORD") {
		t.Fatalf("exit %d %v", res.ExitCode, r.finished)
	}
	if _, err := os.Stat(out); err == nil {
		t.Fatal("payload ran without its secret")
	}
}

func TestSecretsMaskedAcrossReadsAndChunks(t *testing.T) {
	const secret = "Sup3r-S3cret-Value"
	// The first half, a pause longer than the chunk flush interval, the
	// second half; then the secret across a chunk-size boundary on stderr.
	script := `printf 'token=Sup3r-S3c'
sleep 0.4
printf 'ret-Value end\n'
head -c 60 /dev/zero | tr '\0' 'a' >&2
printf '%s\n' "$PW" >&2
echo "$PW$PW"
`
	f := newPipe(t, manifest.Spec{Script: script, Secrets: []string{"PW"}})
	os.WriteFile(filepath.Join(f.secrets, "PW"), []byte(secret), 0o600)
	opts := f.opts()
	opts.ChunkBytes = 64
	res := f.run(opts)
	if res.ExitCode != 0 {
		t.Fatalf("exit %d: %s", res.ExitCode, f.stderr)
	}
	r := only(t, f)
	wantOut := "token=*** end\n******\n"
	wantErr := strings.Repeat("a", 60) + "***\n"
	if got := r.text(agentpb.LogStream_LOG_STREAM_STDOUT); got != wantOut {
		t.Fatalf("stdout chunks %q, want %q", got, wantOut)
	}
	if got := r.text(agentpb.LogStream_LOG_STREAM_STDERR); got != wantErr {
		t.Fatalf("stderr chunks %q, want %q", got, wantErr)
	}
	// The pause flushed a chunk holding "token=" without the secret's start.
	var stdoutChunks []string
	for _, c := range r.chunks {
		if c.Stream == agentpb.LogStream_LOG_STREAM_STDOUT {
			stdoutChunks = append(stdoutChunks, string(c.Data))
		}
		for n := 4; n <= len(secret); n++ {
			for i := 0; i+n <= len(secret); i++ {
				if n >= 6 && bytes.Contains(c.Data, []byte(secret[i:i+n])) {
					t.Fatalf("chunk %d holds %q of the secret: %q", c.ChunkSeq, secret[i:i+n], c.Data)
				}
			}
		}
	}
	if len(stdoutChunks) < 2 || stdoutChunks[0] != "token=" {
		t.Fatalf("stdout chunks %q: the pause should have flushed \"token=\" alone", stdoutChunks)
	}
	// The tee to the journal is masked the same way.
	if f.stdout.String() != wantOut || !strings.Contains(f.stderr.String(), "a***\n") || strings.Contains(f.stderr.String()+f.stdout.String(), "S3cret") {
		t.Fatalf("tee not masked: %q %q", f.stdout, f.stderr)
	}
}

func TestChunkSize(t *testing.T) {
	f := newPipe(t, manifest.Spec{Script: "head -c 40000 /dev/zero | tr '\\0' x\n"})
	f.run(f.opts())
	r := only(t, f)
	if len(r.chunks) != 3 || len(r.chunks[0].Data) != DefaultChunkBytes || len(r.chunks[1].Data) != DefaultChunkBytes || len(r.chunks[2].Data) != 40000-2*DefaultChunkBytes {
		var sizes []int
		for _, c := range r.chunks {
			sizes = append(sizes, len(c.Data))
		}
		t.Fatalf("chunk sizes %v", sizes)
	}
}

// gone reports whether pid no longer runs (a zombie waiting for its new
// parent to reap it counts as gone).
func gone(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	i := bytes.LastIndexByte(b, ')')
	return i < 0 || i+2 >= len(b) || b[i+2] == 'Z' || b[i+2] == 'X'
}

func waitGone(t *testing.T, pid int) {
	t.Helper()
	for start := time.Now(); time.Since(start) < 3*time.Second; time.Sleep(10 * time.Millisecond) {
		if gone(pid) {
			return
		}
	}
	syscall.Kill(pid, syscall.SIGKILL)
	t.Fatalf("grandchild %d still running", pid)
}

func readPid(t *testing.T, path string) int {
	t.Helper()
	for start := time.Now(); time.Since(start) < 5*time.Second; time.Sleep(5 * time.Millisecond) {
		b, _ := os.ReadFile(path)
		if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && strings.HasSuffix(string(b), "\n") {
			return pid
		}
	}
	t.Fatalf("no pid in %s", path)
	return 0
}

func TestTimeoutKillsTree(t *testing.T) {
	pidFile := filepath.Join(t.TempDir(), "pid")
	f := newPipe(t, manifest.Spec{
		Script:  "sh -c 'sleep 100 & echo $! > " + pidFile + "; wait'\n",
		Timeout: manifest.Duration(time.Second),
	})
	start := time.Now()
	res := f.run(f.opts())
	if el := time.Since(start); el > 4*time.Second {
		t.Fatalf("took %s", el)
	}
	if res.ExitCode != ExitTimedOut {
		t.Fatalf("exit %d", res.ExitCode)
	}
	r := only(t, f)
	if r.finished.Status != agentpb.RunStatus_RUN_STATUS_TIMED_OUT || r.finished.Signal != "SIGTERM" {
		t.Fatalf("finished %v", r.finished)
	}
	if !strings.Contains(r.text(agentpb.LogStream_LOG_STREAM_SYSTEM), "timed out") {
		t.Fatalf("system log %q", r.text(agentpb.LogStream_LOG_STREAM_SYSTEM))
	}
	waitGone(t, readPid(t, pidFile))
}

func TestTimeoutEscalatesToSIGKILL(t *testing.T) {
	f := newPipe(t, manifest.Spec{Script: "trap '' TERM\nwhile :; do sleep 0.05; done\n", Timeout: manifest.Duration(300 * time.Millisecond)})
	opts := f.opts()
	opts.KillGrace = 300 * time.Millisecond
	res := f.run(opts)
	r := only(t, f)
	if res.ExitCode != ExitTimedOut || r.finished.Signal != "SIGKILL" {
		t.Fatalf("exit %d, %v", res.ExitCode, r.finished)
	}
}

func TestCancelByContext(t *testing.T) {
	pidFile := filepath.Join(t.TempDir(), "pid")
	f := newPipe(t, manifest.Spec{Script: "sleep 100 &\necho $! > " + pidFile + "\nwait\n"})
	ctx, cancel := context.WithCancel(context.Background())
	go func() { readPid(t, pidFile); cancel() }()
	res, err := Run(ctx, f.opts())
	if err != nil {
		t.Fatal(err)
	}
	r := only(t, f)
	if r.finished.Status != agentpb.RunStatus_RUN_STATUS_CANCELED || res.ExitCode != 128+int(syscall.SIGTERM) {
		t.Fatalf("exit %d, %v", res.ExitCode, r.finished)
	}
	waitGone(t, readPid(t, pidFile))
}

// TestSIGTERMCancelsTree runs the real `drover-agent run` entry point as a
// process, stops it the way systemctl stop does, and checks the tree died,
// the run was recorded canceled and the runner died by SIGTERM.
func TestSIGTERMCancelsTree(t *testing.T) {
	pidFile := filepath.Join(t.TempDir(), "pid")
	f := newPipe(t, manifest.Spec{Script: "sh -c 'sleep 100 & echo $! > " + pidFile + "; wait'\n"})
	exe, _ := os.Executable()
	cmd := exec.Command(exe, "demo", "--pipe-dir", f.pipeDir, "--spool-dir", f.spoolDir)
	cmd.Env = append(os.Environ(), "RUNNER_TEST_MAIN=1")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	grandchild := readPid(t, pidFile)
	cmd.Process.Signal(syscall.SIGTERM)
	err := cmd.Wait()
	ws := cmd.ProcessState.Sys().(syscall.WaitStatus)
	if !ws.Signaled() || ws.Signal() != syscall.SIGTERM {
		t.Fatalf("runner exit: %v (%s)", err, stderr.String())
	}
	waitGone(t, grandchild)
	r := only(t, f)
	if r.finished.Status != agentpb.RunStatus_RUN_STATUS_CANCELED {
		t.Fatalf("finished %v", r.finished)
	}
}

func TestOverlapIsSkipped(t *testing.T) {
	marker := filepath.Join(t.TempDir(), "ran")
	f := newPipe(t, manifest.Spec{Script: "echo x >> " + marker + "\nsleep 1\n"})
	first := make(chan Result)
	go func() { res, _ := Run(context.Background(), f.opts()); first <- res }()
	for start := time.Now(); time.Since(start) < 5*time.Second; time.Sleep(5 * time.Millisecond) {
		if _, err := os.Stat(marker); err == nil {
			break
		}
	}
	second := f.run(f.opts())
	if second.ExitCode != 0 || second.Runs[0].Status != agentpb.RunStatus_RUN_STATUS_SKIPPED {
		t.Fatalf("second run %+v", second)
	}
	if res := <-first; res.Runs[0].Status != agentpb.RunStatus_RUN_STATUS_SUCCEEDED {
		t.Fatalf("first run %+v", res)
	}
	order, runs := byRun(t, f.records())
	if len(order) != 2 {
		t.Fatalf("%d runs", len(order))
	}
	skipped := 0
	for _, id := range order {
		if runs[id].finished.Status == agentpb.RunStatus_RUN_STATUS_SKIPPED {
			skipped++
			if !strings.Contains(runs[id].finished.Error, "still running") {
				t.Fatalf("skip reason %q", runs[id].finished.Error)
			}
		}
	}
	if b, _ := os.ReadFile(marker); skipped != 1 || string(b) != "x\n" {
		t.Fatalf("%d skipped, payload ran %q", skipped, b)
	}
}

// everyMinute is a stand-in for the "* * * * *" evaluator.
func everyMinute(after time.Time) time.Time { return after.Truncate(time.Minute).Add(time.Minute) }

// hourly is a stand-in for "0 * * * *".
func hourly(after time.Time) time.Time { return after.Truncate(time.Hour).Add(time.Hour) }

func timerEnv(elapse time.Time) []string {
	return []string{
		"INVOCATION_ID=aaaabbbbccccddddeeeeffff00001111",
		"TRIGGER_UNIT=drover-pipe-demo.timer",
		fmt.Sprintf("TRIGGER_TIMER_REALTIME_USEC=%d", elapse.UnixMicro()),
	}
}

func writeStateFile(t *testing.T, f *fixture, st state) {
	t.Helper()
	os.MkdirAll(f.spoolDir, 0o700)
	if err := writeState(f.spoolDir, st); err != nil {
		t.Fatal(err)
	}
}

func TestTriggerFromTimer(t *testing.T) {
	f := newPipe(t, manifest.Spec{Script: "true", Schedule: "0 * * * *", Jitter: manifest.Duration(5 * time.Minute)})
	fire := time.Now().Truncate(time.Hour)
	opts := f.opts(timerEnv(fire.Add(4 * time.Minute))...) // within jitter + 1m
	opts.Schedule = hourly
	f.run(opts)
	r := only(t, f)
	if r.started.Trigger != agentpb.Trigger_TRIGGER_SCHEDULE || !r.started.ScheduledAt.AsTime().Equal(fire) || r.started.RunId != "aaaabbbbccccddddeeeeffff00001111" {
		t.Fatalf("started %v (fire %s)", r.started, fire)
	}
	st := readState(f.spoolDir)
	if !st.LastFire.Equal(fire) || st.Schedule != "0 * * * *" || st.Timezone != "UTC" {
		t.Fatalf("state %+v", st)
	}

	// The same fire time again (an elapsed Persistent timer re-firing on a
	// reload): recorded as skipped, the payload does not run twice.
	res := f.run(opts)
	r = only(t, f)
	if res.ExitCode != 0 || r.finished.Status != agentpb.RunStatus_RUN_STATUS_SKIPPED || !strings.Contains(r.finished.Error, "already ran") {
		t.Fatalf("duplicate fire: %v", r.finished)
	}

	// Late by more than jitter + 1 minute: a catch-up (Persistent at boot).
	f = newPipe(t, manifest.Spec{Script: "true", Schedule: "0 * * * *", Jitter: manifest.Duration(5 * time.Minute)})
	opts = f.opts(timerEnv(fire.Add(7 * time.Minute))...)
	opts.Schedule = hourly
	f.run(opts)
	r = only(t, f)
	if r.started.Trigger != agentpb.Trigger_TRIGGER_CATCHUP || !r.finished.ScheduledAt.AsTime().Equal(fire) {
		t.Fatalf("late: %v", r.started)
	}

	// No TRIGGER_UNIT under systemd: started by hand (systemctl start).
	f = newPipe(t, manifest.Spec{Script: "true"})
	f.run(f.opts("INVOCATION_ID=aaaabbbbccccddddeeeeffff00002222"))
	if r := only(t, f); r.started.Trigger != agentpb.Trigger_TRIGGER_MANUAL || r.started.ScheduledAt != nil {
		t.Fatalf("manual: %v", r.started)
	}

	// Forced by flags (the cron backend).
	f = newPipe(t, manifest.Spec{Script: "true"})
	opts = f.opts()
	opts.Trigger, opts.ScheduledAt = "schedule", fire
	f.run(opts)
	if r := only(t, f); r.started.Trigger != agentpb.Trigger_TRIGGER_SCHEDULE || !r.started.ScheduledAt.AsTime().Equal(fire) {
		t.Fatalf("forced: %v", r.started)
	}
}

func TestTriggerWithRealEvaluator(t *testing.T) {
	s, err := manifest.ParseSchedule("*/5 * * * *")
	if err != nil || s.Next(time.Now(), time.UTC).IsZero() {
		t.Fatalf("the schedule evaluator: %v", err)
	}
	f := newPipe(t, manifest.Spec{Script: "true", Schedule: "*/5 * * * *", Timezone: "Europe/Berlin"})
	fire := time.Now().Truncate(5 * time.Minute)
	f.run(f.opts(timerEnv(fire.Add(2 * time.Second))...))
	if r := only(t, f); r.started.Trigger != agentpb.Trigger_TRIGGER_SCHEDULE || !r.started.ScheduledAt.AsTime().Equal(fire) {
		t.Fatalf("started %v, fire %s", r.started, fire)
	}
}

func TestAPIRequestFile(t *testing.T) {
	f := newPipe(t, manifest.Spec{Script: "echo $DROVER_TRIGGER"})
	reqDir := filepath.Join(f.pipeDir, "requests")
	os.MkdirAll(reqDir, 0o755)
	req := filepath.Join(reqDir, "demo.json")
	os.WriteFile(req, []byte(`{"request_id":"req-1"}`), 0o644)
	f.run(f.opts("INVOCATION_ID=aaaabbbbccccddddeeeeffff00003333"))
	r := only(t, f)
	if r.started.Trigger != agentpb.Trigger_TRIGGER_API || r.finished.RequestId != "req-1" || r.text(agentpb.LogStream_LOG_STREAM_STDOUT) != "api\n" {
		t.Fatalf("api run: %v", r.finished)
	}
	if _, err := os.Stat(req); !os.IsNotExist(err) {
		t.Fatal("request file not consumed")
	}

	// A stale request does not count.
	os.WriteFile(req, []byte(`{"request_id":"req-2"}`), 0o644)
	old := time.Now().Add(-2 * time.Minute)
	os.Chtimes(req, old, old)
	f.run(f.opts())
	if r := only(t, f); r.started.Trigger != agentpb.Trigger_TRIGGER_MANUAL {
		t.Fatalf("stale request: %v", r.started)
	}

	// A request already consumed (its file could not be removed) does not
	// count twice.
	os.WriteFile(req, []byte(`{"request_id":"req-1"}`), 0o644)
	f.run(f.opts())
	if r := only(t, f); r.started.Trigger != agentpb.Trigger_TRIGGER_MANUAL {
		t.Fatalf("reused request: %v", r.started)
	}

	// An expired one neither (the daemon's request format).
	os.WriteFile(req, []byte(`{"request_id":"req-4","trigger":"api","expires_at":"2001-01-01T00:00:00Z"}`), 0o644)
	f.run(f.opts())
	if r := only(t, f); r.started.Trigger != agentpb.Trigger_TRIGGER_MANUAL {
		t.Fatalf("expired request: %v", r.started)
	}
	os.WriteFile(req, []byte(`{"request_id":"req-5","trigger":"api","expires_at":"`+time.Now().Add(time.Minute).UTC().Format(time.RFC3339)+`"}`), 0o644)
	f.run(f.opts())
	if r := only(t, f); r.started.Trigger != agentpb.Trigger_TRIGGER_API || r.started.RequestId != "req-5" {
		t.Fatalf("daemon request: %v", r.started)
	}

	// --request-id (RunNow on the cron backend).
	opts := f.opts()
	opts.RequestID = "req-3"
	f.run(opts)
	if r := only(t, f); r.started.Trigger != agentpb.Trigger_TRIGGER_API || r.started.RequestId != "req-3" {
		t.Fatalf("flag request: %v", r.started)
	}
}

func TestCatchupAll(t *testing.T) {
	f := newPipe(t, manifest.Spec{Script: "echo $DROVER_TRIGGER $DROVER_SCHEDULED_AT", Catchup: manifest.CatchupAll})
	now := time.Now().Truncate(time.Minute)
	writeStateFile(t, f, state{Schedule: "* * * * *", Timezone: "UTC", LastFire: now.Add(-45 * time.Minute)})
	opts := f.opts(timerEnv(now.Add(3 * time.Second))...)
	opts.Schedule = everyMinute
	res := f.run(opts)
	if res.ExitCode != 0 || len(res.Runs) != manifest.MaxCatchup {
		t.Fatalf("%d runs, exit %d", len(res.Runs), res.ExitCode)
	}
	order, runs := byRun(t, f.records())
	if len(order) != manifest.MaxCatchup {
		t.Fatalf("%d runs recorded", len(order))
	}
	for i, id := range order {
		r := runs[id]
		want := now.Add(time.Duration(i-(manifest.MaxCatchup-1)) * time.Minute)
		if !r.started.ScheduledAt.AsTime().Equal(want) || !r.finished.ScheduledAt.AsTime().Equal(want) {
			t.Fatalf("run %d scheduled at %s, want %s", i, r.started.ScheduledAt.AsTime(), want)
		}
		wantTrigger := agentpb.Trigger_TRIGGER_CATCHUP
		if i == len(order)-1 {
			wantTrigger = agentpb.Trigger_TRIGGER_SCHEDULE // the current fire time is on time
			if id != "aaaabbbbccccddddeeeeffff00001111" {
				t.Fatalf("last run id %s, want $INVOCATION_ID", id)
			}
		}
		if r.started.Trigger != wantTrigger || r.finished.Status != agentpb.RunStatus_RUN_STATUS_SUCCEEDED {
			t.Fatalf("run %d: %v %v", i, r.started.Trigger, r.finished.Status)
		}
		if out := r.text(agentpb.LogStream_LOG_STREAM_STDOUT); out != wantTrigger.Name()+" "+want.UTC().Format(time.RFC3339)+"\n" {
			t.Fatalf("run %d printed %q", i, out)
		}
	}
	if st := readState(f.spoolDir); !st.LastFire.Equal(now) {
		t.Fatalf("state %+v", st)
	}

	// Three missed while down, the timer fires late at boot: catch-up runs
	// for the two missed fire times and the one the timer stands for.
	every10 := func(after time.Time) time.Time { return after.Truncate(10 * time.Minute).Add(10 * time.Minute) }
	base := now.Truncate(10 * time.Minute).Add(-20 * time.Minute)
	f = newPipe(t, manifest.Spec{Script: "true", Catchup: manifest.CatchupAll})
	writeStateFile(t, f, state{Schedule: "* * * * *", Timezone: "UTC", LastFire: base.Add(-30 * time.Minute)})
	opts = f.opts(timerEnv(base.Add(90 * time.Second))...)
	opts.Schedule = every10
	res = f.run(opts)
	var triggers []string
	for _, rr := range res.Runs {
		triggers = append(triggers, rr.Trigger.Name()+"@"+rr.ScheduledAt.Sub(base).String())
	}
	if got := strings.Join(triggers, " "); got != "catchup@-20m0s catchup@-10m0s catchup@0s" {
		t.Fatalf("runs %s", got)
	}

	// A schedule edit forgets the old last fire time: no replay.
	f = newPipe(t, manifest.Spec{Script: "true", Catchup: manifest.CatchupAll})
	writeStateFile(t, f, state{Schedule: "0 3 * * *", Timezone: "UTC", LastFire: now.Add(-45 * time.Minute)})
	opts = f.opts(timerEnv(now.Add(time.Second))...)
	opts.Schedule = everyMinute
	if res := f.run(opts); len(res.Runs) != 1 || res.Runs[0].Trigger != agentpb.Trigger_TRIGGER_SCHEDULE {
		t.Fatalf("after an edit: %+v", res.Runs)
	}
}

func TestCatchupOnceAndSkip(t *testing.T) {
	// An hourly pipe whose timer elapses 10 minutes after the fire time
	// (Persistent= catch-up at boot).
	fire := time.Now().Truncate(time.Hour).Add(-time.Hour)
	marker := filepath.Join(t.TempDir(), "ran")
	f := newPipe(t, manifest.Spec{Script: "touch " + marker, Catchup: manifest.CatchupSkip})
	opts := f.opts(timerEnv(fire.Add(10 * time.Minute))...)
	opts.Schedule = hourly
	res := f.run(opts)
	r := only(t, f)
	if res.ExitCode != 0 || r.finished.Status != agentpb.RunStatus_RUN_STATUS_SKIPPED || r.finished.Trigger != agentpb.Trigger_TRIGGER_CATCHUP ||
		!r.finished.ScheduledAt.AsTime().Equal(fire) {
		t.Fatalf("skip: exit %d %v", res.ExitCode, r.finished)
	}
	if _, err := os.Stat(marker); err == nil {
		t.Fatal("payload ran under catchup: skip")
	}

	f = newPipe(t, manifest.Spec{Script: "touch " + marker, Catchup: manifest.CatchupOnce})
	writeStateFile(t, f, state{Schedule: "* * * * *", Timezone: "UTC", LastFire: fire.Add(-5 * time.Hour)})
	opts = f.opts(timerEnv(fire.Add(10 * time.Minute))...)
	opts.Schedule = hourly
	res = f.run(opts)
	if len(res.Runs) != 1 || res.Runs[0].Trigger != agentpb.Trigger_TRIGGER_CATCHUP || !res.Runs[0].ScheduledAt.Equal(fire) {
		t.Fatalf("once: %+v", res.Runs)
	}
	if _, err := os.Stat(marker); err != nil {
		t.Fatal("payload did not run under catchup: once")
	}
}

func TestPrevAndMissedFires(t *testing.T) {
	base := time.Date(2026, 3, 10, 12, 0, 0, 0, time.UTC)
	if p := prevFire(hourly, base.Add(30*time.Minute)); !p.Equal(base) {
		t.Fatalf("prev %s", p)
	}
	if p := prevFire(hourly, base); !p.Equal(base) {
		t.Fatalf("prev at a fire time %s", p)
	}
	yearly := func(after time.Time) time.Time {
		n := time.Date(after.Year(), 1, 1, 0, 0, 0, 0, time.UTC)
		if !n.After(after) {
			n = n.AddDate(1, 0, 0)
		}
		return n
	}
	if p := prevFire(yearly, base); !p.Equal(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)) {
		t.Fatalf("yearly prev %s", p)
	}
	if p := prevFire(func(time.Time) time.Time { return time.Time{} }, base); !p.IsZero() {
		t.Fatal("stub evaluator gave a time")
	}
	m := missedFires(hourly, base.Add(-100*time.Hour), base, 5)
	if len(m) != 5 || !m[0].Equal(base.Add(-4*time.Hour)) || !m[4].Equal(base) {
		t.Fatalf("missed %v", m)
	}
}

func TestParseArgs(t *testing.T) {
	opts, err := ParseArgs([]string{"--pipe-dir", "/p", "backup", "--spool-dir=/s", "--trigger", "schedule", "--scheduled-at", "2026-01-02T03:04:00Z", "--request-id", "r"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if opts.Pipe != "backup" || opts.PipeDir != "/p" || opts.SpoolDir != "/s" || opts.Trigger != "schedule" || opts.RequestID != "r" ||
		!opts.ScheduledAt.Equal(time.Date(2026, 1, 2, 3, 4, 0, 0, time.UTC)) {
		t.Fatalf("%+v", opts)
	}
	for _, bad := range [][]string{{}, {"a", "b"}, {"a", "--trigger", "often"}, {"a", "--scheduled-at", "yesterday"}} {
		if _, err := ParseArgs(bad, nil); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

func TestSpoolDirFromSystemd(t *testing.T) {
	f := newPipe(t, manifest.Spec{Script: "true"})
	state := t.TempDir()
	f.run(f.opts("STATE_DIRECTORY=" + state + ":/other"))
	names, _ := spool.List(filepath.Join(state, "spool"))
	if len(names) != 2 {
		t.Fatalf("%d records under $STATE_DIRECTORY/spool", len(names))
	}
}

// TestRunsAsUnprivilegedUser runs `drover-agent run` as an unprivileged
// user (as DynamicUser= does) with its spool in a directory it owns, and
// drains that spool as root (the daemon).
func TestRunsAsUnprivilegedUser(t *testing.T) {
	if os.Geteuid() != 0 {
		testkit.Unavailable(t, "needs root")
	}
	const uid = 65534
	f := newPipe(t, manifest.Spec{Script: "id -u\necho $PW\n", Secrets: []string{"PW"}})
	os.WriteFile(filepath.Join(f.secrets, "PW"), []byte("hidden-value"), 0o400)
	os.Chown(f.secrets, uid, uid) // what LoadCredential= gives the service
	os.Chown(filepath.Join(f.secrets, "PW"), uid, uid)
	cmd, state := f.runnerAsUser(uid, "CREDENTIALS_DIRECTORY="+f.secrets)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("runner as uid %d: %v", uid, err)
	}
	if string(out) != "65534\n***\n" {
		t.Fatalf("output %q", out)
	}
	f.spoolDir = filepath.Join(state, "spool")
	r := only(t, f)
	if r.finished.Status != agentpb.RunStatus_RUN_STATUS_SUCCEEDED || r.text(agentpb.LogStream_LOG_STREAM_STDOUT) != "65534\n***\n" {
		t.Fatalf("finished %v, log %q", r.finished, r.text(agentpb.LogStream_LOG_STREAM_STDOUT))
	}
}

// runnerAsUser prepares a run of the pipe as uid, as a service with
// DynamicUser= and StateDirectory= runs it: a copy of the test binary the
// user can execute and a state directory it owns. It returns the command
// (env appended to the runner's environment) and the state directory.
func (f *fixture) runnerAsUser(uid int, env ...string) (*exec.Cmd, string) {
	root := filepath.Dir(f.pipeDir)
	os.Chmod(root, 0o755)
	os.Chmod(filepath.Dir(root), 0o755)
	state := filepath.Join(root, "state")
	os.Mkdir(state, 0o700)
	os.Chown(state, uid, uid)
	exe, _ := os.Executable()
	b, _ := os.ReadFile(exe)
	bin := filepath.Join(root, "drover-agent")
	os.WriteFile(bin, b, 0o755)
	cmd := exec.Command(bin, "demo", "--pipe-dir", f.pipeDir)
	cmd.Env = append([]string{"RUNNER_TEST_MAIN=1", "PATH=" + os.Getenv("PATH"), "STATE_DIRECTORY=" + state,
		"INVOCATION_ID=00112233445566778899aabbccddeeff"}, env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(uid)}}
	return cmd, state
}

// TestStopSignalsWholeCgroup is systemctl stop as systemd does it
// (KillMode=control-group): SIGTERM reaches the runner and the payload at the
// same moment. The run is still recorded canceled, not failed.
func TestStopSignalsWholeCgroup(t *testing.T) {
	dir := t.TempDir()
	pidFile := filepath.Join(dir, "pid")
	f := newPipe(t, manifest.Spec{Script: "echo $$ > " + pidFile + "\nsleep 100 &\nwait\n"})
	exe, _ := os.Executable()
	cmd := exec.Command(exe, "demo", "--pipe-dir", f.pipeDir, "--spool-dir", f.spoolDir)
	cmd.Env = append(os.Environ(), "RUNNER_TEST_MAIN=1")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	payload := readPid(t, pidFile)
	syscall.Kill(-payload, syscall.SIGTERM)
	cmd.Process.Signal(syscall.SIGTERM)
	cmd.Wait()
	r := only(t, f)
	if r.finished.Status != agentpb.RunStatus_RUN_STATUS_CANCELED {
		t.Fatalf("finished %v", r.finished)
	}
}

// TestCronBackendEnvironment: the cron backend starts `drover-agent run
// <name>` with DROVER_PIPE_DIR=D/pipes/<name>, DROVER_TRIGGER,
// DROVER_SCHEDULED_AT, DROVER_RUN_ID and DROVER_REQUEST_ID.
func TestCronBackendEnvironment(t *testing.T) {
	data := t.TempDir()
	f := &fixture{t: t, pipeDir: filepath.Join(data, "pipes", "demo"), secrets: filepath.Join(data, "secrets", "demo"),
		stdout: &testkit.Buffer{}, stderr: &testkit.Buffer{}}
	// D/pipes/demo is a symlink to the current generation.
	gen := filepath.Join(data, "pipes", ".demo.0123456789ab")
	f.pipeDir = gen
	layoutPipe(t, f, manifest.Spec{Name: "demo", Schedule: "* * * * *", Script: "echo $DROVER_RUN_ID $DROVER_TRIGGER\n"})
	f.pipeDir = filepath.Join(data, "pipes", "demo")
	if err := os.Symlink(".demo.0123456789ab", f.pipeDir); err != nil {
		t.Fatal(err)
	}
	at := time.Date(2026, 5, 1, 2, 30, 0, 0, time.UTC)
	opts := f.opts("DROVER_PIPE_DIR="+f.pipeDir, "DROVER_TRIGGER=catchup", "DROVER_SCHEDULED_AT="+at.Format(time.RFC3339), "DROVER_RUN_ID=cron-run-1")
	opts.PipeDir, opts.SpoolDir = "", ""
	f.run(opts)
	f.spoolDir = filepath.Join(data, "runs", "demo", "spool")
	r := only(t, f)
	if r.started.RunId != "cron-run-1" || r.started.Trigger != agentpb.Trigger_TRIGGER_CATCHUP || !r.started.ScheduledAt.AsTime().Equal(at) ||
		r.text(agentpb.LogStream_LOG_STREAM_STDOUT) != "cron-run-1 catchup\n" {
		t.Fatalf("started %v, output %q", r.started, r.text(agentpb.LogStream_LOG_STREAM_STDOUT))
	}
	if st := readState(f.spoolDir); !st.LastFire.Equal(at) {
		t.Fatalf("state %+v", st)
	}

	opts = f.opts("DROVER_PIPE_DIR="+f.pipeDir, "DROVER_TRIGGER=api", "DROVER_SCHEDULED_AT=0001-01-01T00:00:00Z", "DROVER_RUN_ID=cron-run-2", "DROVER_REQUEST_ID=req-7")
	opts.PipeDir, opts.SpoolDir = "", ""
	f.run(opts)
	r = only(t, f)
	if r.started.RunId != "cron-run-2" || r.started.Trigger != agentpb.Trigger_TRIGGER_API || r.started.RequestId != "req-7" || r.started.ScheduledAt != nil {
		t.Fatalf("api: %v", r.started)
	}
}

// TestManagerTimeoutIsTimedOut: when the service manager's own timeout
// (TimeoutStartSec=) stops the runner at about the run's timeout, the run
// is timed_out, not canceled.
func TestManagerTimeoutIsTimedOut(t *testing.T) {
	f := newPipe(t, manifest.Spec{Script: "sleep 100\n", Timeout: manifest.Duration(3 * time.Second)})
	ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
	defer cancel()
	res, _ := Run(ctx, f.opts())
	if r := only(t, f); res.ExitCode != ExitTimedOut || r.finished.Status != agentpb.RunStatus_RUN_STATUS_TIMED_OUT {
		t.Fatalf("exit %d, %v", res.ExitCode, r.finished)
	}
}

// TestPayloadMismatchRefused: a payload edited after the agent unpacked it
// does not run; the run is recorded failed with reason payload_mismatch.
func TestPayloadMismatchRefused(t *testing.T) {
	marker := filepath.Join(t.TempDir(), "ran")
	f := newPipe(t, manifest.Spec{Script: "touch " + marker + "\n"})
	opts := f.opts() // seals the payload as unpacked
	os.WriteFile(filepath.Join(f.pipeDir, "payload", manifest.ScriptFile), []byte("touch "+marker+"; echo pwned\n"), 0o755)
	res := f.run(opts)
	r := only(t, f)
	if _, err := os.Stat(marker); err == nil {
		t.Fatal("the edited payload ran")
	}
	if res.ExitCode != ExitRunnerFailed || r.finished.Status != agentpb.RunStatus_RUN_STATUS_FAILED || r.finished.Reason != ReasonPayloadMismatch {
		t.Fatalf("exit %d, %v", res.ExitCode, r.finished)
	}
	// A file added beside the payload is a mismatch too.
	f = newPipe(t, manifest.Spec{Script: "touch " + marker + "\n"})
	opts = f.opts()
	os.WriteFile(filepath.Join(f.pipeDir, "payload", "extra"), []byte("x"), 0o644)
	f.run(opts)
	if r := only(t, f); r.finished.Reason != ReasonPayloadMismatch {
		t.Fatalf("extra file: %v", r.finished)
	}
	// The intact payload runs.
	f = newPipe(t, manifest.Spec{Script: "touch " + marker + "\n"})
	f.run(f.opts())
	if r := only(t, f); r.finished.Status != agentpb.RunStatus_RUN_STATUS_SUCCEEDED || r.finished.Reason != "" {
		t.Fatalf("intact: %v", r.finished)
	}
}

// TestRunnerRecordReason: runner records carry reason, attempts and
// written_by.
func TestRunnerRecordReason(t *testing.T) {
	for _, c := range []struct {
		script, reason string
	}{
		{"exit 3\n", "exit 3"},
		{"kill -TERM $$\n", "signal SIGTERM"},
		{"true\n", ""},
	} {
		f := newPipe(t, manifest.Spec{Script: c.script})
		f.run(f.opts())
		r := only(t, f)
		if r.finished.Reason != c.reason || r.finished.Attempts != 1 || r.finished.WrittenBy != "runner" || r.started.Attempt != 1 {
			t.Errorf("%q: started %v, finished %v", c.script, r.started, r.finished)
		}
	}
	f := newPipe(t, manifest.Spec{Script: "sleep 30\n", Timeout: manifest.Duration(time.Second)})
	f.run(f.opts())
	if r := only(t, f); r.finished.Reason != "timeout" {
		t.Errorf("timeout: %v", r.finished)
	}
}

// systemd 252 gives a timer-started service the timer's previous trigger in
// TRIGGER_TIMER_REALTIME_USEC. The runner must serve the fire time it was
// started for, not skip it as the one that already ran.
func TestTriggerStaleTimerElapse(t *testing.T) {
	f := newPipe(t, manifest.Spec{Script: "true", Schedule: "* * * * *"})
	fire := time.Now().Truncate(time.Minute)
	prev := fire.Add(-time.Minute)
	writeStateFile(t, f, state{LastFire: prev, Schedule: "* * * * *", Timezone: "UTC"})
	opts := f.opts(timerEnv(prev.Add(20 * time.Millisecond))...)
	opts.Now = func() time.Time { return fire.Add(400 * time.Millisecond) }
	opts.Schedule = func(after time.Time) time.Time { return after.Truncate(time.Minute).Add(time.Minute) }
	f.run(opts)
	r := only(t, f)
	if r.started == nil || r.started.Trigger != agentpb.Trigger_TRIGGER_SCHEDULE || !r.started.ScheduledAt.AsTime().Equal(fire) {
		t.Fatalf("started %v, finished %v; want a scheduled run for %s", r.started, r.finished, fire)
	}
	if r.finished.GetStatus() == agentpb.RunStatus_RUN_STATUS_SKIPPED {
		t.Fatalf("skipped: %v", r.finished)
	}
}
