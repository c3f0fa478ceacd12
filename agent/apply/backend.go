package apply

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/drover/drover/agent/lease"
	"github.com/drover/drover/internal/atomicfile"
	"github.com/drover/drover/internal/paths"
	"github.com/drover/drover/manifest"
	agentpb "github.com/drover/drover/proto"
	"github.com/drover/drover/units"
	"io/fs"
)

// Backend installs pipes on the host and drives their runs. The daemon owns
// one; its methods are safe for concurrent use.
type Backend interface {
	// Name is "systemd" or "cron".
	Name() string
	// Apply makes the host match in.Manifest. A pipe that fails is reported
	// in Result.Errors and left as it was; the others are applied. The error
	// is for failures that stop everything (no unit dir, the manager gone).
	Apply(ctx context.Context, in Input) (*Result, error)
	// Check restores drift against the last applied input (managed units
	// edited or deleted by hand, timers stopped by hand) and returns the
	// steps it took; none before the first Apply.
	Check(ctx context.Context) ([]Step, error)
	// Status returns every installed pipe's schedule and last result.
	Status(ctx context.Context) ([]PipeState, error)
	// RunNow starts a run of pipe with trigger api and requestID.
	RunNow(ctx context.Context, pipe, requestID string) error
	// Cancel stops pipe's active run, killing its whole process tree. With
	// a runID it acts only if that run is the active one.
	Cancel(ctx context.Context, pipe, runID string) error
	Close() error
}

// PayloadFunc returns the bundle bytes of a pipe's payload (verified by the
// caller; Apply checks the digest again).
type PayloadFunc func(p *manifest.Pipe) ([]byte, error)

// Input is what Apply applies.
type Input struct {
	Manifest *manifest.Manifest
	Payloads PayloadFunc
	// Secrets holds secret values by pipe, then by name.
	Secrets map[string]map[string]string
}

// Result reports one Apply.
type Result struct {
	Steps  []Step            // every step of the plan, noop ones included
	Errors map[string]string // pipe -> why it was not (fully) applied
	Drift  []Step            // restore steps: what had been changed by hand
	// Reloads counts daemon-reloads (0 or 1).
	Reloads  int
	Duration time.Duration
}

// Changed reports whether the apply changed the host.
func (r *Result) Changed() bool {
	for _, s := range r.Steps {
		if s.Changes() {
			return true
		}
	}
	return false
}

func (r *Result) fail(pipe string, err error) {
	if r.Errors == nil {
		r.Errors = map[string]string{}
	}
	if old, ok := r.Errors[pipe]; ok {
		r.Errors[pipe] = old + "; " + err.Error()
		return
	}
	r.Errors[pipe] = err.Error()
}

// PipeState is one pipe as the backend sees it.
type PipeState struct {
	Name        string    `json:"name"`
	Enabled     bool      `json:"enabled"`
	Scheduled   bool      `json:"scheduled"`             // the timer or cron entry is active
	Next        time.Time `json:"next,omitzero"`         // next elapse
	LastTrigger time.Time `json:"last_trigger,omitzero"` // last elapse
	Running     bool      `json:"running"`
	RunID       string    `json:"run_id,omitempty"`      // the active run (systemd: invocation id)
	LastResult  string    `json:"last_result,omitempty"` // success, exit-code, signal, timeout, ...
	LastExit    int       `json:"last_exit,omitempty"`
}

// Errors returned by RunNow and Cancel.
var (
	ErrUnknownPipe    = errors.New("no such pipe")
	ErrNotRunning     = errors.New("pipe is not running (or another run is)")
	ErrAlreadyRunning = errors.New("pipe is already running")
)

// Config configures a backend.
type Config struct {
	DataDir   string      // default units.DefaultDataDir
	Scope     units.Scope // default units.ScopeSystem
	AgentPath string      // default units.DefaultAgentPath
	RunArgs   []string    // extra `run` arguments

	// Paths, defaulted from Scope and the environment.
	UnitDir    string // /etc/systemd/system | $XDG_CONFIG_HOME/systemd/user
	RuntimeDir string // /run/drover | $XDG_RUNTIME_DIR/drover (RunNow requests)
	StampDir   string // /var/lib/systemd/timers | $XDG_DATA_HOME/systemd/timers
	// BusAddress is the D-Bus address of the manager; default: the system
	// manager's private socket or bus, or $DBUS_SESSION_BUS_ADDRESS.
	BusAddress string

	Logger *slog.Logger
	Now    func() time.Time // tests
}

func (c Config) withDefaults() (Config, error) { return c.defaults(true) }

// defaults fills c in; manager is false for the cron backend, which talks to
// no service manager and so needs no user session ($XDG_RUNTIME_DIR).
func (c Config) defaults(manager bool) (Config, error) {
	c.DataDir = cmp.Or(c.DataDir, units.DefaultDataDir)
	c.Scope = cmp.Or(c.Scope, units.ScopeSystem)
	c.AgentPath = cmp.Or(c.AgentPath, units.DefaultAgentPath)
	c.Logger = cmp.Or(c.Logger, slog.Default())
	if c.Now == nil {
		c.Now = time.Now
	}
	// xdg is $XDG_<name>_HOME, else def below $HOME.
	home := os.Getenv("HOME")
	xdg := func(name string, def ...string) string {
		return cmp.Or(os.Getenv("XDG_"+name+"_HOME"), filepath.Join(append([]string{home}, def...)...))
	}
	switch c.Scope {
	case units.ScopeSystem:
		c.UnitDir = cmp.Or(c.UnitDir, paths.SystemUnitDir)
		c.RuntimeDir = cmp.Or(c.RuntimeDir, paths.RuntimeDir)
		c.StampDir = cmp.Or(c.StampDir, paths.SystemTimerStampDir)
	case units.ScopeUser:
		if c.UnitDir == "" {
			c.UnitDir = filepath.Join(xdg("CONFIG", ".config"), "systemd", "user")
		}
		if c.RuntimeDir == "" {
			rt := os.Getenv("XDG_RUNTIME_DIR")
			switch {
			case rt != "":
				c.RuntimeDir = filepath.Join(rt, paths.RuntimeName)
			case !manager:
				c.RuntimeDir = filepath.Join(c.DataDir, "run")
			default:
				return c, errors.New("user scope: XDG_RUNTIME_DIR is not set (the user manager's session)")
			}
		}
		if c.StampDir == "" {
			c.StampDir = filepath.Join(xdg("DATA", ".local", "share"), "systemd", "timers")
		}
	default:
		return c, fmt.Errorf("scope %q is not system or user", c.Scope)
	}
	for _, p := range []string{c.DataDir, c.UnitDir, c.RuntimeDir, c.StampDir, c.AgentPath} {
		if !filepath.IsAbs(p) {
			return c, fmt.Errorf("path %q is not absolute", p)
		}
	}
	return c, nil
}

func (c Config) renderOptions() units.Options {
	// Now: the DST correction lines reach 400 days past the render's day;
	// every apply and drift check renders again, so they never run out.
	o := units.Options{AgentPath: c.AgentPath, Scope: c.Scope, DataDir: c.DataDir, RunArgs: c.RunArgs}
	if c.Now != nil {
		o.Now = c.Now()
	}
	return o
}

// prepared is one pipe of an Input, ready to plan.
type prepared struct {
	pipe    manifest.Pipe
	json    []byte
	desired Desired
}

// prepare renders every pipe of m (withUnits: for systemd) and computes its
// generation digest. A pipe that fails has Desired.Err set. Leases are
// judged at now; prev is the manifest applied before (nil: none known),
// which tells a re-enabled pipe (no catch-up) from one that becomes held.
func prepare(m *manifest.Manifest, opts units.Options, withUnits bool, now time.Time, prev *manifest.Manifest) ([]prepared, error) {
	if m == nil {
		return nil, errors.New("apply: nil manifest")
	}
	seen := map[string]bool{}
	out := make([]prepared, 0, len(m.Pipes))
	for i := range m.Pipes {
		p := m.Pipes[i]
		pr := prepared{pipe: p, desired: Desired{Pipe: p.Name}}
		if !manifest.ValidName(p.Name) {
			return nil, fmt.Errorf("apply: pipe name %q is not valid", p.Name)
		}
		if seen[p.Name] {
			return nil, fmt.Errorf("apply: pipe %q appears twice", p.Name)
		}
		seen[p.Name] = true
		spec := p.Spec.Clone()
		spec.Normalize()
		pr.desired.Enabled = spec.IsEnabled()
		if lease.Ended(&p, now) {
			pr.desired.Enabled, pr.desired.LeaseEnded = false, spec.IsEnabled()
		} else if pr.desired.Enabled && !wasDisabled(prev, p.Name) {
			pc := p
			pc.Spec.Catchup = spec.Catchup // normalised: "" is once
			pr.desired.CatchupFrom = lease.CatchupFrom(&pc, now)
		}
		if spec.Name != p.Name {
			pr.desired.Err = fmt.Errorf("spec name %q differs from pipe name", spec.Name)
			out = append(out, pr)
			continue
		}
		if withUnits {
			files, err := units.Render(spec, opts)
			if err != nil {
				pr.desired.Err = err
				out = append(out, pr)
				continue
			}
			for _, f := range files {
				pr.desired.Units = append(pr.desired.Units, UnitFile{Name: f.Name, Data: f.Content})
			}
		} else if err := spec.Validate(); err != nil {
			pr.desired.Err = err
			out = append(out, pr)
			continue
		}
		pj, err := encodePipe(&p)
		if err != nil {
			pr.desired.Err = err
			out = append(out, pr)
			continue
		}
		pr.json = pj
		pr.desired.Digest = pipeDigest(pj, p.Payload.Digest, pr.desired.Units)
		out = append(out, pr)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].pipe.Name < out[j].pipe.Name })
	return out, nil
}

// wasDisabled reports whether prev has pipe name, disabled.
func wasDisabled(prev *manifest.Manifest, name string) bool {
	if prev == nil {
		return false
	}
	for i := range prev.Pipes {
		if prev.Pipes[i].Name == name {
			return !prev.Pipes[i].Spec.IsEnabled()
		}
	}
	return false
}

// parallel runs f(0..n-1) on a few goroutines.
func parallel(n int, f func(i int)) {
	workers := min(n, 4)
	var wg sync.WaitGroup
	next := make(chan int)
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				f(i)
			}
		}()
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
}

// materialise carries out the pipe-directory steps and writes secrets. It
// returns the set of pipes that failed (their unit steps must be skipped).
func materialise(dataDir string, preps []prepared, steps []Step, in Input, res *Result) map[string]bool {
	failed := map[string]bool{}
	fail := func(name string, err error) {
		failed[name] = true
		res.fail(name, err)
	}
	root := filepath.Join(dataDir, pipesDir)
	for _, d := range []struct {
		path string
		perm fs.FileMode
	}{{dataDir, 0o700}, {root, 0o755}} {
		if err := ensureDir(d.path, d.perm); err != nil {
			for _, p := range preps {
				fail(p.pipe.Name, err)
			}
			return failed
		}
	}
	// Fetch payloads in order, build generations on a few goroutines (the
	// work is file system calls), sync once, then make them live.
	builds := generationBuilds(preps, steps, in)
	parallel(len(builds), func(i int) {
		bl := builds[i]
		if bl.err == nil {
			bl.final, bl.err = buildGeneration(dataDir, &bl.pr.pipe, bl.pr.json, bl.bundle, bl.pr.desired.Gen())
			bl.bundle = nil
		}
	})
	if len(builds) > 0 {
		syncErr := syncFS(map[string]bool{root: true})
		for _, bl := range builds {
			err := bl.err
			if err == nil {
				err = syncErr
			}
			if err == nil {
				err = publishGeneration(dataDir, bl.pr.pipe.Name, bl.final)
			}
			if err != nil {
				if bl.final != "" {
					os.RemoveAll(bl.final)
				}
				fail(bl.pr.pipe.Name, fmt.Errorf("pipe directory: %w", err))
			}
		}
		if err := atomicfile.SyncDir(root); err != nil {
			for _, bl := range builds {
				fail(bl.pr.pipe.Name, err)
			}
		}
	}
	keep := map[string]bool{}
	for _, p := range preps {
		keep[p.pipe.Name] = true
		if p.desired.Err != nil || failed[p.pipe.Name] {
			continue
		}
		if err := writeSecrets(dataDir, p.pipe.Name, in.Secrets[p.pipe.Name]); err != nil {
			fail(p.pipe.Name, fmt.Errorf("secrets: %w", err))
		}
	}
	removeSecretsExcept(dataDir, keep)
	return failed
}

// genBuild is a pipe directory generation to build: the pipe, its
// verified bundle, then the directory built (or why not).
type genBuild struct {
	pr     *prepared
	bundle []byte
	final  string
	err    error
}

// generationBuilds are the generations the plan's steps ask for (pipe
// directories to create, update or restore), with their bundles fetched in
// order and checked against the manifest's digest.
func generationBuilds(preps []prepared, steps []Step, in Input) []*genBuild {
	byName := map[string]*prepared{}
	for i := range preps {
		byName[preps[i].pipe.Name] = &preps[i]
	}
	var builds []*genBuild
	for _, s := range steps {
		if s.File != "pipes/"+s.Pipe || !(s.Action == ActionCreate || s.Action == ActionUpdate || s.Action == ActionRestore) {
			continue
		}
		pr := byName[s.Pipe]
		if pr == nil {
			continue
		}
		bl := &genBuild{pr: pr}
		switch {
		case in.Payloads == nil:
			bl.err = errors.New("no payload source")
		default:
			bundle, err := in.Payloads(&pr.pipe)
			switch {
			case err != nil:
				bl.err = fmt.Errorf("payload: %w", err)
			case manifest.Digest(bundle) != pr.pipe.Payload.Digest:
				bl.err = fmt.Errorf("payload digest %s, manifest says %s", manifest.Digest(bundle), pr.pipe.Payload.Digest)
			default:
				bl.bundle = bundle
			}
		}
		builds = append(builds, bl)
	}
	return builds
}

// Ended is the service manager's account of one invocation of a pipe that
// has ended (the backend's side of "every run accounted for"). The daemon
// settles it: when the runner wrote no final record for RunID, the daemon
// writes one from this account.
type Ended struct {
	// Key identifies the invocation for Forget (systemd: InvocationID and
	// the state change time, so that a start-limit-hit, which gets no new
	// InvocationID, is an invocation of its own).
	Key  string
	Pipe string
	// RunID is the run id the runner uses for this invocation (systemd:
	// the InvocationID; cron: the DROVER_RUN_ID it was given), or one
	// derived from Key when nothing could start.
	RunID                 string
	StartedAt, FinishedAt time.Time
	// Result is systemd's Result (success, exit-code, signal, core-dump,
	// oom-kill, timeout, watchdog, start-limit-hit, resources, ...).
	Result   string
	ExitCode int    // the main process's exit status, or -1
	Signal   string // the signal that killed it ("SIGKILL"), if any
	// Reason is the run record's reason when the daemon writes it
	// ("systemd: 203/EXEC", "oom-kill", "signal SIGKILL", ...); "" for a
	// success.
	Reason string
	// Trigger is "api" (RequestID set), "schedule" or "catchup" (agentpb
	// Trigger names; see triggerAPI)
	// (ScheduledAt or TriggeredAt set), or "" when unknown.
	Trigger     string
	RequestID   string
	ScheduledAt time.Time
	TriggeredAt time.Time // when the timer elapsed (systemd)
	// OneAtATime: the pipe's runs never overlap (systemd), so runs of the
	// pipe started during the invocation and never finished died with it.
	OneAtATime bool
}

// Accounter is implemented by backends that report ended invocations. The
// daemon calls Ended at start, when Changes fires and on every status
// pass, settles each invocation, then Forgets it.
type Accounter interface {
	Ended(ctx context.Context) ([]Ended, error)
	Forget(keys ...string)
	// Changes fires (buffered, coalesced) when an invocation may have ended.
	Changes() <-chan struct{}
}

// notifier is a coalescing wake-up channel.
type notifier chan struct{}

func newNotifier() notifier { return make(notifier, 1) }

func (n notifier) notify() {
	select {
	case n <- struct{}{}:
	default:
	}
}

// exitStatusNames are systemd's exit statuses for a service whose process
// could not be set up (systemd.exec(5), "Process Exit Codes").
var exitStatusNames = map[int]string{
	200: "CHDIR", 201: "NICE", 202: "FDS", 203: "EXEC", 204: "MEMORY", 205: "LIMITS",
	206: "OOM_ADJUST", 207: "SIGNAL_MASK", 208: "STDIN", 209: "STDOUT", 210: "CHROOT",
	211: "IOPRIO", 212: "TIMERSLACK", 213: "SECUREBITS", 214: "SETSCHEDULER",
	215: "CPUAFFINITY", 216: "GROUP", 217: "USER", 218: "CAPABILITIES", 219: "CGROUP",
	220: "SETSID", 221: "CONFIRM", 222: "STDERR", 224: "PAM", 225: "NETWORK",
	226: "NAMESPACE", 227: "NO_NEW_PRIVILEGES", 228: "SECCOMP", 229: "SELINUX_CONTEXT",
	230: "PERSONALITY", 231: "APPARMOR_PROFILE", 232: "ADDRESS_FAMILIES",
	233: "RUNTIME_DIRECTORY", 235: "CHOWN", 236: "SMACK_PROCESS_LABEL", 237: "KEYRING",
	238: "STATE_DIRECTORY", 239: "CACHE_DIRECTORY", 240: "LOGS_DIRECTORY",
	241: "CONFIGURATION_DIRECTORY", 242: "NUMA", 243: "CREDENTIALS", 245: "BPF",
}

// SystemdReason is the reason of a service invocation as systemd tells it:
// Result, ExecMainCode (1 exited, 2 killed, 3 dumped) and ExecMainStatus.
func SystemdReason(result string, code, status int) string {
	switch result {
	case "success", "":
		if code == 1 && status != 0 {
			return fmt.Sprintf("exit %d", status)
		}
		return ""
	case "exit-code":
		if n, ok := exitStatusNames[status]; ok {
			return fmt.Sprintf("systemd: %d/%s", status, n)
		}
		return fmt.Sprintf("exit %d", status)
	case "signal", "core-dump":
		name := unix.SignalName(syscall.Signal(status))
		if name == "" {
			name = fmt.Sprintf("signal %d", status)
		} else {
			name = "signal " + name
		}
		if result == "core-dump" {
			name += " (core dumped)"
		}
		return name
	case "oom-kill", "timeout", "watchdog", "start-limit-hit":
		return result
	}
	return "systemd: " + result
}

// The names of the triggers apply starts runs with, as DROVER_TRIGGER and
// the run accounts spell them: agentpb's, one home for the runner and us.
var (
	triggerSchedule = agentpb.Trigger_TRIGGER_SCHEDULE.Name()
	triggerCatchup  = agentpb.Trigger_TRIGGER_CATCHUP.Name()
	triggerAPI      = agentpb.Trigger_TRIGGER_API.Name()
)

// planSteps plans the prepared pipes against the host's units and records
// in res the steps, the pipes that cannot be applied and the drift found.
func planSteps(preps []prepared, cur State, res *Result) []Step {
	desired := make([]Desired, len(preps))
	for i, p := range preps {
		desired[i] = p.desired
	}
	steps := Plan(desired, cur)
	res.Steps = steps
	for _, s := range steps {
		switch s.Action {
		case ActionError, ActionConflict:
			res.fail(s.Pipe, errors.New(s.String()))
		case ActionRestore:
			res.Drift = append(res.Drift, s)
		}
	}
	return steps
}

// changes are the steps of r that changed something (what Check reports).
func (r *Result) changes() []Step {
	var out []Step
	for _, s := range r.Steps {
		if s.Changes() {
			out = append(out, s)
		}
	}
	return out
}
