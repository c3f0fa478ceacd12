package api

import (
	"time"

	"github.com/drover/drover/signing"
)

// EnrollRequest is the body of POST /api/v1/agents/enroll.
type EnrollRequest struct {
	Token        string `json:"token"`
	Hostname     string `json:"hostname"`
	OS           string `json:"os"`
	Arch         string `json:"arch"`
	AgentVersion string `json:"agent_version"`
	CSR          string `json:"csr"`
	// MachineID, optional, is the host's /etc/machine-id (32 hex digits):
	// the identity is bound to it at once, else at its first stream.
	MachineID string `json:"machine_id,omitempty"`
}

// EnrollResponse is the answer to a successful enrollment.
type EnrollResponse struct {
	AgentID       string            `json:"agent_id"`
	Certificate   string            `json:"certificate"`
	CABundle      string            `json:"ca_bundle"`
	TrustRoot     signing.TrustRoot `json:"trust_root"`
	GRPCAddr      string            `json:"grpc_addr"`
	CertExpiresAt time.Time         `json:"cert_expires_at"`
}

// RenewRequest is the body of POST /api/v1/agents/self/renew.
type RenewRequest struct {
	CSR string `json:"csr"`
}

// RenewResponse is the answer to a renewal.
type RenewResponse struct {
	Certificate   string    `json:"certificate"`
	CABundle      string    `json:"ca_bundle"`
	CertExpiresAt time.Time `json:"cert_expires_at"`
}

// SecretsResponse is the answer to GET /api/v1/agents/self/secrets.
type SecretsResponse struct {
	Secrets map[string]string `json:"secrets"`
}

// MachineIDHeader carries the host's machine id (machine-id(5)) on every
// mTLS request of an agent; once an identity is bound to a machine, the
// server refuses requests without it or naming another machine.
const MachineIDHeader = "X-Drover-Machine-Id"
