package cli

import (
	"strings"
	"testing"
	"time"

	agentpb "github.com/drover/drover/proto"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// TestDescribeRunTelemetry: describe run shows what the run wrote to
// $DROVER_OUTPUT and $DROVER_METRICS, and the notes on what was cut.
func TestDescribeRunTelemetry(t *testing.T) {
	f := newFleet(t)
	at := f.runStart.Add(time.Hour)
	f.db.runStarted("run-tel", "backup-db", 1, at)
	f.db.send(&agentpb.AgentMessage{Body: &agentpb.AgentMessage_RunFinished{RunFinished: &agentpb.RunFinished{
		RunId: "run-tel", Pipe: "backup-db", PipeVersion: 1, Status: agentpb.RunStatus_RUN_STATUS_SUCCEEDED,
		StartedAt: timestamppb.New(at), FinishedAt: timestamppb.New(at.Add(time.Second)), DurationMs: 1000,
		Output:         "dump=/srv/a.tar\nrows=49\n",
		Metrics:        []*agentpb.MetricSample{{Name: "backup_rows_total", Type: "counter", Value: 42, Labels: map[string]string{"table": "users", "db": "main\x1b[31m"}}},
		TelemetryNotes: []string{"output: larger than 65536 bytes, cut"}}}})
	out := f.ts.ctlOK("describe", "run", "run-tel").stdout
	for _, want := range []string{
		"Output:\n  dump=/srv/a.tar\n  rows=49\n",
		"Metrics:\n  backup_rows_total{db=\"main\\x1b[31m\",table=\"users\"} 42  (counter)\n",
		"Telemetry notes:\n  output: larger than 65536 bytes, cut\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("describe run lacks %q:\n%s", want, out)
		}
	}
}
