package api

import (
	"testing"

	agentpb "github.com/drover/drover/proto"
)

// The API's names and the stream's enums are one vocabulary: every enum
// value an agent may send has the API's constant as its name.
func TestNamesMatchTheStream(t *testing.T) {
	triggers := map[agentpb.Trigger]string{
		agentpb.Trigger_TRIGGER_SCHEDULE: TriggerSchedule,
		agentpb.Trigger_TRIGGER_CATCHUP:  TriggerCatchup,
		agentpb.Trigger_TRIGGER_MANUAL:   TriggerManual,
		agentpb.Trigger_TRIGGER_API:      TriggerAPI,
	}
	for v := range agentpb.Trigger_name {
		tr := agentpb.Trigger(v)
		if got, want := TriggerName(tr), triggers[tr]; got != want {
			t.Errorf("TriggerName(%v) = %q, want %q", tr, got, want)
		}
	}
	if got := TriggerName(agentpb.Trigger(99)); got != "" {
		t.Errorf("TriggerName(99) = %q, want empty", got)
	}
	reported := map[agentpb.RunStatus]string{
		agentpb.RunStatus_RUN_STATUS_PENDING:   StatusPending,
		agentpb.RunStatus_RUN_STATUS_RUNNING:   StatusRunning,
		agentpb.RunStatus_RUN_STATUS_SUCCEEDED: StatusSucceeded,
		agentpb.RunStatus_RUN_STATUS_FAILED:    StatusFailed,
		agentpb.RunStatus_RUN_STATUS_TIMED_OUT: StatusTimedOut,
		agentpb.RunStatus_RUN_STATUS_CANCELED:  StatusCanceled,
		agentpb.RunStatus_RUN_STATUS_SKIPPED:   StatusSkipped,
	}
	for v := range agentpb.RunStatus_name {
		s := agentpb.RunStatus(v)
		got, ok := RunStatusName(s)
		want, wantOK := reported[s]
		if got != want || ok != wantOK {
			t.Errorf("RunStatusName(%v) = %q, %v; want %q, %v", s, got, ok, want, wantOK)
		}
		if ok && !KnownStatus(got) {
			t.Errorf("%q is not in RunStatuses", got)
		}
	}
	if agentpb.RunStatus_RUN_STATUS_MISSED.Name() != StatusMissed {
		t.Errorf("the stream's MISSED is %q, the API's %q", agentpb.RunStatus_RUN_STATUS_MISSED.Name(), StatusMissed)
	}
	for _, s := range RunStatuses {
		if Terminal(s) == (s == StatusPending || s == StatusRunning) {
			t.Errorf("Terminal(%q) = %v", s, Terminal(s))
		}
	}
}
