package api

import (
	agentpb "github.com/drover/drover/proto"
)

// Run statuses as the API and the store spell them (docs/design.md,
// "Telemetry stream").
const (
	StatusPending   = "pending"
	StatusRunning   = "running"
	StatusSucceeded = "succeeded"
	StatusFailed    = "failed"
	StatusTimedOut  = "timed_out"
	StatusCanceled  = "canceled"
	StatusSkipped   = "skipped"
	// StatusMissed is written by the server only: no run started within a
	// fire time's grace. An agent cannot report it.
	StatusMissed = "missed"
)

// RunStatuses lists every run status, in the order metrics and views show
// them.
var RunStatuses = []string{StatusPending, StatusRunning, StatusSucceeded, StatusFailed, StatusTimedOut, StatusCanceled, StatusSkipped, StatusMissed}

// Terminal reports whether a run in status has ended.
func Terminal(status string) bool {
	switch status {
	case StatusSucceeded, StatusFailed, StatusTimedOut, StatusCanceled, StatusSkipped, StatusMissed:
		return true
	}
	return false
}

// KnownStatus reports whether s is a run status.
func KnownStatus(s string) bool {
	for _, k := range RunStatuses {
		if k == s {
			return true
		}
	}
	return false
}

// RunStatusName names an agent-reported status; ok is false for a value an
// agent may not report (unspecified, MISSED, or unknown).
func RunStatusName(s agentpb.RunStatus) (name string, ok bool) {
	switch s {
	case agentpb.RunStatus_RUN_STATUS_UNSPECIFIED, agentpb.RunStatus_RUN_STATUS_MISSED:
		return "", false
	}
	name = s.Name()
	return name, name != "unknown"
}

// Triggers: what started a run.
const (
	TriggerSchedule = "schedule"
	TriggerCatchup  = "catchup"
	TriggerManual   = "manual"
	TriggerAPI      = "api"
)

// TriggerName names a trigger as the API and the store spell it (the
// enum's own name, agentpb.Trigger.Name); it is "" for unspecified or
// unknown.
func TriggerName(t agentpb.Trigger) string {
	if name := t.Name(); name != "unknown" {
		return name
	}
	return ""
}

// Log streams of a run's log chunks.
const (
	LogStdout = "stdout"
	LogStderr = "stderr"
	LogSystem = "system"
)

var logStreamOf = map[agentpb.LogStream]string{
	agentpb.LogStream_LOG_STREAM_STDOUT: LogStdout,
	agentpb.LogStream_LOG_STREAM_STDERR: LogStderr,
	agentpb.LogStream_LOG_STREAM_SYSTEM: LogSystem,
}

// LogStreamName names a log stream; it is "" for unspecified or unknown.
func LogStreamName(s agentpb.LogStream) string { return logStreamOf[s] }

// Manifest states an agent reports for the manifest it was sent.
const (
	ManifestApplied     = "applied"
	ManifestRejected    = "rejected"
	ManifestApplyFailed = "apply_failed"
)

var manifestStateOf = map[agentpb.ManifestStatus_State]string{
	agentpb.ManifestStatus_STATE_APPLIED:      ManifestApplied,
	agentpb.ManifestStatus_STATE_REJECTED:     ManifestRejected,
	agentpb.ManifestStatus_STATE_APPLY_FAILED: ManifestApplyFailed,
}

// ManifestStateName names a manifest state; it is "" for unspecified or
// unknown.
func ManifestStateName(s agentpb.ManifestStatus_State) string { return manifestStateOf[s] }
