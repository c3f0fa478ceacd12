package agentpb

import "time"

// The bounds of a SyncNow that carries the manifest (written by hand).
const (
	// MaxSyncNowManifestBytes is the largest manifest envelope the server
	// puts on the stream with a SyncNow; a larger one is announced alone
	// and the agent polls. 256 KiB holds a manifest of a few hundred
	// pipes (a 1,000-pipe envelope is ~900 KB), which is nearly every
	// host's; past it the envelope's transfer, parse and verify, not the
	// poll's TLS handshake, are what a change costs, while a larger
	// message would hold the stream's flow-control window (and the
	// server's send memory, once per agent of a fleet-wide change) for
	// longer.
	MaxSyncNowManifestBytes = 256 << 10
	// MaxSyncNowManifestETag bounds the ETag a SyncNow carries.
	MaxSyncNowManifestETag = 256
	// MaxServerMessageBytes is the largest ServerMessage an agent accepts
	// (its gRPC receive limit): a SyncNow with the largest manifest and
	// room for the message's other fields.
	MaxServerMessageBytes = MaxSyncNowManifestBytes + 64<<10
)

// StreamWindowBytes is the fixed HTTP/2 flow-control window, per stream
// and per connection, that both ends of AgentStream set. A fixed window
// switches off gRPC's bandwidth estimator, which answers nearly every
// message received with a PING to measure the link (one more write and
// read on each side for each heartbeat, record, ack and SyncNow: at
// 19,500 agents, 650 heartbeats/s meant 650 pings/s). 128 KiB lets a
// 100 ms link carry ~1.3 MB/s per agent, far above what run logs need,
// and bounds what a stream whose reader is held may have buffered.
const StreamWindowBytes = 128 << 10

// StreamKeepalive is how long an agent's stream goes without reading
// anything before the agent sends a gRPC keepalive PING, which the server
// answers (an idle stream reads nothing between SyncNows: heartbeats are
// not answered). With the stream's liveness probe and the TCP user timeout
// it is the backstop for a server process that hangs while its host still
// answers and the agent has nothing to send. Each PING is a read and a
// write at the server: at 10 s (gRPC's minimum) a fleet of 19,500 agents
// sent 1,950 a second, ~7% of a core; at 30 s, 650 a second. At 5,000 idle
// agents, PINGs every 2 min with the server's keepalive at 2 min cost the
// server 1.31% of a core per 1,000 agents, against 1.90% with both at 30 s.
// The server allows one every 5 s at the most.
const StreamKeepalive = 2 * time.Minute
