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
	AgentID     string            `json:"agent_id"`
	Certificate string            `json:"certificate"`
	CABundle    string            `json:"ca_bundle"`
	TrustRoot   signing.TrustRoot `json:"trust_root"`
	// GRPCAddr is the first of GRPCAddrs, for agents that know one address.
	GRPCAddr      string    `json:"grpc_addr"`
	CertExpiresAt time.Time `json:"cert_expires_at"`
	// ServerURLs are the HTTPS base URLs of every replica (public_urls),
	// in the order agents should prefer them; empty from a server that
	// has no public URLs configured (the agent keeps the URL it enrolled
	// with).
	ServerURLs []string `json:"server_urls,omitempty"`
	// GRPCAddrs are the stream addresses (host:port) of every replica
	// (grpc_public_addrs), in order of preference.
	GRPCAddrs []string `json:"grpc_addrs,omitempty"`
}

// MaxReplicaAddrs bounds server_urls and grpc_addrs (in the server's
// configuration, in its answers and in an agent's configuration).
const MaxReplicaAddrs = 16

// Replica lists on agent responses. Every answer to an agent's manifest
// poll carries the server's current lists of replica addresses in these
// headers (comma-separated, the same values as server_urls and grpc_addrs
// at enrollment), so that agents learn of replicas added or removed
// without re-enrolling. A server without configured public addresses sends
// neither.
const (
	ServerURLsHeader = "X-Drover-Server-Urls"
	GRPCAddrsHeader  = "X-Drover-Grpc-Addrs"
)

// RenewRequest is the body of POST /api/v1/agents/self/renew.
type RenewRequest struct {
	CSR string `json:"csr"`
}

// RenewResponse is the answer to a renewal.
type RenewResponse struct {
	Certificate   string    `json:"certificate"`
	CABundle      string    `json:"ca_bundle"`
	CertExpiresAt time.Time `json:"cert_expires_at"`
	// ServerURLs and GRPCAddrs are the replicas' current addresses, as in
	// EnrollResponse.
	ServerURLs []string `json:"server_urls,omitempty"`
	GRPCAddrs  []string `json:"grpc_addrs,omitempty"`
}

// SecretsResponse is the answer to GET /api/v1/agents/self/secrets.
type SecretsResponse struct {
	Secrets map[string]string `json:"secrets"`
}

// MachineIDHeader carries the host's machine id (machine-id(5)) on every
// mTLS request of an agent; once an identity is bound to a machine, the
// server refuses requests without it or naming another machine.
const MachineIDHeader = "X-Drover-Machine-Id"
