package api

import (
	"time"
)

// AuditEntry is an audit entry as the API shows it.
type AuditEntry struct {
	ID           string    `json:"id"`
	At           time.Time `json:"at"`
	Actor        string    `json:"actor"`    // the token's (or agent's) name
	ActorID      string    `json:"actor_id"` // the token id, agent id or enrollment token id
	Role         string    `json:"role"`
	Action       string    `json:"action"`
	Target       string    `json:"target"`
	BeforeDigest string    `json:"before_digest,omitempty"`
	AfterDigest  string    `json:"after_digest,omitempty"`
	Source       string    `json:"source,omitempty"` // the client's address
}

// AuditList is a page of the audit log.
type AuditList struct {
	Entries    []AuditEntry `json:"entries"`
	NextCursor string       `json:"next_cursor,omitempty"`
}

// Event is an event as the API shows it.
type Event struct {
	ID      int64     `json:"id"`
	At      time.Time `json:"at"`
	Kind    string    `json:"kind"`
	Pipe    string    `json:"pipe,omitempty"`
	Agent   string    `json:"agent,omitempty"`
	RunID   string    `json:"run_id,omitempty"`
	Message string    `json:"message,omitempty"`
}

// EventList is a page of events, newest first.
type EventList struct {
	Events     []Event `json:"events"`
	NextCursor string  `json:"next_cursor,omitempty"`
}

// Fire is one fire time of a pipe.
type Fire struct {
	At       time.Time      `json:"at"`
	Expected int            `json:"expected"`
	Counts   map[string]int `json:"counts"`
	// Unreported counts the expected agents with no run for this fire time
	// yet (before its grace ends, or before detection ran); the first of
	// them are listed.
	Unreported       int      `json:"unreported"`
	UnreportedAgents []string `json:"unreported_agents,omitempty"`
}

// FireList is the fire-time view of a pipe, oldest first.
type FireList struct {
	Pipe     string    `json:"pipe"`
	Schedule string    `json:"schedule"`
	Timezone string    `json:"timezone"`
	Since    time.Time `json:"since"`
	Until    time.Time `json:"until"`
	Fires    []Fire    `json:"fires"`
	// Truncated: older fire times in the window were left out.
	Truncated bool `json:"truncated,omitempty"`
}
