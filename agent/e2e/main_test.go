package e2e

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/drover/drover/agent/internal/sdtest"
	"github.com/drover/drover/internal/testkit"
	"github.com/drover/drover/packaging"
)

// binDir holds drover-server, drover-agent and droverctl, built by TestMain.
var binDir string

func serverBin() string { return filepath.Join(binDir, "drover-server") }
func agentBin() string  { return filepath.Join(binDir, "drover-agent") }
func ctlBin() string    { return filepath.Join(binDir, "droverctl") }

// TestMain builds the binaries once (testkit.Build: as the Makefile does,
// static and stripped, so that they also run inside the Debian container
// and the memory figures are those of the shipped binaries; the test binary
// re-executed under unshare reuses them), then runs the tests under a
// private systemd user manager (agent/internal/sdtest). A build failure
// fails the package: this proof must never pass by skipping.
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
	d, err := testkit.Build(packaging.BuildTags, "drover-server", "drover-agent", "droverctl")
	if err != nil {
		fmt.Fprintln(os.Stderr, "agent/e2e:", err)
		os.Exit(1)
	}
	binDir = d
	sdtest.Main(m)
}
