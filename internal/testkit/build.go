package testkit

import (
	"fmt"
	"hash/fnv"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
)

// envBinRoot passes the directory of the built commands from a test binary
// to itself re-executed (as sdtest.Main does under unshare), so they are
// built once.
const envBinRoot = "DROVER_TESTKIT_BIN"

// binPrefix names the build directories: drover-testbin-<pid>-*. The pid is
// the test binary's (re-executing keeps it), so a later run can tell a
// stale directory (its test binary is gone) from one in use.
const binPrefix = "drover-testbin-"

var build struct {
	mu   sync.Mutex
	root string
}

// Build builds the repository's commands cmds (names below cmd/, e.g.
// "drover-agent") as they ship: static (CGO_ENABLED=0), -trimpath,
// stripped, with the build tags tags (may be empty). It builds once per
// test binary for each tags and set of commands, and returns the directory
// holding the binaries. The directory outlives the test binary (TestMain
// often ends with os.Exit); the next run removes it.
func Build(tags string, cmds ...string) (string, error) {
	build.mu.Lock()
	defer build.mu.Unlock()
	cmds = slices.Sorted(slices.Values(cmds))
	if build.root == "" {
		build.root = os.Getenv(envBinRoot)
	}
	if build.root == "" {
		removeStaleBinDirs()
		d, err := os.MkdirTemp("", fmt.Sprintf("%s%d-", binPrefix, os.Getpid()))
		if err != nil {
			return "", err
		}
		build.root = d
		os.Setenv(envBinRoot, d)
	}
	h := fnv.New64a()
	fmt.Fprintf(h, "%s\x00%s", tags, strings.Join(cmds, "\x00"))
	dir := filepath.Join(build.root, strconv.FormatUint(h.Sum64(), 16))
	if built(dir, cmds) {
		return dir, nil
	}
	root, err := ModuleRoot()
	if err != nil {
		return "", err
	}
	args := []string{"build", "-trimpath", "-ldflags", "-s -w", "-o", dir + "/"}
	if tags != "" {
		args = append(args, "-tags", tags)
	}
	for _, c := range cmds {
		args = append(args, "./cmd/"+c)
	}
	cmd := exec.Command("go", args...)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		os.RemoveAll(dir)
		return "", fmt.Errorf("go %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return dir, nil
}

// Binaries is Build for a test: a failed build fails t (the commands are
// the thing under test, so this never skips).
func Binaries(t testing.TB, tags string, cmds ...string) string {
	t.Helper()
	dir, err := Build(tags, cmds...)
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

func built(dir string, cmds []string) bool {
	for _, c := range cmds {
		if fi, err := os.Stat(filepath.Join(dir, c)); err != nil || !fi.Mode().IsRegular() {
			return false
		}
	}
	return true
}

// removeStaleBinDirs removes the build directories of test binaries that
// have exited.
func removeStaleBinDirs() {
	ents, _ := os.ReadDir(os.TempDir())
	for _, e := range ents {
		rest, ok := strings.CutPrefix(e.Name(), binPrefix)
		if !ok || !e.IsDir() {
			continue
		}
		pidText, _, _ := strings.Cut(rest, "-")
		pid, err := strconv.Atoi(pidText)
		if err != nil || pid <= 0 || syscall.Kill(pid, 0) == nil {
			continue
		}
		os.RemoveAll(filepath.Join(os.TempDir(), e.Name()))
	}
}
