package packaging

import (
	"os/exec"
	"testing"

	"github.com/drover/drover/internal/testkit"
)

// TestPrometheusRules: the example alert rules pass promtool check rules.
func TestPrometheusRules(t *testing.T) {
	promtool := testkit.RequireCommand(t, "promtool", "Debian package prometheus")
	out, err := exec.Command(promtool, "check", "rules", "prometheus/drover-rules.yml").CombinedOutput()
	if err != nil {
		t.Fatalf("promtool check rules: %v\n%s", err, out)
	}
	t.Logf("%s", out)
}
