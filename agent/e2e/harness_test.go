package e2e

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/drover/drover/api"

	"github.com/drover/drover/agent"
	"github.com/drover/drover/agent/internal/sdtest"
	"github.com/drover/drover/internal/testkit"
	"github.com/drover/drover/manifest"
	"github.com/drover/drover/server"
)

// ---- processes' logs

// logSink is a process's log: a file in the test's directory, streamed to
// t.Log with DROVER_TEST_LOG=1 and its tail shown when the test fails.
type logSink struct {
	name string
	path string
	f    *os.File
}

func newLogSink(t testing.TB, dir, name string) *logSink {
	t.Helper()
	path := filepath.Join(dir, name+".log")
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	s := &logSink{name: name, path: path, f: f}
	t.Cleanup(func() {
		if t.Failed() {
			b, _ := os.ReadFile(path)
			t.Logf("---- %s log (tail) ----\n%s", name, tailLines(string(b), 60))
		}
		f.Close()
	})
	return s
}

// size is the log's current length (to read what a process wrote later).
func (s *logSink) size() int64 {
	fi, err := os.Stat(s.path)
	if err != nil {
		return 0
	}
	return fi.Size()
}

// since returns the log from offset on.
func (s *logSink) since(off int64) string {
	b, _ := os.ReadFile(s.path)
	if off > int64(len(b)) {
		return ""
	}
	return string(b[off:])
}

func tailLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// childEnv is the environment of the processes the tests start: the test
// binary's without its DROVER_* variables (sdtest's among them), plus extra.
func childEnv(extra ...string) []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "DROVER_") {
			env = append(env, kv)
		}
	}
	return append(env, extra...)
}

// ---- drover-server

// serverProc is drover-server running as a child process on 127.0.0.1.
type serverProc struct {
	t       testing.TB
	dataDir string
	env     []string // extra environment (DROVER_* settings)
	log     *logSink
	https   string // host:port
	grpc    string
	proc    child

	base   string
	admin  string
	client *http.Client
}

// startServer starts drover-server on fresh data and ports chosen by the
// kernel (it reports them in its "drover-server ready" log line).
func startServer(t testing.TB, env ...string) *serverProc {
	t.Helper()
	s := launchServer(t, "drover-server", "127.0.0.1:0", "127.0.0.1:0", env)
	t.Cleanup(func() { s.stop() })
	return s
}

// launchServer starts drover-server on a fresh data dir and the given
// addresses, logging to name's log file, and gives it an API client that
// trusts its CA with its admin token. The caller says how it ends.
func launchServer(t testing.TB, name, httpAddr, grpcAddr string, env []string) *serverProc {
	t.Helper()
	dir := t.TempDir()
	s := &serverProc{t: t, dataDir: filepath.Join(dir, "data"), log: newLogSink(t, dir, name), env: env}
	s.start(httpAddr, grpcAddr)
	caPEM, err := os.ReadFile(filepath.Join(s.dataDir, "ca.crt"))
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	if s.admin, err = server.ReadAdminToken(s.dataDir); err != nil {
		t.Fatal(err)
	}
	s.client = &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	return s
}

// start runs the server process and waits for its ready line.
func (s *serverProc) start(httpAddr, grpcAddr string) {
	t := s.t
	t.Helper()
	cmd := exec.Command(serverBin(), "serve", "--data-dir", s.dataDir, "--http-addr", httpAddr, "--grpc-addr", grpcAddr)
	cmd.Env = childEnv(append([]string{"DROVER_LOG_FORMAT=json"}, s.env...)...)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	ready := make(chan [2]string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			line := sc.Bytes()
			s.log.f.Write(append(line, '\n'))
			if os.Getenv("DROVER_TEST_LOG") != "" {
				t.Logf("server: %s", line)
			}
			var l struct{ Msg, HTTPS, GRPC string }
			if json.Unmarshal(line, &l) == nil && l.Msg == "drover-server ready" {
				ready <- [2]string{l.HTTPS, l.GRPC}
			}
		}
		io.Copy(io.Discard, stderr)
	}()
	done := s.proc.started(cmd)
	select {
	case a := <-ready:
		s.https, s.grpc = a[0], a[1]
	case <-done:
		t.Fatalf("drover-server exited before it was ready: %v", cmd.ProcessState)
	case <-time.After(60 * time.Second):
		cmd.Process.Kill()
		t.Fatal("drover-server was not ready within 60 s")
	}
	s.base = "https://" + s.https
}

// stop ends the server with SIGTERM (SIGKILL after 30 s); idempotent.
func (s *serverProc) stop() {
	cmd := s.proc.terminate(s.t, "drover-server")
	if cmd == nil {
		return
	}
	if st := cmd.ProcessState; st != nil && !st.Success() {
		s.t.Errorf("drover-server after SIGTERM: %v", st)
	}
}

// token creates an enrollment token with `drover-server tokens create`.
func (s *serverProc) token(tags map[string]string) string {
	s.t.Helper()
	args := []string{"tokens", "create", "--data-dir", s.dataDir, "--ttl", "1h"}
	keys := make([]string, 0, len(tags))
	for k := range tags {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		args = append(args, "--tag", k+"="+tags[k])
	}
	cmd := exec.Command(serverBin(), args...)
	cmd.Env = childEnv(s.env...) // the store settings (PostgreSQL replicas)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		s.t.Fatalf("drover-server tokens create: %v\n%s", err, stderr.String())
	}
	tok := strings.TrimSpace(string(out))
	if !strings.HasPrefix(tok, "drv1.") {
		s.t.Fatalf("drover-server tokens create printed %q", tok)
	}
	return tok
}

// api makes an admin API request, fails the test on an error status, and
// decodes the JSON answer into out (when not nil).
func (s *serverProc) api(method, path string, body, out any) {
	s.t.Helper()
	testkit.APIClient{HTTP: s.client, Base: s.base, Token: s.admin}.JSON(s.t, method, path, body, out)
}

// pipeSpec is a pipe as the tests write it.
type pipeSpec struct {
	Schedule  string            `json:"schedule"`
	Script    string            `json:"script"`
	Timezone  string            `json:"timezone,omitempty"`
	Timeout   string            `json:"timeout,omitempty"`
	Env       map[string]string `json:"env,omitempty"`
	Secrets   []string          `json:"secrets,omitempty"`
	Catchup   string            `json:"catchup,omitempty"`
	RunAs     string            `json:"run_as,omitempty"`
	Limits    map[string]int    `json:"limits,omitempty"`
	Grace     string            `json:"grace,omitempty"`
	Placement string            `json:"placement,omitempty"`
	Targets   map[string]any    `json:"targets"`
}

func byTags(tags map[string]string) map[string]any { return map[string]any{"tags": tags} }

// putPipe creates or changes a pipe and returns its version.
func (s *serverProc) putPipe(name string, spec pipeSpec) api.PutPipeResponse {
	s.t.Helper()
	var out api.PutPipeResponse
	s.api("PUT", "/api/v1/pipes/"+name, map[string]any{"spec": spec}, &out)
	return out
}

// waitSoleAgentOnline waits (60 s, what says for what) until the server
// knows exactly one agent and it is online, and returns its id.
func (s *serverProc) waitSoleAgentOnline(what string) string {
	s.t.Helper()
	var id string
	testkit.WaitFor(s.t, 60*time.Second, what, func() bool {
		var list api.AgentList
		s.api("GET", "/api/v1/agents", nil, &list)
		if len(list.Agents) == 1 && list.Agents[0].Online {
			id = list.Agents[0].ID
			return true
		}
		return false
	})
	return id
}

func (s *serverProc) agentView(id string) api.Agent {
	s.t.Helper()
	var ag api.Agent
	s.api("GET", "/api/v1/agents/"+id, nil, &ag)
	return ag
}

// runs lists the runs of pipe by agent, oldest first.
func (s *serverProc) runs(pipe, agentID string) []api.Run {
	s.t.Helper()
	var all []api.Run
	q := url.Values{"pipe": {pipe}, "agent": {agentID}, "limit": {"1000"}}
	for {
		var page api.RunList
		s.api("GET", "/api/v1/runs?"+q.Encode(), nil, &page)
		all = append(all, page.Runs...)
		if page.NextCursor == "" {
			break
		}
		q.Set("cursor", page.NextCursor)
	}
	sort.SliceStable(all, func(i, j int) bool { return all[i].CreatedAt.Before(all[j].CreatedAt) })
	return all
}

// logs returns a run's log chunks as the server stored them.
func (s *serverProc) logs(runID string) api.Logs {
	s.t.Helper()
	req, err := http.NewRequest("GET", s.base+"/api/v1/runs/"+url.PathEscape(runID)+"/logs", nil)
	if err != nil {
		s.t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+s.admin)
	req.Header.Set("Accept", "application/json")
	resp, err := s.client.Do(req)
	if err != nil {
		s.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		s.t.Fatalf("logs of %s: %d %s", runID, resp.StatusCode, b)
	}
	var l api.Logs
	if err := json.Unmarshal(b, &l); err != nil {
		s.t.Fatal(err)
	}
	return l
}

// logText is a run's log as one string.
func (s *serverProc) logText(runID string) string {
	var b strings.Builder
	for _, c := range s.logs(runID).Chunks {
		b.Write(c.Data)
	}
	return b.String()
}

// runNow asks the server to run pipe on one agent now.
func (s *serverProc) runNow(pipe, agentID string) api.RunPipeResponse {
	s.t.Helper()
	var out api.RunPipeResponse
	s.api("POST", "/api/v1/pipes/"+pipe+"/run", api.RunPipeRequest{Agent: agentID}, &out)
	if len(out.Sent) != 1 || out.Sent[0] != agentID {
		s.t.Fatalf("run %s now: sent to %v, offline %v", pipe, out.Sent, out.Offline)
	}
	return out
}

// runOfRequest waits for the run a RunNow request started to reach one of
// the given statuses.
func (s *serverProc) runOfRequest(requestID string, timeout time.Duration, statuses ...string) api.Run {
	s.t.Helper()
	var got api.Run
	testkit.WaitFor(s.t, timeout, "the run of request "+requestID+" to be "+strings.Join(statuses, "|"), func() bool {
		var page api.RunList
		s.api("GET", "/api/v1/runs?request_id="+url.QueryEscape(requestID), nil, &page)
		for _, r := range page.Runs {
			for _, st := range statuses {
				if r.Status == st {
					got = r
					return true
				}
			}
		}
		return false
	})
	return got
}

// ---- drover-agent

// agentOpts configure an agent process.
type agentOpts struct {
	name         string // log name
	backend      string // systemd | cron
	scope        string // default user
	mgr          *sdtest.Env
	tags         map[string]string
	syncInterval time.Duration // default 1h: the tests sync on demand
	heartbeat    time.Duration // default 5s
	logLevel     string        // default debug
	serverURL    string        // default the server's
	binary       string        // the drover-agent to start; default the built one
	noAgentPath  bool          // leave agent_path out: the daemon runs its own binary
	token        string        // the enrollment token; default one from `drover-server tokens create`
	// serverURLs and grpcAddrs, when set, pin the replica lists in
	// agent.yaml (they win over what the server sends).
	serverURLs, grpcAddrs []string
}

// agentProc is drover-agent running as a child process.
type agentProc struct {
	t       testing.TB
	srv     *serverProc
	opts    agentOpts
	dir     string
	dataDir string
	cfgPath string
	token   string // the token file
	env     []string
	log     *logSink
	proc    child

	mu sync.Mutex
	id string
}

// newAgent prepares an agent of srv: its configuration file and a token
// file made by `drover-server tokens create`. Start it with start.
func newAgent(t testing.TB, srv *serverProc, o agentOpts) *agentProc {
	t.Helper()
	if o.scope == "" {
		o.scope = "user"
	}
	if o.syncInterval == 0 {
		o.syncInterval = time.Hour
	}
	if o.heartbeat == 0 {
		o.heartbeat = 5 * time.Second
	}
	if o.logLevel == "" {
		o.logLevel = "debug"
	}
	if o.name == "" {
		o.name = "drover-agent-" + o.backend
	}
	dir := testkit.ShortTempDir(t, "e2e")
	a := &agentProc{t: t, srv: srv, opts: o, dir: dir, dataDir: filepath.Join(dir, "data"),
		cfgPath: filepath.Join(dir, "agent.yaml"), token: filepath.Join(dir, "enroll.token"),
		log: newLogSink(t, t.TempDir(), o.name)}
	a.writeConfig(o.serverURL)
	if o.mgr != nil {
		a.env = childEnv(o.mgr.Environ()...)
	} else {
		a.env = childEnv()
	}
	if o.token == "" {
		o.token = srv.token(o.tags)
	}
	if err := os.WriteFile(a.token, []byte(o.token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.stop() })
	return a
}

// enrolledAgent is newAgent started, once it has enrolled (and is online):
// the agent and its id.
func enrolledAgent(t testing.TB, srv *serverProc, o agentOpts) (*agentProc, string) {
	t.Helper()
	a := newAgent(t, srv, o)
	a.start()
	return a, a.waitEnrolled()
}

// systemdAndCronAgents starts two agents of srv with tags, one on systemd
// timers (of mgr) and one on the cron backend, and waits for both to
// enroll.
func systemdAndCronAgents(t testing.TB, srv *serverProc, mgr *sdtest.Env, tags map[string]string) (sys, crn *agentProc, sysID, cronID string) {
	t.Helper()
	sys = newAgent(t, srv, agentOpts{name: "agent-systemd", backend: "systemd", mgr: mgr, tags: tags})
	crn = newAgent(t, srv, agentOpts{name: "agent-cron", backend: "cron", tags: tags})
	sys.start()
	crn.start()
	return sys, crn, sys.waitEnrolled(), crn.waitEnrolled()
}

// writeConfig writes the agent's configuration file (serverURL "" = the
// server's own URL).
func (a *agentProc) writeConfig(serverURL string) {
	a.t.Helper()
	if serverURL == "" {
		serverURL = a.srv.base
	}
	cfg := fmt.Sprintf(`server: %s
data_dir: %s
token_file: %s
backend: %s
scope: %s
agent_path: %s
sync_interval: %s
heartbeat_interval: %s
max_backoff: 2s
request_timeout: 10s
log_level: %s
log_format: json
`, serverURL, a.dataDir, a.token, a.opts.backend, a.opts.scope, agentBin(), a.opts.syncInterval, a.opts.heartbeat, a.opts.logLevel)
	if len(a.opts.serverURLs) > 0 {
		cfg += "server_urls: [" + strings.Join(a.opts.serverURLs, ", ") + "]\n"
	}
	if len(a.opts.grpcAddrs) > 0 {
		cfg += "grpc_addrs: [" + strings.Join(a.opts.grpcAddrs, ", ") + "]\n"
	}
	if a.opts.noAgentPath {
		cfg = strings.Replace(cfg, "agent_path: "+agentBin()+"\n", "", 1)
	}
	if err := os.WriteFile(a.cfgPath, []byte(cfg), 0o600); err != nil {
		a.t.Fatal(err)
	}
}

// start runs the daemon: `drover-agent --config FILE`.
func (a *agentProc) start() {
	a.t.Helper()
	bin := a.opts.binary
	if bin == "" {
		bin = agentBin()
	}
	cmd := exec.Command(bin, "--config", a.cfgPath)
	cmd.Env = a.env
	w := io.Writer(a.log.f)
	if os.Getenv("DROVER_TEST_LOG") != "" {
		w = io.MultiWriter(w, testkit.LogWriter(a.t, a.opts.name+": "))
	}
	cmd.Stdout, cmd.Stderr = w, w
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		a.t.Fatal(err)
	}
	a.proc.started(cmd)
}

func (a *agentProc) pid() int { return a.proc.pid() }

// stop ends the daemon with SIGTERM; idempotent.
func (a *agentProc) stop() { a.proc.terminate(a.t, a.opts.name) }

// kill ends the daemon with SIGKILL and waits for it.
func (a *agentProc) kill() { a.proc.kill() }

func (a *agentProc) socket() string { return filepath.Join(a.dataDir, "control", "agent.sock") }

// status asks the daemon over its control socket (what `drover-agent
// status --json` prints); nil while it does not answer.
func (a *agentProc) status() *agent.Status {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := agent.QueryStatus(ctx, a.socket())
	if err != nil {
		return nil
	}
	return st
}

// cli runs `drover-agent ARGS --config FILE` and returns its stdout.
func (a *agentProc) cli(args ...string) string {
	a.t.Helper()
	cmd := exec.Command(agentBin(), append(args, "--config", a.cfgPath)...)
	cmd.Env = a.env
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		a.t.Fatalf("drover-agent %s: %v\n%s%s", strings.Join(args, " "), err, out, stderr.String())
	}
	return string(out)
}

// statusCLI is `drover-agent status --json`.
func (a *agentProc) statusCLI() agent.Status {
	a.t.Helper()
	var st agent.Status
	out := a.cli("status", "--json")
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		a.t.Fatalf("status --json: %v\n%s", err, out)
	}
	return st
}

// syncCLI is `drover-agent sync`; it returns the outcome: from stdout
// ("sync applied (serial 3)", exit 0) or, for a failed sync, from stderr
// ("drover-agent: sync rejected: <reason>", exit 1).
func (a *agentProc) syncCLI() string {
	a.t.Helper()
	cmd := exec.Command(agentBin(), "sync", "--timeout", "60s", "--config", a.cfgPath)
	cmd.Env = a.env
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	return syncOutcome(a.t, stdout.String(), stderr.String(), err)
}

// syncOutcome reads the outcome of `drover-agent sync` from its output.
func syncOutcome(t testing.TB, stdout, stderr string, err error) string {
	t.Helper()
	text := strings.TrimSpace(stdout)
	if err != nil {
		text = strings.TrimPrefix(strings.TrimSpace(stderr), "drover-agent: ")
	}
	f := strings.Fields(strings.Replace(text, ":", " ", 1))
	if len(f) < 2 || f[0] != "sync" {
		t.Fatalf("drover-agent sync: %v\n%s%s", err, stdout, stderr)
	}
	return f[1]
}

// waitEnrolled waits until the agent enrolled from its token file, removed
// the file and has its stream up on the server; it returns the agent id.
func (a *agentProc) waitEnrolled() string {
	a.t.Helper()
	var id string
	testkit.WaitFor(a.t, 60*time.Second, a.opts.name+" to enroll", func() bool {
		st := a.status()
		if st == nil || !st.Enrolled {
			return false
		}
		id = st.AgentID
		return true
	})
	if _, err := os.Stat(a.token); !os.IsNotExist(err) {
		a.t.Fatalf("the token file is still there after enrollment (%v)", err)
	}
	a.mu.Lock()
	a.id = id
	a.mu.Unlock()
	a.waitOnline()
	return id
}

// waitOnline waits until the server sees the agent's stream.
func (a *agentProc) waitOnline() {
	a.t.Helper()
	testkit.WaitFor(a.t, 60*time.Second, a.opts.name+" online on the server", func() bool {
		st := a.status()
		return st != nil && st.StreamConnected && a.srv.agentView(st.AgentID).Online
	})
}

// waitPipes waits until the agent's status lists exactly these pipes, each
// applied without error and scheduled.
func (a *agentProc) waitPipes(timeout time.Duration, names ...string) *agent.Status {
	a.t.Helper()
	want := map[string]bool{}
	for _, n := range names {
		want[n] = true
	}
	var st *agent.Status
	testkit.WaitFor(a.t, timeout, fmt.Sprintf("%s to apply pipes %v", a.opts.name, names), func() bool {
		st = a.status()
		if st == nil || st.Serial == 0 || st.AppliedSerial != st.Serial {
			return false
		}
		n := 0
		for _, p := range st.Pipes {
			if p.Version == 0 {
				continue // on the host, no longer in the manifest
			}
			if !want[p.Name] || p.ApplyError != "" || p.NextRun.IsZero() {
				return false
			}
			n++
		}
		return n == len(want)
	})
	return st
}

// ---- helpers

// sleepUntil sleeps until at.
func sleepUntil(at time.Time) {
	if d := time.Until(at); d > 0 {
		time.Sleep(d)
	}
}

// nextFire is the schedule evaluator's next fire time after now.
func nextFire(t testing.TB, schedule, tz string, after time.Time) time.Time {
	t.Helper()
	s, err := manifest.ParseSchedule(schedule)
	if err != nil {
		t.Fatal(err)
	}
	if tz == "" {
		tz = "UTC"
	}
	loc, err := manifest.LoadLocation(tz)
	if err != nil {
		t.Fatal(err)
	}
	return s.Next(after, loc)
}

// unitFiles reads the managed pipe units of a unit directory.
func unitFiles(t testing.TB, dir string) map[string][]byte {
	t.Helper()
	out := map[string][]byte{}
	ents, err := os.ReadDir(dir)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	for _, e := range ents {
		if !strings.HasPrefix(e.Name(), "drover-pipe-") || e.IsDir() {
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		out[e.Name()] = b
	}
	return out
}

// fileStamp is a file's bytes and modification time.
type fileStamp struct {
	data  []byte
	mtime time.Time
}

func stampFiles(t testing.TB, dir string) map[string]fileStamp {
	t.Helper()
	out := map[string]fileStamp{}
	for name, b := range unitFiles(t, dir) {
		fi, err := os.Stat(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		out[name] = fileStamp{b, fi.ModTime()}
	}
	return out
}

// sameStamps reports how two snapshots differ ("" when they do not).
func sameStamps(a, b map[string]fileStamp) string {
	var diffs []string
	for name, x := range a {
		y, ok := b[name]
		switch {
		case !ok:
			diffs = append(diffs, name+" removed")
		case !bytes.Equal(x.data, y.data):
			diffs = append(diffs, name+" rewritten")
		case !x.mtime.Equal(y.mtime):
			diffs = append(diffs, fmt.Sprintf("%s touched (mtime %s -> %s)", name, x.mtime.Format(time.RFC3339Nano), y.mtime.Format(time.RFC3339Nano)))
		}
	}
	for name := range b {
		if _, ok := a[name]; !ok {
			diffs = append(diffs, name+" added")
		}
	}
	sort.Strings(diffs)
	return strings.Join(diffs, "; ")
}

// userScenario starts a scenario on a private systemd user manager: the
// test runs in parallel with the others, needs a user manager (sdtest),
// gets its own (whose units it shows when it fails) and its own server
// (env: the server's extra settings). tags {"e2e": tag} target its agents.
func userScenario(t *testing.T, tag string, env ...string) (sdtest.Env, *serverProc, map[string]string) {
	t.Helper()
	t.Parallel()
	sdtest.Require(t)
	mgr := sdtest.NewManager(t)
	diagnoseOnFailure(t, mgr)
	return mgr, startServer(t, env...), map[string]string{"e2e": tag}
}

// diagnoseOnFailure logs the state of a user manager's pipe units and the
// runner spools when t fails.
func diagnoseOnFailure(t testing.TB, mgr sdtest.Env) {
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		out, _ := mgr.SystemctlErr("status", "--all", "--lines=20", "drover-pipe-*")
		t.Logf("---- systemctl --user status drover-pipe-* ----\n%s", tailLines(out, 120))
		var files []string
		for _, base := range []string{mgr.ConfigHome, mgr.StateHome} {
			filepath.WalkDir(filepath.Join(base, "drover-runs"), func(p string, d os.DirEntry, err error) error {
				if err == nil {
					files = append(files, p)
				}
				return nil
			})
		}
		t.Logf("---- runner spools ----\n%s", tailLines(strings.Join(files, "\n"), 60))
	})
}

// agentTLS is the client side of an agent's mTLS identity, read from its
// data dir (agent.pem: certificate chain and key; ca.pem).
func agentTLS(t testing.TB, dataDir string) *tls.Config {
	t.Helper()
	cred, err := os.ReadFile(filepath.Join(dataDir, "agent.pem"))
	if err != nil {
		t.Fatal(err)
	}
	cert, err := tls.X509KeyPair(cred, cred)
	if err != nil {
		t.Fatalf("agent.pem: %v", err)
	}
	caPEM, err := os.ReadFile(filepath.Join(dataDir, "ca.pem"))
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	return &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{cert}}
}

// agentHTTP is an HTTP client that is the agent of dataDir to the server.
func agentHTTP(t testing.TB, dataDir string) *http.Client {
	return &http.Client{Timeout: 30 * time.Second, Transport: machineHeader{
		id: agent.ReadMachineID(agent.DefaultMachineIDFile), next: &http.Transport{TLSClientConfig: agentTLS(t, dataDir)}}}
}

// machineHeader says which machine a request comes from, as the agent does
// (the test agents run on this host, so they carry its machine id).
type machineHeader struct {
	id   string
	next http.RoundTripper
}

func (m machineHeader) RoundTrip(r *http.Request) (*http.Response, error) {
	if m.id != "" {
		r = r.Clone(r.Context())
		r.Header.Set("X-Drover-Machine-Id", m.id)
	}
	return m.next.RoundTrip(r)
}

// fetchManifest gets the agent's current signed manifest from the server
// as the agent would, and decodes its payload (not verified: the agent is
// under test, the test only reads what the manifest says).
func fetchManifest(t testing.TB, c *http.Client, base string) ([]byte, *manifest.Manifest) {
	t.Helper()
	resp, err := c.Get(base + "/api/v1/agents/self/manifest")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	env, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("GET manifest: %d %v %s", resp.StatusCode, err, env)
	}
	return env, decodeEnvelope(t, env)
}

// dsse is the envelope of a signed manifest.
type dsse struct {
	PayloadType string          `json:"payloadType"`
	Payload     []byte          `json:"payload"`
	Signatures  json.RawMessage `json:"signatures"`
}

func decodeEnvelope(t testing.TB, env []byte) *manifest.Manifest {
	t.Helper()
	var e dsse
	if err := json.Unmarshal(env, &e); err != nil {
		t.Fatalf("manifest envelope: %v", err)
	}
	m, err := manifest.DecodeManifest(e.Payload)
	if err != nil {
		t.Fatalf("manifest payload: %v", err)
	}
	return m
}

// child is the current process of a serverProc or an agentProc (a new one
// after each restart).
type child struct {
	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{} // closed when cmd has exited
}

// started records cmd, just started, and returns a channel closed when it
// has exited.
func (c *child) started(cmd *exec.Cmd) <-chan struct{} {
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	c.mu.Lock()
	c.cmd, c.done = cmd, done
	c.mu.Unlock()
	return done
}

// take forgets the process and returns it (nil when none runs).
func (c *child) take() (*exec.Cmd, <-chan struct{}) {
	c.mu.Lock()
	defer c.mu.Unlock()
	cmd, done := c.cmd, c.done
	c.cmd = nil
	return cmd, done
}

func (c *child) pid() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cmd == nil {
		return 0
	}
	return c.cmd.Process.Pid
}

// terminate sends SIGTERM to the process and waits for it to exit; after
// 30 s it fails t and kills the process. It returns the process, or nil
// when none ran (idempotent).
func (c *child) terminate(t testing.TB, name string) *exec.Cmd {
	cmd, done := c.take()
	if cmd == nil {
		return nil
	}
	cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Errorf("%s did not stop within 30 s of SIGTERM", name)
		cmd.Process.Kill()
		<-done
	}
	return cmd
}

// kill ends the process with SIGKILL and waits for it (idempotent).
func (c *child) kill() {
	cmd, done := c.take()
	if cmd == nil {
		return
	}
	cmd.Process.Signal(syscall.SIGKILL)
	<-done
}
