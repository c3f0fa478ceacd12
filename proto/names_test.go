package agentpb

import "testing"

func TestNames(t *testing.T) {
	for tr, want := range map[Trigger]string{
		Trigger_TRIGGER_SCHEDULE: "schedule", Trigger_TRIGGER_CATCHUP: "catchup", Trigger_TRIGGER_MANUAL: "manual",
		Trigger_TRIGGER_API: "api", Trigger_TRIGGER_UNSPECIFIED: "unknown", Trigger(99): "unknown",
	} {
		if tr.Name() != want {
			t.Errorf("%v.Name() = %q, want %q", tr, tr.Name(), want)
		}
		if want == "unknown" {
			continue
		}
		if got, err := ParseTrigger(" " + want + " "); err != nil || got != tr {
			t.Errorf("ParseTrigger(%q) = %v, %v", want, got, err)
		}
	}
	for _, bad := range []string{"", "unknown", "unspecified", "TRIGGER_API", "cron"} {
		if _, err := ParseTrigger(bad); err == nil {
			t.Errorf("ParseTrigger(%q) succeeded", bad)
		}
	}
	if _, err := ParseTrigger("API"); err != nil {
		t.Errorf("ParseTrigger ignores case: %v", err)
	}
	for s, want := range map[RunStatus]string{
		RunStatus_RUN_STATUS_PENDING: "pending", RunStatus_RUN_STATUS_RUNNING: "running", RunStatus_RUN_STATUS_SUCCEEDED: "succeeded",
		RunStatus_RUN_STATUS_FAILED: "failed", RunStatus_RUN_STATUS_TIMED_OUT: "timed_out", RunStatus_RUN_STATUS_CANCELED: "canceled",
		RunStatus_RUN_STATUS_SKIPPED: "skipped", RunStatus_RUN_STATUS_MISSED: "missed", RunStatus_RUN_STATUS_UNSPECIFIED: "unknown", RunStatus(42): "unknown",
	} {
		if s.Name() != want {
			t.Errorf("%v.Name() = %q, want %q", s, s.Name(), want)
		}
	}
}
