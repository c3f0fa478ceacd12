package units

import (
	"bytes"
	"context"
	"fmt"
	"github.com/drover/drover/internal/testkit"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
	"unicode"
)

// hostileValues are strings an attacker (or a careless operator) might put in
// a free-text field. Each must either be rejected or come back unchanged
// through go-systemd's parser and systemd's unescaping.
func hostileValues() []string {
	return append(hostileDescriptions(),
		"a\nExecStartPre=/bin/sh",
		"a\r\nb",
		"a\x00b",
		"a\tb",
		"\x1b[31mred",
		"del\x7f",
		"nel\u0085",
		"line\u2028sep",
		"para\u2029sep",
		"bad utf8 \xff\xfe",
		" leading blank",
		"trailing blank ",
		"",
	)
}

// embed puts a rendered value in a minimal unit, parses it with go-systemd
// and decodes it with systemd's rules.
func embed(t *testing.T, key, value string) string {
	t.Helper()
	content := []byte(Header + "\n\n[Service]\n" + key + "=" + value + "\nType=oneshot\n")
	opts := deserialize(t, content)
	if len(opts) != 2 || opts[0].Name != key || opts[1].Name != "Type" || opts[1].Value != "oneshot" {
		var got []string
		for _, o := range opts {
			got = append(got, o.Name+"="+o.Value)
		}
		t.Fatalf("%s=%q parsed as %q", key, value, got)
	}
	v, err := decodeValue(key, opts[0].Value)
	if err != nil {
		t.Fatalf("%s=%q: %v", key, value, err)
	}
	if bytes.HasSuffix(bytes.TrimSuffix(content, []byte("\nType=oneshot\n")), []byte(`\`)) {
		t.Fatalf("%s=%q ends in a backslash", key, value)
	}
	return v
}

func TestLiteralValue(t *testing.T) {
	for _, s := range hostileValues() {
		v, err := literalValue("test", s)
		bad := s == "" || strings.TrimSpace(s) != s || strings.ContainsAny(s, "\t\r\n\x00\x1b\x7f\u0085\u2028\u2029") || !validUTF8(s)
		if bad {
			if err == nil {
				t.Errorf("literalValue(%q) = %q, want an error", s, v)
			}
			continue
		}
		if err != nil {
			t.Errorf("literalValue(%q): %v", s, err)
			continue
		}
		if strings.Count(v, "%")%2 != 0 {
			t.Errorf("literalValue(%q) = %q: odd number of %%", s, v)
		}
		got := embed(t, "Description", v)
		if got != s {
			t.Errorf("literalValue(%q) = %q, reads back as %q", s, v, got)
		}
	}
	// The exact rules.
	for in, want := range map[string]string{
		"50%":           "50%%",
		"%n":            "%%n",
		"$HOME":         "$HOME",
		`a\`:            `a\ `,
		`a\\`:           `a\\ `,
		`\a`:            `\a`,
		"-x":            "-x",
		"ünï ✓":         "ünï ✓",
		`"q" 's' ; # [`: `"q" 's' ; # [`,
	} {
		got, err := literalValue("test", in)
		if err != nil || got != want {
			t.Errorf("literalValue(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
}

func validUTF8(s string) bool { return strings.ToValidUTF8(s, "\uFFFD") == s }

func TestExecWord(t *testing.T) {
	for _, s := range hostileValues() {
		if s == ";" {
			continue
		}
		v, err := execWord("test", s, false)
		bad := s == "" || strings.ContainsAny(s, "\r\n\x00\x1b\x7f\u0085\u2028\u2029\t") || !validUTF8(s)
		if bad {
			if err == nil {
				t.Errorf("execWord(%q) = %q, want an error", s, v)
			}
			continue
		}
		if err != nil {
			t.Errorf("execWord(%q): %v", s, err)
			continue
		}
		got := embed(t, "ExecStart", "/bin/true "+v+" end")
		if want := execValue([]string{"/bin/true", s, "end"}); got != want {
			t.Errorf("execWord(%q) = %q, reads back as %s, want %s", s, v, got, want)
		}
		// As the last word too: its line must not end in a backslash.
		got = embed(t, "ExecStart", "/bin/true "+v)
		if want := execValue([]string{"/bin/true", s}); got != want {
			t.Errorf("execWord(%q) last = %q, reads back as %s, want %s", s, v, got, want)
		}
	}
	for in, want := range map[string]string{
		"$HOME":      "$$HOME",
		"${X}":       "$${X}",
		"%n":         "%%n",
		"a b":        `"a b"`,
		`a\`:         `"a\\"`,
		`say "hi"`:   `"say \"hi\""`,
		"it's":       `"it's"`,
		"-x":         "-x",
		"--c=/a.yml": "--c=/a.yml",
		"a;b":        `"a;b"`,
	} {
		got, err := execWord("test", in, false)
		if err != nil || got != want {
			t.Errorf("execWord(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, in := range []string{";", "", "-/bin/sh", "@/bin/sh", ":/bin/sh", "+/bin/sh", "!/bin/sh", "!!/bin/sh", "|/bin/sh", "bin/sh", "sh"} {
		if got, err := execWord("test", in, true); err == nil {
			t.Errorf("execWord(%q, first) = %q, want an error", in, got)
		}
	}
	if _, err := execWord("test", ";", false); err == nil {
		t.Error("lone ';' accepted")
	}
	if got, err := execWord("test", "/usr/bin/drover-agent", true); err != nil || got != "/usr/bin/drover-agent" {
		t.Errorf("execWord(agent) = %q, %v", got, err)
	}
}

func TestEnvAssignment(t *testing.T) {
	for _, s := range hostileValues() {
		v, err := envAssignment("DROVER_PIPE_DIR", s)
		bad := strings.ContainsAny(s, "\r\n\x00\x1b\x7f\u0085\u2028\u2029\t") || !validUTF8(s)
		if bad {
			if err == nil {
				t.Errorf("envAssignment(%q) = %q, want an error", s, v)
			}
			continue
		}
		if err != nil {
			t.Errorf("envAssignment(%q): %v", s, err)
			continue
		}
		got := embed(t, "Environment", v)
		if want := execValue([]string{"DROVER_PIPE_DIR=" + s}); got != want {
			t.Errorf("envAssignment(%q) = %q, reads back as %s, want %s", s, v, got, want)
		}
	}
	if got, _ := envAssignment("DROVER_PIPE_DIR", "/run/drover/pipe"); got != "DROVER_PIPE_DIR=/run/drover/pipe" {
		t.Errorf("plain assignment quoted: %q", got)
	}
	for _, k := range []string{"", "1A", "A B", "A=B", "A\nB", "Ä"} {
		if _, err := envAssignment(k, "x"); err == nil {
			t.Errorf("env name %q accepted", k)
		}
	}
}

func TestCheckPath(t *testing.T) {
	for _, p := range []string{"/", "/usr/bin/drover-agent", "/opt/drover@2/bin/agent+x", "/var/lib/drover", "/a/b.c_d-e"} {
		if err := checkPath("p", p); err != nil {
			t.Errorf("checkPath(%q): %v", p, err)
		}
	}
	for _, p := range []string{"", "rel", "./x", "/a//b", "/a/./b", "/a/../b", "/a/", "/a b", "/a:b", "/a%n", "/a$b", `/a\b`,
		"/a\nb", "/a\"b", "/a'b", "/a*b", "/a?b", "/a[b", "/ä", "/a;b", "/" + strings.Repeat("a", 1024)} {
		if err := checkPath("p", p); err == nil {
			t.Errorf("checkPath(%q) accepted", p)
		}
	}
}

func TestCheckRunArg(t *testing.T) {
	for _, a := range []string{"--config", "/etc/drover/agent.yaml", "-v", "--log-format=json", "--tags=a:b,c", "--x=", "--a.b_c-d=/x/y"} {
		if err := checkRunArg("a", a); err != nil {
			t.Errorf("checkRunArg(%q): %v", a, err)
		}
	}
	for _, a := range []string{"", "-", "--", "---x", "--=x", "-=", "debug", "./x", "--x y", "--x=$HOME", "--x=%n", `--x=\`,
		"--x=\"a\"", "--x='a'", "--x=a b", "--x\n", ";", "--x;y", "--ä", "--x=ä", "-@", "--1=2=3 4"} {
		if err := checkRunArg("a", a); err == nil {
			t.Errorf("checkRunArg(%q) accepted", a)
		}
	}
}

func TestFormatSpan(t *testing.T) {
	for d, want := range map[time.Duration]string{
		time.Hour:                          "3600",
		time.Second:                        "1",
		90 * time.Minute:                   "5400",
		1500 * time.Millisecond:            "1500ms",
		750 * time.Millisecond:             "750ms",
		time.Second + 1500*time.Nanosecond: "1000002us",
		time.Nanosecond:                    "1us",
	} {
		if got := formatSpan(d); got != want {
			t.Errorf("formatSpan(%v) = %q, want %q", d, got, want)
		}
	}
}

// Every rendered line, whatever the input, is bounded.
func TestLongValues(t *testing.T) {
	spec := baseSpec()
	spec.Description = strings.Repeat("🚀", 256) // the longest description manifest accepts
	files, err := Render(spec, Options{})
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		for _, line := range strings.Split(string(f.Content), "\n") {
			if len(line) > maxLine {
				t.Errorf("%s: line of %d bytes", f.Name, len(line))
			}
		}
	}
	spec.Description = strings.Repeat("%", 256)
	if _, err := Render(spec, Options{}); err != nil {
		t.Errorf("256 %% signs: %v", err)
	}
	long := make([]string, 32)
	for i := range long {
		long[i] = "/" + strings.Repeat("x", 100)
	}
	if _, err := Render(baseSpec(), Options{RunArgs: long}); err == nil {
		t.Error("an ExecStart= line over the limit rendered")
	}
}

// TestSystemdReadsEscapedValues checks the escaping against systemd itself
// rather than this package's model of it: a systemd user manager, started in
// a private mount namespace as docs/design.md "Testing on a real systemd"
// describes, loads units whose Description=, ExecStart= words and
// Environment= value are hostile strings, runs them, and must hand the
// strings back unchanged (argv and environment as the process sees them;
// Description as `systemctl show` prints it). It needs root, unshare(1) and
// systemd.
func TestSystemdReadsEscapedValues(t *testing.T) {
	manager := ""
	for _, p := range []string{"/lib/systemd/systemd", "/usr/lib/systemd/systemd"} {
		if _, err := os.Stat(p); err == nil {
			manager = p
			break
		}
	}
	_, errU := exec.LookPath("unshare")
	_, errC := exec.LookPath("systemctl")
	if missing := manager == "" || errU != nil || errC != nil || os.Geteuid() != 0; missing {
		testkit.Unavailable(t, "needs root, unshare, systemctl and systemd (manager %q, %v, %v, euid %d)", manager, errU, errC, os.Geteuid())
	}

	root := t.TempDir()
	unitDir := filepath.Join(root, "config", "systemd", "user")
	outDir := filepath.Join(root, "out")
	for _, d := range []string{unitDir, outDir, filepath.Join(root, "runtime")} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	helper := filepath.Join(root, "argv.sh")
	script := "#!/bin/sh\nout=$1\nshift\nprintf '%s\\0' \"$@\" > \"$out.args\"\nprintf '%s' \"$DROVER_PIPE_DIR\" > \"$out.env\"\n"
	if err := os.WriteFile(helper, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}

	// Words and environment values, in hand-made units.
	words := map[string]string{}
	for i, s := range hostileValues() {
		w, err1 := execWord("word", s, false)
		e, err2 := envAssignment(PipeDirEnv, s)
		if err1 != nil || err2 != nil {
			continue
		}
		name := fmt.Sprintf("drover-esc-%d", i)
		words[name] = s
		unit := fmt.Sprintf("[Unit]\nDescription=escaping %d\n[Service]\nType=oneshot\nExecStart=%s %s %s %s\nEnvironment=%s\n",
			i, helper, filepath.Join(outDir, name), w, w, e)
		if err := os.WriteFile(filepath.Join(unitDir, name+".service"), []byte(unit), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// Descriptions, in units as Render writes them.
	descs := map[string]string{}
	for i, d := range hostileDescriptions() {
		spec := baseSpec()
		spec.Name = fmt.Sprintf("desc-%d", i)
		spec.Description = d
		files, err := Render(spec, Options{Scope: ScopeUser, AgentPath: helper, DataDir: root})
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range files {
			if err := os.WriteFile(filepath.Join(unitDir, f.Name), f.Content, 0o644); err != nil {
				t.Fatal(err)
			}
			if strings.HasSuffix(f.Name, ".service") {
				// The timer carries the same Description=; it is loaded
				// (and must load) but not shown, to keep the test short.
				descs[f.Name] = "Drover pipe " + spec.Name + ": " + strings.TrimFunc(d, unicode.IsSpace)
			}
		}
	}

	var sh strings.Builder
	fmt.Fprintf(&sh, `set -e
# A private /run/systemd/system tells the manager systemd is running;
# the host's /run stays untouched.
if [ -d /run/systemd ]; then mount -t tmpfs tmpfs /run/systemd; else mount -t tmpfs tmpfs /run; fi
mkdir -p /run/systemd/system
export XDG_RUNTIME_DIR=%[1]s/runtime XDG_CONFIG_HOME=%[1]s/config
%[2]s --user >%[1]s/manager.log 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null || true' EXIT
i=0
while [ ! -S $XDG_RUNTIME_DIR/bus ]; do i=$((i+1)); [ $i -lt 200 ] || { echo "user manager did not start"; cat %[1]s/manager.log; exit 1; }; sleep 0.05; done
export DBUS_SESSION_BUS_ADDRESS=unix:path=$XDG_RUNTIME_DIR/bus
`, root, manager)
	// One start for all word units (systemd runs the jobs in parallel and
	// waits for all), one show for all rendered units.
	sh.WriteString("systemctl --user start")
	for name := range words {
		sh.WriteString(" " + name + ".service")
	}
	fmt.Fprintf(&sh, "\nsystemctl --user show -p Id -p Description")
	for name := range descs {
		sh.WriteString(" " + name)
	}
	fmt.Fprintf(&sh, " > %s/show.txt\n", outDir)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "unshare", "-m", "--propagation", "private", "sh", "-c", sh.String())
	// On timeout, kill the whole group, the user manager included.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 5 * time.Second
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("user manager run: %v\n%s", err, out)
	}

	for name, s := range words {
		args, err1 := os.ReadFile(filepath.Join(outDir, name+".args"))
		env, err2 := os.ReadFile(filepath.Join(outDir, name+".env"))
		if err1 != nil || err2 != nil {
			t.Errorf("%q: no output (%v, %v)", s, err1, err2)
			continue
		}
		if want := s + "\x00" + s + "\x00"; string(args) != want {
			t.Errorf("ExecStart word %q: the process got %q", s, args)
		}
		if string(env) != s {
			t.Errorf("Environment value %q: the process got %q", s, env)
		}
	}
	show, err := os.ReadFile(filepath.Join(outDir, "show.txt"))
	if err != nil {
		t.Fatal(err)
	}
	shown := map[string]string{}
	for _, block := range strings.Split(strings.TrimSpace(string(show)), "\n\n") {
		var id, desc string
		for _, line := range strings.Split(block, "\n") {
			if v, ok := strings.CutPrefix(line, "Id="); ok {
				id = v
			} else if v, ok := strings.CutPrefix(line, "Description="); ok {
				desc = v
			}
		}
		shown[id] = desc
	}
	for name, want := range descs {
		got, ok := shown[name]
		if !ok {
			t.Errorf("%s: not shown by systemctl", name)
		} else if got != want {
			t.Errorf("%s: systemd shows Description=%q, want %q", name, got, want)
		}
	}
	if len(words) < 20 || len(descs) < 20 {
		t.Errorf("only %d words and %d unit files checked", len(words), len(descs))
	}
}
