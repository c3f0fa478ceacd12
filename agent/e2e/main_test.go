package e2e

import (
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/drover/drover/agent/internal/sdtest"
	"github.com/drover/drover/packaging"
)

// envBinDir passes the directory of the built binaries from the test binary
// to itself re-executed under unshare (sdtest.Main), so they are built once.
const envBinDir = "DROVER_E2E_BIN"

// binDir holds drover-server and drover-agent, built by TestMain.
var binDir string

func serverBin() string { return filepath.Join(binDir, "drover-server") }
func agentBin() string  { return filepath.Join(binDir, "drover-agent") }
func ctlBin() string    { return filepath.Join(binDir, "droverctl") }

// TestMain builds the binaries once, then runs the tests under a private
// systemd user manager (agent/internal/sdtest). A build failure fails the
// package: this proof must never pass by skipping.
func TestMain(m *testing.M) {
	// The scenarios mostly wait (for minute boundaries, runs, restarts):
	// run them all at once unless -parallel says otherwise (its default,
	// GOMAXPROCS, is 2 on the project's machine).
	flag.Parse()
	explicit := false
	flag.Visit(func(f *flag.Flag) { explicit = explicit || f.Name == "test.parallel" })
	if !explicit {
		flag.Set("test.parallel", "8")
	}
	binDir = os.Getenv(envBinDir)
	if binDir == "" {
		d, err := buildBinaries()
		if err != nil {
			fmt.Fprintln(os.Stderr, "agent/e2e:", err)
			os.Exit(1)
		}
		binDir = d
		os.Setenv(envBinDir, d)
	}
	sdtest.Main(m)
}

// binPrefix names the build directories: drover-e2e-bin-<pid>-*. The pid is
// the test binary's (unshare keeps it), so a later run can tell a stale
// directory (its test binary is gone) from one in use.
const binPrefix = "drover-e2e-bin-"

// buildBinaries builds cmd/drover-server and cmd/drover-agent as the
// Makefile does (static, stripped), so that they also run inside the Debian
// container and the memory figures are those of the shipped binaries.
func buildBinaries() (string, error) {
	removeStaleBinDirs()
	root, err := moduleRoot()
	if err != nil {
		return "", err
	}
	dir, err := os.MkdirTemp("", fmt.Sprintf("%s%d-", binPrefix, os.Getpid()))
	if err != nil {
		return "", err
	}
	t0 := time.Now()
	cmd := exec.Command("go", "build", "-trimpath", "-tags", packaging.BuildTags, "-ldflags", "-s -w", "-o", dir+"/", "./cmd/drover-server", "./cmd/drover-agent", "./cmd/droverctl")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		os.RemoveAll(dir)
		return "", fmt.Errorf("go build ./cmd/drover-server ./cmd/drover-agent ./cmd/droverctl: %v\n%s", err, out)
	}
	if testingVerbose() {
		fmt.Fprintf(os.Stderr, "agent/e2e: built the binaries in %s\n", time.Since(t0).Round(time.Millisecond))
	}
	return dir, nil
}

func testingVerbose() bool {
	for _, a := range os.Args {
		if a == "-test.v=true" || a == "-test.v" {
			return true
		}
	}
	return false
}

// removeStaleBinDirs removes build directories of test binaries that have
// exited (the directory of a run cannot be removed by that run itself:
// sdtest.Main ends the process with os.Exit).
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

func moduleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("no go.mod above %s", dir)
		}
		dir = parent
	}
}
