package agent

import (
	"os"
	"testing"

	"github.com/drover/drover/agent/internal/sdtest"
	"github.com/drover/drover/agent/runner"
)

// envTestRunner makes the test binary `drover-agent run` (its arguments
// after the binary: run <pipe> [flags]), so that tests on a real user
// manager run the real runner without building the agent.
const envTestRunner = "DROVER_AGENT_TEST_RUNNER"

// TestMain runs the package's tests against a private systemd user manager
// (agent/internal/sdtest); tests that need it call sdtest.Require.
func TestMain(m *testing.M) {
	if os.Getenv(envTestRunner) == "1" && len(os.Args) > 1 && os.Args[1] == "run" {
		os.Exit(runner.Main(os.Args[2:]))
	}
	sdtest.Main(m)
}
