// Package paths names the default locations of Drover's files on a host,
// once (docs/design.md lists them). Flags and configuration override each;
// these are the defaults the packages ship with.
//
// Any package of this module may import it; it imports nothing.
package paths

// The agent (drover-agent).
const (
	// AgentBinary is where the packages install drover-agent; units
	// run `<AgentBinary> run <pipe>`.
	AgentBinary = "/usr/bin/drover-agent"
	// AgentConfigFile is the agent's configuration.
	AgentConfigFile = "/etc/drover/agent.yaml"
	// EnrollTokenFile is the one-time enrollment token dropped by
	// configuration management.
	EnrollTokenFile = "/etc/drover/enroll.token"
	// AgentDataDir holds the agent's key, certificates, database and
	// payloads (mode 0700).
	AgentDataDir = "/var/lib/drover"
	// RuntimeDir is the agent's runtime directory in system scope; in user
	// scope it is $XDG_RUNTIME_DIR/RuntimeName.
	RuntimeDir = "/run/drover"
	// RuntimeName is the agent's directory below $XDG_RUNTIME_DIR.
	RuntimeName = "drover"
	// PipeMount is where system-scope services see their pipe's files.
	PipeMount = RuntimeDir + "/pipe"
	// RunsName is the per-pipe StateDirectory= prefix, below /var/lib
	// (system scope) or the user manager's state base (user scope):
	// RunsName/<pipe>.
	RunsName = "drover-runs"
	// SystemRunsDir is RunsName below /var/lib: where system-scope runners
	// spool their records.
	SystemRunsDir = "/var/lib/" + RunsName
)

// systemd in system scope.
const (
	// SystemUnitDir is where system-scope units are written.
	SystemUnitDir = "/etc/systemd/system"
	// SystemTimerStampDir is where PID 1 keeps Persistent= timer stamps.
	SystemTimerStampDir = "/var/lib/systemd/timers"
)

// The server (drover-server).
const (
	// ServerConfigFile is the server's configuration.
	ServerConfigFile = "/etc/drover-server/server.yaml"
	// ServerDataDir holds the server's CA, keys, database, admin.token
	// and ca.crt (mode 0700, owner drover).
	ServerDataDir = "/var/lib/drover-server"
)
