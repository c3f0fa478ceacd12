package manifest

import (
	"fmt"
	"math"
	"path"
	"regexp"
	"sort"
	"strings"
	"sync"
	"time"
	"unicode"
	"unicode/utf8"
)

// Limits on what a spec may hold. They keep manifests, units and the runner's
// environment bounded whatever an operator (or an attacker with a token) sends.
const (
	MaxDescriptionLen = 256
	MaxScriptBytes    = 1 << 20
	MaxCommandArgs    = 256
	MaxArgBytes       = 4096
	MaxFiles          = 256
	MaxEnv            = 128
	MaxEnvValueBytes  = 32 << 10
	MaxSecrets        = 64
	MaxTimeout        = Duration(7 * 24 * time.Hour)
	MinTimeout        = Duration(time.Second)
	MaxJitter         = Duration(24 * time.Hour)
	MinGrace          = Duration(time.Minute)
	MaxGrace          = Duration(24 * time.Hour)
	MaxCPUPercent     = 100 * 1024
	MaxMemoryMB       = 1 << 20
	MaxTasks          = 1 << 22
	MaxTags           = 64
	MaxTargetAgents   = 10000
	MaxWritablePaths  = 32
)

var (
	nameRE    = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,62}$`)
	envKeyRE  = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,127}$`)
	userRE    = regexp.MustCompile(`^[a-z_][a-z0-9_-]{0,30}$`)
	tagKeyRE  = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._/-]{0,62}$`)
	tagValRE  = regexp.MustCompile(`^[A-Za-z0-9._-]{0,63}$`)
	agentIDRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`)
	digestRE  = regexp.MustCompile(`^sha256:[0-9a-f]{64}$`)
)

// ValidName reports whether s is a valid pipe name.
func ValidName(s string) bool { return nameRE.MatchString(s) }

// ValidTagKey and ValidTagValue report whether s may be used as an agent tag.
func ValidTagKey(s string) bool   { return tagKeyRE.MatchString(s) }
func ValidTagValue(s string) bool { return tagValRE.MatchString(s) }

// ValidAgentID reports whether s is shaped like an agent id.
func ValidAgentID(s string) bool { return agentIDRE.MatchString(s) }

// ValidDigest reports whether s is a "sha256:<64 lowercase hex>" digest.
func ValidDigest(s string) bool { return digestRE.MatchString(s) }

// Validate checks every field of s and returns all problems at once as a
// *ValidationError. Empty optional fields are fine: Normalize fills them.
func (s *Spec) Validate() error {
	var p problems
	s.validate(&p, "")
	return p.err()
}

// specProblems adds problems about one spec, under its path.
type specProblems struct {
	p  *problems
	at string
}

func (c specProblems) add(field, format string, args ...any) {
	c.p.add(join(c.at, field), format, args...)
}

// addAt is add for an indexed field: field is a format such as "files[%d]".
func (c specProblems) addAt(field string, i int, format string, args ...any) {
	c.add(fmt.Sprintf(field, i), format, args...)
}

// validate checks the spec's fields in the order of the spec format, one
// group at a time, adding every problem under at.
func (s *Spec) validate(p *problems, at string) {
	c := specProblems{p, at}
	s.checkName(c)
	s.checkSchedule(c)
	s.checkProgram(c)
	s.checkEnv(c)
	s.checkSecrets(c)
	s.checkSandbox(c)
	s.Targets.check(c)
}

// checkName checks name and description.
func (s *Spec) checkName(c specProblems) {
	switch {
	case s.Name == "":
		c.add("name", "required")
	case !nameRE.MatchString(s.Name):
		c.add("name", "%s is not a valid name: use 1-63 lowercase letters, digits and '-', starting with a letter or digit", quote(s.Name))
	}
	if n := utf8.RuneCountInString(s.Description); n > MaxDescriptionLen {
		c.add("description", "%d characters, at most %d", n, MaxDescriptionLen)
	}
	if hasControl(s.Description, false) {
		c.add("description", "must be one line without control characters")
	}
	if !utf8.ValidString(s.Description) {
		c.add("description", "not valid UTF-8")
	}
}

// checkSchedule checks schedule and timezone.
func (s *Spec) checkSchedule(c specProblems) {
	if strings.TrimSpace(s.Schedule) == "" {
		c.add("schedule", "required")
	} else if _, err := ParseSchedule(s.Schedule); err != nil {
		c.add("schedule", "%s", err.Error())
	}
	if s.Timezone != "" {
		if err := checkTimezone(s.Timezone); err != nil {
			c.add("timezone", "%s", err.Error())
		}
	}
}

// checkProgram checks what runs: script and interpreter, or command and
// files.
func (s *Spec) checkProgram(c specProblems) {
	hasScript, hasCommand := s.Script != "", len(s.Command) > 0
	switch {
	case hasScript && hasCommand:
		c.add("command", "set either script or command, not both")
	case !hasScript && !hasCommand:
		c.add("script", "required: set script (inline) or command (with files)")
	}
	if hasScript {
		if len(s.Script) > MaxScriptBytes {
			c.add("script", "%d bytes, at most %d", len(s.Script), MaxScriptBytes)
		}
		if strings.ContainsRune(s.Script, 0) {
			c.add("script", "must not contain NUL bytes")
		}
		if !utf8.ValidString(s.Script) {
			c.add("script", "not valid UTF-8")
		}
		if len(s.Files) > 0 {
			c.add("files", "files are only used with command")
		}
	}
	if s.Interpreter != "" {
		if !hasScript {
			c.add("interpreter", "only used with script")
		}
		if !path.IsAbs(s.Interpreter) || path.Clean(s.Interpreter) != s.Interpreter || hasControl(s.Interpreter, false) || strings.ContainsAny(s.Interpreter, " \t\\%$") {
			c.add("interpreter", "%s must be a clean absolute path without spaces, '\\', '%%' or '$'", quote(s.Interpreter))
		}
	}
	if len(s.Command) > MaxCommandArgs {
		c.add("command", "%d arguments, at most %d", len(s.Command), MaxCommandArgs)
	}
	for i, a := range s.Command {
		switch {
		case i == 0 && strings.TrimSpace(a) == "":
			c.addAt("command[%d]", i, "the program must not be empty")
		case len(a) > MaxArgBytes:
			c.addAt("command[%d]", i, "%d bytes, at most %d", len(a), MaxArgBytes)
		case hasControl(a, false) || !utf8.ValidString(a):
			c.addAt("command[%d]", i, "must not contain control characters or invalid UTF-8")
		}
	}
	if len(s.Files) > MaxFiles {
		c.add("files", "%d entries, at most %d", len(s.Files), MaxFiles)
	}
	seen := map[string]int{}
	for i, fp := range s.Files {
		if msg := checkRelPath(fp); msg != "" {
			c.addAt("files[%d]", i, "%s", msg)
			continue
		}
		c.checkUnique(seen, path.Clean(fp), "files[%d]", i)
	}
}

// checkUnique adds "duplicate of" when key was seen at an earlier index of
// the list field (a format such as "files[%d]"), then records i as the
// index of key.
func (c specProblems) checkUnique(seen map[string]int, key, field string, i int) {
	if j, ok := seen[key]; ok {
		c.addAt(field, i, "duplicate of "+field, j)
	}
	seen[key] = i
}

// checkEnv checks the environment variables.
func (s *Spec) checkEnv(c specProblems) {
	if len(s.Env) > MaxEnv {
		c.add("env", "%d variables, at most %d", len(s.Env), MaxEnv)
	}
	for _, k := range sortedKeys(s.Env) {
		at := "env." + k
		if !envKeyRE.MatchString(k) {
			c.add("env", "%s is not a valid variable name: use letters, digits and '_', not starting with a digit", quote(k))
			continue
		}
		if strings.HasPrefix(k, "DROVER_") {
			c.add(at, "names starting with DROVER_ are reserved for the runner")
		}
		v := s.Env[k]
		if len(v) > MaxEnvValueBytes {
			c.add(at, "%d bytes, at most %d", len(v), MaxEnvValueBytes)
		}
		if strings.ContainsRune(v, 0) || !utf8.ValidString(v) {
			c.add(at, "must not contain NUL bytes or invalid UTF-8")
		}
	}
}

// checkSecrets checks the secret names.
func (s *Spec) checkSecrets(c specProblems) {
	if len(s.Secrets) > MaxSecrets {
		c.add("secrets", "%d names, at most %d", len(s.Secrets), MaxSecrets)
	}
	seen := map[string]int{}
	for i, name := range s.Secrets {
		if !envKeyRE.MatchString(name) {
			c.addAt("secrets[%d]", i, "%s is not a valid secret name: use letters, digits and '_', not starting with a digit", quote(name))
			continue
		}
		c.checkUnique(seen, name, "secrets[%d]", i)
		if _, ok := s.Env[name]; ok {
			c.addAt("secrets[%d]", i, "%s is also set in env", name)
		}
		if strings.HasPrefix(name, "DROVER_") {
			c.addAt("secrets[%d]", i, "names starting with DROVER_ are reserved for the runner")
		}
	}
}

// checkSandbox checks how a run is bounded: its user, times, catch-up,
// hardening and resource limits.
func (s *Spec) checkSandbox(c specProblems) {
	if s.RunAs != "" && !userRE.MatchString(s.RunAs) {
		c.add("run_as", "%s is not a valid user name: use lowercase letters, digits, '_' and '-', at most 31, starting with a letter or '_'", quote(s.RunAs))
	}
	if s.Timeout != 0 && (s.Timeout < MinTimeout || s.Timeout > MaxTimeout) {
		c.add("timeout", "%s out of range %s-%s", s.Timeout, MinTimeout, MaxTimeout)
	}
	if s.Jitter < 0 || s.Jitter > MaxJitter {
		c.add("jitter", "%s out of range 0s-%s", s.Jitter, MaxJitter)
	}
	if s.Grace != 0 && (s.Grace < MinGrace || s.Grace > MaxGrace) {
		c.add("grace", "%s out of range %s-%s", s.Grace, MinGrace, MaxGrace)
	}
	if s.MaxDuration != 0 && (s.MaxDuration < MinGrace || s.MaxDuration > MaxTimeout) {
		c.add("max_duration", "%s out of range %s-%s", s.MaxDuration, MinGrace, MaxTimeout)
	}
	switch s.Placement {
	case "", PlacementAll, PlacementOne:
	default:
		c.add("placement", "%s is not one of all, one", quote(s.Placement))
	}
	s.Retries.check(c)
	switch s.Catchup {
	case "", CatchupOnce, CatchupAll, CatchupSkip:
	default:
		c.add("catchup", "%s is not one of once, all, skip", quote(s.Catchup))
	}
	switch s.Hardening {
	case "", HardeningStrict, HardeningDefault, HardeningNone:
	default:
		c.add("hardening", "%s is not one of strict, default, none", quote(s.Hardening))
	}
	if len(s.WritablePaths) > MaxWritablePaths {
		c.add("writable_paths", "%d paths, at most %d", len(s.WritablePaths), MaxWritablePaths)
	}
	for i, wp := range s.WritablePaths {
		switch {
		case !path.IsAbs(wp) || path.Clean(wp) != wp:
			c.addAt("writable_paths[%d]", i, "%s must be a clean absolute path", quote(wp))
		case wp == "/":
			c.addAt("writable_paths[%d]", i, "the whole file system cannot be made writable; use hardening: none")
		case hasControl(wp, false) || !utf8.ValidString(wp) || strings.ContainsAny(wp, " \t\\\"';%$"):
			c.addAt("writable_paths[%d]", i, "%s must not contain blanks, quotes, '\\', ';', '%%' or '$'", quote(wp))
		}
	}
	if len(s.WritablePaths) > 0 && s.Hardening == HardeningNone {
		c.add("writable_paths", "only used with hardening default or strict (none leaves the file system writable)")
	}
	c.checkRange("limits.cpu_percent", s.Limits.CPUPercent, MaxCPUPercent)
	c.checkRange("limits.memory_mb", s.Limits.MemoryMB, MaxMemoryMB)
	c.checkRange("limits.tasks", s.Limits.Tasks, MaxTasks)
}

// check checks the tag selector and the agent ids; nil targets are fine.
func (t *Targets) check(c specProblems) {
	if t == nil {
		return
	}
	if len(t.Tags) > MaxTags {
		c.add("targets.tags", "%d tags, at most %d", len(t.Tags), MaxTags)
	}
	for _, k := range sortedKeys(t.Tags) {
		if !tagKeyRE.MatchString(k) {
			c.add("targets.tags", "%s is not a valid tag key", quote(k))
			continue
		}
		if !tagValRE.MatchString(t.Tags[k]) {
			c.add("targets.tags."+k, "%s is not a valid tag value: use at most 63 letters, digits, '.', '_' and '-'", quote(t.Tags[k]))
		}
	}
	if len(t.Agents) > MaxTargetAgents {
		c.add("targets.agents", "%d agents, at most %d", len(t.Agents), MaxTargetAgents)
	}
	for i, id := range t.Agents {
		if !agentIDRE.MatchString(id) {
			c.addAt("targets.agents[%d]", i, "%s is not a valid agent id", quote(id))
		}
	}
}

// Validate checks a manifest and every pipe in it, returning all problems.
func (m *Manifest) Validate() error {
	var p problems
	if !agentIDRE.MatchString(m.AgentID) {
		p.add("agent_id", "%s is not a valid agent id", quote(m.AgentID))
	}
	if m.Serial == 0 {
		p.add("serial", "must be at least 1")
	}
	if m.IssuedAt.IsZero() {
		p.add("issued_at", "required")
	}
	if m.ExpiresAt.IsZero() {
		p.add("expires_at", "required")
	} else if !m.ExpiresAt.After(m.IssuedAt) {
		p.add("expires_at", "must be after issued_at")
	}
	seen := map[string]int{}
	for i := range m.Pipes {
		pp := &m.Pipes[i]
		at := fmt.Sprintf("pipes[%d]", i)
		if j, ok := seen[pp.Name]; ok {
			p.add(join(at, "name"), "duplicate of pipes[%d]", j)
		}
		seen[pp.Name] = i
		if pp.Name != pp.Spec.Name {
			p.add(join(at, "name"), "%s does not match spec.name %s", quote(pp.Name), quote(pp.Spec.Name))
		}
		if pp.Version == 0 {
			p.add(join(at, "version"), "must be at least 1")
		}
		pp.Spec.validate(&p, join(at, "spec"))
		if pp.Spec.Targets != nil {
			p.add(join(at, "spec.targets"), "must not appear in a manifest")
		}
		if pp.Spec.Placement != "" {
			p.add(join(at, "spec.placement"), "must not appear in a manifest (the entry's lease_until says it is held)")
		}
		if !pp.LastFireServed.IsZero() && pp.LeaseUntil.IsZero() {
			p.add(join(at, "last_fire_served"), "only with lease_until")
		}
		if !pp.LeaseUntil.IsZero() && !pp.LeaseUntil.After(m.IssuedAt) {
			p.add(join(at, "lease_until"), "must be after issued_at")
		}
		if !digestRE.MatchString(pp.Payload.Digest) {
			p.add(join(at, "payload.digest"), "%s is not a sha256:<hex> digest", quote(pp.Payload.Digest))
		}
		if pp.Payload.Size < 0 {
			p.add(join(at, "payload.size"), "must not be negative")
		}
	}
	return p.err()
}

// ValidateSpecs validates several specs, as from one file or one apply, with
// paths "[i].field"; duplicate names are problems too.
func ValidateSpecs(specs []Spec) error {
	var p problems
	seen := map[string]int{}
	for i := range specs {
		at := fmt.Sprintf("[%d]", i)
		specs[i].validate(&p, at)
		if j, ok := seen[specs[i].Name]; ok && specs[i].Name != "" {
			p.add(join(at, "name"), "duplicate of [%d] (%s)", j, specs[i].Name)
		}
		seen[specs[i].Name] = i
	}
	return p.err()
}

func (c specProblems) checkRange(field string, v, max int) {
	if v < 0 || v > max {
		c.add(field, "%d out of range 0-%d", v, max)
	}
}

func checkTimezone(tz string) error {
	if tz == "Local" || strings.HasPrefix(tz, "/") || strings.Contains(tz, "..") || hasControl(tz, false) || strings.ContainsAny(tz, " %$\\") {
		return fmt.Errorf("%s is not an IANA time zone name (e.g. Europe/Berlin)", quote(tz))
	}
	// systemd reads a bare abbreviation such as GMT, EST or CET as "local
	// time" when it matches the host's own zone, and "right/" zones count leap
	// seconds: allow only UTC and Region/City names so both backends agree.
	if tz != "UTC" && (!strings.Contains(tz, "/") || strings.HasPrefix(tz, "right/") || strings.HasPrefix(tz, "posix/")) {
		return fmt.Errorf("%s: use UTC or a Region/City IANA name such as Europe/Berlin (abbreviations like CET or EST are ambiguous to systemd)", quote(tz))
	}
	if _, err := loadLocationCached(tz); err != nil {
		return fmt.Errorf("unknown time zone %s (use an IANA name such as Europe/Berlin)", quote(tz))
	}
	return nil
}

// zoneCache keeps loaded zones: validating a 1,000-pipe manifest would
// otherwise read a zoneinfo file from disk per pipe. Only successes are kept,
// so a zone installed later is still found.
var zoneCache sync.Map // string -> *time.Location

func loadLocationCached(tz string) (*time.Location, error) {
	if l, ok := zoneCache.Load(tz); ok {
		return l.(*time.Location), nil
	}
	l, err := time.LoadLocation(tz)
	if err != nil {
		return nil, err
	}
	zoneCache.Store(tz, l)
	return l, nil
}

// LoadLocation loads a validated pipe time zone; "" means UTC.
func LoadLocation(tz string) (*time.Location, error) {
	if tz == "" {
		return time.UTC, nil
	}
	if err := checkTimezone(tz); err != nil {
		return nil, err
	}
	return loadLocationCached(tz)
}

func checkRelPath(fp string) string {
	switch {
	case fp == "":
		return "must not be empty"
	case path.IsAbs(fp):
		return fmt.Sprintf("%s must be relative to the pipe file", quote(fp))
	case hasControl(fp, false) || !utf8.ValidString(fp) || strings.Contains(fp, "\\"):
		return fmt.Sprintf("%s must not contain control characters or '\\'", quote(fp))
	}
	for _, part := range strings.Split(fp, "/") {
		if part == ".." {
			return fmt.Sprintf("%s must not leave the pipe's directory", quote(fp))
		}
	}
	if path.Clean(fp) == "." {
		return fmt.Sprintf("%s names the pipe's own directory", quote(fp))
	}
	return ""
}

// hasControl reports control characters; tab is allowed when tabOK.
func hasControl(s string, tabOK bool) bool {
	for _, r := range s {
		if r == '\t' && tabOK {
			continue
		}
		if unicode.IsControl(r) || r == '\u2028' || r == '\u2029' {
			return true
		}
	}
	return false
}

func quote(s string) string {
	if len(s) > 80 {
		s = s[:80] + "…"
	}
	return fmt.Sprintf("%q", s)
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// check checks the retry policy; nil is valid (one attempt). Attempts are
// required: a retries block without them is a mistake, not one attempt.
func (r *Retries) check(c specProblems) {
	if r == nil {
		return
	}
	if r.Attempts < 1 || r.Attempts > MaxAttempts {
		c.add("retries.attempts", "%d out of range 1-%d", r.Attempts, MaxAttempts)
	}
	if r.Delay != 0 && (r.Delay < MinRetryDelay || r.Delay > MaxRetryDelay) {
		c.add("retries.delay", "%s out of range %s-%s", r.Delay, MinRetryDelay, MaxRetryDelay)
	}
	if r.Backoff != 0 && (math.IsNaN(r.Backoff) || r.Backoff < 1 || r.Backoff > MaxRetryBackoff) {
		c.add("retries.backoff", "%v out of range 1-%v", r.Backoff, MaxRetryBackoff)
	}
	if r.MaxDelay != 0 && (r.MaxDelay < MinRetryDelay || r.MaxDelay > MaxRetryDelay) {
		c.add("retries.max_delay", "%s out of range %s-%s", r.MaxDelay, MinRetryDelay, MaxRetryDelay)
	} else if r.MaxDelay != 0 && r.Delay != 0 && r.MaxDelay < r.Delay {
		c.add("retries.max_delay", "%s is less than delay %s", r.MaxDelay, r.Delay)
	}
}

// valid reports whether check finds nothing wrong with r.
func (r *Retries) valid() bool {
	var p problems
	r.check(specProblems{&p, ""})
	return p.err() == nil
}
