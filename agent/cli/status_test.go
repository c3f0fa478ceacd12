package cli

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/drover/drover/agent"
)

// `drover-agent status` names the replica in use for polls and stream,
// since when, every replica known (the ones in use marked) and the
// failover count.
func TestPrintStatusReplicas(t *testing.T) {
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	st := &agent.Status{Enrolled: true, AgentID: "agt-1", Version: "1.0", Server: "https://b.example:8443", GRPCAddr: "b.example:8444",
		StreamConnected: true, Backend: "cron", Scope: "system",
		Replicas: &agent.ReplicaStatus{
			ServerURLs: []string{"https://a.example:8443", "https://b.example:8443"}, GRPCAddrs: []string{"a.example:8444", "b.example:8444"},
			ServerIndex: 1, GRPCIndex: 1, ServerSince: now.Add(-time.Minute), Failovers: 3,
		}}
	var b bytes.Buffer
	printStatus(&b, st, now)
	out := b.String()
	for _, want := range []string{
		"Replica:      https://b.example:8443, since ",
		"(1m0s ago)",
		"Stream:       b.example:8444, not answered yet",
		"Replicas:     2 known (from the server), 3 failovers",
		"  0  https://a.example:8443  a.example:8444",
		"* 1  https://b.example:8443  b.example:8444",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("status output lacks %q:\n%s", want, out)
		}
	}
}
