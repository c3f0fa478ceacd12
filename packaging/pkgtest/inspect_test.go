package pkgtest

import (
	"bytes"
	"debug/elf"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/drover/drover/internal/testkit"
	"github.com/drover/drover/packaging"
)

// entry is one path in a package: its permission string as ls shows it,
// owner and group.
type entry struct{ mode, owner, group string }

// expected lists every path each package carries (directories only where
// the package sets them; implicit parents must be root:root 0755).
func expected(pkg, format string) map[string]entry {
	f := func(mode string) entry { return entry{mode, "root", "root"} }
	m := expectedFiles(pkg, format)
	// Licence, changelog and lintian's overrides (packaging/debian).
	if format == "deb" {
		m["/usr/share/doc/"+pkg+"/copyright"] = f("-rw-r--r--")
		m["/usr/share/doc/"+pkg+"/changelog.Debian.gz"] = entry{"-rw-r--r--", "0", "0"} // nfpm writes it without owner names
		m["/usr/share/lintian/overrides/"+pkg] = f("-rw-r--r--")
		m["/usr/share/doc/"+pkg+"/go-modules-licenses"] = f("-rw-r--r--")
	} else {
		m["/usr/share/licenses/"+pkg+"/copyright"] = f("-rw-r--r--")
		m["/usr/share/licenses/"+pkg+"/go-modules-licenses"] = f("-rw-r--r--")
	}
	return m
}

func expectedFiles(pkg, format string) map[string]entry {
	f := func(mode string) entry { return entry{mode, "root", "root"} }
	switch pkg {
	case "drover-agent":
		return map[string]entry{
			"/usr/bin/drover-agent":                        f("-rwxr-xr-x"),
			"/usr/lib/systemd/system/drover-agent.service": f("-rw-r--r--"),
			"/etc/drover":                           f("drwxr-xr-x"),
			"/etc/drover/agent.yaml":                f("-rw-r--r--"),
			"/var/lib/drover":                       f("drwx------"),
			"/usr/share/man/man8/drover-agent.8.gz": f("-rw-r--r--"),
			"/usr/share/doc/drover-agent/README.md": f("-rw-r--r--"),
		}
	case "drover-server":
		return map[string]entry{
			"/usr/bin/drover-server":                        f("-rwxr-xr-x"),
			"/usr/lib/systemd/system/drover-server.service": f("-rw-r--r--"),
			"/usr/lib/sysusers.d/drover-server.conf":        f("-rw-r--r--"),
			"/etc/drover-server":                            {"drwxr-x---", "root", "drover"},
			"/etc/drover-server/server.yaml":                {"-rw-r-----", "root", "drover"},
			"/var/lib/drover-server":                        {"drwx------", "drover", "drover"},
			"/usr/share/man/man8/drover-server.8.gz":        f("-rw-r--r--"),
			"/usr/share/doc/drover-server/README.md":        f("-rw-r--r--"),
		}
	default:
		zsh := "/usr/share/zsh/vendor-completions/_droverctl"
		if format == "rpm" {
			zsh = "/usr/share/zsh/site-functions/_droverctl"
		}
		return map[string]entry{
			"/usr/bin/droverctl": f("-rwxr-xr-x"),
			"/usr/share/bash-completion/completions/droverctl": f("-rw-r--r--"),
			zsh: f("-rw-r--r--"),
			"/usr/share/fish/vendor_completions.d/droverctl.fish": f("-rw-r--r--"),
			"/usr/share/man/man1/droverctl.1.gz":                  f("-rw-r--r--"),
		}
	}
}

var conffiles = map[string]string{
	"drover-agent":  "/etc/drover/agent.yaml",
	"drover-server": "/etc/drover-server/server.yaml",
	"droverctl":     "",
}

var debScripts = map[string]string{
	"drover-agent":  "postinst postrm prerm",
	"drover-server": "postinst postrm preinst prerm",
	"droverctl":     "",
}

// rpmRequires are each RPM's Requires besides rpmlib(...): sh for the
// scriptlets, systemd (systemd-sysusers) for the server's user.
var rpmRequires = map[string]string{
	"drover-agent":  "/bin/sh",
	"drover-server": "/bin/sh systemd",
	"droverctl":     "",
}

var rpmScripts = map[string][]string{
	"drover-agent":  {"postinstall", "preuninstall", "postuninstall"},
	"drover-server": {"preinstall", "postinstall", "preuninstall", "postuninstall"},
	"droverctl":     nil,
}

func run(t testing.TB, name string, args ...string) string {
	t.Helper()
	var stdout, stderr bytes.Buffer
	cmd := exec.Command(name, args...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s %s: %v\n%s%s", name, strings.Join(args, " "), err, stdout.String(), stderr.String())
	}
	return stdout.String()
}

func debArch(goarch string) string { return goarch }

func rpmArch(goarch string) string {
	return map[string]string{"amd64": "x86_64", "arm64": "aarch64"}[goarch]
}

func elfMachine(goarch string) elf.Machine {
	return map[string]elf.Machine{"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64}[goarch]
}

// TestDebs inspects every .deb with dpkg-deb: control fields, conffiles,
// maintainer scripts, the exact file list with modes and owners, and the
// binaries' architecture.
func TestDebs(t *testing.T) {
	testkit.RequireCommand(t, "dpkg-deb", "Debian package dpkg; `make deps` installs it")
	dir, ix := packages(t)
	for _, arch := range packaging.Arches {
		for _, pkg := range packaging.Packages {
			t.Run(pkg+"_"+arch, func(t *testing.T) {
				deb := ix.Path(dir, pkg, arch, "deb")
				info := run(t, "dpkg-deb", "--info", deb)
				field := func(name string) string {
					return strings.TrimSpace(run(t, "dpkg-deb", "--field", deb, name))
				}
				for name, want := range map[string]string{
					"Package": pkg, "Version": ix.Version + "-1", "Architecture": debArch(arch), "Section": "admin",
				} {
					if got := field(name); got != want {
						t.Errorf("%s: %q, want %q", name, got, want)
					}
				}
				if got, want := field("Depends"), map[string]string{"drover-server": "systemd-sysusers | passwd"}[pkg]; got != want {
					t.Errorf("Depends: %q, want %q", got, want)
				}
				if pkg == "drover-agent" {
					if got := field("Recommends"); got != "systemd, libnss-systemd" {
						t.Errorf("Recommends: %q, want systemd, libnss-systemd (dynamic users' names)", got)
					}
				}
				if field("Maintainer") == "" || field("Description") == "" {
					t.Errorf("no Maintainer or Description:\n%s", info)
				}
				ctrl := t.TempDir()
				run(t, "dpkg-deb", "--control", deb, ctrl)
				var scripts []string
				for _, s := range []string{"preinst", "postinst", "prerm", "postrm"} {
					if fi, err := os.Stat(filepath.Join(ctrl, s)); err == nil {
						scripts = append(scripts, s)
						if fi.Mode().Perm() != 0o755 {
							t.Errorf("%s mode %v", s, fi.Mode())
						}
					}
				}
				sort.Strings(scripts)
				if got := strings.Join(scripts, " "); got != debScripts[pkg] {
					t.Errorf("maintainer scripts %q, want %q", got, debScripts[pkg])
				}
				cf, _ := os.ReadFile(filepath.Join(ctrl, "conffiles"))
				if got := strings.TrimSpace(string(cf)); got != conffiles[pkg] {
					t.Errorf("conffiles %q, want %q", got, conffiles[pkg])
				}
				checkScriptsContent(t, ctrl, pkg)

				got := debContents(t, deb)
				checkEntries(t, got, expected(pkg, "deb"), true)

				bin := map[string]string{"drover-agent": "drover-agent", "drover-server": "drover-server", "droverctl": "droverctl"}[pkg]
				data := run(t, "sh", "-c", `dpkg-deb --fsys-tarfile "$1" | tar -xO "./usr/bin/$2"`, "sh", deb, bin)
				checkELF(t, []byte(data), arch)

				// The notices of what is linked into the binary travel with it.
				lic := run(t, "sh", "-c", `dpkg-deb --fsys-tarfile "$1" | tar -xO "./usr/share/doc/$2/go-modules-licenses"`, "sh", deb, pkg)
				for _, want := range []string{"Go standard library and runtime", "github.com/spf13/cobra", "Redistribution and use in source and binary forms", "Apache License"} {
					if !strings.Contains(lic, want) {
						t.Errorf("go-modules-licenses lacks %q", want)
					}
				}
			})
		}
	}
}

// checkScriptsContent spot-checks the scripts' duties.
func checkScriptsContent(t *testing.T, ctrl, pkg string) {
	read := func(s string) string { b, _ := os.ReadFile(filepath.Join(ctrl, s)); return string(b) }
	switch pkg {
	case "drover-agent":
		post, prerm, postrm := read("postinst"), read("prerm"), read("postrm")
		for _, want := range []string{"deb-systemd-helper enable", "deb-systemd-invoke", "restart", "/run/systemd/system"} {
			if !strings.Contains(post, want) {
				t.Errorf("postinst lacks %q", want)
			}
		}
		for _, s := range []string{prerm, postrm} {
			if !strings.Contains(s, "drover_header='# Managed by drover-agent. Local changes are overwritten.'") {
				t.Error("prerm/postrm lack the managed header rule")
			}
		}
		if !strings.Contains(postrm, "purge)") || !strings.Contains(postrm, "rm -rf /var/lib/drover ") {
			t.Error("postrm does not purge /var/lib/drover")
		}
	case "drover-server":
		if !strings.Contains(read("preinst"), "drover_create_user") || !strings.Contains(read("preinst"), "systemd-sysusers") {
			t.Error("preinst does not create the user")
		}
		if !strings.Contains(read("postrm"), "rm -rf /var/lib/drover-server") {
			t.Error("postrm does not purge /var/lib/drover-server")
		}
		// The conffile's owner and mode are dpkg's (set at unpack, an
		// admin's change kept): configure does not touch them.
		for _, line := range strings.Split(read("postinst"), "\n") {
			if (strings.HasPrefix(strings.TrimSpace(line), "chmod") || strings.HasPrefix(strings.TrimSpace(line), "chown")) && strings.Contains(line, "server.yaml") {
				t.Errorf("postinst resets the conffile: %q", line)
			}
		}
		// Users are made with systemd-sysusers or useradd (Depends:
		// systemd-sysusers | passwd), never adduser.
		for _, sc := range []string{"preinst", "postinst"} {
			if strings.Contains(read(sc), "adduser") {
				t.Errorf("%s uses adduser, which the package does not depend on", sc)
			}
		}
	}
}

// debContents parses dpkg-deb --contents into path -> entry.
func debContents(t *testing.T, deb string) map[string]entry {
	out := map[string]entry{}
	for _, line := range strings.Split(strings.TrimSpace(run(t, "dpkg-deb", "--contents", deb)), "\n") {
		// drwxr-x--- root/drover 0 2026-11-30 13:22 ./etc/drover-server/
		f := strings.Fields(line)
		if len(f) < 6 {
			t.Fatalf("dpkg-deb --contents line %q", line)
		}
		owner, group, _ := strings.Cut(f[1], "/")
		p := strings.TrimSuffix(strings.TrimPrefix(f[5], "."), "/")
		if p == "" {
			continue
		}
		out[p] = entry{f[0], owner, group}
	}
	return out
}

// checkEntries compares a package's entries with want. With implicitDirs,
// directories not in want must be root:root 0755 parents.
func checkEntries(t *testing.T, got, want map[string]entry, implicitDirs bool) {
	t.Helper()
	for p, w := range want {
		g, ok := got[p]
		if !ok {
			t.Errorf("missing %s", p)
			continue
		}
		if g != w {
			t.Errorf("%s: %s %s:%s, want %s %s:%s", p, g.mode, g.owner, g.group, w.mode, w.owner, w.group)
		}
	}
	for p, g := range got {
		if _, ok := want[p]; ok {
			continue
		}
		if implicitDirs && strings.HasPrefix(g.mode, "d") && g == (entry{"drwxr-xr-x", "root", "root"}) {
			continue
		}
		t.Errorf("unexpected %s (%s %s:%s)", p, g.mode, g.owner, g.group)
	}
}

func checkELF(t *testing.T, data []byte, arch string) {
	t.Helper()
	f, err := elf.NewFile(bytes.NewReader(data))
	if err != nil {
		t.Fatalf("binary is not ELF: %v", err)
	}
	if f.Machine != elfMachine(arch) {
		t.Errorf("binary for %v, want %v", f.Machine, elfMachine(arch))
	}
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			t.Error("binary is dynamically linked (CGO_ENABLED=0 builds are static)")
		}
	}
}

// TestRPMs inspects every .rpm with rpm -qp: header fields, the exact
// file list with modes and owners (rpm -qplv), config files marked
// %config(noreplace), and the scriptlets (rpm -qp --scripts).
func TestRPMs(t *testing.T) {
	testkit.RequireCommand(t, "rpm", "Debian package rpm; `make deps` installs it")
	dir, ix := packages(t)
	for _, arch := range packaging.Arches {
		for _, pkg := range packaging.Packages {
			t.Run(pkg+"_"+arch, func(t *testing.T) {
				rpm := ix.Path(dir, pkg, arch, "rpm")
				hdr := run(t, "rpm", "-qp", "--qf", "%{NAME}|%{VERSION}|%{RELEASE}|%{ARCH}|%{OS}|%{SUMMARY}|%{GROUP}\n", rpm)
				want := fmt.Sprintf("%s|%s|1|%s|linux|", pkg, ix.Version, rpmArch(arch))
				if !strings.HasPrefix(hdr, want) {
					t.Errorf("header %q, want prefix %q", hdr, want)
				}
				if got := run(t, "rpm", "-qp", "--qf", "%{LICENSE}", rpm); got != "LicenseRef-Drover-Proprietary" {
					t.Errorf("License %q", got)
				}
				var reqs []string
				for _, r := range strings.Split(strings.TrimSpace(run(t, "rpm", "-qpR", rpm)), "\n") {
					if !strings.HasPrefix(r, "rpmlib(") && r != "" {
						reqs = append(reqs, r)
					}
				}
				if got, want := strings.Join(reqs, " "), rpmRequires[pkg]; got != want {
					t.Errorf("Requires %q, want %q", got, want)
				}
				if log := run(t, "rpm", "-qp", "--changelog", rpm); !strings.Contains(log, "Drover developers <drover@drover.invalid> - "+ix.Version+"-1\n") {
					t.Errorf("%%changelog lacks this version's entry:\n%s", log)
				}
				info := run(t, "rpm", "-qpi", rpm)
				if !strings.Contains(info, "Description :") {
					t.Errorf("rpm -qpi:\n%s", info)
				}
				got := rpmContents(t, rpm)
				checkEntries(t, got, expected(pkg, "rpm"), false)

				flags := run(t, "rpm", "-qp", "--qf", "[%{FILEFLAGS:fflags}|%{FILENAMES}\n]", rpm)
				var cfg []string
				for _, line := range strings.Split(strings.TrimSpace(flags), "\n") {
					fl, name, _ := strings.Cut(line, "|")
					if strings.Contains(fl, "c") {
						cfg = append(cfg, name)
						if !strings.Contains(fl, "n") {
							t.Errorf("%s is %%config without noreplace (%s)", name, fl)
						}
					}
				}
				if got := strings.Join(cfg, " "); got != conffiles[pkg] {
					t.Errorf("config files %q, want %q", got, conffiles[pkg])
				}
				scripts := run(t, "rpm", "-qp", "--scripts", rpm)
				var have []string
				for _, s := range []string{"preinstall", "postinstall", "preuninstall", "postuninstall"} {
					if strings.Contains(scripts, s+" scriptlet (using /bin/sh)") {
						have = append(have, s)
					}
				}
				sort.Strings(have)
				wantScripts := append([]string{}, rpmScripts[pkg]...)
				sort.Strings(wantScripts)
				if strings.Join(have, " ") != strings.Join(wantScripts, " ") {
					t.Errorf("scriptlets %v, want %v\n%s", have, wantScripts, scripts)
				}
				if pkg == "drover-agent" && !strings.Contains(scripts, "# Managed by drover-agent. Local changes are overwritten.") {
					t.Error("the agent's preuninstall scriptlet lacks the managed header rule")
				}
			})
		}
	}
}

// rpmContents parses rpm -qplv into path -> entry.
func rpmContents(t *testing.T, rpm string) map[string]entry {
	out := map[string]entry{}
	for _, line := range strings.Split(strings.TrimSpace(run(t, "rpm", "-qplv", rpm)), "\n") {
		// drwxr-x---    2 root     drover     0 Nov 30 13:22 /etc/drover-server
		f := strings.Fields(line)
		if len(f) < 9 {
			t.Fatalf("rpm -qplv line %q", line)
		}
		out[f[len(f)-1]] = entry{f[0], f[2], f[3]}
	}
	return out
}

// TestGenerated checks what the build generated: man pages render without
// warnings and carry each command's help; the completion scripts load.
func TestGenerated(t *testing.T) {
	testkit.RequireCommand(t, "dpkg-deb", "Debian package dpkg; `make deps` installs it")
	dir, ix := packages(t)
	root := t.TempDir()
	for _, pkg := range packaging.Packages {
		run(t, "dpkg-deb", "-x", ix.Path(dir, pkg, "amd64", "deb"), root)
	}
	if man, err := exec.LookPath("man"); err == nil {
		for page, wants := range map[string][]string{
			"usr/share/man/man8/drover-agent.8.gz":  {"DROVER-AGENT(8)", "drover-agent run", "/etc/drover/enroll.token", "FILES"},
			"usr/share/man/man8/drover-server.8.gz": {"DROVER-SERVER(8)", "tokens create", "admin.token"},
			"usr/share/man/man1/droverctl.1.gz":     {"DROVERCTL(1)", "droverctl completion", "droverctl schedule"},
		} {
			cmd := exec.Command(man, "--warnings", "-l", filepath.Join(root, page))
			cmd.Env = append(os.Environ(), "MANWIDTH=100", "PAGER=cat")
			var stdout, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			if err := cmd.Run(); err != nil || stderr.Len() > 0 {
				t.Errorf("man %s: %v\n%s", page, err, stderr.String())
			}
			text := strings.ReplaceAll(stdout.String(), "\u2010", "-") // groff's hyphen
			for _, w := range wants {
				if !strings.Contains(text, w) {
					t.Errorf("man %s lacks %q", page, w)
				}
			}
		}
	} else {
		t.Log("man is not installed: man pages not rendered")
	}
	bash := filepath.Join(root, "usr/share/bash-completion/completions/droverctl")
	out := run(t, "bash", "-c", `source "$1" && complete -p droverctl`, "bash", bash)
	if !strings.Contains(out, "droverctl") {
		t.Errorf("bash completion registers: %q", out)
	}
	zsh, _ := os.ReadFile(filepath.Join(root, "usr/share/zsh/vendor-completions/_droverctl"))
	if !bytes.HasPrefix(zsh, []byte("#compdef droverctl")) {
		t.Errorf("zsh completion starts %q", zsh[:min(len(zsh), 40)])
	}
	fish, _ := os.ReadFile(filepath.Join(root, "usr/share/fish/vendor_completions.d/droverctl.fish"))
	if !bytes.Contains(fish, []byte("complete -c droverctl")) {
		t.Error("fish completion does not complete droverctl")
	}
	// The unit files in the package verify with the packaged binaries.
	if sa, err := exec.LookPath("systemd-analyze"); err == nil {
		for _, u := range []string{"drover-agent", "drover-server"} {
			unit, err := os.ReadFile(filepath.Join(root, "usr/lib/systemd/system", u+".service"))
			if err != nil {
				t.Fatal(err)
			}
			unit = bytes.ReplaceAll(unit, []byte("/usr/bin/"+u), []byte(filepath.Join(root, "usr/bin", u)))
			unit = bytes.ReplaceAll(unit, []byte("man:"+u+"(8) "), nil)
			p := filepath.Join(t.TempDir(), u+".service")
			os.WriteFile(p, unit, 0o644)
			if out, err := exec.Command(sa, "verify", "--man=no", p).CombinedOutput(); err != nil || len(bytes.TrimSpace(out)) > 0 {
				t.Errorf("systemd-analyze verify %s: %v\n%s", u, err, out)
			}
		}
	}
}
