package boottest

import (
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestMirrorFrom(t *testing.T) {
	dir := t.TempDir()
	oneLine := filepath.Join(dir, "sources.list")
	os.WriteFile(oneLine, []byte("# comment\ndeb [arch=amd64 signed-by=/k.gpg] http://mirror.example/debian/ bookworm main\n"), 0o644)
	if got := mirrorFrom(oneLine); got != "http://mirror.example/debian" {
		t.Errorf("one-line: %q", got)
	}
	deb822 := filepath.Join(dir, "debian.sources")
	os.WriteFile(deb822, []byte("Types: deb\nURIs: http://deb.debian.org/debian-security\nSuites: bookworm-security\n\nTypes: deb\nURIs: https://ftp.example.org/debian\nSuites: bookworm\n"), 0o644)
	if got := mirrorFrom(deb822); got != "https://ftp.example.org/debian" {
		t.Errorf("deb822: %q", got)
	}
	other := filepath.Join(dir, "other.list")
	os.WriteFile(other, []byte("deb http://packages.example.com/apt stable main\n"), 0o644)
	if got := mirrorFrom(other); got != "" {
		t.Errorf("non-Debian archive: %q", got)
	}
}

// TestBoot boots a container and proves what the system-scope tests rely
// on: a running PID-1 systemd, files copied in, and a transient service
// with a dynamic user, strict sandboxing and a credential.
func TestBoot(t *testing.T) {
	c := Boot(t, Options{})
	if !strings.HasPrefix(c.State, "running") && !strings.HasPrefix(c.State, "degraded") {
		t.Fatalf("state %q", c.State)
	}
	if got := strings.TrimSpace(c.Exec(t, "cat", "/proc/1/comm")); got != "systemd" {
		t.Fatalf("PID 1 inside is %q", got)
	}
	if got := strings.TrimSpace(c.Exec(t, "systemd-detect-virt", "--container")); got != "systemd-nspawn" {
		t.Errorf("systemd-detect-virt: %q", got)
	}

	src := filepath.Join(t.TempDir(), "pw")
	if err := os.WriteFile(src, []byte("s3cret"), 0o600); err != nil {
		t.Fatal(err)
	}
	c.CopyIn(t, src, "/root/pw")
	if got := string(c.ReadFile(t, "/root/pw")); got != "s3cret" {
		t.Fatalf("copied file reads %q", got)
	}
	if got := strings.TrimSpace(c.Exec(t, "stat", "-c", "%a %U", "/root/pw")); got != "600 root" {
		t.Errorf("copied file mode/owner %q", got)
	}

	out := c.Exec(t, "systemd-run", "--wait", "--pipe", "--quiet",
		"-p", "DynamicUser=yes", "-p", "ProtectSystem=strict", "-p", "PrivateTmp=yes",
		"-p", "LoadCredential=PW:/root/pw",
		"/bin/sh", "-c", `echo uid=$(id -u); cat "$CREDENTIALS_DIRECTORY/PW"`)
	if !strings.Contains(out, "s3cret") || strings.Contains(out, "uid=0\n") || !strings.Contains(out, "uid=") {
		t.Fatalf("transient hardened service printed %q", out)
	}
	t.Logf("hardened transient service: %q", out)

	// The container's writes never reach the cached root.
	c.WriteFile(t, "/etc/drover-boottest-probe", []byte("x"), 0o644)
	if _, err := os.Stat(filepath.Join(RootfsPath(), "etc/drover-boottest-probe")); err == nil {
		t.Fatal("a write inside the container reached the cached root")
	}
}

// TestParallelBoots boots two containers at once: each has its own PID 1,
// cgroup and root.
func TestParallelBoots(t *testing.T) {
	if testing.Short() {
		t.Skip("short")
	}
	if err := Available(); err != nil {
		unavailable(t, "%v", err)
	}
	cs := make([]*Container, 2)
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for i := range cs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cs[i], errs[i] = Start(t.Context(), Options{PrivateNetwork: i == 1})
		}()
	}
	wg.Wait()
	for i, c := range cs {
		if errs[i] != nil {
			t.Fatalf("container %d: %v", i, errs[i])
		}
		t.Cleanup(func() { c.Stop() })
		t.Logf("%s booted in %s (prepared in %s)", c.Name, c.BootTime.Round(time.Millisecond), c.Prepare.Round(time.Millisecond))
	}
	if cs[0].PID == cs[1].PID {
		t.Fatal("same PID 1")
	}
	cs[0].WriteFile(t, "/root/which", []byte("zero"), 0o644)
	if _, _, err := cs[1].Output(t.Context(), "test", "-e", "/root/which"); err == nil {
		t.Fatal("a file written in one container shows in the other")
	}
	// Each container's systemd sees only its own processes.
	for _, c := range cs {
		n := strings.Count(c.Exec(t, "systemctl", "list-units", "--type=service", "--state=running", "--no-legend", "--plain"), "\n")
		if n == 0 || n > 20 {
			t.Errorf("%s: %d running services", c.Name, n)
		}
	}
}
