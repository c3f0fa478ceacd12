// Package sim is drover-sim: N simulated agents against a real
// drover-server over the real protocol — enrollment with one-time tokens,
// one mTLS gRPC stream per agent with Hello, heartbeats and acknowledged
// durable records, manifest polls with If-None-Match and jitter, SyncNow,
// signature checks, payload fetches, runs with logs — and, at each step of
// N, what a fleet operator asks of the server: RSS and CPU per agent, poll
// latency, how long a change takes to reach every agent, ingest and
// enrollment rates, and every error by kind.
//
// The parent process creates the fleet's pipe, starts worker processes
// (itself, re-executed with the hidden --worker flag) that each hold at
// most --per-worker agents so that no process runs out of open files, and
// aggregates their counts. The admin token reaches workers on their stdin.
package sim

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/drover/drover/internal/tick"
)

// fleetTag is the tag every simulated agent carries (its enrollment token
// sets it); the fleet's pipe targets it.
const fleetTag = "drover-sim"

// WorkerEnv marks a worker process; the parent sets it with --worker.
const WorkerEnv = "DROVER_SIM_WORKER"

// Config is one simulation.
type Config struct {
	Server     string // https://host:port of the HTTPS API
	CAPEM      []byte // the server's CA certificate (PEM)
	AdminToken string // an admin API token (enrollment tokens and the pipe PUTs)
	Steps      []int  // fleet sizes, ascending
	Fleet      string // tag value and pipe name suffix; random when empty
	ServerPID  int    // 0: found by the listening port when the server is local; -1: none

	PerWorker         int
	PerSource         int
	SpreadSources     bool
	EnrollConcurrency int
	AllowRemote       bool
	Agent             AgentParams

	Settle  time.Duration // bound for every agent connected and applied after a step's enrollment
	Warmup  time.Duration // wait after settling, before the window (negative: one poll interval × (1 + jitter))
	Window  time.Duration // idle measurement window per step
	Changes int           // pipe changes per step (0: none)
	// ChangeKind is what a change edits: ChangeScript (the script: a new
	// payload every agent fetches) or ChangeEnv (an env value: the same
	// payload, only the manifest changes).
	ChangeKind    string
	ChangeTimeout time.Duration // bound for a change to reach every agent
	DrainTimeout  time.Duration // bound for outboxes to empty at the end
	MaxDuration   time.Duration // the whole run

	JSON   bool
	Out    io.Writer
	Errout io.Writer
	// WorkerExe is the binary run as a worker; empty: this executable.
	WorkerExe string
}

// What a timed change edits (Config.ChangeKind).
const (
	ChangeScript = "script"
	ChangeEnv    = "env"
)

// DefaultConfig is the command line's defaults.
func DefaultConfig() Config {
	return Config{
		Server: "https://127.0.0.1:8443", Steps: []int{100}, PerWorker: 4000, PerSource: 50, SpreadSources: true,
		EnrollConcurrency: 16,
		Agent: AgentParams{PollInterval: 30 * time.Second, PollJitter: 0.5, Heartbeat: 30 * time.Second,
			LogChunks: 1, LogBytes: 4096, Verify: true, KeepAlive: true, IdleTimeout: 90 * time.Second, Timeout: 30 * time.Second},
		Settle: 5 * time.Minute, Warmup: -1, Window: 30 * time.Second, Changes: 1, ChangeKind: ChangeScript, ChangeTimeout: 2 * time.Minute,
		DrainTimeout: 30 * time.Second, MaxDuration: 2 * time.Hour,
	}
}

// Main is the command line; it returns the exit code: 0 when the run saw
// no error, 1 when it saw errors, 2 for a usage or setup error.
func Main(args []string, stdout, stderr io.Writer) int {
	o := &mainOptions{cfg: DefaultConfig()}
	o.cfg.Out, o.cfg.Errout = stdout, stderr
	fs := o.flagSet(stderr)
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if o.worker || os.Getenv(WorkerEnv) == "1" {
		// Ctrl-C reaches the whole process group: the parent stops the
		// workers in order (outboxes drained), so they ignore it.
		signal.Ignore(os.Interrupt)
		if err := runWorker(os.Stdin, stdout); err != nil {
			fmt.Fprintln(stderr, "drover-sim worker:", err)
			return 1
		}
		return 0
	}
	cfg := o.cfg
	cfg.Agent.Verify = !o.noVerify
	cfg.Agent.KeepAlive = !o.noKeepAlive
	cfg.SpreadSources = !o.noSpread
	var err error
	if cfg.Steps, err = parseSteps(o.steps); err != nil {
		fmt.Fprintln(stderr, "drover-sim: --agents:", err)
		return 2
	}
	if err := o.readCredentials(&cfg); err != nil {
		fmt.Fprintln(stderr, "drover-sim:", err)
		return 2
	}
	ctx, stop := signalContext()
	defer stop()
	rep, err := Run(ctx, cfg)
	if err != nil {
		fmt.Fprintln(stderr, "drover-sim:", err)
		if rep == nil {
			return 2
		}
		return 1
	}
	if rep.ErrorCount() > 0 {
		return 1
	}
	return 0
}

// mainOptions are the command line: the Config and the flags that are not
// Config fields.
type mainOptions struct {
	cfg                               Config
	steps, dataDir, tokenFile, caFile string
	worker, noVerify, noKeepAlive     bool
	noSpread                          bool
}

// flagSet is the command line's flags, writing usage to stderr.
func (o *mainOptions) flagSet(stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("drover-sim", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.cfg.Server, "server", o.cfg.Server, "the server's HTTPS API URL")
	fs.StringVar(&o.steps, "agents", "100", "fleet sizes to measure, comma-separated and ascending (e.g. 1000,5000,10000)")
	fs.StringVar(&o.dataDir, "server-data-dir", "", "a local server's data dir: admin.token and ca.crt are read from it")
	fs.StringVar(&o.tokenFile, "admin-token-file", "", "file holding an admin API token (default <server-data-dir>/admin.token, or $DROVER_SIM_ADMIN_TOKEN)")
	fs.StringVar(&o.caFile, "ca-file", "", "the server's CA certificate (default <server-data-dir>/ca.crt)")
	fs.IntVar(&o.cfg.ServerPID, "server-pid", 0, "the server's pid for RSS and CPU (default: the local process listening on the server's port; -1: none)")
	fs.StringVar(&o.cfg.Fleet, "fleet", "", "fleet name: the agents' "+fleetTag+" tag and the pipe sim-<fleet> (default random)")
	fs.IntVar(&o.cfg.PerWorker, "per-worker", o.cfg.PerWorker, "agents per worker process (each agent holds two sockets)")
	fs.IntVar(&o.cfg.PerSource, "per-source", o.cfg.PerSource, "agents per loopback source address")
	fs.BoolVar(&o.noSpread, "no-spread", false, "do not bind agents to spread loopback source addresses")
	fs.IntVar(&o.cfg.EnrollConcurrency, "enroll-concurrency", o.cfg.EnrollConcurrency, "enrollments in flight per worker")
	fs.DurationVar(&o.cfg.Agent.PollInterval, "poll-interval", o.cfg.Agent.PollInterval, "manifest poll interval per agent")
	fs.Float64Var(&o.cfg.Agent.PollJitter, "poll-jitter", o.cfg.Agent.PollJitter, "poll interval jitter, a fraction (0.5: interval ±50%)")
	fs.DurationVar(&o.cfg.Agent.Heartbeat, "heartbeat", o.cfg.Agent.Heartbeat, "heartbeat interval per agent")
	fs.DurationVar(&o.cfg.Agent.RunEvery, "run-every", 0, "each agent runs a pipe of its manifest this often (0: no runs)")
	fs.IntVar(&o.cfg.Agent.LogChunks, "log-chunks", o.cfg.Agent.LogChunks, "log chunks per run")
	fs.IntVar(&o.cfg.Agent.LogBytes, "log-bytes", o.cfg.Agent.LogBytes, "bytes per log chunk")
	fs.BoolVar(&o.noVerify, "no-verify", false, "do not verify manifest signatures (saves the simulator's CPU)")
	fs.BoolVar(&o.noKeepAlive, "no-keepalive", false, "close the poll connection after each poll (TLS sessions are resumed)")
	fs.DurationVar(&o.cfg.Agent.IdleTimeout, "idle-timeout", o.cfg.Agent.IdleTimeout, "close a kept-alive poll connection after this long idle (below --poll-interval: no idle connection between polls, one reused for a change's fetches)")
	fs.StringVar(&o.cfg.Agent.Probe, "probe", "", "model drover-agent's stream liveness probe (a gRPC health check): "+ProbeSilent+" (after 3 s of silence), "+ProbeUnanswered+" (only while a record is not acknowledged), "+ProbeHeartbeat+" (also after each heartbeat); empty: none")
	fs.DurationVar(&o.cfg.Agent.Timeout, "timeout", o.cfg.Agent.Timeout, "timeout of one request")
	fs.DurationVar(&o.cfg.Settle, "settle", o.cfg.Settle, "bound for every agent connected and applied after a step's enrollment")
	fs.DurationVar(&o.cfg.Warmup, "warmup", o.cfg.Warmup, "wait after a step's agents settled, before the window, so that the polls SyncNow set off at enrollment have spread out (negative: poll interval × (1 + jitter))")
	fs.DurationVar(&o.cfg.Window, "window", o.cfg.Window, "idle measurement window per step")
	fs.IntVar(&o.cfg.Changes, "changes", o.cfg.Changes, "pipe changes timed per step (0: none)")
	fs.StringVar(&o.cfg.ChangeKind, "change-kind", o.cfg.ChangeKind, "what a change edits: script (a new payload for every agent to fetch) or env (the manifest only)")
	fs.DurationVar(&o.cfg.ChangeTimeout, "change-timeout", o.cfg.ChangeTimeout, "bound for a change to reach every agent")
	fs.DurationVar(&o.cfg.DrainTimeout, "drain-timeout", o.cfg.DrainTimeout, "bound for the outboxes to be acknowledged at the end")
	fs.DurationVar(&o.cfg.MaxDuration, "max-duration", o.cfg.MaxDuration, "bound for the whole run")
	fs.BoolVar(&o.cfg.JSON, "json", false, "print one JSON object per step and a final one")
	fs.BoolVar(&o.cfg.AllowRemote, "allow-remote", false, "allow a server that is not on a loopback address")
	fs.BoolVar(&o.worker, "worker", false, "internal: run as a worker process")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: drover-sim [flags]\n\nRuns simulated agents against a real drover-server and reports what the fleet costs it.\n\nFlags:")
		fs.VisitAll(func(f *flag.Flag) {
			if f.Name != "worker" {
				fmt.Fprintf(stderr, "  --%s\t%s (default %q)\n", f.Name, f.Usage, f.DefValue)
			}
		})
	}
	return fs
}

// readCredentials reads the admin token (a file, else
// $DROVER_SIM_ADMIN_TOKEN) and the CA, by default from the server's data
// dir.
func (o *mainOptions) readCredentials(cfg *Config) error {
	tokenFile, caFile := o.tokenFile, o.caFile
	if tokenFile == "" && o.dataDir != "" {
		tokenFile = filepath.Join(o.dataDir, "admin.token")
	}
	if caFile == "" && o.dataDir != "" {
		caFile = filepath.Join(o.dataDir, "ca.crt")
	}
	if tokenFile != "" {
		b, err := os.ReadFile(tokenFile)
		if err != nil {
			return fmt.Errorf("admin token: %w", err)
		}
		cfg.AdminToken = strings.TrimSpace(string(b))
	} else {
		cfg.AdminToken = os.Getenv("DROVER_SIM_ADMIN_TOKEN")
	}
	if caFile != "" {
		var err error
		if cfg.CAPEM, err = os.ReadFile(caFile); err != nil {
			return fmt.Errorf("ca: %w", err)
		}
	}
	return nil
}

func parseSteps(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 || n > 1_000_000 {
			return nil, fmt.Errorf("%q is not a fleet size (1-1000000)", f)
		}
		if len(out) > 0 && n <= out[len(out)-1] {
			return nil, errors.New("sizes must be ascending")
		}
		out = append(out, n)
	}
	if len(out) > 64 {
		return nil, errors.New("at most 64 steps")
	}
	return out, nil
}

func (c *Config) validate() error {
	var errs []string
	bad := func(field, msg string) { errs = append(errs, field+": "+msg) }
	if c.AdminToken == "" {
		bad("admin_token", "required (--admin-token-file, --server-data-dir or $DROVER_SIM_ADMIN_TOKEN)")
	}
	if len(c.CAPEM) == 0 {
		bad("ca", "required (--ca-file or --server-data-dir)")
	}
	if len(c.Steps) == 0 {
		bad("agents", "at least one fleet size")
	}
	if c.PerWorker < 1 || c.PerWorker > 9000 {
		bad("per_worker", "1-9000 (two sockets per agent under the per-process open-files limit)")
	}
	if c.Agent.PollInterval < 100*time.Millisecond || c.Agent.Heartbeat < 100*time.Millisecond {
		bad("poll_interval/heartbeat", "at least 100ms")
	}
	if c.Agent.PollJitter < 0 || c.Agent.PollJitter > 1 {
		bad("poll_jitter", "0-1")
	}
	if c.Agent.LogChunks < 0 || c.Agent.LogChunks > 1000 || c.Agent.LogBytes < 0 || c.Agent.LogBytes > 256<<10 {
		bad("log_chunks/log_bytes", "0-1000 chunks of 0-256 KiB")
	}
	if c.Agent.RunEvery != 0 && c.Agent.RunEvery < 10*time.Millisecond {
		bad("run_every", "0 or at least 10ms")
	}
	if c.Agent.IdleTimeout < 100*time.Millisecond || c.Agent.IdleTimeout > time.Hour {
		bad("idle_timeout", "100ms-1h")
	}
	if p := c.Agent.Probe; p != "" && p != ProbeSilent && p != ProbeUnanswered && p != ProbeHeartbeat {
		bad("probe", "empty, "+ProbeSilent+", "+ProbeUnanswered+" or "+ProbeHeartbeat)
	}
	if c.Changes < 0 || c.Changes > 100 {
		bad("changes", "0-100")
	}
	if c.ChangeKind != ChangeScript && c.ChangeKind != ChangeEnv {
		bad("change_kind", ChangeScript+" or "+ChangeEnv)
	}
	if c.MaxDuration <= 0 || c.Settle <= 0 || c.ChangeTimeout <= 0 || c.Agent.Timeout <= 0 {
		bad("durations", "max_duration, settle, change_timeout and timeout must be positive")
	}
	if len(errs) > 0 {
		return errors.New("invalid configuration: " + strings.Join(errs, "; "))
	}
	return nil
}

// ServerFigures are readings of the server process during a step's window.
type ServerFigures struct {
	PID              int     `json:"pid"`
	RSSBytes         int64   `json:"rss_bytes"`
	RSSPerAgent      int64   `json:"rss_per_agent_bytes"`       // RSS / agents
	RSSDeltaPerAgent int64   `json:"rss_delta_per_agent_bytes"` // (RSS - RSS before the first agent) / agents
	CPUPercent       float64 `json:"cpu_percent_of_one_core"`
	CPUPerAgent      float64 `json:"cpu_percent_per_1000_agents"`
	Threads          int64   `json:"threads"`
	FDs              int64   `json:"fds"`
}

// ChangeFigures time one pipe PUT reaching the fleet.
type ChangeFigures struct {
	Version    uint64  `json:"version"`
	PutMS      float64 `json:"put_ms"`
	SimLag     Latency `json:"simulator_lag"`
	Fetched    Latency `json:"fetched"` // from the PUT's start to the verified manifest with the new version
	Applied    Latency `json:"applied"` // to the server's ack of the agent's ManifestStatus
	NotFetched int64   `json:"not_fetched"`
	NotApplied int64   `json:"not_applied"`
	SyncNows   int64   `json:"sync_nows"`
	// ByStream and ByPoll: agents that first saw the change in a manifest
	// the stream carried, or in a poll's answer.
	ByStream      int64 `json:"by_stream"`
	ByPoll        int64 `json:"by_poll"`
	PayloadsFetch int64 `json:"payload_fetches"`
	Deferred      int64 `json:"payloads_deferred"` // 429 answers waited out
}

// StepReport is what one step measured.
type StepReport struct {
	Agents         int              `json:"agents"`
	Enrolled       int64            `json:"enrolled"`
	Connected      int64            `json:"connected"`
	NewAgents      int64            `json:"new_agents"`
	GrowSeconds    float64          `json:"grow_seconds"`   // tokens created, agents enrolled and started
	EnrollSeconds  float64          `json:"enroll_seconds"` // the enrollment phase alone (tokens made before)
	EnrollRate     float64          `json:"enroll_per_second"`
	Enroll         Latency          `json:"enroll_request"`
	SettleSeconds  float64          `json:"settle_seconds"`
	WindowSeconds  float64          `json:"window_seconds"`
	Server         *ServerFigures   `json:"server,omitempty"`
	PollsPerSec    float64          `json:"polls_per_second"`
	Poll           Latency          `json:"poll"`
	Poll304Share   float64          `json:"poll_304_share"`
	PollResumed    float64          `json:"poll_tls_resumed_share"`
	HeartbeatsSec  float64          `json:"heartbeats_per_second"`
	ProbesSec      float64          `json:"probes_per_second"`
	IngestPerSec   float64          `json:"records_acked_per_second"`
	LogBytesPerSec float64          `json:"log_bytes_acked_per_second"`
	RunsPerSec     float64          `json:"runs_acked_per_second"`
	IngestLag      Latency          `json:"ingest_lag"`
	SimLag         Latency          `json:"simulator_lag"` // the simulator's own scheduling delay in the window
	SimRSSBytes    int64            `json:"simulator_rss_bytes"`
	SimCPUPercent  float64          `json:"simulator_cpu_percent_of_one_core"`
	Changes        []ChangeFigures  `json:"changes,omitempty"`
	Errors         map[string]int64 `json:"errors"` // new in this step
	LoadAvg        string           `json:"loadavg"`
	// StealPercent is the share of the host's CPU time during the step
	// that the hypervisor gave to other guests (-1: unknown): on a shared
	// virtual machine, the figures of a step with much steal are slower
	// for reasons outside the server.
	StealPercent float64 `json:"steal_percent"`
	Workers      int     `json:"workers"`
}

// Report is the whole run.
type Report struct {
	Fleet   string       `json:"fleet"`
	Pipe    string       `json:"pipe"`
	Version uint64       `json:"pipe_version"` // the pipe's last version
	Steps   []StepReport `json:"steps"`
	Final   Counters     `json:"final"`
	// Errors are all errors of the run by kind, including the final drain.
	Errors  map[string]int64 `json:"errors"`
	LoadAvg string           `json:"loadavg"`
}

// ErrorCount is the number of errors of every kind.
func (r *Report) ErrorCount() int64 {
	var n int64
	for _, v := range r.Errors {
		n += v
	}
	return n
}

// workerProc is one worker process as the parent sees it.
type workerProc struct {
	cmd     *exec.Cmd
	stdin   io.WriteCloser
	enc     *json.Encoder
	replies chan reply
	exited  chan struct{}
	target  int // agents it holds
}

func (p *workerProc) send(c command) error {
	if err := p.enc.Encode(c); err != nil {
		return fmt.Errorf("worker %d: %w", p.cmd.Process.Pid, err)
	}
	return nil
}

// await returns the worker's next reply with op, within timeout.
func (p *workerProc) await(ctx context.Context, op string, timeout time.Duration) (reply, error) {
	t := time.NewTimer(timeout)
	defer t.Stop()
	for {
		select {
		case r, ok := <-p.replies:
			if !ok {
				return reply{}, errors.New("a worker exited")
			}
			if r.Op == "error" {
				return r, fmt.Errorf("worker: %s", r.Err)
			}
			if r.Op == op {
				return r, nil
			}
		case <-t.C:
			return reply{}, fmt.Errorf("a worker did not answer %q within %s", op, timeout)
		case <-ctx.Done():
			return reply{}, ctx.Err()
		}
	}
}

type fleet struct {
	cfg     Config
	wcfg    WorkerConfig
	workers []*workerProc
	wg      sync.WaitGroup
	changes uint64 // changes made so far (their ids)
}

func (f *fleet) spawn(ctx context.Context, index int) (*workerProc, error) {
	exe := f.cfg.WorkerExe
	if exe == "" {
		var err error
		if exe, err = os.Executable(); err != nil {
			return nil, fmt.Errorf("worker: %w", err)
		}
	}
	cmd := exec.Command(exe, "--worker")
	cmd.Env = append(os.Environ(), WorkerEnv+"=1")
	cmd.Stderr = f.cfg.Errout
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start worker: %w", err)
	}
	p := &workerProc{cmd: cmd, stdin: stdin, enc: json.NewEncoder(stdin), replies: make(chan reply, 16), exited: make(chan struct{})}
	f.wg.Add(1)
	go func() {
		defer f.wg.Done()
		defer close(p.replies)
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 64<<10), 64<<20)
		for sc.Scan() {
			var r reply
			if json.Unmarshal(sc.Bytes(), &r) == nil {
				p.replies <- r
			}
		}
		_ = cmd.Wait()
		close(p.exited)
	}()
	wc := f.wcfg
	wc.Index, wc.First = index, index*f.cfg.PerWorker
	if err := p.send(command{Op: "init", Init: &wc}); err != nil {
		return nil, err
	}
	if _, err := p.await(ctx, "ready", 30*time.Second); err != nil {
		return nil, err
	}
	return p, nil
}

// stats merges every worker's cumulative statistics.
func (f *fleet) stats(ctx context.Context) (Stats, error) {
	var all Stats
	for _, p := range f.workers {
		if err := p.send(command{Op: "stats"}); err != nil {
			return all, err
		}
	}
	for _, p := range f.workers {
		r, err := p.await(ctx, "stats", 60*time.Second)
		if err != nil {
			return all, err
		}
		all.merge(*r.Stats)
	}
	return all, nil
}

// stop ends every worker: polls and runs stop, outboxes drain, streams close.
func (f *fleet) stop() (Stats, error) {
	var all Stats
	var firstErr error
	for _, p := range f.workers {
		if err := p.send(command{Op: "stop"}); err != nil && firstErr == nil {
			firstErr = err
		}
	}
	for _, p := range f.workers {
		r, err := p.await(context.Background(), "stopped", f.cfg.DrainTimeout+30*time.Second)
		if err != nil {
			if firstErr == nil {
				firstErr = err
			}
			continue
		}
		all.merge(*r.Stats)
	}
	for _, p := range f.workers {
		_ = p.stdin.Close()
		select {
		case <-p.exited:
		case <-time.After(10 * time.Second):
			_ = p.cmd.Process.Kill()
		}
	}
	f.wg.Wait()
	return all, firstErr
}

// Run runs the simulation. The report is returned with an error too when
// part of the run happened.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	if cfg.Out == nil {
		cfg.Out = io.Discard
	}
	if cfg.Errout == nil {
		cfg.Errout = io.Discard
	}
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	u, err := url.Parse(cfg.Server)
	if err != nil || u.Scheme != "https" || u.Host == "" {
		return nil, fmt.Errorf("server: %q is not an https URL", cfg.Server)
	}
	local := checkLoopback(ctx, u.Host) == nil
	if !cfg.AllowRemote && !local {
		return nil, checkLoopback(ctx, u.Host)
	}
	if cfg.Fleet == "" {
		b := make([]byte, 4)
		_, _ = rand.Read(b)
		cfg.Fleet = hex.EncodeToString(b)
	}
	ctx, cancel := context.WithTimeout(ctx, cfg.MaxDuration)
	defer cancel()
	adm, err := newAdmin(strings.TrimSuffix(cfg.Server, "/"), cfg.AdminToken, cfg.CAPEM)
	if err != nil {
		return nil, err
	}
	rep := &Report{Fleet: cfg.Fleet, Pipe: "sim-" + cfg.Fleet, Errors: map[string]int64{}}
	version, err := adm.putPipe(ctx, rep.Pipe, cfg.Fleet, cfg.ChangeKind, 0)
	if err != nil {
		return nil, err
	}
	rep.Version = version

	pid := cfg.ServerPID
	if pid == 0 && local {
		port, _ := strconv.Atoi(u.Port())
		if port == 0 {
			port = 443
		}
		if pid, err = pidListening(port); err != nil {
			fmt.Fprintln(cfg.Errout, "drover-sim: server RSS and CPU not measured:", err)
			pid = -1
		}
	}
	var base procSample
	if pid > 0 {
		if base, err = readProc(pid); err != nil {
			fmt.Fprintln(cfg.Errout, "drover-sim:", err)
			pid = -1
		}
	}

	f := &fleet{cfg: cfg, wcfg: WorkerConfig{Server: strings.TrimSuffix(cfg.Server, "/"), Host: u.Hostname(), CAPEM: cfg.CAPEM,
		AdminToken: cfg.AdminToken, Fleet: cfg.Fleet, SpreadSources: cfg.SpreadSources && local, PerSource: cfg.PerSource,
		EnrollConcurrency: cfg.EnrollConcurrency, AllowRemote: cfg.AllowRemote, Agent: cfg.Agent, DrainTimeout: Duration(cfg.DrainTimeout)}}
	defer func() {
		if f.workers != nil {
			_, _ = f.stop()
		}
	}()
	var prev Stats
	prevErrs := map[string]int64{}
	for _, n := range cfg.Steps {
		st, err := runStep(ctx, cfg, f, adm, rep, n, pid, base, &prev, prevErrs)
		if st != nil {
			rep.Steps = append(rep.Steps, *st)
			printStep(cfg, *st)
		}
		if err != nil {
			return rep, finish(cfg, f, rep, err)
		}
	}
	return rep, finish(cfg, f, rep, nil)
}

// finish stops the workers and completes the report.
func finish(cfg Config, f *fleet, rep *Report, runErr error) error {
	final, err := f.stop()
	f.workers = nil
	rep.Final = final.Counters
	for k, v := range final.Errors {
		rep.Errors[k] = v
	}
	if final.RecordsAcked != final.RecordsSent {
		rep.Errors["records sent but not acknowledged"] = final.RecordsSent - final.RecordsAcked
	}
	rep.LoadAvg = loadAvg()
	printFinal(cfg, rep)
	return errors.Join(runErr, err)
}

func runStep(ctx context.Context, cfg Config, f *fleet, adm *admin, rep *Report, n, pid int, base procSample, prev *Stats, prevErrs map[string]int64) (*StepReport, error) {
	st := &StepReport{Agents: n, StealPercent: -1}
	cpu0, cpuOK := readCPUTimes()
	s, err := growFleet(ctx, cfg, f, st, n, prev)
	if err != nil {
		return nil, err
	}
	if s, err = settleFleet(ctx, cfg, f, st, s); err != nil {
		return nil, err
	}
	w1, err := idleWindow(ctx, cfg, f, st, s, pid, base)
	if err != nil {
		return nil, err
	}

	// Changes: one PUT of the fleet's pipe each, timed from the PUT's start.
	last := w1
	for range cfg.Changes {
		ch, s, err := runChange(ctx, cfg, f, adm, rep, len(rep.Steps)+1)
		if err != nil {
			return st, err
		}
		st.Changes = append(st.Changes, *ch)
		last = s
	}
	st.Enrolled, st.Connected = last.Enrolled, last.Connected
	stepErrors(st, rep, last, n, prevErrs)
	st.LoadAvg = loadAvg()
	if cpu1, ok := readCPUTimes(); ok && cpuOK {
		st.StealPercent = stealPercent(cpu0, cpu1)
	}
	*prev = last
	return st, nil
}

// growFleet grows the fleet to n agents (workers fill up in order, each to
// at most PerWorker agents) and records the enrollment figures; it returns
// the stats after growing.
func growFleet(ctx context.Context, cfg Config, f *fleet, st *StepReport, n int, prev *Stats) (Stats, error) {
	start := time.Now()
	need := (n + cfg.PerWorker - 1) / cfg.PerWorker
	for len(f.workers) < need {
		p, err := f.spawn(ctx, len(f.workers))
		if err != nil {
			return Stats{}, err
		}
		f.workers = append(f.workers, p)
	}
	var growing []*workerProc
	for i, p := range f.workers {
		to := min(cfg.PerWorker, n-i*cfg.PerWorker)
		if to > p.target {
			p.target = to
			if err := p.send(command{Op: "grow", To: to}); err != nil {
				return Stats{}, err
			}
			growing = append(growing, p)
		}
	}
	var from, until int64
	for _, p := range growing {
		r, err := p.await(ctx, "grown", cfg.Settle+time.Duration(n)*time.Second)
		if err != nil {
			return Stats{}, err
		}
		if from == 0 || r.EnrollFrom < from {
			from = r.EnrollFrom
		}
		until = max(until, r.EnrollUntil)
	}
	st.GrowSeconds = time.Since(start).Seconds()
	st.EnrollSeconds = float64(until-from) / 1e9
	st.Workers = len(f.workers)
	s, err := f.stats(ctx)
	if err != nil {
		return Stats{}, err
	}
	st.NewAgents = s.Enrolled - prev.Enrolled
	if st.EnrollSeconds > 0 {
		st.EnrollRate = float64(st.NewAgents) / st.EnrollSeconds
	}
	st.Enroll = s.Enroll.sub(prev.Enroll).summary()
	return s, nil
}

// settleFleet waits until every agent is connected and has its manifest
// applied and acknowledged (at most cfg.Settle), then for the warm-up; it
// returns the stats after.
func settleFleet(ctx context.Context, cfg Config, f *fleet, st *StepReport, s Stats) (Stats, error) {
	settle := time.Now()
	deadline := settle.Add(cfg.Settle)
	for s.Connected < s.Enrolled || s.AgentsApplied < s.Enrolled {
		if time.Now().After(deadline) {
			break
		}
		if err := sleep(ctx, 250*time.Millisecond); err != nil {
			return Stats{}, err
		}
		var err error
		if s, err = f.stats(ctx); err != nil {
			return Stats{}, err
		}
	}
	st.SettleSeconds = time.Since(settle).Seconds()
	warm := cfg.Warmup
	if warm < 0 {
		warm = time.Duration(float64(cfg.Agent.PollInterval) * (1 + cfg.Agent.PollJitter))
	}
	if err := sleep(ctx, warm); err != nil {
		return Stats{}, err
	}
	return f.stats(ctx)
}

// idleWindow measures the fleet and the server over cfg.Window from s, and
// returns the stats at its end.
func idleWindow(ctx context.Context, cfg Config, f *fleet, st *StepReport, w0 Stats, pid int, base procSample) (Stats, error) {
	var p0 procSample
	if pid > 0 {
		p0, _ = readProc(pid)
	}
	if err := sleep(ctx, cfg.Window); err != nil {
		return Stats{}, err
	}
	w1, err := f.stats(ctx)
	if err != nil {
		return Stats{}, err
	}
	secs := cfg.Window.Seconds()
	st.WindowSeconds = secs
	if pid > 0 {
		if p1, err := readProc(pid); err == nil {
			agents := max(w1.Enrolled, 1)
			cpu := cpuPercent(p0, p1)
			st.Server = &ServerFigures{PID: pid, RSSBytes: p1.rssBytes, RSSPerAgent: p1.rssBytes / agents,
				RSSDeltaPerAgent: (p1.rssBytes - base.rssBytes) / agents, CPUPercent: cpu, CPUPerAgent: cpu * 1000 / float64(agents),
				Threads: p1.threads, FDs: p1.fds}
		}
	}
	d := func(a, b int64) float64 { return float64(a-b) / secs }
	st.PollsPerSec = d(w1.Polls, w0.Polls)
	st.Poll = w1.Poll.sub(w0.Poll).summary()
	if polls := w1.Polls200 + w1.Polls304 - w0.Polls200 - w0.Polls304; polls > 0 {
		st.Poll304Share = float64(w1.Polls304-w0.Polls304) / float64(polls)
		st.PollResumed = float64(w1.PollsResumed-w0.PollsResumed) / float64(polls)
	}
	st.HeartbeatsSec = d(w1.Heartbeats, w0.Heartbeats)
	st.ProbesSec = d(w1.Probes, w0.Probes)
	st.IngestPerSec = d(w1.RecordsAcked, w0.RecordsAcked)
	st.LogBytesPerSec = d(w1.LogBytesAcked, w0.LogBytesAcked)
	st.RunsPerSec = d(w1.RunsAcked, w0.RunsAcked)
	st.IngestLag = w1.Ingest.sub(w0.Ingest).summary()
	st.SimLag = w1.Lag.sub(w0.Lag).summary()
	st.SimRSSBytes = w1.SimRSS
	st.SimCPUPercent = float64(w1.SimCPUTicks-w0.SimCPUTicks) / clockTicks / secs * 100
	return w1, nil
}

// stepErrors counts the errors of a step: those the agents met since the
// last step (prevErrs is updated), changes not fetched or applied in time,
// agents not enrolled or not connected. The changes' and agents' counts go
// to the report too.
func stepErrors(st *StepReport, rep *Report, last Stats, n int, prevErrs map[string]int64) {
	st.Errors = map[string]int64{}
	for k, v := range last.Errors {
		if v > prevErrs[k] {
			st.Errors[k] = v - prevErrs[k]
		}
		prevErrs[k] = v
	}
	both := func(kind string, n int64) {
		if n > 0 {
			st.Errors[kind] += n
			rep.Errors[kind] += n
		}
	}
	for _, ch := range st.Changes {
		both("change: not fetched within the timeout", ch.NotFetched)
		both("change: not applied within the timeout", ch.NotApplied)
	}
	both("agents not enrolled", int64(n)-last.Enrolled)
	both("agents not connected after settling", last.Enrolled-last.Connected)
}

func runChange(ctx context.Context, cfg Config, f *fleet, adm *admin, rep *Report, step int) (*ChangeFigures, Stats, error) {
	f.changes++
	target := &changeTarget{ID: f.changes, Pipe: rep.Pipe, MinVersion: rep.Version + 1}
	for _, p := range f.workers {
		if err := p.send(command{Op: "change", Change: target}); err != nil {
			return nil, Stats{}, err
		}
	}
	for _, p := range f.workers {
		if _, err := p.await(ctx, "change", 30*time.Second); err != nil {
			return nil, Stats{}, err
		}
	}
	s0, err := f.stats(ctx)
	if err != nil {
		return nil, Stats{}, err
	}
	t0 := time.Now()
	v, err := adm.putPipe(ctx, rep.Pipe, cfg.Fleet, cfg.ChangeKind, int(f.changes)*1000+step)
	put := time.Since(t0)
	if err != nil {
		return nil, s0, err
	}
	if v < target.MinVersion {
		return nil, s0, fmt.Errorf("put pipe %s: version %d, want at least %d", rep.Pipe, v, target.MinVersion)
	}
	rep.Version = v
	ch := &ChangeFigures{Version: v, PutMS: float64(put.Microseconds()) / 1000}
	deadline := t0.Add(cfg.ChangeTimeout)
	var s Stats
	for {
		if s, err = f.stats(ctx); err != nil {
			return nil, s, err
		}
		if int64(len(s.Applied)) >= s.Enrolled || time.Now().After(deadline) {
			break
		}
		if err := sleep(ctx, 250*time.Millisecond); err != nil {
			return nil, s, err
		}
	}
	rel := func(at []int64) []int64 {
		out := make([]int64, len(at))
		for i, a := range at {
			out[i] = (a - t0.UnixNano()) / 1000
		}
		return out
	}
	ch.Fetched = exactSummary(rel(s.Fetched))
	ch.Applied = exactSummary(rel(s.Applied))
	ch.NotFetched = max(s.Enrolled-int64(len(s.Fetched)), 0)
	ch.NotApplied = max(s.Enrolled-int64(len(s.Applied)), 0)
	ch.SimLag = s.Lag.sub(s0.Lag).summary()
	ch.SyncNows = s.SyncNows - s0.SyncNows
	ch.ByStream = s.ChangesStream - s0.ChangesStream
	ch.ByPoll = s.ChangesPoll - s0.ChangesPoll
	ch.PayloadsFetch = s.Payloads - s0.Payloads
	ch.Deferred = s.PayloadsDeferred - s0.PayloadsDeferred
	return ch, s, nil
}

// sleep waits d; it returns ctx's error when ctx ended first.
func sleep(ctx context.Context, d time.Duration) error {
	if !tick.Sleep(ctx, d) {
		return ctx.Err()
	}
	return nil
}

func kib(b int64) string { return fmt.Sprintf("%.0f KiB", float64(b)/1024) }
func mib(b int64) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }

func lat(l Latency) string {
	if l.Count == 0 {
		return "none"
	}
	return fmt.Sprintf("p50 %s, p99 %s, max %s (n=%d)", ms(l.P50), ms(l.P99), ms(l.Max), l.Count)
}

func ms(v float64) string {
	if v >= 1000 {
		return fmt.Sprintf("%.2f s", v/1000)
	}
	return fmt.Sprintf("%.1f ms", v)
}

func printStep(cfg Config, st StepReport) {
	if cfg.JSON {
		b, _ := json.Marshal(map[string]any{"step": st})
		fmt.Fprintln(cfg.Out, string(b))
		return
	}
	w := cfg.Out
	steal := ""
	if st.StealPercent >= 0 {
		steal = fmt.Sprintf("; %.1f%% of the CPU time stolen by the hypervisor", st.StealPercent)
	}
	fmt.Fprintf(w, "== %d agents (%d enrolled, %d connected; %d worker processes; load %s%s)\n", st.Agents, st.Enrolled, st.Connected, st.Workers, st.LoadAvg, steal)
	fmt.Fprintf(w, "  enrollment  %d new in %.1f s: %.0f/s (tokens made before; %.1f s with them); request %s\n",
		st.NewAgents, st.EnrollSeconds, st.EnrollRate, st.GrowSeconds, lat(st.Enroll))
	if s := st.Server; s != nil {
		fmt.Fprintf(w, "  server      pid %d: RSS %s = %s/agent (%s/agent above the empty server); CPU %.1f%% of one core idle (%.2f%% per 1000 agents); %d threads, %d fds\n",
			s.PID, mib(s.RSSBytes), kib(s.RSSPerAgent), kib(s.RSSDeltaPerAgent), s.CPUPercent, s.CPUPerAgent, s.Threads, s.FDs)
	}
	fmt.Fprintf(w, "  polls       %.1f/s, %.0f%% 304, %.0f%% on resumed TLS sessions: %s\n", st.PollsPerSec, 100*st.Poll304Share, 100*st.PollResumed, lat(st.Poll))
	fmt.Fprintf(w, "  ingest      %.1f records/s acked (%.1f runs/s, %.0f log bytes/s), %.1f heartbeats/s, %.1f probes/s; lag %s\n",
		st.IngestPerSec, st.RunsPerSec, st.LogBytesPerSec, st.HeartbeatsSec, st.ProbesSec, lat(st.IngestLag))
	fmt.Fprintf(w, "  simulator   workers RSS %s, CPU %.1f%% of one core; own timer lag %s\n", mib(st.SimRSSBytes), st.SimCPUPercent, lat(st.SimLag))
	for _, c := range st.Changes {
		fmt.Fprintf(w, "  change      v%d: PUT %s; fetched %s; applied %s; %d SyncNow, %d by stream, %d by poll, %d payload fetches (%d deferred by 429); simulator lag meanwhile p99 %s, max %s\n",
			c.Version, ms(c.PutMS), lat(c.Fetched), lat(c.Applied), c.SyncNows, c.ByStream, c.ByPoll, c.PayloadsFetch, c.Deferred, ms(c.SimLag.P99), ms(c.SimLag.Max))
	}
	fmt.Fprintf(w, "  errors      %s\n", errorList(st.Errors))
}

func errorList(m map[string]int64) string {
	if len(m) == 0 {
		return "none"
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for i, k := range keys {
		if i > 0 {
			b.WriteString("; ")
		}
		fmt.Fprintf(&b, "%d × %s", m[k], k)
	}
	return b.String()
}

func printFinal(cfg Config, rep *Report) {
	if cfg.JSON {
		b, _ := json.Marshal(map[string]any{"final": rep})
		fmt.Fprintln(cfg.Out, string(b))
		return
	}
	c := rep.Final
	fmt.Fprintf(cfg.Out, "== total (fleet %s, pipe %s v%d): %d agents enrolled; %d records sent, %d acked; %d runs acked, %d log chunks; %d polls (%d 304); %d streams opened\n",
		rep.Fleet, rep.Pipe, rep.Version, c.Enrolled, c.RecordsSent, c.RecordsAcked, c.RunsAcked, c.LogChunksAcked, c.Polls, c.Polls304, c.StreamsOpened)
	fmt.Fprintf(cfg.Out, "  errors      %s\n", errorList(rep.Errors))
}
