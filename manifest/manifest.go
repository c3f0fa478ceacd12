package manifest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"time"
)

// PayloadType is the DSSE payload type of a manifest (pinned).
const PayloadType = "application/vnd.drover.manifest.v1+json"

// DefaultLifetime is how long a manifest is valid after it is issued.
const DefaultLifetime = 7 * 24 * time.Hour

// Manifest is the list of pipes one agent must run (docs/design.md, "Manifest").
// The server signs the exact bytes of its JSON encoding; the agent parses
// them only after the signature verified.
type Manifest struct {
	AgentID        string    `json:"agent_id"`
	Serial         uint64    `json:"serial"`
	IssuedAt       time.Time `json:"issued_at"`
	ExpiresAt      time.Time `json:"expires_at"`
	KeyListVersion uint64    `json:"key_list_version"`
	Pipes          []Pipe    `json:"pipes"`
}

// Pipe is one pipe inside a manifest: a version of a spec and its payload.
// Spec.Targets and Spec.Placement are always empty here.
type Pipe struct {
	Name    string  `json:"name"`
	Version uint64  `json:"version"`
	Spec    Spec    `json:"spec"`
	Payload Payload `json:"payload"`
	// LeaseUntil is set on a placement: one pipe's entry in its holder's
	// manifest: the agent runs the pipe only until then unless a fresher
	// manifest renews it; at the end it stops the timer (fencing). Zero for
	// placement: all.
	LeaseUntil time.Time `json:"lease_until,omitzero"`
	// LastFireServed is the latest fire time of the pipe that any holder
	// served (a run record exists for it) or, after a hand-over, may have
	// served without the server knowing yet (one before the previous
	// holder's lease_until minus LeaseLead), so that a new holder's catch-up
	// policy covers the fire times after it that nobody ran and none that
	// the holder before could have run. Only with LeaseUntil; zero when
	// none is known.
	LastFireServed time.Time `json:"last_fire_served,omitzero"`
}

// Held reports whether the entry is a placement: one lease.
func (p *Pipe) Held() bool { return !p.LeaseUntil.IsZero() }

// LeaseLead is how long before lease_until a holder stops scheduling a
// held pipe (agent/lease): it serves no fire time at or after
// lease_until - LeaseLead, which the server counts on when it hands the
// pipe over.
const LeaseLead = 2 * time.Second

// Payload names the content-addressed bundle a pipe runs.
type Payload struct {
	Digest string `json:"digest"` // "sha256:<64 hex>"
	Size   int64  `json:"size"`
}

// Encode returns the canonical bytes of m: compact JSON, pipes in the order
// given. These bytes are what gets signed, stored and sent.
func (m *Manifest) Encode() ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(m); err != nil {
		return nil, fmt.Errorf("encode manifest: %w", err)
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
}

// DecodeManifest parses manifest bytes strictly (unknown fields are refused)
// and validates the result. Call it only on bytes whose signature verified.
func DecodeManifest(b []byte) (*Manifest, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	var m Manifest
	if err := dec.Decode(&m); err != nil {
		return nil, fmt.Errorf("decode manifest: %w", err)
	}
	if dec.More() {
		return nil, fmt.Errorf("decode manifest: trailing data after the JSON object")
	}
	if err := m.Validate(); err != nil {
		return nil, err
	}
	return &m, nil
}

// Pipe returns the pipe with the given name, or nil.
func (m *Manifest) Pipe(name string) *Pipe {
	for i := range m.Pipes {
		if m.Pipes[i].Name == name {
			return &m.Pipes[i]
		}
	}
	return nil
}
