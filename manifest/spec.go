package manifest

import (
	"maps"
	"math"
	"slices"
	"time"
)

// Catch-up policies: what a timer does about fire times missed while the host
// was off or the agent was down.
const (
	CatchupOnce = "once" // one run for any number of missed fire times (default)
	CatchupAll  = "all"  // every missed fire time, oldest first, at most MaxCatchup
	CatchupSkip = "skip" // missed fire times are dropped
)

// MaxCatchup caps the runs that catchup: all replays.
const MaxCatchup = 20

// Hardening profiles for the rendered service unit.
const (
	HardeningStrict  = "strict"
	HardeningDefault = "default"
	HardeningNone    = "none"
)

// Defaults applied by Spec.Normalize.
const (
	DefaultTimezone    = "UTC"
	DefaultTimeout     = Duration(time.Hour)
	DefaultInterpreter = "/bin/sh"
	DefaultGrace       = Duration(10 * time.Minute)
)

// Spec is a pipe as an operator writes it (docs/design.md, "Pipe spec"). The field
// names are pinned. Targets is used by the server only and is dropped from the
// spec that goes into a manifest.
type Spec struct {
	Name        string            `json:"name" yaml:"name"`
	Description string            `json:"description,omitempty" yaml:"description,omitempty"`
	Schedule    string            `json:"schedule" yaml:"schedule"`
	Timezone    string            `json:"timezone,omitempty" yaml:"timezone,omitempty"`
	Script      string            `json:"script,omitempty" yaml:"script,omitempty"`
	Interpreter string            `json:"interpreter,omitempty" yaml:"interpreter,omitempty"`
	Command     []string          `json:"command,omitempty" yaml:"command,omitempty"`
	Files       []string          `json:"files,omitempty" yaml:"files,omitempty"`
	Env         map[string]string `json:"env,omitempty" yaml:"env,omitempty"`
	Secrets     []string          `json:"secrets,omitempty" yaml:"secrets,omitempty"`
	RunAs       string            `json:"run_as,omitempty" yaml:"run_as,omitempty"`
	Timeout     Duration          `json:"timeout,omitempty" yaml:"timeout,omitempty"`
	Catchup     string            `json:"catchup,omitempty" yaml:"catchup,omitempty"`
	Jitter      Duration          `json:"jitter,omitempty" yaml:"jitter,omitempty"`
	// Grace is how long after a fire time (plus its jitter) a run must have
	// started before the server records the fire time as missed; zero
	// means DefaultGrace.
	Grace Duration `json:"grace,omitempty" yaml:"grace,omitempty"`
	// MaxDuration is how long a run may go before the server raises
	// run.long (the timeout still kills it); zero: no such event.
	MaxDuration Duration `json:"max_duration,omitempty" yaml:"max_duration,omitempty"`
	Hardening   string   `json:"hardening,omitempty" yaml:"hardening,omitempty"`
	// WritablePaths are the places outside its state directory a job under
	// the default or strict profile may write (e.g. /var/backups).
	WritablePaths []string `json:"writable_paths,omitempty" yaml:"writable_paths,omitempty"`
	Limits        Limits   `json:"limits,omitzero" yaml:"limits,omitempty"`
	// Placement is PlacementAll (every targeted agent; written as "") or
	// PlacementOne (exactly one healthy targeted agent holds it under a
	// lease). Used by the server only, like Targets: it is dropped from the
	// spec that goes into a manifest, whose entry carries the lease instead.
	Placement string `json:"placement,omitempty" yaml:"placement,omitempty"`
	// Retries are the attempts of one run (nil: one attempt).
	Retries *Retries `json:"retries,omitempty" yaml:"retries,omitempty"`
	Targets *Targets `json:"targets,omitempty" yaml:"targets,omitempty"`
	Enabled *bool    `json:"enabled,omitempty" yaml:"enabled,omitempty"`
}

// Placement policies (docs/design.md, "Fleet semantics").
const (
	PlacementAll = "all" // every targeted agent runs the pipe (default)
	PlacementOne = "one" // exactly one healthy targeted agent holds it
)

// Retries are the attempts of one run: after a failed attempt n the runner
// waits Delay × Backoff^(n-1), capped at MaxDelay, and runs the payload
// again, up to Attempts in all. Timeout bounds each attempt; only the final
// attempt's result counts.
type Retries struct {
	Attempts int      `json:"attempts" yaml:"attempts"`
	Delay    Duration `json:"delay,omitempty" yaml:"delay,omitempty"`
	Backoff  float64  `json:"backoff,omitempty" yaml:"backoff,omitempty"`
	MaxDelay Duration `json:"max_delay,omitempty" yaml:"max_delay,omitempty"`
}

// Retry defaults applied by Spec.Normalize when retries are given, and
// their bounds.
const (
	DefaultRetryDelay    = Duration(30 * time.Second)
	DefaultRetryBackoff  = 2.0
	DefaultRetryMaxDelay = Duration(10 * time.Minute)
	MaxAttempts          = 10
	MinRetryDelay        = Duration(time.Second)
	MaxRetryDelay        = Duration(24 * time.Hour)
	MaxRetryBackoff      = 10.0
)

// DelayBefore returns how long the runner waits before attempt n (n ≥ 2):
// Delay × Backoff^(n-2), capped at MaxDelay. Zero fields count as their
// defaults (as Normalize fills them), so an unnormalised policy gives the
// same waits; n < 2 gives 0.
func (r *Retries) DelayBefore(n int) time.Duration {
	if r == nil || n < 2 {
		return 0
	}
	delay, backoff, maxDelay := r.Delay, r.Backoff, r.MaxDelay
	if delay <= 0 {
		delay = DefaultRetryDelay
	}
	if backoff <= 0 || math.IsNaN(backoff) {
		backoff = DefaultRetryBackoff
	}
	if maxDelay <= 0 {
		maxDelay = max(DefaultRetryMaxDelay, delay)
	}
	d := float64(delay)
	for i := 2; i < n && d < float64(maxDelay); i++ {
		d *= backoff
	}
	if d >= float64(maxDelay) {
		return maxDelay.D()
	}
	return time.Duration(d)
}

// RunBudget is the longest one run of the pipe can take inside the runner:
// every attempt running to its timeout plus the delays between them (one
// timeout without retries). The service manager's own limits (the unit's
// TimeoutStartSec=, the cron backend's deadline) add their kill grace to it.
func (s *Spec) RunBudget() time.Duration {
	timeout := s.Timeout.D()
	if timeout <= 0 {
		timeout = DefaultTimeout.D()
	}
	n := s.AttemptsOrOne()
	total := time.Duration(n) * timeout
	for i := 2; i <= n; i++ {
		total += s.Retries.DelayBefore(i)
	}
	return total
}

// AttemptsOrOne is the number of attempts of one run (1 without retries).
func (s *Spec) AttemptsOrOne() int {
	if s.Retries == nil || s.Retries.Attempts < 1 {
		return 1
	}
	return s.Retries.Attempts
}

// PlacementOrDefault is the pipe's placement, PlacementAll when unset.
func (s *Spec) PlacementOrDefault() string {
	if s.Placement == "" {
		return PlacementAll
	}
	return s.Placement
}

// Limits are resource limits for one run. Zero means unlimited.
type Limits struct {
	CPUPercent int `json:"cpu_percent,omitempty" yaml:"cpu_percent,omitempty"`
	MemoryMB   int `json:"memory_mb,omitempty" yaml:"memory_mb,omitempty"`
	Tasks      int `json:"tasks,omitempty" yaml:"tasks,omitempty"`
}

// Targets selects the agents a pipe runs on: every agent listed by id, and every
// agent that carries all of the listed tags.
type Targets struct {
	Tags   map[string]string `json:"tags,omitempty" yaml:"tags,omitempty"`
	Agents []string          `json:"agents,omitempty" yaml:"agents,omitempty"`
}

// GraceOrDefault is the pipe's grace, DefaultGrace when unset.
func (s *Spec) GraceOrDefault() time.Duration {
	if s.Grace == 0 {
		return DefaultGrace.D()
	}
	return s.Grace.D()
}

// IsEnabled reports whether the pipe is enabled (the default).
func (s *Spec) IsEnabled() bool { return s.Enabled == nil || *s.Enabled }

// Normalize fills in every default so that two specs that mean the same thing
// compare and serialise equal. It does not validate.
func (s *Spec) Normalize() {
	if s.Timezone == "" {
		s.Timezone = DefaultTimezone
	}
	if s.Timeout == 0 {
		s.Timeout = DefaultTimeout
	}
	if s.Catchup == "" {
		s.Catchup = CatchupOnce
	}
	if s.Hardening == "" {
		s.Hardening = HardeningDefault
	}
	if s.Script != "" && s.Interpreter == "" {
		s.Interpreter = DefaultInterpreter
	}
	if s.Enabled == nil {
		t := true
		s.Enabled = &t
	}
	if len(s.Env) == 0 {
		s.Env = nil
	}
	s.Secrets = nilIfEmpty(s.Secrets)
	s.WritablePaths = nilIfEmpty(s.WritablePaths)
	if s.Targets != nil && len(s.Targets.Tags) == 0 && len(s.Targets.Agents) == 0 {
		s.Targets = nil
	}
	if s.Placement == PlacementAll {
		s.Placement = "" // the default, written once: "all" and unset compare equal
	}
	if s.Retries != nil {
		switch r := *s.Retries; {
		case r.Attempts == 1 && r.valid():
			s.Retries = nil // one attempt is no retries
		case r.Attempts > 1:
			if r.Delay == 0 {
				r.Delay = DefaultRetryDelay
			}
			if r.Backoff == 0 {
				r.Backoff = DefaultRetryBackoff
			}
			if r.MaxDelay == 0 {
				r.MaxDelay = max(DefaultRetryMaxDelay, r.Delay)
			}
			s.Retries = &r
		}
		// Anything else (attempts below 1, out-of-range fields) is kept as
		// written for Validate to report.
	}
}

// Clone returns a deep copy of s. Empty lists become nil; maps keep
// whether they were nil.
func (s *Spec) Clone() *Spec {
	c := *s
	c.Command = nilIfEmpty(slices.Clone(s.Command))
	c.Files = nilIfEmpty(slices.Clone(s.Files))
	c.Secrets = nilIfEmpty(slices.Clone(s.Secrets))
	c.WritablePaths = nilIfEmpty(slices.Clone(s.WritablePaths))
	c.Env = maps.Clone(s.Env)
	if s.Targets != nil {
		c.Targets = &Targets{Tags: maps.Clone(s.Targets.Tags), Agents: nilIfEmpty(slices.Clone(s.Targets.Agents))}
	}
	if s.Enabled != nil {
		e := *s.Enabled
		c.Enabled = &e
	}
	if s.Retries != nil {
		r := *s.Retries
		c.Retries = &r
	}
	return &c
}

// nilIfEmpty returns nil for an empty list, else the list.
func nilIfEmpty[T any](l []T) []T {
	if len(l) == 0 {
		return nil
	}
	return l
}
