// Package agentpb is the generated Go for proto/agent.proto, the telemetry
// stream between drover-agent and drover-server. Regenerate with `make proto`.
//
// Imported by the server's stream handler and the agent's stream client.
package agentpb

//go:generate ../scripts/protogen.sh
