package agent

import (
	"strings"
	"testing"
	"time"

	"github.com/drover/drover/internal/testkit"
	"github.com/drover/drover/manifest"
	agentpb "github.com/drover/drover/proto"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// TestReenrollDropsOldStatuses: a ManifestStatus of the old identity that
// was still waiting for its ack when the agent enrolled again is not
// delivered on the new agent's stream (the server would file the old
// agent's applied serial under the new id), nor is one the old manifest's
// apply or lease report queues after the switch; runs are delivered as the
// new agent's.
func TestReenrollDropsOldStatuses(t *testing.T) {
	srv := newFakeServer(t)
	ta, oldID := enrolledAgent(t, srv)
	srv.mu.Lock()
	srv.holdAcks = true
	srv.mu.Unlock()
	p, b := testPipe(t, "old-status", "0 * * * *", "echo old", 1)
	serial := srv.publish(oldID, []manifest.Pipe{p}, b)
	testkit.WaitFor(t, 10*time.Second, "the old agent's status, unacknowledged", func() bool {
		for _, ms := range srv.manifestStatuses() {
			if ms.GetSerial() == serial && ms.GetState() == agentpb.ManifestStatus_STATE_APPLIED {
				return true
			}
		}
		return false
	})
	runs := spoolRuns(t, ta.cfg.DataDir, "old-status", 0, 2)
	testkit.WaitFor(t, 10*time.Second, "the runs in the outbox", func() bool {
		n, _, _ := ta.store.OutboxStats()
		return n >= 1+3*uint64(len(runs))
	})

	must(t, ta.a.reenroll(t.Context(), srv.token(time.Hour)))
	newID := ta.a.identity().AgentID
	if newID == oldID {
		t.Fatal("re-enrollment kept the agent id")
	}
	// The old manifest is still in force until the new agent's arrives; a
	// status of it queued now is not sent.
	ta.a.enqueueStatus(oldID, &agentpb.ManifestStatus{Serial: serial, AppliedSerial: serial, State: agentpb.ManifestStatus_STATE_APPLIED, At: timestamppb.Now()})
	srv.mu.Lock()
	srv.holdAcks = false
	srv.mu.Unlock()
	testkit.WaitFor(t, 20*time.Second, "an empty outbox", func() bool {
		ta.a.kickOutbox()
		n, _, _ := ta.store.OutboxStats()
		return n == 0
	})
	checkDelivered(t, srv, runs)
	srv.mu.Lock()
	defer srv.mu.Unlock()
	for _, s := range srv.statusesBy {
		if s.agentID == newID && s.status.GetSerial() == serial {
			t.Fatalf("the old agent's status (serial %d) was delivered as %s's: %+v", serial, newID, s.status)
		}
	}
	if !strings.Contains(ta.logs.String(), "dropped the previous identity's manifest statuses") {
		t.Error("no log line for the dropped statuses")
	}
}
