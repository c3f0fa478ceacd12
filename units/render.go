package units

import (
	"bytes"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/drover/drover/internal/paths"
	"github.com/drover/drover/manifest"
)

// Header is the first line of every rendered file (pinned). The agent only
// ever modifies or removes unit files that carry it.
const Header = "# Managed by drover-agent. Local changes are overwritten."

// Scope selects the systemd instance the units are rendered for.
type Scope string

const (
	ScopeSystem Scope = "system" // /etc/systemd/system, PID 1
	ScopeUser   Scope = "user"   // $XDG_CONFIG_HOME/systemd/user, the user manager
)

// Defaults for Options.
const (
	DefaultAgentPath = paths.AgentBinary
	DefaultDataDir   = paths.AgentDataDir
	// PipeMount is where system-scope services see their pipe's files.
	PipeMount = paths.PipeMount
	// PipeDirEnv names the variable that tells the runner where the pipe's
	// files are.
	PipeDirEnv = "DROVER_PIPE_DIR"
	// StateDirPrefix is the per-pipe StateDirectory= below /var/lib (system)
	// or $XDG_STATE_HOME (user): drover-runs/<name>.
	StateDirPrefix = paths.RunsName
	// TimeoutGrace is added to a pipe's timeout for TimeoutStartSec=: the
	// runner times the job out itself (SIGTERM, SIGKILL 5 s later) and
	// records timed_out before systemd's own limit would stop it.
	TimeoutGrace = 15 * time.Second
)

// StartTimeout is the service's TimeoutStartSec=, a backstop behind the
// runner's own timeout: every attempt running to the pipe's timeout
// (retries.attempts of them) plus the delays between them, with
// TimeoutGrace per attempt for the runner to stop an attempt that timed
// out and record it. Without retries it is timeout + TimeoutGrace. The cron
// backend gives a runner the same deadline.
func StartTimeout(s *manifest.Spec) time.Duration {
	return s.RunBudget() + time.Duration(s.AttemptsOrOne())*TimeoutGrace
}

// Options says how the agent that renders the units is installed.
type Options struct {
	AgentPath string   // ExecStart binary; default DefaultAgentPath
	Scope     Scope    // default ScopeSystem
	DataDir   string   // agent data dir; default DefaultDataDir
	RunArgs   []string // extra args after `run <name>`: absolute paths and --flag[=value] only

	// Now is the time of the render: the timer gets DST correction lines
	// for the changes within CorrectionHorizon of its UTC day (see
	// Corrections). Zero means time.Now(). The agent re-renders on every
	// apply and drift check, so the window moves with it.
	Now time.Time
	// NoCorrections leaves the correction lines out, for comparisons in
	// tests and benchmarks only: systemd alone misses fire times on DST days.
	NoCorrections bool
}

// File is one rendered unit file.
type File struct {
	Name    string
	Content []byte
}

const unitPrefix = "drover-pipe-"

// ServiceName returns "drover-pipe-<name>.service".
func ServiceName(pipe string) string { return unitPrefix + pipe + ".service" }

// TimerName returns "drover-pipe-<name>.timer".
func TimerName(pipe string) string { return unitPrefix + pipe + ".timer" }

// IsManaged reports whether content is a file Drover rendered: its first
// line is exactly Header.
func IsManaged(content []byte) bool {
	line, _, _ := bytes.Cut(content, []byte("\n"))
	return string(line) == Header
}

// withDefaults checks o and fills in its defaults.
func (o Options) withDefaults() (Options, error) {
	if o.AgentPath == "" {
		o.AgentPath = DefaultAgentPath
	}
	if o.DataDir == "" {
		o.DataDir = DefaultDataDir
	}
	if o.Scope == "" {
		o.Scope = ScopeSystem
	}
	if o.Now.IsZero() {
		o.Now = time.Now()
	}
	if o.Scope != ScopeSystem && o.Scope != ScopeUser {
		return o, fmt.Errorf("units: scope %q is not system or user", o.Scope)
	}
	if err := checkPath("agent path", o.AgentPath); err != nil {
		return o, err
	}
	if err := checkPath("data dir", o.DataDir); err != nil {
		return o, err
	}
	if o.DataDir == "/" {
		return o, fmt.Errorf("units: data dir must not be /")
	}
	if len(o.RunArgs) > 32 {
		return o, fmt.Errorf("units: %d run args, at most 32", len(o.RunArgs))
	}
	for i, a := range o.RunArgs {
		if err := checkRunArg(fmt.Sprintf("run args[%d]", i), a); err != nil {
			return o, err
		}
	}
	return o, nil
}

// Render validates spec (a normalized clone of it; spec is not modified) and
// returns its service and timer, in that order. The same spec and options
// always give the same bytes (with Options.Now set; only its UTC day
// matters).
//
// Render does not look at Enabled: whether the timer is enabled and started
// is the agent's decision.
//
// Only these spec fields reach the files: name (validated), description,
// schedule and timezone (through OnCalendar and Corrections), run_as, secret
// names, timeout and retries (through TimeoutStartSec), jitter, catchup,
// hardening and limits. Script, command, files, env and secret values never
// do: the runner reads them from the pipe's directory and the agent's store.
func Render(spec *manifest.Spec, opts Options) ([]File, error) {
	if spec == nil {
		return nil, fmt.Errorf("units: nil spec")
	}
	s := spec.Clone()
	s.Normalize()
	if err := s.Validate(); err != nil {
		return nil, fmt.Errorf("units: pipe %q: %w", spec.Name, err)
	}
	o, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	desc, err := description(s)
	if err != nil {
		return nil, err
	}
	svc, err := serviceSections(s, o, desc)
	if err != nil {
		return nil, err
	}
	tmr, err := timerSections(s, o, desc)
	if err != nil {
		return nil, err
	}
	svcBytes, err := writeUnit(svc)
	if err != nil {
		return nil, err
	}
	tmrBytes, err := writeUnit(tmr)
	if err != nil {
		return nil, err
	}
	return []File{
		{Name: ServiceName(s.Name), Content: svcBytes},
		{Name: TimerName(s.Name), Content: tmrBytes},
	}, nil
}

// section is one [Name] block of a unit file.
type section struct {
	name string
	opts []option
}

// description builds the escaped Description= value shared by both units:
// "Drover pipe <name>: <description>". Space around the description is
// dropped (systemd would drop the trailing part anyway).
func description(s *manifest.Spec) (string, error) {
	text := "Drover pipe " + s.Name
	if d := trimSpace(s.Description); d != "" {
		text += ": " + d
	}
	return literalValue("description", text)
}

func serviceSections(s *manifest.Spec, o Options, desc string) ([]section, error) {
	// No start rate limit: RunNow bursts, catch-up and runs started by hand
	// must not hit systemd's default of 5 starts per 10 s (start-limit-hit);
	// overlapping runs are the runner's business (it records them skipped).
	unit := []option{{"Description", desc}, {"StartLimitIntervalSec", "0"}}
	if o.Scope == ScopeSystem && networkAllowed(s.Hardening) {
		// Catch-up runs start early at boot; jobs that may use the network
		// wait until it is up.
		unit = append(unit,
			option{"Wants", "network-online.target"},
			option{"After", "network-online.target"})
	}

	execStart, err := execLine(append([]string{o.AgentPath, "run", s.Name}, o.RunArgs...))
	if err != nil {
		return nil, err
	}
	ident, err := literalValue("syslog identifier", unitPrefix+s.Name)
	if err != nil {
		return nil, err
	}
	stateDir := StateDirPrefix + "/" + s.Name
	pipeDir := o.DataDir + "/pipes/" + s.Name
	svc := []option{
		{"Type", "oneshot"},
		{"ExecStart", execStart},
		// The runner enforces the pipe's timeout on each attempt itself
		// (and records timed_out); systemd's limit is a backstop after its
		// kill grace, for all the attempts and the delays between them.
		{"TimeoutStartSec", formatSpan(StartTimeout(s))},
		// Cancel and timeout kill the job's whole process tree.
		{"KillMode", "control-group"},
		{"SyslogIdentifier", ident},
		// The runner's durable spool, found through $STATE_DIRECTORY; it
		// works for dynamic users too (systemd chowns it).
		{"StateDirectory", stateDir},
		{"StateDirectoryMode", "0700"},
	}

	scoped, err := scopeOptions(s, o, pipeDir)
	if err != nil {
		return nil, err
	}
	svc = append(svc, scoped...)

	if l := s.Limits; l.CPUPercent > 0 {
		svc = append(svc, option{"CPUQuota", strconv.Itoa(l.CPUPercent) + "%"})
	}
	if l := s.Limits; l.MemoryMB > 0 {
		svc = append(svc, option{"MemoryMax", strconv.Itoa(l.MemoryMB) + "M"})
	}
	if l := s.Limits; l.Tasks > 0 {
		svc = append(svc, option{"TasksMax", strconv.Itoa(l.Tasks)})
	}

	if o.Scope == ScopeSystem && s.Hardening != manifest.HardeningNone {
		paths := slices.Clone(s.WritablePaths)
		slices.Sort(paths)
		for _, p := range paths {
			v, err := literalValue("writable path", p)
			if err != nil {
				return nil, err
			}
			svc = append(svc, option{"ReadWritePaths", v})
		}
	}

	h, err := hardening(s.Hardening, o.Scope, s.RunAs == "root")
	if err != nil {
		return nil, err
	}
	svc = append(svc, h...)
	return []section{{"Unit", unit}, {"Service", svc}}, nil
}

// execLine is the ExecStart= command line of argv, each word escaped.
func execLine(argv []string) (string, error) {
	words := make([]string, len(argv))
	for i, a := range argv {
		w, err := execWord("ExecStart", a, i == 0)
		if err != nil {
			return "", err
		}
		words[i] = w
	}
	return strings.Join(words, " "), nil
}

// scopeOptions are the [Service] options that differ by scope: who the job
// runs as, where it finds its pipe's files and how it gets its secrets.
func scopeOptions(s *manifest.Spec, o Options, pipeDir string) ([]option, error) {
	var opts []option
	if o.Scope == ScopeSystem {
		if s.RunAs != "" {
			u, err := literalValue("run_as", s.RunAs)
			if err != nil {
				return nil, err
			}
			opts = append(opts, option{"User", u})
		} else {
			opts = append(opts, option{"DynamicUser", "yes"})
		}
		// The agent keeps the pipe's files in <DataDir>/pipes/<name>, below
		// a 0700 root directory the job's user cannot enter: bind them
		// read-only at a fixed place instead.
		opts = append(opts, option{"BindReadOnlyPaths", pipeDir + ":" + PipeMount})
		env, err := envAssignment(PipeDirEnv, PipeMount)
		if err != nil {
			return nil, err
		}
		opts = append(opts, option{"Environment", env})
		secrets := slices.Clone(s.Secrets)
		slices.Sort(secrets)
		for _, name := range secrets {
			if !envNameOK(name) {
				return nil, fmt.Errorf("units: secret name %q is not valid", name)
			}
			// A credential, read by PID 1 from the agent's store; the value
			// never appears in a unit file or the environment.
			opts = append(opts, option{"LoadCredential",
				name + ":" + o.DataDir + "/secrets/" + s.Name + "/" + name})
		}
	} else {
		// The user manager runs jobs as its own user, which can read the
		// agent's data directly; it cannot load credentials (the runner
		// reads secrets from the agent's store).
		env, err := envAssignment(PipeDirEnv, pipeDir)
		if err != nil {
			return nil, err
		}
		opts = append(opts, option{"Environment", env})
	}
	return opts, nil
}

func timerSections(s *manifest.Spec, o Options, desc string) ([]section, error) {
	sched, err := manifest.ParseSchedule(s.Schedule)
	if err != nil {
		return nil, fmt.Errorf("units: pipe %q: schedule: %w", s.Name, err)
	}
	var tmr []option
	if every, ok := sched.Every(); ok {
		// An interval since the timer was activated, then since the last
		// run. Persistent= only applies to OnCalendar=, so catchup has no
		// effect here.
		if every <= 0 {
			return nil, fmt.Errorf("units: pipe %q: interval %s is not positive", s.Name, every)
		}
		span := formatSpan(every)
		tmr = append(tmr, option{"OnActiveSec", span}, option{"OnUnitActiveSec", span})
	} else {
		cals, err := OnCalendar(sched, s.Timezone)
		if err == nil && !o.NoCorrections {
			var corr []string
			corr, err = Corrections(sched, s.Timezone, o.Now)
			cals = append(cals, corr...)
		}
		if err != nil {
			return nil, fmt.Errorf("units: pipe %q: schedule %q: %w", s.Name, s.Schedule, err)
		}
		if len(cals) == 0 {
			return nil, fmt.Errorf("units: pipe %q: schedule %q gave no calendar", s.Name, s.Schedule)
		}
		for _, c := range cals {
			v, err := literalValue("calendar", c)
			if err != nil {
				return nil, err
			}
			tmr = append(tmr, option{"OnCalendar", v})
		}
		persistent := "true"
		if s.Catchup == manifest.CatchupSkip {
			persistent = "false"
		}
		tmr = append(tmr, option{"Persistent", persistent})
	}
	tmr = append(tmr, option{"AccuracySec", "1s"})
	if j := s.Jitter.D(); j > 0 {
		// FixedRandomDelay= keeps each host's offset stable across reboots.
		tmr = append(tmr, option{"RandomizedDelaySec", formatSpan(j)}, option{"FixedRandomDelay", "yes"})
	}
	tmr = append(tmr, option{"Unit", ServiceName(s.Name)})
	return []section{
		{"Unit", []option{{"Description", desc}}},
		{"Timer", tmr},
		{"Install", []option{{"WantedBy", "timers.target"}}},
	}, nil
}

// writeUnit serialises sections after the Header and enforces, for every
// line, the invariants escaping is meant to give: one physical line, no
// trailing '\', bounded length. A violation is a bug in this package, and
// refusing to write the file is the safe answer.
func writeUnit(secs []section) ([]byte, error) {
	size := len(Header) + 1
	for _, sec := range secs {
		size += len(sec.name) + 4
		for _, o := range sec.opts {
			size += len(o.Key) + len(o.Value) + 2
		}
	}
	var b bytes.Buffer
	b.Grow(size)
	b.WriteString(Header)
	b.WriteByte('\n')
	for _, sec := range secs {
		b.WriteString("\n[")
		b.WriteString(sec.name)
		b.WriteString("]\n")
		for _, o := range sec.opts {
			if strings.ContainsAny(o.Value, "\n\r\x00") || strings.HasSuffix(o.Value, `\`) {
				return nil, fmt.Errorf("units: internal error: unsafe value for %s=", o.Key)
			}
			if len(o.Key)+1+len(o.Value) > maxLine {
				return nil, fmt.Errorf("units: %s= is longer than %d bytes", o.Key, maxLine)
			}
			b.WriteString(o.Key)
			b.WriteByte('=')
			b.WriteString(o.Value)
			b.WriteByte('\n')
		}
	}
	return b.Bytes(), nil
}
