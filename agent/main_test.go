package agent

import (
	"testing"

	"github.com/drover/drover/agent/internal/sdtest"
)

// TestMain runs the package's tests against a private systemd user manager
// (agent/internal/sdtest); tests that need it call sdtest.Require.
func TestMain(m *testing.M) { sdtest.Main(m) }
