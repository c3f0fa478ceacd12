// Package agentpb is the generated Go for proto/agent.proto, the telemetry
// stream between drover-agent and drover-server. Regenerate with `make proto`;
// names.go, the enums' lower-case names, is written by hand.
//
// Imported by the server's stream handler and the agent's stream client.
package agentpb

//go:generate ../scripts/protogen.sh
