package api

import (
	"time"
)

// Run is a run as the API shows it.
type Run struct {
	ID           string     `json:"id"`
	AgentID      string     `json:"agent_id"`
	Pipe         string     `json:"pipe"`
	PipeVersion  uint64     `json:"pipe_version"`
	Trigger      string     `json:"trigger"`
	Status       string     `json:"status"`
	ExitCode     int        `json:"exit_code"`
	Signal       string     `json:"signal,omitempty"`
	Error        string     `json:"error,omitempty"`
	RequestID    string     `json:"request_id,omitempty"`
	Reason       string     `json:"reason,omitempty"`     // why, when not succeeded: "exit 1", "systemd: 203/EXEC", "lost"
	Attempts     uint32     `json:"attempts"`             // attempts made (0: not reported)
	WrittenBy    string     `json:"written_by,omitempty"` // runner, daemon, or server (settled lost)
	ScheduledAt  *time.Time `json:"scheduled_at,omitempty"`
	StartedAt    *time.Time `json:"started_at,omitempty"`
	FinishedAt   *time.Time `json:"finished_at,omitempty"`
	DurationMS   int64      `json:"duration_ms"`
	LogChunks    uint64     `json:"log_chunks"`
	LogBytes     int64      `json:"log_bytes"`
	LogTruncated bool       `json:"log_truncated"`
	CreatedAt    time.Time  `json:"created_at"`
	UpdatedAt    time.Time  `json:"updated_at"`
	// Output, Metrics and TelemetryNotes are what the run wrote to
	// $DROVER_OUTPUT (key=value lines) and $DROVER_METRICS, and what the
	// runner or the server cut from them.
	Output         string         `json:"output,omitempty"`
	Metrics        []MetricSample `json:"metrics,omitempty"`
	TelemetryNotes []string       `json:"telemetry_notes,omitempty"`
}

// MetricSample is one sample a run wrote to $DROVER_METRICS.
type MetricSample struct {
	Name   string            `json:"name"`
	Labels map[string]string `json:"labels,omitempty"`
	Value  float64           `json:"value"`
	Type   string            `json:"type"` // counter, gauge or untyped
	Help   string            `json:"help,omitempty"`
}

// RunList is a page of runs, newest first.
type RunList struct {
	Runs       []Run  `json:"runs"`
	NextCursor string `json:"next_cursor,omitempty"`
}

// LogChunk is one chunk in the JSON form of a run's log.
type LogChunk struct {
	Seq    uint64    `json:"seq"`
	Stream string    `json:"stream"`
	At     time.Time `json:"at"`
	Data   []byte    `json:"data"` // base64
}

// Logs is the JSON form of a run's log.
type Logs struct {
	RunID     string     `json:"run_id"`
	Truncated bool       `json:"truncated"`
	Chunks    []LogChunk `json:"chunks"`
}

// CancelResponse says to which agent CancelRun went.
type CancelResponse struct {
	RunID   string `json:"run_id"`
	AgentID string `json:"agent_id"`
	Sent    bool   `json:"sent"`
}

// ReasonLeaseEnded is the reason of the skipped record of a scheduled or
// catch-up run an agent refused because the pipe is held (placement: one)
// and its lease had ended when the run was to start. Such a record does
// not serve its fire time: the next holder's catch-up covers it.
const ReasonLeaseEnded = "lease_ended"
