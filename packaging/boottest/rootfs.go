package boottest

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// Suite and Includes are what the cached root is debootstrapped from.
const (
	Suite    = "bookworm"
	Includes = "systemd,dbus,systemd-sysv"
)

// DefaultCacheDir holds the cached root, outside any repository.
const DefaultCacheDir = "/var/cache/drover-test"

// rootfsFormat changes whenever the cached root must be rebuilt: a root whose
// marker differs is replaced.
const rootfsFormat = "drover-boottest rootfs v1: debootstrap --variant=minbase --include=" + Includes + " " + Suite

const markerFile = ".drover-boottest"

// CacheDir returns the directory that holds the cached root and its lock.
func CacheDir() string {
	if d := os.Getenv("DROVER_BOOTTEST_CACHE"); d != "" {
		return d
	}
	return DefaultCacheDir
}

// RootfsPath is where the cached root lives once built.
func RootfsPath() string { return filepath.Join(CacheDir(), Suite+"-rootfs") }

func lockPath() string { return RootfsPath() + ".lock" }

// BuildStats tells what EnsureRootfs did.
type BuildStats struct {
	Built    bool          // false: the cached root was reused
	Duration time.Duration // how long the debootstrap (and rename) took
	Mirror   string
}

// rootfsOK reports whether dir is a complete root of the current format.
func rootfsOK(dir string) bool {
	b, err := os.ReadFile(filepath.Join(dir, markerFile))
	return err == nil && strings.TrimSpace(string(b)) == rootfsFormat
}

// lockFile opens the lock and takes it (how = syscall.LOCK_SH or LOCK_EX).
// Closing the file releases it.
func lockFile(ctx context.Context, how int) (*os.File, error) {
	if err := os.MkdirAll(CacheDir(), 0o755); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(lockPath(), os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, err
	}
	for {
		err := syscall.Flock(int(f.Fd()), how|syscall.LOCK_NB)
		if err == nil {
			return f, nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) && !errors.Is(err, syscall.EINTR) {
			f.Close()
			return nil, fmt.Errorf("lock %s: %w", lockPath(), err)
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, fmt.Errorf("waiting for lock %s: %w", lockPath(), ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// EnsureRootfs builds the cached root when it is missing or stale and
// returns the lock held shared: keep it open while a container uses the
// root, close it afterwards. logf receives progress lines.
func EnsureRootfs(ctx context.Context, logf func(string, ...any)) (*os.File, BuildStats, error) {
	var st BuildStats
	shared, err := lockFile(ctx, syscall.LOCK_SH)
	if err != nil {
		return nil, st, err
	}
	if rootfsOK(RootfsPath()) {
		return shared, st, nil
	}
	shared.Close()

	excl, err := lockFile(ctx, syscall.LOCK_EX)
	if err != nil {
		return nil, st, err
	}
	if !rootfsOK(RootfsPath()) { // another binary may have built it meanwhile
		st, err = buildRootfs(ctx, logf)
		if err != nil {
			excl.Close()
			return nil, st, err
		}
	}
	excl.Close() // a waiting builder would find it complete; shared holders wait no longer
	shared, err = lockFile(ctx, syscall.LOCK_SH)
	if err != nil {
		return nil, st, err
	}
	if !rootfsOK(RootfsPath()) {
		shared.Close()
		return nil, st, errors.New("cached root vanished after it was built")
	}
	return shared, st, nil
}

// buildRootfs runs debootstrap into a temporary sibling of the cache and
// renames it into place. The caller holds the lock exclusively.
func buildRootfs(ctx context.Context, logf func(string, ...any)) (BuildStats, error) {
	st := BuildStats{Built: true, Mirror: Mirror()}
	if err := ensureCommand("debootstrap", "debootstrap"); err != nil {
		return st, err
	}
	final := RootfsPath()
	// Leftovers of interrupted builds, and a stale root of an older format.
	olds, _ := filepath.Glob(final + ".tmp-*")
	if _, err := os.Stat(final); err == nil {
		aside := fmt.Sprintf("%s.tmp-stale-%d", final, os.Getpid())
		if err := os.Rename(final, aside); err != nil {
			return st, err
		}
		olds = append(olds, aside)
	}
	for _, o := range olds {
		if err := os.RemoveAll(o); err != nil {
			return st, fmt.Errorf("remove %s: %w", o, err)
		}
	}
	tmp := fmt.Sprintf("%s.tmp-%d", final, os.Getpid())
	logf("boottest: building the cached %s root in %s from %s (once per machine; minutes)", Suite, final, st.Mirror)
	start := time.Now()
	cmd := exec.CommandContext(ctx, "debootstrap", "--variant=minbase", "--include="+Includes, Suite, tmp, st.Mirror)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.Env = cleanEnv()
	if err := cmd.Run(); err != nil {
		os.RemoveAll(tmp)
		return st, fmt.Errorf("debootstrap: %v\n%s", err, tail(out.String(), 3000))
	}
	if err := finishRootfs(tmp); err != nil {
		os.RemoveAll(tmp)
		return st, err
	}
	if err := os.Rename(tmp, final); err != nil {
		os.RemoveAll(tmp)
		return st, err
	}
	st.Duration = time.Since(start)
	logf("boottest: cached root built in %s", st.Duration.Round(100*time.Millisecond))
	return st, nil
}

// finishRootfs trims the fresh root and marks it complete.
func finishRootfs(root string) error {
	// Downloaded .debs are not needed again.
	debs, _ := filepath.Glob(filepath.Join(root, "var/cache/apt/archives/*.deb"))
	for _, d := range debs {
		os.Remove(d)
	}
	// Each container gets its own machine id at boot (an empty file makes
	// systemd generate a transient one).
	if err := os.WriteFile(filepath.Join(root, "etc/machine-id"), nil, 0o444); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(root, "etc/hostname"), []byte("drover-boottest\n"), 0o644); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(root, markerFile), []byte(rootfsFormat+"\n"), 0o644)
}

// Mirror is the Debian archive debootstrap downloads from: $DROVER_BOOTTEST_MIRROR,
// else the first Debian (non-security) archive configured for apt on this
// host, else deb.debian.org.
func Mirror() string {
	if m := os.Getenv("DROVER_BOOTTEST_MIRROR"); m != "" {
		return m
	}
	files := []string{"/etc/apt/sources.list"}
	more, _ := filepath.Glob("/etc/apt/sources.list.d/*.list")
	files = append(files, more...)
	more, _ = filepath.Glob("/etc/apt/sources.list.d/*.sources")
	files = append(files, more...)
	for _, f := range files {
		if m := mirrorFrom(f); m != "" {
			return m
		}
	}
	return "http://deb.debian.org/debian"
}

// mirrorFrom returns the first Debian archive URI of an apt sources file
// (one-line or deb822 format), skipping security and non-Debian archives.
func mirrorFrom(path string) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	good := func(u string) bool {
		return (strings.HasPrefix(u, "http://") || strings.HasPrefix(u, "https://")) &&
			strings.HasSuffix(strings.TrimSuffix(u, "/"), "/debian")
	}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		fields := strings.Fields(line)
		switch {
		case fields[0] == "deb":
			rest := fields[1:]
			if len(rest) > 0 && strings.HasPrefix(rest[0], "[") { // [option=value ...]
				for len(rest) > 0 && !strings.HasSuffix(rest[0], "]") {
					rest = rest[1:]
				}
				if len(rest) > 0 {
					rest = rest[1:]
				}
			}
			if len(rest) > 0 && good(rest[0]) {
				return strings.TrimSuffix(rest[0], "/")
			}
		case strings.EqualFold(fields[0], "URIs:"):
			for _, w := range fields[1:] {
				if good(w) {
					return strings.TrimSuffix(w, "/")
				}
			}
		}
	}
	return ""
}

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "…" + s[len(s)-n:]
}
