package agent

import (
	"strings"
	"testing"
	"time"

	"github.com/drover/drover/agent/internal/sdtest"
	"github.com/drover/drover/internal/testkit"
	"github.com/drover/drover/manifest"
	agentpb "github.com/drover/drover/proto"
	"github.com/drover/drover/units"
)

// TestDaemonRecordKeepsAttempts: a runner with retries killed (SIGKILL, so
// it writes nothing) during its second attempt's delay ends in one daemon
// record that says two attempts were made, as the runner's RunStarted
// records did, not one.
func TestDaemonRecordKeepsAttempts(t *testing.T) {
	r := newAccountRig(t)
	r.useRunner()
	p, b := testPipe(t, "retried", "17 3 * * *", "echo \"attempt $DROVER_ATTEMPT\"\nexit 1\n", 1)
	p.Spec.Retries = &manifest.Retries{Attempts: 3, Delay: manifest.Duration(time.Second), Backoff: 10}
	r.srv.publish(r.agentID, []manifest.Pipe{p}, b)
	svc := units.ServiceName("retried")
	testkit.WaitFor(t, 20*time.Second, "the pipe", func() bool {
		return strings.Contains(sdtest.Show(t, svc, "ExecStart"), r.bin) && r.ta.a.pipeVersion("retried") == 1
	})
	r.runNow("retried", uniq("req-retried"))
	testkit.WaitFor(t, 30*time.Second, "the second attempt's RunStarted", func() bool {
		for _, s := range r.srv.runsStarted() {
			if s.GetRequestId() == uniq("req-retried") && s.GetAttempt() == 2 {
				return true
			}
		}
		return false
	})
	// The second attempt fails at once; the runner then waits 10 s.
	time.Sleep(time.Second)
	inv := sdtest.Show(t, svc, "InvocationID")
	sdtest.Systemctl(t, "kill", "--signal=SIGKILL", svc)
	f := r.finishedOnce("the killed runner's run", func(f *agentpb.RunFinished) bool { return f.GetRunId() == inv })
	if f.GetWrittenBy() != WrittenByDaemon || f.GetAttempts() != 2 || f.GetStatus() != agentpb.RunStatus_RUN_STATUS_FAILED {
		t.Fatalf("daemon record %v", f)
	}
}
