package api

import (
	"encoding/json"
	"time"

	"github.com/drover/drover/manifest"
)

// PutPipeRequest is the body of PUT /api/v1/pipes/{name}.
type PutPipeRequest struct {
	Spec   json.RawMessage `json:"spec"`
	Bundle *string         `json:"bundle,omitempty"` // base64 (standard) of a bundle
}

// PutPipeResponse reports the version in force after a PUT.
type PutPipeResponse struct {
	Name    string `json:"name"`
	Version uint64 `json:"version"`
	Digest  string `json:"digest"`
	Created bool   `json:"created"`
	// Manifests is where the fleet's manifests stood when the answer was
	// sent (a new version only).
	Manifests *PublishState `json:"manifests,omitempty"`
}

// PublishState reports the recompile a pipe change started. The PUT waits
// for it a bounded time (under a second): Done says every affected
// manifest was signed and stored by then, Changed how many changed. When
// not Done the version is stored and the recompile goes on in the
// background; each agent's manifest serial (GET /api/v1/agents/{id})
// shows it landing, and a failed recompile is retried and logged.
type PublishState struct {
	Done    bool `json:"done"`
	Changed int  `json:"changed"`
}

// Pipe is a pipe as the API shows it.
type Pipe struct {
	Name      string           `json:"name"`
	Version   uint64           `json:"version"`
	Spec      manifest.Spec    `json:"spec"`
	Payload   manifest.Payload `json:"payload"`
	CreatedAt time.Time        `json:"created_at"`
	UpdatedAt time.Time        `json:"updated_at"`
	Versions  []PipeVersionRef `json:"versions,omitempty"`
	// Placement is the holder of a placement: one pipe (GET of one pipe).
	Placement *Placement `json:"placement,omitempty"`
}

// Placement is who holds a placement: one pipe (docs/placement.md).
type Placement struct {
	Policy string `json:"policy"` // "one"
	// Holder runs the pipe until LeaseUntil (renewed while it is healthy);
	// it gained it at Since, with LastFireServed for its catch-up. Empty
	// while nobody holds it.
	Holder         string    `json:"holder,omitempty"`
	LeaseUntil     time.Time `json:"lease_until,omitzero"`
	Since          time.Time `json:"since,omitzero"`
	LastFireServed time.Time `json:"last_fire_served,omitzero"`
	// While nobody holds it: the holder before, whose lease ended (or
	// ends) at PreviousLeaseUntil; nobody gains the pipe before NextAfter
	// (that plus the skew margin) unless it confirms it dropped the pipe.
	Previous           string    `json:"previous,omitempty"`
	PreviousLeaseUntil time.Time `json:"previous_lease_until,omitzero"`
	NextAfter          time.Time `json:"next_after,omitzero"`
	// MoveTo is a requested holder not reached yet.
	MoveTo string `json:"move_to,omitempty"`
	// Reported is what the holder last reported of its lease.
	Reported *LeaseReport `json:"reported,omitempty"`
}

// LeaseReport is a holder's own view of its lease, from its last manifest
// status.
type LeaseReport struct {
	LeaseUntil time.Time `json:"lease_until,omitzero"`
	LeaseEnded bool      `json:"lease_ended,omitempty"`
	At         time.Time `json:"at,omitzero"`
}

// MovePipeRequest is the body of POST /api/v1/pipes/{name}/move.
type MovePipeRequest struct {
	To string `json:"to"`
}

// PipeVersionRef is one entry of a pipe's history.
type PipeVersionRef struct {
	Version   uint64    `json:"version"`
	Digest    string    `json:"digest"`
	CreatedAt time.Time `json:"created_at"`
}

// PipeList is a page of pipes.
type PipeList struct {
	Pipes      []Pipe `json:"pipes"`
	NextCursor string `json:"next_cursor,omitempty"`
}

// PipeVersion is one version of a pipe.
type PipeVersion struct {
	Name      string           `json:"name"`
	Version   uint64           `json:"version"`
	Spec      manifest.Spec    `json:"spec"`
	Payload   manifest.Payload `json:"payload"`
	CreatedAt time.Time        `json:"created_at"`
	Current   bool             `json:"current"` // the version in force (false for every version of a deleted pipe)
}

// PipeVersionList is a page of a pipe's versions, newest first.
type PipeVersionList struct {
	Name       string        `json:"name"`
	Deleted    bool          `json:"deleted"`
	Versions   []PipeVersion `json:"versions"`
	NextCursor string        `json:"next_cursor,omitempty"`
}

// SchedulePreview lists a pipe's next fire times, in its time zone.
type SchedulePreview struct {
	Pipe      string      `json:"pipe"`
	Schedule  string      `json:"schedule"`
	Timezone  string      `json:"timezone"`
	After     time.Time   `json:"after"`
	Enabled   bool        `json:"enabled"`
	Every     string      `json:"every,omitempty"` // for @every: fire times count from after, as from a timer's activation
	FireTimes []time.Time `json:"fire_times"`
}

// DryRunRequest is the body of POST /api/v1/pipes/{name}/dry-run: the body
// of a PUT, or {"delete": true}.
type DryRunRequest struct {
	Spec   json.RawMessage `json:"spec,omitempty"`
	Bundle *string         `json:"bundle,omitempty"`
	Delete bool            `json:"delete,omitempty"`
}

// DryRunResponse says what a change would do. Action is create, update,
// unchanged or delete (or absent: deleting a pipe that does not exist is a
// 404); Version and Digest are those the pipe would have.
type DryRunResponse struct {
	Name    string        `json:"name"`
	Action  string        `json:"action"`
	Version uint64        `json:"version,omitempty"`
	Digest  string        `json:"digest,omitempty"`
	Agents  []AgentChange `json:"agents"`
	// Privileged lists why the spec needs the admin role (policy.go);
	// Refused says why the calling token could not apply the change.
	Privileged []Detail `json:"privileged,omitempty"`
	Refused    string   `json:"refused,omitempty"`
}

// AgentChange is how a change reaches one agent's manifest: the pipe is
// added to it, updated in it or removed from it. Diff lists the manifest
// entry's changed fields, "- field: old" and "+ field: new" lines.
type AgentChange struct {
	ID       string `json:"id"`
	Name     string `json:"name,omitempty"`
	Hostname string `json:"hostname,omitempty"`
	Action   string `json:"action"` // add, update or remove
	Diff     string `json:"diff,omitempty"`
	// Reason says why a placement: one pipe moves; After, that the agent
	// gains it only then (the lease of the holder before plus the skew
	// margin).
	Reason string    `json:"reason,omitempty"`
	After  time.Time `json:"after,omitzero"`
}

// RunPipeRequest is the body of POST /api/v1/pipes/{name}/run: at most one
// of agent and tags; neither runs the pipe on every agent it targets.
type RunPipeRequest struct {
	Agent string            `json:"agent,omitempty"`
	Tags  map[string]string `json:"tags,omitempty"`
}

// RunPipeResponse lists where RunNow was sent. The runs the agents start
// carry request_id (GET /api/v1/runs?request_id=...).
type RunPipeResponse struct {
	RequestID string   `json:"request_id"`
	Sent      []string `json:"sent"`    // agents that got RunNow: expect a run from each
	Offline   []string `json:"offline"` // targeted agents without a live stream: nothing was sent
}

// Actions of a DryRunResponse (and of droverctl's apply plan).
const (
	ActionCreate    = "create"
	ActionUpdate    = "update"
	ActionUnchanged = "unchanged"
	ActionDelete    = "delete"
)

// Actions of an AgentChange: how the pipe's entry in the agent's manifest
// changes.
const (
	AgentAdd    = "add"
	AgentUpdate = "update"
	AgentRemove = "remove"
)
