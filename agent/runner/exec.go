package runner

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/drover/drover/manifest"
	agentpb "github.com/drover/drover/proto"
	"golang.org/x/sys/unix"
)

const defaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// secrets reads the values of the pipe's secrets.
func (r *runner) secrets() (map[string]string, error) {
	out := map[string]string{}
	for _, name := range r.spec.Secrets {
		var dirs []string
		for _, k := range []string{"CREDENTIALS_DIRECTORY", "DROVER_SECRETS_DIR"} {
			if d := r.env[k]; d != "" {
				dirs = append(dirs, d)
			}
		}
		if len(dirs) == 0 {
			return nil, fmt.Errorf("secret %s: no CREDENTIALS_DIRECTORY or DROVER_SECRETS_DIR", name)
		}
		var b []byte
		var err error
		for _, d := range dirs {
			if b, err = os.ReadFile(filepath.Join(d, name)); err == nil || !errors.Is(err, fs.ErrNotExist) {
				break
			}
		}
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil, fmt.Errorf("secret %s is not available", name)
			}
			return nil, fmt.Errorf("secret %s: %w", name, err)
		}
		v := string(b)
		v = strings.TrimSuffix(v, "\n")
		v = strings.TrimSuffix(v, "\r")
		out[name] = v
	}
	return out, nil
}

// childEnv builds the payload's environment.
func (r *runner) childEnv(p *plannedRun, secrets map[string]string) []string {
	env := map[string]string{}
	for k, v := range r.env {
		if !strings.HasPrefix(k, "DROVER_") {
			env[k] = v
		}
	}
	if env["PATH"] == "" {
		env["PATH"] = defaultPath
	}
	for k, v := range r.spec.Env {
		env[k] = v
	}
	for k, v := range secrets {
		env[k] = v
	}
	if p.telemetryDir != "" {
		env["DROVER_METRICS"] = filepath.Join(p.telemetryDir, metricsFile)
		env["DROVER_OUTPUT"] = filepath.Join(p.telemetryDir, outputFile)
	}
	env["DROVER_RUN_ID"] = p.runID
	env["DROVER_ATTEMPT"] = strconv.Itoa(max(p.attempt, 1))
	env["DROVER_MAX_ATTEMPTS"] = strconv.Itoa(r.spec.AttemptsOrOne())
	env["DROVER_PIPE"] = r.opts.Pipe
	env["DROVER_TRIGGER"] = p.trigger.Name()
	if !p.scheduledAt.IsZero() {
		env["DROVER_SCHEDULED_AT"] = p.scheduledAt.UTC().Format(time.RFC3339)
	}
	out := make([]string, 0, len(env))
	for k, v := range env {
		out = append(out, k+"="+v)
	}
	sort.Strings(out)
	return out
}

// argv returns the payload's command line and working directory.
func (r *runner) argv(path string) ([]string, string, error) {
	payload := filepath.Join(r.pdir, "payload")
	if len(r.spec.Command) == 0 {
		interp := r.spec.Interpreter
		if interp == "" {
			interp = manifest.DefaultInterpreter
		}
		return []string{interp, filepath.Join(payload, manifest.ScriptFile)}, payload, nil
	}
	args := append([]string(nil), r.spec.Command...)
	c0 := args[0]
	switch {
	case filepath.IsAbs(c0):
	case strings.Contains(c0, "/"):
		args[0] = filepath.Join(payload, c0)
	default:
		if st, err := os.Stat(filepath.Join(payload, c0)); err == nil && st.Mode().IsRegular() {
			args[0] = filepath.Join(payload, c0)
		} else if found := lookPath(c0, path); found != "" {
			args[0] = found
		} else {
			return nil, payload, fmt.Errorf("%s: %w", c0, exec.ErrNotFound)
		}
	}
	return args, payload, nil
}

func lookPath(file, path string) string {
	for _, dir := range filepath.SplitList(path) {
		if dir == "" {
			dir = "."
		}
		p := filepath.Join(dir, file)
		if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0 {
			return p
		}
	}
	return ""
}

// note writes a runner message into the run's log (stream SYSTEM) and to
// the runner's stderr.
func (r *runner) note(c *chunker, format string, args ...any) {
	msg := fmt.Sprintf("drover-agent: "+format+"\n", args...)
	_, _ = r.opts.Stderr.Write([]byte(msg))
	c.in <- piece{stream: agentpb.LogStream_LOG_STREAM_SYSTEM, data: []byte(msg)}
}

// runPayload makes the attempts of one run (one without retries: see
// retries.go) and fills rr with the final attempt's outcome. It returns the
// run's last log chunks, not yet written.
func (r *runner) runPayload(ctx context.Context, p *plannedRun, rr *RunResult) (final []*agentpb.LogChunk) {
	c := newChunker(p.runID, r.opts.ChunkBytes, r.opts.FlushEvery, r.now, func(ch *agentpb.LogChunk) {
		_ = r.record(&agentpb.AgentMessage{Body: &agentpb.AgentMessage_LogChunk{LogChunk: ch}}, false)
	})
	defer func() { rr.LogChunks, final = c.close() }()
	r.attempts(ctx, p, rr, c)
	return nil // set by the deferred close
}

// runAttempt executes the payload once in its own process group and fills
// rr with how that attempt ended.
func (r *runner) runAttempt(ctx context.Context, p *plannedRun, rr *RunResult, c *chunker) {
	fail := func(code int, err error) {
		rr.Status = agentpb.RunStatus_RUN_STATUS_FAILED
		rr.ExitCode = code
		rr.Error = err.Error()
		r.note(c, "%v", err)
	}

	secrets, err := r.secrets()
	if err != nil {
		fail(ExitRunnerFailed, err)
		rr.Reason = "secrets"
		return
	}
	if dir, err := r.newTelemetryDir(); err != nil {
		r.note(c, "no $DROVER_METRICS and $DROVER_OUTPUT for this run: %v", err)
	} else {
		p.telemetryDir = dir
		defer func() {
			t := readTelemetry(dir)
			p.telemetryDir = ""
			rr.Output, rr.Metrics, rr.TelemetryNotes = t.output, t.metrics, t.notes
			for _, n := range t.notes {
				r.note(c, "telemetry: %s", n)
			}
		}()
	}
	env := r.childEnv(p, secrets)
	args, dir, err := r.argv(envMap(env)["PATH"])
	if err != nil {
		fail(ExitNotFound, fmt.Errorf("cannot start the payload: %w", err))
		return
	}
	ooms := oomKills()
	proc, code, err := r.startPayload(args, dir, env, secrets, c)
	if err != nil {
		fail(code, err)
		return
	}
	timeout := r.spec.Timeout.D()
	if timeout <= 0 {
		timeout = manifest.DefaultTimeout.D()
	}
	cause, waitErr := r.waitPayload(ctx, proc, timeout, c)
	rr.Duration = time.Since(proc.start)
	proc.finish()
	settle(ctx, rr, proc.cmd.ProcessState, cause, waitErr, timeout, ooms)
}

// payloadProc is a started payload: its process group and the pumps
// copying its output into the log.
type payloadProc struct {
	cmd        *exec.Cmd
	outR, errR *os.File
	pgid       int
	start      time.Time
	pumps      sync.WaitGroup
	waited     chan error
}

// startPayload starts args in dir with env in a process group of its own,
// its stdout and stderr pumped (secret values masked) into c and the
// runner's own output. On error code is the runner's exit code for it.
func (r *runner) startPayload(args []string, dir string, env []string, secrets map[string]string, c *chunker) (proc *payloadProc, code int, err error) {
	values := make([]string, 0, len(secrets))
	for _, v := range secrets {
		values = append(values, v)
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		return nil, ExitRunnerFailed, err
	}
	errR, errW, err := os.Pipe()
	if err != nil {
		outR.Close()
		outW.Close()
		return nil, ExitRunnerFailed, err
	}
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Dir = dir
	cmd.Env = env
	cmd.Stdout = outW
	cmd.Stderr = errW
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	start := time.Now()
	err = cmd.Start()
	outW.Close()
	errW.Close()
	if err != nil {
		outR.Close()
		errR.Close()
		code := ExitCannotExecute
		if errors.Is(err, fs.ErrNotExist) || errors.Is(err, exec.ErrNotFound) {
			code = ExitNotFound
		}
		return nil, code, fmt.Errorf("cannot start the payload: %w", err)
	}
	proc = &payloadProc{cmd: cmd, outR: outR, errR: errR, pgid: cmd.Process.Pid, start: start, waited: make(chan error, 1)}
	proc.pumps.Add(2)
	go pump(&proc.pumps, outR, agentpb.LogStream_LOG_STREAM_STDOUT, newMasker(values), r.opts.Stdout, c.in)
	go pump(&proc.pumps, errR, agentpb.LogStream_LOG_STREAM_STDERR, newMasker(values), r.opts.Stderr, c.in)
	go func() { proc.waited <- cmd.Wait() }()
	return proc, 0, nil
}

// waitPayload waits for the payload to exit. When the timeout passes or
// ctx is canceled first, it stops the process group (SIGTERM, SIGKILL after
// the kill grace) and returns the cause: TIMED_OUT or CANCELED (else 0).
func (r *runner) waitPayload(ctx context.Context, proc *payloadProc, timeout time.Duration, c *chunker) (cause agentpb.RunStatus, waitErr error) {
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	select {
	case waitErr = <-proc.waited:
		return 0, waitErr
	case <-timer.C:
		cause = agentpb.RunStatus_RUN_STATUS_TIMED_OUT
	case <-ctx.Done():
		cause = agentpb.RunStatus_RUN_STATUS_CANCELED
	}
	what := "timed out after " + timeout.String()
	if cause == agentpb.RunStatus_RUN_STATUS_CANCELED {
		what = "canceled"
	}
	r.note(c, "run %s: stopping its processes (SIGTERM, SIGKILL after %s)", what, r.opts.KillGrace)
	_ = unix.Kill(-proc.pgid, unix.SIGTERM)
	grace := time.NewTimer(r.opts.KillGrace)
	select {
	case waitErr = <-proc.waited:
		grace.Stop()
	case <-grace.C:
		_ = unix.Kill(-proc.pgid, unix.SIGKILL)
		waitErr = <-proc.waited
	}
	return cause, waitErr
}

// finish kills whatever is left of the process group (background children
// go with the run, as systemd does with the rest of a service's cgroup) and
// waits for the pumps to drain the output.
func (proc *payloadProc) finish() {
	_ = unix.Kill(-proc.pgid, unix.SIGKILL)
	pumpsDone := make(chan struct{})
	go func() { proc.pumps.Wait(); close(pumpsDone) }()
	select {
	case <-pumpsDone:
	case <-time.After(2 * time.Second):
		// A process that left the group still holds the pipes open.
		proc.outR.Close()
		proc.errR.Close()
		<-pumpsDone
	}
	proc.outR.Close()
	proc.errR.Close()
}

// settle sets rr's exit code, signal, status and error from how the
// payload ended: its wait status, the runner's cause for stopping it (0,
// TIMED_OUT or CANCELED), and the OOM kills in the cgroup since ooms.
func settle(ctx context.Context, rr *RunResult, ps *os.ProcessState, cause agentpb.RunStatus, waitErr error, timeout time.Duration, ooms int) {
	ws, _ := ps.Sys().(syscall.WaitStatus)
	switch {
	case ws.Signaled():
		rr.Signal = unix.SignalName(ws.Signal())
		rr.ExitCode = 128 + int(ws.Signal())
		if cause == 0 && (ws.Signal() == syscall.SIGTERM || ws.Signal() == syscall.SIGINT) {
			// systemctl stop signals the whole cgroup: the payload may see
			// SIGTERM before the runner does.
			select {
			case <-ctx.Done():
				cause = agentpb.RunStatus_RUN_STATUS_CANCELED
			case <-time.After(500 * time.Millisecond):
			}
		}
	default:
		rr.ExitCode = ws.ExitStatus()
	}
	if cause == agentpb.RunStatus_RUN_STATUS_CANCELED && rr.Duration >= timeout-2*time.Second {
		// The service manager's own timeout (TimeoutStartSec=, the cron
		// backend's timer) stopped the run at about the run's timeout.
		cause = agentpb.RunStatus_RUN_STATUS_TIMED_OUT
	}
	switch {
	case cause != 0:
		rr.Status = cause
	case waitErr == nil && rr.ExitCode == 0:
		rr.Status = agentpb.RunStatus_RUN_STATUS_SUCCEEDED
	default:
		rr.Status = agentpb.RunStatus_RUN_STATUS_FAILED
	}
	if cause == agentpb.RunStatus_RUN_STATUS_TIMED_OUT {
		rr.Error = "timed out after " + timeout.String()
	}
	if rr.Status != agentpb.RunStatus_RUN_STATUS_TIMED_OUT && ooms >= 0 {
		if n := oomKills(); n > ooms {
			// The kernel killed a process of the run for memory (the
			// unit's MemoryMax=, limits.memory_mb). On cgroup v2 systemd
			// then stops the unit (OOMPolicy=stop), which the runner sees
			// as a cancel; on v1 nothing stops it, and a script may even
			// go on and exit 0. Either way the run failed for memory, as
			// systemd's own account says on v2.
			rr.Status, rr.Reason = agentpb.RunStatus_RUN_STATUS_FAILED, "oom-kill"
			rr.Error = "the kernel's OOM killer ended a process of the run (memory limit)"
		}
	}
}

// oomKills returns how many processes the kernel's OOM killer has killed in
// the runner's own cgroup (the service's, under systemd): memory.events'
// oom_kill on cgroup v2, memory.oom_control's on v1; -1 when unknown.
func oomKills() int {
	b, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return -1
	}
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		var file string
		switch {
		case parts[0] == "0" && parts[1] == "":
			file = filepath.Join("/sys/fs/cgroup", parts[2], "memory.events")
		case slices.Contains(strings.Split(parts[1], ","), "memory"):
			if parts[2] == "/" {
				// Not a cgroup of its own (a manager without the memory
				// controller): the root's counter is the whole host's.
				return -1
			}
			file = filepath.Join("/sys/fs/cgroup/memory", parts[2], "memory.oom_control")
		default:
			continue
		}
		data, err := os.ReadFile(file)
		if err != nil {
			continue
		}
		for _, l := range strings.Split(string(data), "\n") {
			if v, ok := strings.CutPrefix(l, "oom_kill "); ok {
				if n, err := strconv.Atoi(strings.TrimSpace(v)); err == nil {
					return n
				}
			}
		}
	}
	return -1
}
