// Package runner is `drover-agent run <pipe>`: the ExecStart of every pipe's
// systemd service and the body of every cron-backend job. It runs the pipe's
// payload once (or once per missed fire time under catchup: all; each run up
// to retries.attempts times, see retries.go), tees its
// output to its own stdout/stderr (the journal) and into numbered log chunks
// with secret values masked, and records the run in the pipe's spool
// (agent/spool) before anything else, so that the daemon can report it
// later, exactly once, even when it was down while the run happened.
//
// Inputs (docs/design.md, "Paths and names" and "Every run accounted for"):
//
//   - the pipe: $DROVER_PIPE_DIR (or --pipe-dir) holds pipe.json (a
//     manifest.Pipe) and payload/ (the unpacked bundle);
//   - the spool: $STATE_DIRECTORY/spool under systemd (units set
//     StateDirectory=drover-runs/<name>), else --spool-dir, else
//     $DROVER_SPOOL_DIR, else D/runs/<name>/spool when the pipe directory
//     is D/pipes/<name>, else $DROVER_DATA_DIR (default /var/lib/drover)
//     /runs/<name>/spool;
//   - secrets: $CREDENTIALS_DIRECTORY/<NAME> (systemd LoadCredential=), else
//     $DROVER_SECRETS_DIR/<NAME>; one trailing newline is removed;
//   - the trigger: --trigger/--request-id/--scheduled-at when given; else api
//     when a fresh run request (<request dir>/<name>.json, {"request_id":..})
//     exists; else schedule or catchup when a systemd timer started the unit
//     ($TRIGGER_UNIT, $TRIGGER_TIMER_REALTIME_USEC); else manual.
//
// Each run's payload gets $DROVER_METRICS and $DROVER_OUTPUT, two files in a
// private directory of the run inside the spool directory; what the run
// writes there ships with RunFinished, within caps (telemetry.go).
//
// Exit codes of the runner (so that systemd marks a failed run's unit failed):
//
//	0        the run succeeded, or was skipped (overlap, catchup: skip)
//	1-123    the payload's own exit code when it failed
//	124      the run timed out (the process group was killed)
//	125      the runner itself failed (bad flags, unreadable pipe, secrets, spool)
//	126/127  the payload could not be executed / was not found
//	128+n    the payload was killed by signal n
//	canceled the runner re-raises the SIGTERM/SIGINT it got (Main), so systemd
//	         sees a clean stop; Run reports 128+n
//
// With several runs (catchup: all) the code is that of the last run that did
// not succeed, else 0.
//
// Imported by agent/cli (`drover-agent run`), the daemon (agent) and agent/apply
// (which seals the payloads it unpacks: WritePayloadSum, VerifyPayload).
package runner

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/drover/drover/agent/spool"
	"github.com/drover/drover/internal/paths"
	"github.com/drover/drover/manifest"
	agentpb "github.com/drover/drover/proto"
	"github.com/google/uuid"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// Exit codes (see the package documentation).
const (
	ExitTimedOut      = 124
	ExitRunnerFailed  = 125
	ExitCannotExecute = 126
	ExitNotFound      = 127
)

// Defaults.
const (
	DefaultChunkBytes = 16 << 10
	DefaultFlushEvery = 200 * time.Millisecond
	DefaultKillGrace  = 5 * time.Second
	DefaultDataDir    = paths.AgentDataDir
)

const noFollow = syscall.O_NOFOLLOW

// Options configure one invocation. Only Pipe is required; everything else
// falls back to the environment (Env) as described in the package doc.
type Options struct {
	Pipe     string // the pipe's name
	PipeDir  string // holds pipe.json and payload/; default $DROVER_PIPE_DIR
	SpoolDir string // default: see the package doc

	// Trigger forces the trigger ("schedule", "catchup", "manual", "api");
	// the cron backend passes it with ScheduledAt, RunNow with RequestID.
	// Without them the runner reads DROVER_TRIGGER, DROVER_REQUEST_ID,
	// DROVER_SCHEDULED_AT and DROVER_RUN_ID from Env (what the cron backend
	// sets). RunID is the run id when systemd gives none ($INVOCATION_ID).
	Trigger     string
	RequestID   string
	ScheduledAt time.Time
	RunID       string

	// Env is the runner's environment (default os.Environ()). The payload
	// inherits it without DROVER_* variables, plus the pipe's env, secrets,
	// DROVER_RUN_ID, DROVER_PIPE, DROVER_TRIGGER, DROVER_SCHEDULED_AT,
	// DROVER_ATTEMPT (1, 2 ... with retries) and DROVER_MAX_ATTEMPTS.
	Env []string
	// Stdout and Stderr receive the masked output (default os.Stdout/Stderr).
	Stdout, Stderr io.Writer

	RequestDir string        // default: see requestDir
	KillGrace  time.Duration // SIGTERM to SIGKILL on timeout or cancel (default 5 s)
	ChunkBytes int           // log chunk size (default 16 KiB)
	FlushEvery time.Duration // log chunk age (default 200 ms)
	Now        func() time.Time
	// Schedule overrides the pipe's fire-time evaluation (tests).
	Schedule func(after time.Time) time.Time
}

// RunResult is the outcome of one run.
type RunResult struct {
	RunID       string
	Trigger     agentpb.Trigger
	Status      agentpb.RunStatus
	ExitCode    int    // as reported in RunFinished (the payload's, or -1)
	Signal      string // "SIGKILL" when the payload died by a signal
	ScheduledAt time.Time
	RequestID   string
	StartedAt   time.Time
	Duration    time.Duration
	LogChunks   uint64
	Attempts    int // attempts made (retries.attempts); 1 when the payload never ran
	Error       string
	// Reason says why in a word or two when the run did not succeed
	// ("exit 3", "timeout", "canceled", "signal SIGTERM", "payload_mismatch").
	Reason string
	// Output, Metrics and TelemetryNotes are what the run wrote to
	// $DROVER_OUTPUT and $DROVER_METRICS, within the caps, and what was cut.
	Output         string
	Metrics        []*agentpb.MetricSample
	TelemetryNotes []string
}

// Result is the outcome of one invocation.
type Result struct {
	Runs     []RunResult
	ExitCode int // the runner's exit code (see the package doc)
}

type runner struct {
	opts   Options
	env    map[string]string
	now    func() time.Time
	w      *spool.Writer
	dir    string // spool dir
	pipe   *manifest.Pipe
	spec   *manifest.Spec
	pdir   string // the pipe directory, symlinks resolved once at start
	loaded error  // why the pipe could not be loaded

	verified   bool
	payloadErr error
}

// plannedRun is one run the invocation will make.
type plannedRun struct {
	runID       string
	trigger     agentpb.Trigger
	scheduledAt time.Time
	requestID   string
	skip        string // non-empty: record a skipped run with this message
	skipReason  string // its reason, a word or two
	// telemetryDir holds the run's $DROVER_METRICS and $DROVER_OUTPUT
	// while its payload runs.
	telemetryDir string
	attempt      int // the attempt running ($DROVER_ATTEMPT), from 1
}

// Run runs the pipe once (or once per missed fire time) and records every
// run in the spool. Canceling ctx cancels the run (status canceled). The
// error is non-nil only when nothing could be recorded (no spool).
func Run(ctx context.Context, opts Options) (Result, error) {
	r, err := newRunner(opts)
	if err != nil {
		return Result{ExitCode: ExitRunnerFailed}, err
	}
	return r.run(ctx), nil
}

func newRunner(opts Options) (*runner, error) {
	if opts.Env == nil {
		opts.Env = os.Environ()
	}
	if opts.Stdout == nil {
		opts.Stdout = os.Stdout
	}
	if opts.Stderr == nil {
		opts.Stderr = os.Stderr
	}
	if opts.KillGrace <= 0 {
		opts.KillGrace = DefaultKillGrace
	}
	if opts.ChunkBytes <= 0 {
		opts.ChunkBytes = DefaultChunkBytes
	}
	if opts.FlushEvery <= 0 {
		opts.FlushEvery = DefaultFlushEvery
	}
	r := &runner{opts: opts, env: envMap(opts.Env), now: opts.Now}
	if r.now == nil {
		r.now = time.Now
	}
	if r.opts.Trigger == "" {
		r.opts.Trigger = r.env["DROVER_TRIGGER"]
	}
	if r.opts.RequestID == "" {
		r.opts.RequestID = r.env["DROVER_REQUEST_ID"]
	}
	if r.opts.ScheduledAt.IsZero() {
		if t, err := time.Parse(time.RFC3339, r.env["DROVER_SCHEDULED_AT"]); err == nil && t.Year() > 1 {
			r.opts.ScheduledAt = t
		}
	}
	if r.opts.RunID == "" {
		r.opts.RunID = r.env["DROVER_RUN_ID"]
	}
	if !manifest.ValidName(opts.Pipe) {
		return nil, fmt.Errorf("runner: %q is not a valid pipe name", opts.Pipe)
	}
	r.dir = r.spoolDir()
	w, err := spool.NewWriter(r.dir)
	if err != nil {
		return nil, fmt.Errorf("runner: %w", err)
	}
	r.w = w
	r.loaded = r.loadPipe()
	return r, nil
}

func envMap(env []string) map[string]string {
	m := make(map[string]string, len(env))
	for _, kv := range env {
		if k, v, ok := strings.Cut(kv, "="); ok {
			m[k] = v
		}
	}
	return m
}

func (r *runner) spoolDir() string {
	if sd := r.env["STATE_DIRECTORY"]; sd != "" {
		first, _, _ := strings.Cut(sd, ":")
		return filepath.Join(first, "spool")
	}
	if r.opts.SpoolDir != "" {
		return r.opts.SpoolDir
	}
	if d := r.env["DROVER_SPOOL_DIR"]; d != "" {
		return d
	}
	// The agent keeps a pipe in D/pipes/<name>; its spool is D/runs/<name>/spool.
	if pd := filepath.Clean(r.pipeDir()); filepath.Base(pd) == r.opts.Pipe && filepath.Base(filepath.Dir(pd)) == "pipes" {
		return filepath.Join(filepath.Dir(filepath.Dir(pd)), "runs", r.opts.Pipe, "spool")
	}
	data := r.env["DROVER_DATA_DIR"]
	if data == "" {
		data = DefaultDataDir
	}
	return filepath.Join(data, "runs", r.opts.Pipe, "spool")
}

func (r *runner) pipeDir() string {
	if r.opts.PipeDir != "" {
		return r.opts.PipeDir
	}
	return r.env["DROVER_PIPE_DIR"]
}

func (r *runner) loadPipe() error {
	dir := r.pipeDir()
	if dir == "" {
		return errors.New("no pipe directory (--pipe-dir or DROVER_PIPE_DIR)")
	}
	// D/pipes/<name> is a symlink that the agent swaps to a new generation
	// on update: resolve it once so that this run sees one generation.
	if resolved, err := filepath.EvalSymlinks(dir); err == nil {
		dir = resolved
	}
	r.pdir = dir
	b, err := os.ReadFile(filepath.Join(dir, "pipe.json"))
	if err != nil {
		return fmt.Errorf("read pipe: %w", err)
	}
	var p manifest.Pipe
	if err := json.Unmarshal(b, &p); err != nil {
		return fmt.Errorf("read pipe %s: %w", filepath.Join(dir, "pipe.json"), err)
	}
	if p.Name != r.opts.Pipe {
		return fmt.Errorf("%s describes pipe %q, not %q", filepath.Join(dir, "pipe.json"), p.Name, r.opts.Pipe)
	}
	spec := p.Spec.Clone()
	spec.Normalize()
	r.pipe, r.spec = &p, spec
	return nil
}

func (r *runner) debugf(format string, args ...any) {
	fmt.Fprintf(r.opts.Stderr, "drover-agent run: "+format+"\n", args...)
}

func (r *runner) newRunID() string {
	if id, err := uuid.NewV7(); err == nil {
		return id.String()
	}
	return uuid.NewString()
}

func (r *runner) run(ctx context.Context) Result {
	var res Result
	// No overlap: hold an exclusive lock on the spool for the whole invocation.
	lock, locked, lockErr := r.lock()
	if lock != nil {
		defer lock.Close()
	}
	var st state
	if locked {
		st = readState(r.dir)
		r.removeStaleTelemetry()
	}
	plan := r.plan(st, locked)
	if lockErr != nil {
		r.debugf("lock: %v", lockErr)
	}
	for i := range plan {
		p := &plan[i]
		if i > 0 && ctx.Err() != nil {
			break // canceled between catch-up runs
		}
		r.fence(p)
		rr := r.execute(ctx, p)
		res.Runs = append(res.Runs, rr)
		if code := exitCodeOf(rr); code != 0 {
			res.ExitCode = code
		}
		if locked && r.spec != nil && p.skipReason != ReasonLeaseEnded {
			changed := false
			if !p.scheduledAt.IsZero() && (p.trigger == agentpb.Trigger_TRIGGER_SCHEDULE || p.trigger == agentpb.Trigger_TRIGGER_CATCHUP) &&
				p.scheduledAt.After(st.lastFireFor(r.spec)) {
				st.Schedule, st.Timezone, st.LastFire = r.spec.Schedule, r.spec.Timezone, p.scheduledAt.UTC()
				changed = true
			}
			if p.requestID != "" && p.requestID != st.LastRequestID {
				st.LastRequestID = p.requestID
				changed = true
			}
			if changed {
				if err := writeState(r.dir, st); err != nil {
					r.debugf("write state: %v", err)
				}
			}
		}
	}
	return res
}

func exitCodeOf(rr RunResult) int {
	switch rr.Status {
	case agentpb.RunStatus_RUN_STATUS_SUCCEEDED, agentpb.RunStatus_RUN_STATUS_SKIPPED:
		return 0
	case agentpb.RunStatus_RUN_STATUS_TIMED_OUT:
		return ExitTimedOut
	case agentpb.RunStatus_RUN_STATUS_CANCELED:
		return 128 + int(syscall.SIGTERM)
	}
	if rr.Signal != "" {
		if s := unix.SignalNum(rr.Signal); s != 0 {
			return 128 + int(s)
		}
	}
	if rr.ExitCode > 0 && rr.ExitCode < 256 {
		return rr.ExitCode
	}
	return ExitRunnerFailed
}

// lock takes the overlap lock without waiting.
func (r *runner) lock() (*os.File, bool, error) {
	f, err := os.OpenFile(filepath.Join(r.dir, LockFile), os.O_RDWR|os.O_CREATE|noFollow, spool.FileMode)
	if err != nil {
		return nil, false, err
	}
	for {
		err = unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err != unix.EINTR {
			break
		}
	}
	if err != nil {
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, false, nil
		}
		return nil, false, err
	}
	return f, true, nil
}

// plan decides the trigger(s) of this invocation and the runs to make.
func (r *runner) plan(st state, locked bool) []plannedRun {
	p, elapse, fromTimer := r.pickTrigger(st)
	if p.runID == "" {
		p.runID = r.newRunID()
	}
	if !locked {
		p.skip, p.skipReason = "another run of this pipe is still running", "overlap"
		return []plannedRun{p}
	}
	if r.spec == nil || !fromTimer {
		return []plannedRun{p}
	}
	return r.fireRuns(st, p, elapse)
}

// pickTrigger decides what started this run: the flags, else a fresh run
// request (api), else the timer that started the unit (schedule; elapse is
// its elapse), else a person (manual).
func (r *runner) pickTrigger(st state) (p plannedRun, elapse time.Time, fromTimer bool) {
	one := func(t agentpb.Trigger, at time.Time, req string) plannedRun {
		id := r.env["INVOCATION_ID"]
		if id == "" {
			id = r.opts.RunID
		}
		return plannedRun{runID: id, trigger: t, scheduledAt: at, requestID: req}
	}
	switch {
	case r.opts.Trigger != "":
		t, err := agentpb.ParseTrigger(r.opts.Trigger)
		if err != nil {
			t = agentpb.Trigger_TRIGGER_MANUAL
			r.debugf("%v", err)
		}
		p = one(t, r.opts.ScheduledAt, r.opts.RequestID)
		if (t == agentpb.Trigger_TRIGGER_SCHEDULE || t == agentpb.Trigger_TRIGGER_CATCHUP) && r.opts.ScheduledAt.IsZero() {
			elapse, fromTimer = r.now(), true
		}
	case r.opts.RequestID != "":
		p = one(agentpb.Trigger_TRIGGER_API, time.Time{}, r.opts.RequestID)
	default:
		if id := r.takeRequest(st.LastRequestID); id != "" {
			p = one(agentpb.Trigger_TRIGGER_API, time.Time{}, id)
		} else if e, ok := r.timerElapse(); ok {
			p = one(agentpb.Trigger_TRIGGER_SCHEDULE, time.Time{}, "")
			elapse, fromTimer = e, true
		} else {
			p = one(agentpb.Trigger_TRIGGER_MANUAL, time.Time{}, "")
		}
	}
	return p, elapse, fromTimer
}

// fireRuns places a run a timer (or the cron backend) started: which fire
// time it stands for, whether it is on time or a catch-up after downtime,
// whether that fire time already ran, and the earlier missed ones
// catchup: all adds.
func (r *runner) fireRuns(st state, p plannedRun, elapse time.Time) []plannedRun {
	next := r.schedule()
	if next == nil {
		return []plannedRun{p}
	}
	prev := prevFire(next, elapse)
	if prev.IsZero() {
		return []plannedRun{p}
	}
	p.scheduledAt = prev
	late := elapse.Sub(prev) > r.spec.Jitter.D()+time.Minute
	if late || p.trigger == agentpb.Trigger_TRIGGER_CATCHUP {
		p.trigger = agentpb.Trigger_TRIGGER_CATCHUP
	}
	last := r.lastServed(st)
	if !last.IsZero() && !prev.After(last) {
		p.skip, p.skipReason = fmt.Sprintf("fire time %s already ran", prev.UTC().Format(time.RFC3339)), "already ran"
		return []plannedRun{p}
	}
	switch r.spec.Catchup {
	case manifest.CatchupSkip:
		if p.trigger == agentpb.Trigger_TRIGGER_CATCHUP {
			p.skip, p.skipReason = "missed fire time skipped (catchup: skip)", "catchup: skip"
		}
	case manifest.CatchupAll:
		if last.IsZero() {
			break // nothing known about earlier fire times
		}
		missed := missedFires(next, last, prev.Add(-time.Nanosecond), manifest.MaxCatchup-1)
		var runs []plannedRun
		for _, at := range missed {
			runs = append(runs, plannedRun{runID: r.newRunID(), trigger: agentpb.Trigger_TRIGGER_CATCHUP, scheduledAt: at})
		}
		return append(runs, p)
	}
	return []plannedRun{p}
}

// record writes a record to the spool; durable ones are fsync'd with their
// directory before record returns.
func (r *runner) record(msg *agentpb.AgentMessage, durable bool) error {
	var err error
	if durable {
		_, err = r.w.Write(msg)
	} else {
		_, err = r.w.WriteDeferred(msg)
	}
	if err != nil {
		r.debugf("spool: %v", err)
	}
	return err
}

func ts(t time.Time) *timestamppb.Timestamp {
	if t.IsZero() {
		return nil
	}
	return timestamppb.New(t)
}

func (r *runner) pipeVersion() uint64 {
	if r.pipe == nil {
		return 0
	}
	return r.pipe.Version
}

// execute makes one planned run and records it.
func (r *runner) execute(ctx context.Context, p *plannedRun) RunResult {
	rr := RunResult{RunID: p.runID, Trigger: p.trigger, ScheduledAt: p.scheduledAt, RequestID: p.requestID, StartedAt: r.now(), ExitCode: -1}
	started := &agentpb.RunStarted{
		RunId: p.runID, Pipe: r.opts.Pipe, PipeVersion: r.pipeVersion(), Trigger: p.trigger,
		StartedAt: ts(rr.StartedAt), ScheduledAt: ts(p.scheduledAt), RequestId: p.requestID,
		Attempt: 1,
	}
	startMsg := &agentpb.AgentMessage{Body: &agentpb.AgentMessage_RunStarted{RunStarted: started}}
	var spoolErr error
	var final []*agentpb.LogChunk
	var batch []*agentpb.AgentMessage
	switch {
	case p.skip != "":
		rr.Status = agentpb.RunStatus_RUN_STATUS_SKIPPED
		rr.ExitCode = 0
		rr.Error, rr.Reason = p.skip, p.skipReason
		r.debugf("%s: run skipped: %s", r.opts.Pipe, p.skip)
		batch = append(batch, startMsg)
	case r.loaded != nil:
		rr.Status = agentpb.RunStatus_RUN_STATUS_FAILED
		rr.Error, rr.Reason = r.loaded.Error(), "runner: pipe unreadable"
		rr.ExitCode = ExitRunnerFailed
		r.debugf("%v", r.loaded)
		batch = append(batch, startMsg)
	case r.verifyPayload() != nil:
		// Only bytes the manifest names run: not these.
		rr.Status = agentpb.RunStatus_RUN_STATUS_FAILED
		rr.Error, rr.Reason = r.verifyPayload().Error(), ReasonPayloadMismatch
		rr.ExitCode = ExitRunnerFailed
		r.debugf("%s: not run: %s", r.opts.Pipe, rr.Error)
		batch = append(batch, startMsg)
	default:
		// RunStarted is in the spool (data fsync'd, visible to the daemon)
		// before the payload starts; the directory fsync that makes its name
		// durable runs concurrently with the exec, and always completes
		// before RunFinished is written.
		if err := r.record(startMsg, false); err != nil {
			spoolErr = err
		}
		synced := make(chan error, 1)
		go func() { synced <- r.w.Sync() }()
		final = r.runPayload(ctx, p, &rr)
		if err := <-synced; err != nil && spoolErr == nil {
			spoolErr = err
		}
	}
	finished := r.now()
	if rr.Duration == 0 && rr.Status != agentpb.RunStatus_RUN_STATUS_SKIPPED {
		rr.Duration = finished.Sub(rr.StartedAt)
	}
	if spoolErr != nil && rr.Error == "" {
		rr.Error = "spool: " + spoolErr.Error()
	}
	if rr.Reason == "" {
		rr.Reason = runReason(rr)
	}
	fin := &agentpb.RunFinished{
		RunId: p.runID, Pipe: r.opts.Pipe, PipeVersion: r.pipeVersion(), Trigger: p.trigger,
		Status: rr.Status, ExitCode: int32(rr.ExitCode), Signal: rr.Signal,
		StartedAt: ts(rr.StartedAt), FinishedAt: ts(finished), DurationMs: rr.Duration.Milliseconds(),
		Error: rr.Error, LogChunks: rr.LogChunks, ScheduledAt: ts(p.scheduledAt), RequestId: p.requestID,
		Reason: rr.Reason, Attempts: uint32(max(rr.Attempts, 1)), WrittenBy: WrittenByRunner,
		Output: rr.Output, Metrics: rr.Metrics, TelemetryNotes: rr.TelemetryNotes,
	}
	for _, ch := range final {
		batch = append(batch, &agentpb.AgentMessage{Body: &agentpb.AgentMessage_LogChunk{LogChunk: ch}})
	}
	batch = append(batch, &agentpb.AgentMessage{Body: &agentpb.AgentMessage_RunFinished{RunFinished: fin}})
	if _, err := r.w.WriteBatch(batch...); err != nil {
		r.debugf("spool: %v", err)
	}
	return rr
}

// WrittenByRunner is RunFinished.written_by of the records the runner writes.
const WrittenByRunner = "runner"

// verifyPayload checks the payload against the sum recorded when the agent
// unpacked it (once per invocation; catch-up runs share the result).
func (r *runner) verifyPayload() error {
	if !r.verified {
		r.verified = true
		r.payloadErr = VerifyPayload(r.pdir, r.pipe.Payload.Digest)
	}
	return r.payloadErr
}

// runReason is the reason of a finished run that has none yet.
func runReason(rr RunResult) string {
	switch rr.Status {
	case agentpb.RunStatus_RUN_STATUS_SUCCEEDED:
		return ""
	case agentpb.RunStatus_RUN_STATUS_TIMED_OUT:
		return "timeout"
	case agentpb.RunStatus_RUN_STATUS_CANCELED:
		return "canceled"
	}
	switch {
	case rr.Signal != "":
		return "signal " + rr.Signal
	case rr.ExitCode >= 0:
		return fmt.Sprintf("exit %d", rr.ExitCode)
	}
	return "failed"
}
