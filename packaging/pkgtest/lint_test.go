package pkgtest

import (
	"bufio"
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/drover/drover/internal/testkit"
	"github.com/drover/drover/packaging"
)

// The packages pass their ecosystems' own linters, as distributions and
// users run them: lintian on the .debs and rpmlint on the RPMs, with no
// error and every remaining finding covered by an override whose reason is
// written above it (packaging/debian/*.lintian-overrides, shipped in the
// packages; packaging/rpmlint.toml). A finding nothing covers fails, and so
// does an override that matches nothing.

// unprivileged prepares to run a linter as nobody when the tests run as
// root: lintian warns against root, and rpmlint unpacks payloads with
// `rpm2cpio | cpio -id`, which as root writes wherever the members' names
// point. It returns a directory nobody may write (for copies of the
// packages and the linters' temporary files) and the credential to use
// (nil when not root).
func unprivileged(t *testing.T) (string, *syscall.SysProcAttr) {
	t.Helper()
	if os.Geteuid() != 0 {
		return t.TempDir(), nil
	}
	// Directly in /tmp: t.TempDir's parent is root's alone (0700).
	dir, err := os.MkdirTemp("", "drover-lint-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	const nobody = 65534
	if err := os.Chown(dir, nobody, nobody); err != nil {
		t.Fatal(err)
	}
	return dir, &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: nobody, Gid: nobody}}
}

// copyFor copies the files into dir, readable by whoever runs the linter.
func copyFor(t *testing.T, dir string, files []string) []string {
	t.Helper()
	var out []string
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		dst := filepath.Join(dir, filepath.Base(f))
		if err := os.WriteFile(dst, b, 0o644); err != nil {
			t.Fatal(err)
		}
		out = append(out, dst)
	}
	return out
}

// lint runs a linter in dir (as nobody when root) and returns its output;
// the exit status is the caller's to judge from the output.
func lint(t *testing.T, dir string, attr *syscall.SysProcAttr, name string, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	cmd.SysProcAttr = attr
	cmd.Env = []string{"PATH=/usr/bin:/bin:/usr/sbin:/sbin", "HOME=" + dir, "TMPDIR=" + dir, "LANG=C.UTF-8", "XDG_CONFIG_HOME=" + dir}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	if ctx.Err() != nil {
		t.Fatalf("%s timed out:\n%s", name, out.String())
	}
	return out.String(), err
}

// lintianLine is one finding: "E: drover-agent: no-copyright-file".
var lintianLine = regexp.MustCompile(`^([EWIPXCMO]): ([a-z0-9.+-]+)(?: [a-z]+)?: ([a-z0-9.+-]+)(?: (.*))?$`)

func TestLintian(t *testing.T) {
	testkit.RequireCommand(t, "lintian", "Debian package lintian; `make deps` installs it")
	checkOverrideReasons(t)
	dir, ix := packages(t)
	for _, arch := range packaging.Arches {
		t.Run(arch, func(t *testing.T) {
			work, attr := unprivileged(t)
			var debs []string
			for _, pkg := range packaging.Packages {
				debs = append(debs, ix.Path(dir, pkg, arch, "deb"))
			}
			debs = copyFor(t, work, debs)
			// --display-info and --pedantic show every finding; the
			// overrides shipped in each package apply as they do for users.
			out, err := lint(t, work, attr, "lintian", append([]string{"--display-info", "--pedantic", "--tag-display-limit", "0"}, debs...)...)
			bad, other := judgeLintian(out)
			if len(other) > 0 {
				t.Logf("lintian, informational (not failing):\n%s", strings.Join(other, "\n"))
			}
			if len(bad) > 0 {
				t.Errorf("lintian findings without an override with a reason in packaging/debian/<package>.lintian-overrides:\n%s", strings.Join(bad, "\n"))
			}
			if err != nil && len(bad) == 0 {
				t.Errorf("lintian: %v\n%s", err, out)
			}
		})
	}
}

// judgeLintian sorts lintian's report: bad are errors, warnings,
// experimental tags, overrides that match nothing and lines it cannot read;
// other the informational and pedantic tags left (logged, not failing).
func judgeLintian(out string) (bad, other []string) {
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		m := lintianLine.FindStringSubmatch(line)
		switch {
		case line == "" || strings.HasPrefix(line, "N:"):
		case m == nil:
			bad = append(bad, "unparsed: "+line)
		case m[1] == "E" || m[1] == "W" || m[1] == "X":
			bad = append(bad, line)
		case m[3] == "unused-override" || m[3] == "mismatched-override":
			bad = append(bad, line)
		default:
			other = append(other, line)
		}
	}
	return bad, other
}

// TestJudgeLintian: what fails the lintian test and what does not.
func TestJudgeLintian(t *testing.T) {
	bad, other := judgeLintian(`E: drover-agent: no-copyright-file
W: drover-server: maintainer-script-needs-depends-on-adduser adduser (does not satisfy adduser) [postinst:29]
I: droverctl: unused-override statically-linked-binary [usr/bin/droverctl]
I: drover-server: spelling-error-in-binary ment meant [usr/bin/drover-server]
P: drover-agent: some-pedantic-tag
N: a note
running with root privileges is not recommended!`)
	if len(bad) != 4 || !strings.HasPrefix(bad[0], "E: ") || !strings.HasPrefix(bad[1], "W: ") || !strings.Contains(bad[2], "unused-override") || !strings.HasPrefix(bad[3], "unparsed: ") {
		t.Errorf("bad %q", bad)
	}
	if len(other) != 2 {
		t.Errorf("other %q", other)
	}
	if bad, other := judgeLintian("\n"); len(bad)+len(other) != 0 {
		t.Errorf("an empty report: %q %q", bad, other)
	}
}

// checkOverrideReasons: every override line in packaging/debian has a
// comment above it (the override's reason), in its own block.
func checkOverrideReasons(t *testing.T) {
	t.Helper()
	files, _ := filepath.Glob(filepath.Join(repoRoot(t), "packaging", "debian", "*.lintian-overrides"))
	if len(files) != len(packaging.Packages) {
		t.Errorf("lintian overrides: %v, want one per package", files)
	}
	for _, f := range files {
		pkg := strings.TrimSuffix(filepath.Base(f), ".lintian-overrides")
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		reason := false
		sc := bufio.NewScanner(bytes.NewReader(b))
		for n := 1; sc.Scan(); n++ {
			line := strings.TrimSpace(sc.Text())
			switch {
			case line == "":
				reason = false
			case strings.HasPrefix(line, "#"):
				reason = true
			case !reason:
				t.Errorf("%s:%d: override %q has no reason (a comment right above it)", f, n, line)
			case !strings.HasPrefix(line, pkg+": "):
				t.Errorf("%s:%d: override %q is not for %s", f, n, line, pkg)
			}
		}
	}
}

// rpmlintFilter is one filter of packaging/rpmlint.toml with its reason.
type rpmlintFilter struct {
	re     *regexp.Regexp
	reason string
	used   bool
}

// readRpmlintFilters parses the Filters list of packaging/rpmlint.toml: one
// single-quoted regular expression a line, the comment lines above it its
// reason.
func readRpmlintFilters(t *testing.T, path string) []*rpmlintFilter {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var (
		filters []*rpmlintFilter
		in      bool
		reason  []string
	)
	for n, line := range strings.Split(string(b), "\n") {
		line = strings.TrimSpace(line)
		switch {
		case line == "Filters = [":
			in = true
		case !in:
		case line == "]":
			in = false
		case strings.HasPrefix(line, "#"):
			if len(filters) > 0 && filters[len(filters)-1].reason == strings.Join(reason, " ") {
				reason = nil // a new reason after a group of filters
			}
			reason = append(reason, strings.TrimSpace(strings.TrimPrefix(line, "#")))
		case strings.HasPrefix(line, "'") && strings.HasSuffix(line, "',"):
			re, err := regexp.Compile(strings.TrimSuffix(strings.TrimPrefix(line, "'"), "',"))
			if err != nil {
				t.Fatalf("%s:%d: %v", path, n+1, err)
			}
			if len(reason) == 0 {
				t.Errorf("%s:%d: filter %s has no reason (a comment right above it, or above the group it follows without a blank line)", path, n+1, re)
			}
			filters = append(filters, &rpmlintFilter{re: re, reason: strings.Join(reason, " ")})
		case line == "":
			reason = nil
		default:
			t.Errorf("%s:%d: cannot read %q (one quoted filter a line)", path, n+1, line)
		}
	}
	if len(filters) == 0 {
		t.Fatalf("%s: no Filters", path)
	}
	return filters
}

// coverRpmlint matches rpmlint's findings against the filters, marking
// those used, and returns how many findings there were and those no filter
// covers.
func coverRpmlint(out string, filters []*rpmlintFilter) (findings int, uncovered []string) {
	for _, line := range strings.Split(out, "\n") {
		line = strings.TrimSpace(line)
		if !rpmlintFinding.MatchString(line) {
			continue
		}
		findings++
		covered := false
		for _, f := range filters {
			if f.re.MatchString(line) {
				f.used, covered = true, true
			}
		}
		if !covered {
			uncovered = append(uncovered, line)
		}
	}
	return findings, uncovered
}

// TestCoverRpmlint: the shipped filters cover what they say and no more;
// a finding they do not name stays uncovered.
func TestCoverRpmlint(t *testing.T) {
	filters := readRpmlintFilters(t, filepath.Join(repoRoot(t), "packaging", "rpmlint.toml"))
	n, uncovered := coverRpmlint(`rpmlint: 2.4.0
drover-agent.x86_64: E: statically-linked-binary /usr/bin/drover-agent
droverctl.aarch64: E: no-signature
drover-agent.x86_64: E: non-standard-dir-perm /var/lib/drover 755
drover-server.x86_64: E: no-license
droverctl.x86_64: W: dangerous-command-in-%preun rm
 3 packages and 0 specfiles checked; 4 errors, 0 warnings`, filters)
	if n != 5 {
		t.Errorf("%d findings, want 5", n)
	}
	want := []string{
		"drover-agent.x86_64: E: non-standard-dir-perm /var/lib/drover 755", // only 700 is intended
		"drover-server.x86_64: E: no-license",
		"droverctl.x86_64: W: dangerous-command-in-%preun rm", // the agent's, not droverctl's
	}
	if strings.Join(uncovered, "\n") != strings.Join(want, "\n") {
		t.Errorf("uncovered:\n%s\nwant:\n%s", strings.Join(uncovered, "\n"), strings.Join(want, "\n"))
	}
	for _, f := range filters {
		if f.reason == "" {
			t.Errorf("filter %s has no reason", f.re)
		}
	}
}

// rpmlintFinding is one line of rpmlint's report: "pkg.arch: E: tag args".
var rpmlintFinding = regexp.MustCompile(`^[a-z0-9._+-]+\.[a-z0-9_]+: [EWI]: `)

func TestRpmlint(t *testing.T) {
	testkit.RequireCommand(t, "rpmlint", "Debian package rpmlint; `make deps` installs it")
	testkit.RequireCommand(t, "rpm2cpio", "Debian package rpm; `make deps` installs it")
	testkit.RequireCommand(t, "cpio", "Debian package cpio")
	cfg := filepath.Join(repoRoot(t), "packaging", "rpmlint.toml")
	dir, ix := packages(t)
	for _, arch := range packaging.Arches {
		t.Run(arch, func(t *testing.T) {
			var rpms []string
			for _, pkg := range packaging.Packages {
				rpms = append(rpms, ix.Path(dir, pkg, arch, "rpm"))
			}
			// First the payload: relative member names (./usr/...), else
			// the unpacking below would write into /; and the digests that
			// cover it, rewritten by the build, must verify.
			for _, rpm := range rpms {
				names := run(t, "sh", "-c", `rpm2cpio "$1" | cpio --quiet -t`, "sh", rpm)
				for _, n := range strings.Fields(names) {
					if !strings.HasPrefix(n, "./") {
						t.Fatalf("%s: payload member %q is not relative (./...): unpacking it writes outside the target directory", filepath.Base(rpm), n)
					}
				}
				if out := run(t, "rpm", "-K", "--nosignature", rpm); !strings.HasSuffix(strings.TrimSpace(out), "digests OK") {
					t.Errorf("rpm -K %s: %s", filepath.Base(rpm), out)
				}
			}
			work, attr := unprivileged(t)
			rpms = copyFor(t, work, rpms)
			filters := readRpmlintFilters(t, cfg)

			// Without the filters: every finding, each to be covered.
			out, _ := lint(t, work, attr, "rpmlint", rpms...)
			findings, uncovered := coverRpmlint(out, filters)
			if !strings.Contains(out, "3 packages and 0 specfiles checked") {
				t.Fatalf("rpmlint did not check the 3 packages:\n%s", out)
			}
			if len(uncovered) > 0 {
				t.Errorf("rpmlint findings no filter in packaging/rpmlint.toml covers:\n%s", strings.Join(uncovered, "\n"))
			}
			for _, f := range filters {
				if !f.used {
					t.Errorf("packaging/rpmlint.toml: filter %s matches nothing (remove it): %s", f.re, f.reason)
				}
			}
			t.Logf("rpmlint: %d findings, each covered by a filter with a reason", findings)

			// With the configuration, as a user runs it: a clean report.
			c := copyFor(t, work, []string{cfg})[0]
			out, err := lint(t, work, attr, "rpmlint", append([]string{"-c", c}, rpms...)...)
			if err != nil || !strings.Contains(out, "0 errors, 0 warnings") {
				t.Errorf("rpmlint -c packaging/rpmlint.toml: %v\n%s", err, out)
			}
		})
	}
}
