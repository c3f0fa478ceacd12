package apply

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/google/uuid"
	"github.com/robfig/cron/v3"

	"github.com/drover/drover/agent/lease"
	"github.com/drover/drover/agent/runreq"
	"github.com/drover/drover/manifest"
	"github.com/drover/drover/units"
)

// Cron is the fallback backend for hosts without systemd: an in-process
// scheduler (robfig/cron/v3) whose schedules are manifest's evaluator, so
// it fires at the instants systemd would. It runs `<agent> run <name>` as a
// child in its own process group (see the package doc for the environment).
type Cron struct {
	cfg    Config
	sched  *cron.Cron
	output io.Writer

	mu      sync.Mutex
	pipes   map[string]*cronPipe
	state   cronState
	last    *Input
	started bool
	closed  bool
	hostKey []byte
	wg      sync.WaitGroup
	changes notifier
}

type cronPipe struct {
	pipe     manifest.Pipe
	key      string // what the entry was built from; a change re-adds it
	stateKey string // cronKey of the spec: the key of its cron-state.json entry
	enabled  bool
	timeout  time.Duration
	schedule evalSchedule
	entry    cron.EntryID // 0: none
	procs    map[string]*cronProc
	lastExit int
	lastRes  string
	lastFire time.Time
}

type cronProc struct {
	runID string
	cmd   *exec.Cmd
	done  chan struct{}
}

// cronState is D/cron-state.json.
type cronState struct {
	Version int                      `json:"version"`
	Pipes   map[string]cronPipeState `json:"pipes"`
}

type cronPipeState struct {
	Key      string    `json:"key"`
	LastFire time.Time `json:"last_fire"`
}

const cronStateFile = "cron-state.json"

// NewCron returns the cron backend. Scheduling starts with the first Apply,
// which also starts the catch-up runs missed while the agent was down.
func NewCron(cfg Config) (*Cron, error) {
	cfg, err := cfg.defaults(false)
	if err != nil {
		return nil, err
	}
	b := &Cron{
		cfg:     cfg,
		sched:   cron.New(cron.WithLocation(time.UTC)),
		output:  os.Stderr,
		pipes:   map[string]*cronPipe{},
		changes: newNotifier(),
	}
	id, err := os.ReadFile("/etc/machine-id")
	if err != nil {
		h, _ := os.Hostname()
		id = []byte(h)
	}
	b.hostKey = id
	if err := b.loadState(); err != nil {
		cfg.Logger.Warn("cron state unreadable; no catch-up this time", "err", err)
	}
	return b, nil
}

func (b *Cron) Name() string { return "cron" }

// SetOutput sets where the runners' stdout and stderr go (default os.Stderr).
func (b *Cron) SetOutput(w io.Writer) { b.output = w }

// evalSchedule is a cron.Schedule backed by manifest's evaluator.
type evalSchedule struct {
	s      *manifest.Schedule
	loc    *time.Location
	offset time.Duration // fixed per-host jitter
}

// Next returns the first fire instant strictly after t: the evaluator's Next
// shifted by the pipe's fixed jitter offset; for "@every", t plus the
// interval (robfig calls Next when the entry is added and after each fire:
// an interval since activation, then since the last fire, as systemd's
// OnActiveSec=/OnUnitActiveSec=).
func (e evalSchedule) Next(t time.Time) time.Time {
	if every, ok := e.s.Every(); ok {
		return t.Add(every).Truncate(time.Second)
	}
	n := e.s.Next(t.Add(-e.offset), e.loc)
	if n.IsZero() {
		return n
	}
	return n.Add(e.offset)
}

// missed returns the fire instants in (after, upTo], oldest first, at most max
// (the most recent ones).
func (e evalSchedule) missed(after, upTo time.Time, max int) []time.Time {
	if _, ok := e.s.Every(); ok || after.IsZero() {
		return nil
	}
	var out []time.Time
	for t := e.Next(after); !t.IsZero() && !t.After(upTo); t = e.Next(t) {
		out = append(out, t)
		if len(out) > max {
			out = out[1:]
		}
	}
	return out
}

// cronKey is what a pipe's cron entry is built from: a change re-adds it.
func cronKey(spec *manifest.Spec) string {
	return fmt.Sprintf("%s|%s|%s|%v", spec.Schedule, spec.Timezone, spec.Jitter, spec.IsEnabled())
}

// entryKey is what a pipe's entry is built from: the spec's cronKey and,
// for a held pipe, whether its lease is active (an end or a renewal of the
// lease re-plans the entry).
func entryKey(specKey string, p *manifest.Pipe, active bool) string {
	if !p.Held() {
		return specKey
	}
	return fmt.Sprintf("%s|lease %v", specKey, active)
}

// jitterOffset is a stable per-host, per-pipe offset in [0, jitter).
func (b *Cron) jitterOffset(pipe string, jitter time.Duration) time.Duration {
	if jitter <= 0 {
		return 0
	}
	sum := sha256.Sum256(append(append([]byte{}, b.hostKey...), "\x00drover-pipe-"+pipe...))
	v := binary.BigEndian.Uint64(sum[:8])
	return time.Duration(v%uint64(jitter/time.Second)) * time.Second
}

func (b *Cron) loadState() error {
	b.state = cronState{Version: 1, Pipes: map[string]cronPipeState{}}
	data, err := os.ReadFile(filepath.Join(b.cfg.DataDir, cronStateFile))
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		return err
	}
	var st cronState
	if err := json.Unmarshal(data, &st); err != nil {
		return err
	}
	if st.Pipes != nil {
		b.state = st
	}
	return nil
}

// saveStateLocked writes the state file atomically. b.mu must be held.
func (b *Cron) saveStateLocked() error {
	data, err := json.MarshalIndent(b.state, "", "  ")
	if err != nil {
		return err
	}
	if err := ensureDir(b.cfg.DataDir, 0o700); err != nil {
		return err
	}
	return writeFileAtomic(filepath.Join(b.cfg.DataDir, cronStateFile), data, 0o600)
}

// Apply implements Backend.
func (b *Cron) Apply(ctx context.Context, in Input) (*Result, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return nil, errors.New("cron backend closed")
	}
	res, err := b.applyLocked(in)
	if err == nil {
		cp := in
		b.last = &cp
	}
	return res, err
}

// Check implements Backend: restores pipe directories changed by hand.
func (b *Cron) Check(ctx context.Context) ([]Step, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.last == nil || b.closed {
		return nil, nil
	}
	res, err := b.applyLocked(*b.last)
	if err != nil {
		return nil, err
	}
	return res.changes(), nil
}

func (b *Cron) applyLocked(in Input) (*Result, error) {
	t0 := time.Now()
	res := &Result{}
	var prev *manifest.Manifest
	if b.last != nil {
		prev = b.last.Manifest
	}
	preps, err := prepare(in.Manifest, b.cfg.renderOptions(), false, b.cfg.Now(), prev)
	if err != nil {
		return nil, err
	}
	dirs, err := readPipeDirs(b.cfg.DataDir)
	if err != nil {
		return nil, err
	}
	steps := planSteps(preps, State{PipeDirs: dirs}, res)
	failed := materialise(b.cfg.DataDir, preps, steps, in, res)

	now := b.cfg.Now()
	keep := map[string]bool{}
	var sched []Step
	for _, pr := range preps {
		name := pr.pipe.Name
		keep[name] = true
		if pr.desired.Err != nil || failed[name] {
			continue
		}
		step, changed, err := b.schedulePipe(pr.pipe, now, pr.desired.CatchupFrom)
		if err != nil {
			res.fail(name, err)
			continue
		}
		if changed {
			sched = append(sched, step)
		}
	}
	sched = append(sched, b.unscheduleGone(keep)...)
	sort.Slice(sched, func(i, j int) bool { return sched[i].Pipe < sched[j].Pipe })
	res.Steps = append(steps, sched...)
	if err := b.saveStateLocked(); err != nil {
		return res, fmt.Errorf("cron state: %w", err)
	}
	busy := func(name string) bool { p := b.pipes[name]; return p != nil && len(p.procs) > 0 }
	if err := gcPipeDirs(b.cfg.DataDir, keep, busy); err != nil {
		b.cfg.Logger.Warn("clean pipe dirs", "err", err)
	}
	if !b.started {
		b.sched.Start()
		b.started = true
	}
	res.Duration = time.Since(t0)
	return res, nil
}

// schedulePipe (re)schedules pipe when its schedule key changed, or when it
// is enabled but not scheduled yet, and returns the step it took (changed
// false: nothing to do). On the first apply after the agent started, it
// catches up the fire times missed while the agent was down under the same
// schedule; a new, edited or re-enabled pipe counts from now. A held pipe
// (placement: one) is scheduled only while its lease is active; when it
// becomes held here (new, or its lease had ended) with catchupFrom set (the
// last fire time any holder served), the fire times after that one (or
// after the last this host dealt with, if later) are caught up.
func (b *Cron) schedulePipe(pipe manifest.Pipe, now, catchupFrom time.Time) (step Step, changed bool, err error) {
	name := pipe.Name
	spec := pipe.Spec.Clone()
	spec.Normalize()
	specKey := cronKey(spec)
	active := lease.Active(&pipe, now)
	key := entryKey(specKey, &pipe, active)
	p := b.pipes[name]
	existed := p != nil
	if p == nil {
		p = &cronPipe{procs: map[string]*cronProc{}}
		b.pipes[name] = p
	}
	// The runner times out each attempt itself; like systemd's
	// TimeoutStartSec=, this deadline is a backstop for all its attempts.
	wasScheduled, wasEnabled := p.entry != 0, p.enabled
	p.pipe, p.timeout, p.enabled, p.stateKey = pipe, units.StartTimeout(spec), spec.IsEnabled(), specKey
	run := p.enabled && active
	if p.key == key && (p.entry != 0 || !run) {
		return Step{}, false, nil
	}
	s, err := manifest.ParseSchedule(spec.Schedule)
	if err != nil {
		return Step{}, false, err
	}
	loc, err := manifest.LoadLocation(spec.Timezone)
	if err != nil {
		return Step{}, false, err
	}
	es := evalSchedule{s: s, loc: loc, offset: b.jitterOffset(name, spec.Jitter.D())}
	action, reason := ActionUpdate, "schedule changed"
	if p.key == "" {
		action, reason = ActionCreate, "new pipe"
	}
	if p.entry != 0 {
		b.sched.Remove(p.entry)
		p.entry = 0
	}
	p.key, p.schedule = key, es
	saved, had := b.state.Pipes[name]
	sameSchedule := had && saved.Key == specKey
	switch {
	case run:
		p.entry = b.sched.Schedule(es, cron.FuncJob(func() { b.fire(name) }))
		switch {
		case pipe.Held() && !wasScheduled && (!existed || wasEnabled):
			from := catchupFrom
			if (!from.IsZero() || !b.started) && sameSchedule && saved.LastFire.After(from) {
				from = saved.LastFire
			}
			b.catchUp(p, es.missed(from, now, manifest.MaxCatchup), spec.Catchup)
			if existed {
				action, reason = ActionStart, "lease renewed"
			}
		case !b.started && sameSchedule:
			b.catchUp(p, es.missed(saved.LastFire, now, manifest.MaxCatchup), spec.Catchup)
			action, reason = ActionStart, "scheduled (agent started)"
		}
	case p.enabled:
		// The lease ended: the fire times from here on are not this
		// host's; its state keeps the last one it dealt with.
		return Step{Action: ActionStop, Pipe: name, File: "cron:" + name, Reason: ReasonLeaseEnded}, true, nil
	default:
		action, reason = ActionStop, "pipe disabled"
	}
	b.state.Pipes[name] = cronPipeState{Key: specKey, LastFire: now}
	if sameSchedule && saved.LastFire.After(now) {
		b.state.Pipes[name] = saved
	}
	return Step{Action: action, Pipe: name, File: "cron:" + name, Reason: reason}, true, nil
}

// unscheduleGone unschedules and forgets the pipes not in keep, and
// returns their removal steps.
func (b *Cron) unscheduleGone(keep map[string]bool) []Step {
	var steps []Step
	for name, p := range b.pipes {
		if keep[name] {
			continue
		}
		if p.entry != 0 {
			b.sched.Remove(p.entry)
		}
		delete(b.pipes, name)
		delete(b.state.Pipes, name)
		steps = append(steps, Step{Action: ActionRemove, Pipe: name, File: "cron:" + name, Reason: "pipe no longer in the manifest"})
	}
	for name := range b.state.Pipes {
		if !keep[name] {
			delete(b.state.Pipes, name)
		}
	}
	return steps
}

// catchUp starts the runs missed while the agent was down: once (the latest
// missed instant) or all (oldest first, one after the other).
func (b *Cron) catchUp(p *cronPipe, missed []time.Time, policy string) {
	if len(missed) == 0 || policy == manifest.CatchupSkip {
		return
	}
	if policy != manifest.CatchupAll {
		missed = missed[len(missed)-1:]
	}
	name := p.pipe.Name
	b.wg.Add(1)
	go func() {
		defer b.wg.Done()
		for _, at := range missed {
			b.mu.Lock()
			live := b.pipes[name] == p && !b.closed && lease.Active(&p.pipe, b.cfg.Now())
			b.mu.Unlock()
			if !live {
				return // removed, or its lease ended: the rest is the next holder's
			}
			proc, err := b.spawn(name, triggerCatchup, at, "", true)
			if err != nil {
				b.cfg.Logger.Error("catch-up run", "pipe", name, "err", err)
				return
			}
			<-proc.done
		}
	}()
}

// fire is the job of a pipe's entry.
func (b *Cron) fire(name string) {
	now := b.cfg.Now()
	b.mu.Lock()
	p := b.pipes[name]
	if p == nil || !p.enabled || b.closed || lease.Ended(&p.pipe, now) {
		// A held pipe whose lease ended is skipped: the fire time is
		// not this host's (Fence removes the entry; this covers a fire
		// that races it).
		b.mu.Unlock()
		return
	}
	at := p.schedule.prev(now)
	b.state.Pipes[name] = cronPipeState{Key: p.stateKey, LastFire: at}
	if err := b.saveStateLocked(); err != nil {
		b.cfg.Logger.Warn("cron state", "err", err)
	}
	b.mu.Unlock()
	if _, err := b.spawn(name, triggerSchedule, at, "", true); err != nil {
		b.cfg.Logger.Error("start run", "pipe", name, "err", err)
	}
}

// prev returns the latest fire instant not after now (now itself for
// "@every"): the instant a job just started for.
func (e evalSchedule) prev(now time.Time) time.Time {
	if _, ok := e.s.Every(); ok {
		return now.Truncate(time.Second)
	}
	var last time.Time
	for t := e.Next(now.Add(-2 * time.Minute)); !t.IsZero() && !t.After(now); t = e.Next(t) {
		last = t
	}
	if last.IsZero() {
		return now.Truncate(time.Second)
	}
	return last
}

// spawn starts one run of pipe.
// A spawn that fails is recorded for the daemon to settle (a failed run)
// when account is set; RunNow reports its own failure instead.
func (b *Cron) spawn(name, trigger string, scheduled time.Time, requestID string, account ...bool) (*cronProc, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	p := b.pipes[name]
	if p == nil {
		return nil, fmt.Errorf("%w: %q", ErrUnknownPipe, name)
	}
	id, err := uuid.NewV7()
	if err != nil {
		return nil, err
	}
	runID := id.String()
	cmd := exec.Command(b.cfg.AgentPath, append([]string{"run", name}, b.cfg.RunArgs...)...)
	cmd.Env = append(runnerBaseEnv(),
		"DROVER_PIPE_DIR="+PipeDir(b.cfg.DataDir, name),
		"DROVER_SECRETS_DIR="+SecretsDir(b.cfg.DataDir, name),
		"DROVER_TRIGGER="+trigger,
		"DROVER_SCHEDULED_AT="+scheduled.UTC().Format(time.RFC3339),
		"DROVER_RUN_ID="+runID,
		"DROVER_REQUEST_DIR="+runreq.Dir(b.cfg.RuntimeDir),
	)
	if requestID != "" {
		cmd.Env = append(cmd.Env, "DROVER_REQUEST_ID="+requestID)
	}
	cmd.Dir = "/"
	cmd.Stdout, cmd.Stderr = b.output, b.output
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	acct := cronRun{Pipe: name, RunID: runID, Trigger: trigger, RequestID: requestID, StartedAt: b.cfg.Now()}
	if trigger == triggerSchedule || trigger == triggerCatchup {
		acct.ScheduledAt = scheduled
	}
	if err := cmd.Start(); err != nil {
		if len(account) > 0 && account[0] {
			acct.Ended, acct.FinishedAt, acct.ExitCode, acct.Result = true, b.cfg.Now(), -1, "resources"
			acct.Reason = "spawn: " + err.Error()
			b.saveRun(acct)
		}
		return nil, err
	}
	acct.PID = cmd.Process.Pid
	b.saveRun(acct)
	proc := &cronProc{runID: runID, cmd: cmd, done: make(chan struct{})}
	p.procs[runID] = proc
	if !scheduled.IsZero() {
		p.lastFire = scheduled
	}
	b.wg.Add(1)
	go b.reap(p, proc, acct, p.timeout)
	return proc, nil
}

// reap waits for a spawned runner (killing its process group after
// timeout, units.StartTimeout, as systemd's TimeoutStartSec= does), records how it ended in its
// run account, forgets it, and removes its run request.
func (b *Cron) reap(p *cronPipe, proc *cronProc, acct cronRun, timeout time.Duration) {
	defer b.wg.Done()
	cmd := proc.cmd
	var timer *time.Timer
	if timeout > 0 {
		timer = time.AfterFunc(timeout, func() { killGroup(cmd.Process.Pid, proc.done) })
	}
	err := cmd.Wait()
	if timer != nil {
		timer.Stop()
	}
	close(proc.done)
	res, code := waitResult(err)
	acct.Ended, acct.FinishedAt, acct.Result, acct.ExitCode = true, b.cfg.Now(), res, code
	if res == "signal" {
		acct.Signal, acct.ExitCode = signalName(code), -1
	}
	acct.Reason = cronReason(res, code)
	b.saveRun(acct)
	b.mu.Lock()
	delete(p.procs, proc.runID)
	p.lastRes, p.lastExit = res, code
	b.mu.Unlock()
	if acct.RequestID != "" {
		runreq.Remove(runreq.Path(runreq.Dir(b.cfg.RuntimeDir), acct.Pipe), acct.RequestID)
	}
}

// waitResult is how a runner ended, in systemd's words (Result=): success,
// exit-code (code: the exit status), signal (code: the signal) or
// resources (it could not be waited for).
func waitResult(err error) (res string, code int) {
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return "signal", int(ws.Signal())
		}
		return "exit-code", ee.ExitCode()
	case err != nil:
		return "resources", 0
	}
	return "success", 0
}

// killGroup sends SIGTERM to the process group, then SIGKILL after 10 s
// unless done closes first (systemd's default stop behaviour).
func killGroup(pgid int, done <-chan struct{}) {
	_ = syscall.Kill(-pgid, syscall.SIGTERM)
	go func() {
		select {
		case <-done:
			// The leader is gone; members may linger.
			_ = syscall.Kill(-pgid, syscall.SIGKILL)
		case <-time.After(10 * time.Second):
			_ = syscall.Kill(-pgid, syscall.SIGKILL)
		}
	}()
}

// RunNow implements Backend.
func (b *Cron) RunNow(ctx context.Context, pipe, requestID string) error {
	b.mu.Lock()
	p := b.pipes[pipe]
	running := p != nil && len(p.procs) > 0
	b.mu.Unlock()
	if p == nil {
		return fmt.Errorf("%w: %q", ErrUnknownPipe, pipe)
	}
	if running {
		return ErrAlreadyRunning
	}
	if _, err := runreq.Write(runreq.Dir(b.cfg.RuntimeDir), pipe, requestID, b.cfg.Now()); err != nil {
		return err
	}
	_, err := b.spawn(pipe, triggerAPI, b.cfg.Now(), requestID)
	if err != nil {
		runreq.Remove(runreq.Path(runreq.Dir(b.cfg.RuntimeDir), pipe), requestID)
	}
	return err
}

// Cancel implements Backend: SIGTERM to the run's process group, SIGKILL
// after 10 s; it returns when the runner has exited or ctx ends.
func (b *Cron) Cancel(ctx context.Context, pipe, runID string) error {
	b.mu.Lock()
	p := b.pipes[pipe]
	if p == nil {
		b.mu.Unlock()
		return fmt.Errorf("%w: %q", ErrUnknownPipe, pipe)
	}
	var procs []*cronProc
	for id, pr := range p.procs {
		if runID == "" || sameRunID(id, runID) {
			procs = append(procs, pr)
		}
	}
	b.mu.Unlock()
	if len(procs) == 0 {
		return ErrNotRunning
	}
	for _, pr := range procs {
		killGroup(pr.cmd.Process.Pid, pr.done)
	}
	for _, pr := range procs {
		select {
		case <-pr.done:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// Status implements Backend.
func (b *Cron) Status(ctx context.Context) ([]PipeState, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := make([]PipeState, 0, len(b.pipes))
	for name, p := range b.pipes {
		ps := PipeState{Name: name, Enabled: p.enabled, Scheduled: p.entry != 0,
			LastResult: p.lastRes, LastExit: p.lastExit, LastTrigger: p.lastFire}
		if p.entry != 0 {
			ps.Next = b.sched.Entry(p.entry).Next
		}
		for id := range p.procs {
			ps.Running, ps.RunID = true, id
		}
		out = append(out, ps)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// NextFires returns each enabled pipe's next fire time as the evaluator
// gives it after t (what Status shows once the scheduler has run).
func (b *Cron) NextFires(t time.Time) map[string]time.Time {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := map[string]time.Time{}
	for name, p := range b.pipes {
		if p.entry != 0 {
			out[name] = p.schedule.Next(t)
		}
	}
	return out
}

// Close stops scheduling. Runs in progress go on (as under systemd, where
// they do not depend on the agent); Close does not wait for them.
func (b *Cron) Close() error {
	b.mu.Lock()
	b.closed = true
	b.mu.Unlock()
	<-b.sched.Stop().Done()
	return nil
}

// Wait waits for the runs and catch-ups this backend started (tests).
func (b *Cron) Wait() { b.wg.Wait() }

// runnerBaseEnv is the agent's environment without what systemd set for the
// agent's own service: a runner that saw INVOCATION_ID would take the
// agent's invocation for its run id.
func runnerBaseEnv() []string {
	var out []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		switch {
		case k == "INVOCATION_ID", strings.HasPrefix(k, "TRIGGER_"), k == "STATE_DIRECTORY", k == "CREDENTIALS_DIRECTORY":
			continue
		}
		out = append(out, kv)
	}
	return out
}
