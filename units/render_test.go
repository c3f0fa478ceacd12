package units

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode"

	"github.com/coreos/go-systemd/v22/unit"

	"github.com/drover/drover/manifest"
)

// This file holds the API tests and the helpers the golden, fuzz and security
// tests share: an independent statement of what a rendered unit must contain
// (wantUnits), a decoder of unit-file values written from systemd's rules
// (decodeValue), and a wrapper for systemd-analyze.

func baseSpec() *manifest.Spec {
	return &manifest.Spec{
		Name:     "backup-db",
		Schedule: "30 2 * * *",
		Script:   "pg_dump mydb\n",
	}
}

func TestNames(t *testing.T) {
	if got := ServiceName("backup-db"); got != "drover-pipe-backup-db.service" {
		t.Errorf("ServiceName = %q", got)
	}
	if got := TimerName("backup-db"); got != "drover-pipe-backup-db.timer" {
		t.Errorf("TimerName = %q", got)
	}
}

func TestIsManaged(t *testing.T) {
	for _, c := range []struct {
		in   string
		want bool
	}{
		{Header + "\n[Unit]\n", true},
		{Header, true},
		{Header + "\r\n[Unit]\n", false},
		{" " + Header + "\n", false},
		{"[Unit]\n" + Header + "\n", false},
		{"# Managed by drover-agent.\n", false},
		{"", false},
	} {
		if got := IsManaged([]byte(c.in)); got != c.want {
			t.Errorf("IsManaged(%q) = %v, want %v", c.in, got, c.want)
		}
	}
}

// Every file Render returns is managed, named as pinned and deterministic.
func TestRenderBasics(t *testing.T) {
	spec := baseSpec()
	before := *spec
	files, err := Render(spec, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if len(files) != 2 || files[0].Name != ServiceName("backup-db") || files[1].Name != TimerName("backup-db") {
		t.Fatalf("files = %v", fileNames(files))
	}
	for _, f := range files {
		if !IsManaged(f.Content) {
			t.Errorf("%s does not start with the header", f.Name)
		}
		if !bytes.HasSuffix(f.Content, []byte("\n")) {
			t.Errorf("%s does not end in a newline", f.Name)
		}
	}
	if spec.Timezone != "" || spec.Hardening != "" || spec.Timeout != 0 || spec.Name != before.Name {
		t.Errorf("Render modified its input: %+v", spec)
	}
	for i := 0; i < 3; i++ {
		again, err := Render(spec, Options{})
		if err != nil {
			t.Fatal(err)
		}
		for j := range files {
			if !bytes.Equal(files[j].Content, again[j].Content) {
				t.Fatalf("render %d of %s differs", i, files[j].Name)
			}
		}
	}
	// Secret order does not change the bytes: no needless rewrites.
	a, b := baseSpec(), baseSpec()
	a.Secrets, b.Secrets = []string{"B", "A"}, []string{"A", "B"}
	fa, err1 := Render(a, Options{})
	fb, err2 := Render(b, Options{})
	if err1 != nil || err2 != nil || !bytes.Equal(fa[0].Content, fb[0].Content) {
		t.Errorf("secret order changes the service (%v, %v)", err1, err2)
	}
}

// Values that never belong in a unit: env values, secret values, script and
// command text, file names.
func TestRenderLeavesPayloadOut(t *testing.T) {
	spec := baseSpec()
	spec.Script = ""
	spec.Command = []string{"./run.sh", "--password=CMDSECRET"}
	spec.Files = []string{"run.sh", "lib/FILESECRET"}
	spec.Env = map[string]string{"PGHOST": "ENVSECRET-VALUE", "TOKEN_HINT": "hunter2"}
	spec.Secrets = []string{"PGPASSWORD"}
	for _, scope := range []Scope{ScopeSystem, ScopeUser} {
		files, err := Render(spec, Options{Scope: scope})
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range files {
			for _, bad := range []string{"CMDSECRET", "FILESECRET", "ENVSECRET", "hunter2", "PGHOST", "TOKEN_HINT", "run.sh"} {
				if bytes.Contains(f.Content, []byte(bad)) {
					t.Errorf("%s scope %s contains %q", f.Name, scope, bad)
				}
			}
		}
	}
	spec.Command, spec.Files = nil, nil
	spec.Script = "echo SCRIPTSECRET"
	files, err := Render(spec, Options{})
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		if bytes.Contains(f.Content, []byte("SCRIPTSECRET")) {
			t.Errorf("%s contains the script", f.Name)
		}
	}
}

// The user manager cannot run namespaced or credential options.
func TestRenderUserScopeHasNoSystemOnlyOptions(t *testing.T) {
	for _, profile := range []string{"strict", "default", "none"} {
		spec := baseSpec()
		spec.Hardening = profile
		spec.RunAs = "backup"
		spec.Secrets = []string{"PW"}
		files, err := Render(spec, Options{Scope: ScopeUser})
		if err != nil {
			t.Fatal(err)
		}
		for _, o := range deserialize(t, files[0].Content) {
			switch o.Name {
			case "DynamicUser", "User", "Group", "SupplementaryGroups", "LoadCredential", "SetCredential",
				"LoadCredentialEncrypted", "BindReadOnlyPaths", "BindPaths", "CapabilityBoundingSet",
				"AmbientCapabilities", "PrivateUsers", "PrivateNetwork", "IPAddressDeny", "DevicePolicy":
				t.Errorf("%s: user scope has %s=%s", profile, o.Name, o.Value)
			}
			if strings.HasPrefix(o.Name, "Protect") || strings.HasPrefix(o.Name, "Private") ||
				o.Name == "ProcSubset" || o.Name == "RemoveIPC" || o.Name == "ReadWritePaths" {
				t.Errorf("%s: user scope has namespace option %s=%s", profile, o.Name, o.Value)
			}
		}
	}
}

func TestRenderRejects(t *testing.T) {
	specCases := map[string]func(s *manifest.Spec){
		"nil name":             func(s *manifest.Spec) { s.Name = "" },
		"bad name":             func(s *manifest.Spec) { s.Name = "Backup" },
		"name with newline":    func(s *manifest.Spec) { s.Name = "a\nExecStartPre=/bin/sh" },
		"description newline":  func(s *manifest.Spec) { s.Description = "x\n[Service]\nExecStartPre=/bin/evil" },
		"description CR":       func(s *manifest.Spec) { s.Description = "x\rExecStartPre=/bin/evil" },
		"description NUL":      func(s *manifest.Spec) { s.Description = "x\x00y" },
		"description tab":      func(s *manifest.Spec) { s.Description = "x\ty" },
		"description NEL":      func(s *manifest.Spec) { s.Description = "x\u0085y" },
		"description LS":       func(s *manifest.Spec) { s.Description = "x\u2028y" },
		"description bad utf8": func(s *manifest.Spec) { s.Description = "x\xffy" },
		"description too long": func(s *manifest.Spec) { s.Description = strings.Repeat("é", 257) },
		"run_as injection":     func(s *manifest.Spec) { s.RunAs = "root\nUser=root" },
		"run_as specifier":     func(s *manifest.Spec) { s.RunAs = "%u" },
		"run_as leading dash":  func(s *manifest.Spec) { s.RunAs = "-root" },
		"secret injection":     func(s *manifest.Spec) { s.Secrets = []string{"A:/etc/shadow"} },
		"secret newline":       func(s *manifest.Spec) { s.Secrets = []string{"A\nExecStartPre=/x"} },
		"timezone specifier":   func(s *manifest.Spec) { s.Timezone = "Europe/%n" },
		"timezone newline":     func(s *manifest.Spec) { s.Timezone = "UTC\nOnCalendar=minutely" },
		"timezone path":        func(s *manifest.Spec) { s.Timezone = "/etc/localtime" },
		"schedule empty":       func(s *manifest.Spec) { s.Schedule = "" },
		"hardening unknown":    func(s *manifest.Spec) { s.Hardening = "paranoid" },
		"catchup unknown":      func(s *manifest.Spec) { s.Catchup = "twice" },
		"timeout too short":    func(s *manifest.Spec) { s.Timeout = manifest.Duration(time.Millisecond) },
		"negative jitter":      func(s *manifest.Spec) { s.Jitter = manifest.Duration(-time.Second) },
		"negative limit":       func(s *manifest.Spec) { s.Limits.Tasks = -1 },
	}
	for name, mutate := range specCases {
		spec := baseSpec()
		mutate(spec)
		if files, err := Render(spec, Options{}); err == nil {
			t.Errorf("%s: rendered\n%s", name, files[0].Content)
		}
	}
	if _, err := Render(nil, Options{}); err == nil {
		t.Error("nil spec rendered")
	}

	optCases := map[string]Options{
		"relative agent":      {AgentPath: "drover-agent"},
		"agent prefix":        {AgentPath: "-/usr/bin/drover-agent"},
		"agent at":            {AgentPath: "@/usr/bin/drover-agent"},
		"agent space":         {AgentPath: "/usr/bin/drover agent"},
		"agent percent":       {AgentPath: "/usr/bin/%n"},
		"agent dollar":        {AgentPath: "/usr/bin/$X"},
		"agent newline":       {AgentPath: "/usr/bin/a\nExecStartPre=/x"},
		"agent unclean":       {AgentPath: "/usr/bin/../bin/drover-agent"},
		"agent trailing /":    {AgentPath: "/usr/bin/"},
		"data dir relative":   {DataDir: "var/lib/drover"},
		"data dir root":       {DataDir: "/"},
		"data dir colon":      {DataDir: "/var/lib/a:/etc"},
		"data dir space":      {DataDir: "/var/lib/dro ver"},
		"data dir backslash":  {DataDir: `/var/lib/drover\`},
		"scope":               {Scope: "global"},
		"arg word":            {RunArgs: []string{"debug"}},
		"arg semicolon":       {RunArgs: []string{";"}},
		"arg space":           {RunArgs: []string{"--config", "/etc/a b"}},
		"arg dollar":          {RunArgs: []string{"--x=$HOME"}},
		"arg percent":         {RunArgs: []string{"--x=%n"}},
		"arg quote":           {RunArgs: []string{`--x="a"`}},
		"arg backslash":       {RunArgs: []string{`--x=a\`}},
		"arg newline":         {RunArgs: []string{"--x\nExecStartPre=/bin/sh"}},
		"arg triple dash":     {RunArgs: []string{"---x"}},
		"arg empty":           {RunArgs: []string{""}},
		"arg dash only":       {RunArgs: []string{"--"}},
		"arg relative":        {RunArgs: []string{"./config.yaml"}},
		"arg unicode":         {RunArgs: []string{"--naïve"}},
		"too many args":       {RunArgs: slices.Repeat([]string{"--v"}, 33)},
		"arg very long value": {RunArgs: []string{"--x=" + strings.Repeat("a", 2000)}},
	}
	for name, o := range optCases {
		if files, err := Render(baseSpec(), o); err == nil {
			t.Errorf("options %s: rendered\n%s", name, files[0].Content)
		}
	}
}

// Run args that are fine, and a long but legal line.
func TestRenderRunArgs(t *testing.T) {
	args := []string{"--config", "/etc/drover/agent.yaml", "-v", "--log-format=json", "--tags=a:b,c"}
	files, err := Render(baseSpec(), Options{RunArgs: args, AgentPath: "/opt/drover@1/bin/drover-agent"})
	if err != nil {
		t.Fatal(err)
	}
	want := append([]string{"/opt/drover@1/bin/drover-agent", "run", "backup-db"}, args...)
	got := optionValues(t, files[0].Content, "Service", "ExecStart")
	if len(got) != 1 || got[0] != execValue(want) {
		t.Errorf("ExecStart = %v, want %v", got, execValue(want))
	}
}

// The round trip: each rendered file, parsed by go-systemd and decoded with
// systemd's rules, holds exactly the intended options, in order.
func TestRenderRoundTrip(t *testing.T) {
	for _, c := range roundTripCases() {
		t.Run(c.name, func(t *testing.T) {
			files, err := Render(c.spec, c.opts)
			if err != nil {
				t.Fatal(err)
			}
			checkRoundTrip(t, c.spec, c.opts, files)
		})
	}
}

type specCase struct {
	name string
	spec *manifest.Spec
	opts Options
}

func roundTripCases() []specCase {
	var out []specCase
	add := func(name string, o Options, f func(s *manifest.Spec)) {
		s := baseSpec()
		f(s)
		out = append(out, specCase{name, s, o})
	}
	add("minimal", Options{}, func(*manifest.Spec) {})
	for _, d := range hostileDescriptions() {
		add("desc "+strconv.Quote(d), Options{}, func(s *manifest.Spec) { s.Description = d })
	}
	for _, p := range []string{"strict", "default", "none"} {
		for _, scope := range []Scope{ScopeSystem, ScopeUser} {
			add(p+" "+string(scope), Options{Scope: scope, RunArgs: []string{"--config", "/etc/drover/agent.yaml"}}, func(s *manifest.Spec) {
				s.Hardening = p
				s.Secrets = []string{"PGPASSWORD", "API_TOKEN"}
				s.Limits = manifest.Limits{CPUPercent: 150, MemoryMB: 2048, Tasks: 10}
				s.Timeout = manifest.Duration(90*time.Minute + 500*time.Millisecond)
				s.Jitter = manifest.Duration(90 * time.Second)
			})
		}
	}
	add("root default", Options{}, func(s *manifest.Spec) { s.RunAs = "root" })
	add("root strict", Options{}, func(s *manifest.Spec) { s.RunAs = "root"; s.Hardening = "strict" })
	add("catchup skip", Options{}, func(s *manifest.Spec) { s.Catchup = "skip" })
	add("catchup all", Options{}, func(s *manifest.Spec) { s.Catchup = "all" })
	add("every", Options{}, func(s *manifest.Spec) { s.Schedule = "@every 90m"; s.Catchup = "skip" })
	add("timezone", Options{}, func(s *manifest.Spec) { s.Timezone = "America/Argentina/Buenos_Aires" })
	add("tz offset", Options{}, func(s *manifest.Spec) { s.Timezone = "Etc/GMT+5" })
	add("microsecond spans", Options{}, func(s *manifest.Spec) {
		s.Timeout = manifest.Duration(time.Second + 1500*time.Nanosecond)
		s.Jitter = manifest.Duration(1500 * time.Microsecond)
	})
	return out
}

// hostileDescriptions: each must render, and come back out of systemd's
// parser unchanged (up to the surrounding white space Render drops).
func hostileDescriptions() []string {
	return []string{
		"Nightly database dump",
		`ends in a backslash\`,
		`two backslashes\\`,
		`three\\\`,
		`\`,
		`\leading backslash`,
		`mid\nnot a newline \t \x41 \\ \"`,
		"100% %n %i %% %%% %",
		"$HOME ${PATH} $$ $",
		"-leading dash",
		"@ - : + ! leading prefixes",
		"[Service]",
		"# not a comment ; nor this",
		"x=y ExecStartPre=/bin/sh -c evil",
		`"quoted" 'single' "unbalanced`,
		"  surrounded by spaces  ",
		"unicode ✓ ünïcödé 日本語 🚀 \u200b zero width",
		"nbsp at end\u00a0",
		"ideographic space at end\u3000",
		"trailing backslash then nbsp\\\u00a0",
		strings.Repeat("long ", 51),
		strings.Repeat("%", 256),
		strings.Repeat(`\`, 255),
		strings.Repeat("🚀", 256),
	}
}

// ---- the intended unit contents, stated independently of render.go ----

// uopt is one intended option with its decoded value: for ExecStart= and
// Environment= the words, each strconv-quoted and joined by one blank.
type uopt struct{ Section, Name, Value string }

func execValue(words []string) string {
	q := make([]string, len(words))
	for i, w := range words {
		q[i] = strconv.Quote(w)
	}
	return strings.Join(q, " ")
}

// wantUnits states what the service and the timer of spec must hold,
// following docs/design.md "Unit rendering".
// Hardening options come from the profile tables (checked on their own in
// security_test.go); everything else is spelled out here.
func wantUnits(t testing.TB, spec *manifest.Spec, o Options) (svc, tmr []uopt) {
	t.Helper()
	s := spec.Clone()
	s.Normalize()
	agent, dataDir, scope := o.AgentPath, o.DataDir, o.Scope
	if agent == "" {
		agent = "/usr/bin/drover-agent"
	}
	if dataDir == "" {
		dataDir = "/var/lib/drover"
	}
	if scope == "" {
		scope = ScopeSystem
	}
	desc := "Drover pipe " + s.Name
	if d := strings.TrimFunc(s.Description, unicode.IsSpace); d != "" {
		desc += ": " + d
	}
	u := func(name, value string) { svc = append(svc, uopt{"Unit", name, value}) }
	sv := func(name, value string) { svc = append(svc, uopt{"Service", name, value}) }
	u("Description", desc)
	u("StartLimitIntervalSec", "0")
	if scope == ScopeSystem && s.Hardening != "strict" {
		u("Wants", "network-online.target")
		u("After", "network-online.target")
	}
	sv("Type", "oneshot")
	sv("ExecStart", execValue(append([]string{agent, "run", s.Name}, o.RunArgs...)))
	// Every attempt's timeout and 15 s of kill grace, plus the delays
	// between attempts (delay, growing by backoff, capped at max_delay).
	budget := s.Timeout.D() + 15*time.Second
	if r := s.Retries; r != nil {
		budget *= time.Duration(r.Attempts)
		wait := r.Delay.D()
		for i := 1; i < r.Attempts; i++ {
			budget += wait
			wait = min(time.Duration(float64(wait)*r.Backoff), r.MaxDelay.D())
		}
	}
	sv("TimeoutStartSec", spanSeconds(budget))
	sv("KillMode", "control-group")
	sv("SyslogIdentifier", "drover-pipe-"+s.Name)
	sv("StateDirectory", "drover-runs/"+s.Name)
	sv("StateDirectoryMode", "0700")
	if scope == ScopeSystem {
		if s.RunAs != "" {
			sv("User", s.RunAs)
		} else {
			sv("DynamicUser", "yes")
		}
		sv("BindReadOnlyPaths", dataDir+"/pipes/"+s.Name+":/run/drover/pipe")
		sv("Environment", execValue([]string{"DROVER_PIPE_DIR=/run/drover/pipe"}))
		secrets := slices.Sorted(slices.Values(s.Secrets))
		for _, name := range secrets {
			sv("LoadCredential", name+":"+dataDir+"/secrets/"+s.Name+"/"+name)
		}
	} else {
		sv("Environment", execValue([]string{"DROVER_PIPE_DIR=" + dataDir + "/pipes/" + s.Name}))
	}
	if s.Limits.CPUPercent > 0 {
		sv("CPUQuota", fmt.Sprint(s.Limits.CPUPercent, "%"))
	}
	if s.Limits.MemoryMB > 0 {
		sv("MemoryMax", fmt.Sprint(s.Limits.MemoryMB, "M"))
	}
	if s.Limits.Tasks > 0 {
		sv("TasksMax", fmt.Sprint(s.Limits.Tasks))
	}
	if scope == ScopeSystem && s.Hardening != "none" {
		for _, p := range slices.Sorted(slices.Values(s.WritablePaths)) {
			sv("ReadWritePaths", p)
		}
	}
	h, err := hardening(s.Hardening, scope, s.RunAs == "root")
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range h {
		sv(o.Key, o.Value)
	}

	tm := func(name, value string) { tmr = append(tmr, uopt{"Timer", name, value}) }
	tmr = append(tmr, uopt{"Unit", "Description", desc})
	sched, err := manifest.ParseSchedule(s.Schedule)
	if err != nil {
		t.Fatal(err)
	}
	if d, ok := sched.Every(); ok {
		tm("OnActiveSec", spanSeconds(d))
		tm("OnUnitActiveSec", spanSeconds(d))
	} else {
		cals, err := OnCalendar(sched, s.Timezone)
		if err != nil {
			t.Fatal(err)
		}
		if !o.NoCorrections {
			// The DST correction instants (their own tests: golden files
			// and the oracle) follow the translation.
			now := o.Now
			if now.IsZero() {
				now = time.Now()
			}
			corr, err := Corrections(sched, s.Timezone, now)
			if err != nil {
				t.Fatal(err)
			}
			cals = append(cals, corr...)
		}
		for _, c := range cals {
			tm("OnCalendar", c)
		}
		tm("Persistent", strconv.FormatBool(s.Catchup != "skip"))
	}
	tm("AccuracySec", "1s")
	if s.Jitter > 0 {
		tm("RandomizedDelaySec", spanSeconds(s.Jitter.D()))
		tm("FixedRandomDelay", "yes")
	}
	tm("Unit", "drover-pipe-"+s.Name+".service")
	tmr = append(tmr, uopt{"Install", "WantedBy", "timers.target"})
	return svc, tmr
}

// spanSeconds writes d as systemd reads a time span; the check parses it
// back, so it only has to be one valid spelling.
func spanSeconds(d time.Duration) string {
	us := (d + time.Microsecond - 1) / time.Microsecond
	if us%1_000_000 == 0 {
		return strconv.FormatInt(int64(us/1_000_000), 10)
	}
	return strconv.FormatInt(int64(us), 10) + "us"
}

// parseSpan reads a systemd time span the way the renderer may write one:
// a bare number of seconds, or a number with "ms" or "us".
func parseSpan(s string) (time.Duration, error) {
	unit := time.Second
	switch {
	case strings.HasSuffix(s, "us"):
		s, unit = strings.TrimSuffix(s, "us"), time.Microsecond
	case strings.HasSuffix(s, "ms"):
		s, unit = strings.TrimSuffix(s, "ms"), time.Millisecond
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("bad time span %q", s)
	}
	return time.Duration(n) * unit, nil
}

var spanOptions = map[string]bool{"TimeoutStartSec": true, "OnActiveSec": true, "OnUnitActiveSec": true, "RandomizedDelaySec": true}

// ---- decoding unit files with systemd's rules ----

func deserialize(t testing.TB, content []byte) []*unit.UnitOption {
	t.Helper()
	opts, err := unit.DeserializeOptions(bytes.NewReader(content))
	if err != nil {
		t.Fatalf("go-systemd cannot parse the unit: %v\n%s", err, content)
	}
	return opts
}

func optionValues(t testing.TB, content []byte, section, name string) []string {
	t.Helper()
	var out []string
	for _, o := range deserialize(t, content) {
		if o.Section == section && o.Name == name {
			v, err := decodeValue(o.Name, o.Value)
			if err != nil {
				t.Fatalf("%s=%s: %v", o.Name, o.Value, err)
			}
			out = append(out, v)
		}
	}
	return out
}

// decodeValue turns a raw value as go-systemd returns it into what systemd
// 252 makes of it. It fails on anything the renderer must never produce: an
// unescaped specifier, an unescaped '$' in ExecStart=, an escape other than
// \\ \" \'.
func decodeValue(name, raw string) (string, error) {
	switch name {
	case "ExecStart", "Environment":
		words, err := splitWords(raw)
		if err != nil {
			return "", err
		}
		for i, w := range words {
			if w, err = unSpecifier(w); err != nil {
				return "", err
			}
			if name == "ExecStart" {
				if w, err = unDollar(w); err != nil {
					return "", err
				}
			}
			words[i] = w
		}
		if name == "ExecStart" && len(words) > 0 && strings.ContainsAny(words[0][:1], "@-:+!|") {
			return "", fmt.Errorf("ExecStart starts with a prefix character: %q", words[0])
		}
		return execValue(words), nil
	case "CPUQuota", "MemoryMax", "TasksMax":
		// Parsed as numbers, without specifier expansion.
		return raw, nil
	default:
		// systemd strips ASCII blanks around values; go-systemd strips
		// Unicode space already.
		return unSpecifier(strings.Trim(raw, " \t"))
	}
}

func unSpecifier(s string) (string, error) {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] != '%' {
			b.WriteByte(s[i])
			continue
		}
		if i+1 < len(s) && s[i+1] == '%' {
			b.WriteByte('%')
			i++
			continue
		}
		return "", fmt.Errorf("unescaped specifier in %q", s)
	}
	return b.String(), nil
}

func unDollar(s string) (string, error) {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] != '$' {
			b.WriteByte(s[i])
			continue
		}
		if i+1 < len(s) && s[i+1] == '$' {
			b.WriteByte('$')
			i++
			continue
		}
		return "", fmt.Errorf("unescaped variable reference in %q", s)
	}
	return b.String(), nil
}

// splitWords splits like systemd's extract_first_word with unquoting and C
// unescaping, restricted to the escapes a renderer may write.
func splitWords(s string) ([]string, error) {
	var words []string
	i := 0
	for {
		for i < len(s) && (s[i] == ' ' || s[i] == '\t') {
			i++
		}
		if i >= len(s) {
			return words, nil
		}
		var w strings.Builder
		var quote byte
		for i < len(s) {
			c := s[i]
			switch {
			case quote == 0 && (c == ' ' || c == '\t'):
				goto done
			case c == '\\':
				if i+1 >= len(s) {
					return nil, errors.New("trailing backslash")
				}
				n := s[i+1]
				if n != '\\' && n != '"' && n != '\'' {
					return nil, fmt.Errorf("unexpected escape \\%c in %q", n, s)
				}
				w.WriteByte(n)
				i += 2
				continue
			case quote == 0 && (c == '"' || c == '\''):
				quote = c
			case quote != 0 && c == quote:
				quote = 0
			default:
				w.WriteByte(c)
			}
			i++
		}
	done:
		if quote != 0 {
			return nil, fmt.Errorf("unbalanced quote in %q", s)
		}
		words = append(words, w.String())
	}
}

// knownSections lists the sections each unit type may have, in order.
var knownSections = map[string][]string{
	".service": {"Unit", "Service"},
	".timer":   {"Unit", "Timer", "Install"},
}

// checkRoundTrip compares the rendered files with wantUnits, line by line and
// option by option, and checks the raw-text invariants of escaping.
func checkRoundTrip(t testing.TB, spec *manifest.Spec, o Options, files []File) {
	t.Helper()
	wantSvc, wantTmr := wantUnits(t, spec, o)
	if len(files) != 2 {
		t.Fatalf("%d files", len(files))
	}
	for i, want := range [][]uopt{wantSvc, wantTmr} {
		f := files[i]
		checkRawLines(t, f)
		secs, err := unit.DeserializeSections(bytes.NewReader(f.Content))
		if err != nil {
			t.Fatalf("%s: go-systemd: %v", f.Name, err)
		}
		var names []string
		for _, sec := range secs {
			names = append(names, sec.Section)
		}
		if wantNames := knownSections[filepath.Ext(f.Name)]; !slices.Equal(names, wantNames) {
			t.Errorf("%s: sections %q, want %q", f.Name, names, wantNames)
		}
		got := deserialize(t, f.Content)
		n := max(len(got), len(want))
		for j := 0; j < n; j++ {
			if j >= len(got) {
				t.Errorf("%s: missing option %d %s=%s", f.Name, j, want[j].Name, want[j].Value)
				continue
			}
			g := got[j]
			if j >= len(want) {
				t.Errorf("%s: unintended option [%s] %s=%s", f.Name, g.Section, g.Name, g.Value)
				continue
			}
			w := want[j]
			val, err := decodeValue(g.Name, g.Value)
			if err != nil {
				t.Errorf("%s: %s: %v", f.Name, g.Name, err)
				continue
			}
			if spanOptions[g.Name] && w.Name == g.Name {
				gd, err1 := parseSpan(val)
				wd, err2 := parseSpan(w.Value)
				if err1 != nil || err2 != nil || gd != wd {
					t.Errorf("%s: %s=%s, want %s (%v %v)", f.Name, g.Name, val, w.Value, err1, err2)
				}
				continue
			}
			if g.Section != w.Section || g.Name != w.Name || val != w.Value {
				t.Errorf("%s: option %d is [%s] %s=%q, want [%s] %s=%q", f.Name, j, g.Section, g.Name, val, w.Section, w.Name, w.Value)
			}
		}
	}
}

// checkRawLines checks the file as text: the header, then only blank lines,
// section headers and Key=value lines; no line continues onto the next.
func checkRawLines(t testing.TB, f File) {
	t.Helper()
	text := string(f.Content)
	if !strings.HasSuffix(text, "\n") {
		t.Errorf("%s: no final newline", f.Name)
	}
	for i, line := range strings.Split(strings.TrimSuffix(text, "\n"), "\n") {
		switch {
		case i == 0:
			if line != Header {
				t.Errorf("%s: first line %q", f.Name, line)
			}
		case line == "":
		case strings.HasPrefix(line, "[") && strings.HasSuffix(line, "]"):
		default:
			key, _, ok := strings.Cut(line, "=")
			if !ok || key == "" || strings.Trim(key, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz") != "" {
				t.Errorf("%s: line %d is not an assignment: %q", f.Name, i+1, line)
			}
		}
		if strings.HasSuffix(line, `\`) {
			t.Errorf("%s: line %d ends in a backslash: %q", f.Name, i+1, line)
		}
		if strings.ContainsAny(line, "\r\x00") {
			t.Errorf("%s: line %d holds CR or NUL", f.Name, i+1)
		}
	}
}

func fileNames(files []File) []string {
	var out []string
	for _, f := range files {
		out = append(out, f.Name)
	}
	return out
}

// ---- systemd-analyze ----

// fakeAgent writes an executable for ExecStart= to point at: verify checks
// that the binary exists and is executable.
func fakeAgent(t testing.TB, dir string) string {
	t.Helper()
	p := filepath.Join(dir, "bin", "drover-agent")
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte("#!/bin/sh\nexit 0\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}
