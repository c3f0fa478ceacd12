package api

import (
	"time"
)

// EnrollmentTokenRequest is the body of POST /api/v1/enrollment-tokens.
type EnrollmentTokenRequest struct {
	TTL  string            `json:"ttl"`
	Name string            `json:"name"`
	Tags map[string]string `json:"tags"`
}

// EnrollmentTokenCreated shows a new token, once.
type EnrollmentTokenCreated struct {
	ID        string            `json:"id"`
	Token     string            `json:"token"`
	ExpiresAt time.Time         `json:"expires_at"`
	Name      string            `json:"name,omitempty"`
	Tags      map[string]string `json:"tags"`
}

// EnrollmentToken is an enrollment token as listed: never its secret.
type EnrollmentToken struct {
	ID        string            `json:"id"`
	Name      string            `json:"name,omitempty"`
	Tags      map[string]string `json:"tags"`
	CreatedAt time.Time         `json:"created_at"`
	ExpiresAt time.Time         `json:"expires_at"`
	UsedAt    *time.Time        `json:"used_at,omitempty"`
	AgentID   string            `json:"agent_id,omitempty"`
	State     string            `json:"state"` // valid, used or expired
}

// EnrollmentTokenList is a page of enrollment tokens, newest first.
type EnrollmentTokenList struct {
	Tokens     []EnrollmentToken `json:"tokens"`
	NextCursor string            `json:"next_cursor,omitempty"`
}

// APITokenRequest is the body of POST /api/v1/api-tokens.
type APITokenRequest struct {
	Name string `json:"name"`
	Role string `json:"role"`          // viewer, operator or admin
	TTL  string `json:"ttl,omitempty"` // e.g. 720h; empty: the token does not expire
}

// APIToken is an API token as listed: never its secret.
type APIToken struct {
	ID         string     `json:"id"`
	Name       string     `json:"name"`
	Role       string     `json:"role"`
	CreatedAt  time.Time  `json:"created_at"`
	CreatedBy  string     `json:"created_by,omitempty"`
	ExpiresAt  *time.Time `json:"expires_at,omitempty"`
	LastUsedAt *time.Time `json:"last_used_at,omitempty"`
	RevokedAt  *time.Time `json:"revoked_at,omitempty"`
}

// APITokenCreated is the answer of POST /api/v1/api-tokens: the token is
// shown here and never again.
type APITokenCreated struct {
	APIToken
	Token string `json:"token"`
}

// APITokenList is a page of API tokens, oldest first.
type APITokenList struct {
	Tokens     []APIToken `json:"tokens"`
	NextCursor string     `json:"next_cursor,omitempty"`
}

// Health is the answer of GET /healthz.
type Health struct {
	Status string `json:"status"`
	// Leader is true while this server runs the fleet-wide singletons
	// (always for a server alone; one replica at a time on PostgreSQL).
	Leader bool `json:"leader"`
}

// WhoAmI describes the calling token.
type WhoAmI struct {
	ID   string `json:"id"`
	Name string `json:"name"`
	Role string `json:"role"`
}

// SecretRequest is the body of PUT /api/v1/secrets/{name}.
type SecretRequest struct {
	Value *string `json:"value"`
}

// SecretList is a page of secret names.
type SecretList struct {
	Secrets    []Secret `json:"secrets"`
	NextCursor string   `json:"next_cursor,omitempty"`
}

// RotateResponse reports the key now signing manifests.
type RotateResponse struct {
	KeyID          string `json:"key_id"`
	KeyListVersion uint64 `json:"key_list_version"`
}

// Secret describes a secret without its value.
type Secret struct {
	Name      string    `json:"name"`
	CreatedAt time.Time `json:"created_at"`
	UpdatedAt time.Time `json:"updated_at"`
}
