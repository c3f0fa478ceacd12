package agent

import (
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/drover/drover/api"
	"github.com/drover/drover/internal/config"
	"github.com/drover/drover/internal/paths"
	"github.com/drover/drover/manifest"
)

// Default paths (docs/design.md, "Paths and names"; internal/paths).
const (
	DefaultConfigFile = paths.AgentConfigFile
	DefaultDataDir    = paths.AgentDataDir
	DefaultTokenFile  = paths.EnrollTokenFile
	// DefaultMachineIDFile is systemd's machine id (machine-id(5)).
	DefaultMachineIDFile = "/etc/machine-id"
	// DefaultAgentPath is where the packages install the agent. The daemon
	// does not assume it: an empty agent_path is the running binary.
	DefaultAgentPath = paths.AgentBinary
)

// Backend and scope names.
const (
	BackendAuto    = "auto"
	BackendSystemd = "systemd"
	BackendCron    = "cron"
	ScopeSystem    = "system"
	ScopeUser      = "user"
)

// Config is the agent configuration. Start from DefaultConfig, decode the
// YAML file over it (DecodeConfig), apply the environment (ApplyEnv) and
// the flags, then Validate. LoadConfig does the first three.
type Config struct {
	// Server is the HTTPS base URL of drover-server (https://host:8443).
	// Required to enroll; once enrolled the URL recorded at enrollment is
	// used when Server is empty.
	Server string `yaml:"server"`
	// ServerURLs, when set, are the HTTPS base URLs of the server's
	// replicas in the order to try them, in place of the list the server
	// sends; GRPCAddrs the same for the stream (host:port). An agent with
	// neither uses the lists the server gave it (enrollment, renewal and
	// every manifest answer) and, after them, Server. Enrollment tries
	// Server, then ServerURLs, until one answers.
	ServerURLs []string `yaml:"server_urls"`
	GRPCAddrs  []string `yaml:"grpc_addrs"`
	// DataDir holds the key, certificates and agent.db (created 0700).
	DataDir string `yaml:"data_dir"`
	// TokenFile is where config management drops the enrollment token. It is
	// read at start and watched while the agent is not enrolled, and removed
	// after a successful enrollment.
	TokenFile string `yaml:"token_file"`
	// Backend is auto, systemd or cron.
	Backend string `yaml:"backend"`
	// Scope is system or user (which systemd manager the pipes go to).
	Scope string `yaml:"scope"`
	// ControlSocket is the unix socket `drover-agent status` and `sync` use.
	// Default: <data_dir>/control/agent.sock (the directory is 0700).
	ControlSocket string `yaml:"control_socket"`
	// AgentPath is the binary pipe services run (`<agent_path> run <pipe>`).
	// Default (empty): the running drover-agent binary, symlinks resolved
	// (ResolveAgentPath). The daemon checks at start that it is executable.
	AgentPath string `yaml:"agent_path"`

	// SyncInterval is how often the manifest is polled while the stream
	// is down; SyncIntervalStreaming while it is up (the stream's SyncNow
	// announces every change, and the server nudges an agent whose
	// heartbeats show it behind, so the interval poll is only the backstop).
	// The streaming interval is never shorter than SyncInterval.
	SyncInterval          time.Duration `yaml:"sync_interval"`
	SyncIntervalStreaming time.Duration `yaml:"sync_interval_streaming"`
	HeartbeatInterval     time.Duration `yaml:"heartbeat_interval"`
	// OutboxMaxBytes bounds the outbox; when full, the oldest log chunks go.
	OutboxMaxBytes int64 `yaml:"outbox_max_bytes"`
	// MaxManifestBytes caps a manifest envelope.
	MaxManifestBytes int `yaml:"max_manifest_bytes"`
	// MaxPayloadBytes caps one pipe payload (its declared size must be below).
	MaxPayloadBytes int64 `yaml:"max_payload_bytes"`
	// MaxBackoff caps the retry delay of enrollment, sync and the stream.
	MaxBackoff time.Duration `yaml:"max_backoff"`
	// RequestTimeout bounds one HTTP request to the server.
	RequestTimeout time.Duration `yaml:"request_timeout"`

	// MachineIDFile is the host's machine id (default /etc/machine-id),
	// sent in Hello and at enrollment so that the server binds the identity
	// to this machine.
	MachineIDFile string `yaml:"machine_id_file"`

	LogLevel  string `yaml:"log_level"`  // debug | info | warn | error
	LogFormat string `yaml:"log_format"` // text | json
}

// DefaultConfig returns the configuration used with no file, environment or
// flags. Only Server has no default.
func DefaultConfig() Config {
	return Config{
		DataDir:               DefaultDataDir,
		TokenFile:             DefaultTokenFile,
		Backend:               BackendAuto,
		Scope:                 ScopeSystem,
		SyncInterval:          30 * time.Second,
		SyncIntervalStreaming: 30 * time.Minute,
		HeartbeatInterval:     30 * time.Second,
		OutboxMaxBytes:        256 << 20,
		MaxManifestBytes:      16 << 20,
		MaxPayloadBytes:       manifest.DefaultMaxBundleBytes,
		MaxBackoff:            5 * time.Minute,
		RequestTimeout:        60 * time.Second,
		MachineIDFile:         DefaultMachineIDFile,
		LogLevel:              "info",
		LogFormat:             "text",
	}
}

// MaxSyncIntervalStreaming bounds sync_interval_streaming.
const MaxSyncIntervalStreaming = time.Hour

// pollInterval is the interval between manifest polls: SyncInterval while
// the stream is down, SyncIntervalStreaming (at least SyncInterval) while
// it is up.
func (c *Config) pollInterval(streaming bool) time.Duration {
	if streaming {
		return max(c.SyncIntervalStreaming, c.SyncInterval)
	}
	return c.SyncInterval
}

// SocketPath returns the control socket path.
func (c *Config) SocketPath() string {
	if c.ControlSocket != "" {
		return c.ControlSocket
	}
	return filepath.Join(c.DataDir, "control", "agent.sock")
}

// LoadConfig returns DefaultConfig overlaid with the YAML file at path and
// then with DROVER_* variables from env (os.Environ form). A missing file is
// an error only when required. It does not Validate: flags come later.
func LoadConfig(path string, required bool, env []string) (Config, error) {
	cfg := DefaultConfig()
	err := config.Load(path, required, env, &cfg)
	return cfg, err
}

// DecodeConfig decodes YAML over cfg, refusing unknown fields.
func DecodeConfig(b []byte, cfg *Config) error { return config.Decode(b, cfg) }

// ApplyEnv applies the DROVER_* variables of env (os.Environ form) that name
// agent settings: DROVER_<YAML NAME>, e.g. DROVER_DATA_DIR. Other DROVER_
// variables are ignored: the server and droverctl share the prefix. The
// enrollment token value (DROVER_ENROLL_TOKEN) is not configuration: the
// daemon reads it itself.
func (c *Config) ApplyEnv(env []string) error { return config.ApplyEnv(c, env) }

// Validate checks every field and returns all problems at once as a
// *manifest.ValidationError whose fields are the YAML names.
func (c *Config) Validate() error {
	var ps config.Problems
	add := ps.Add
	if c.Server != "" {
		if err := checkServerURL(c.Server); err != nil {
			add("server", "%v", err)
		}
	}
	checkList := func(field string, list []string, check func(string) error, eq func(a, b string) bool) {
		if len(list) > api.MaxReplicaAddrs {
			add(field, "%d entries; at most %d", len(list), api.MaxReplicaAddrs)
			return
		}
		for i, v := range list {
			f := fmt.Sprintf("%s[%d]", field, i)
			if err := check(v); err != nil {
				add(f, "%v", err)
				continue
			}
			if j := indexOf(list[:i], v, eq); j >= 0 {
				add(f, "%q repeats %s[%d]", v, field, j)
			}
		}
	}
	checkList("server_urls", c.ServerURLs, checkServerURL, sameURL)
	checkList("grpc_addrs", c.GRPCAddrs, checkGRPCAddr, strings.EqualFold)
	abs := func(field, p string, required bool) {
		switch {
		case p == "" && required:
			add(field, "required")
		case p != "" && !filepath.IsAbs(p):
			add(field, "%q must be an absolute path", p)
		}
	}
	abs("data_dir", c.DataDir, true)
	abs("token_file", c.TokenFile, false)
	abs("control_socket", c.ControlSocket, false)
	abs("machine_id_file", c.MachineIDFile, false)
	abs("agent_path", c.AgentPath, false)
	if len(c.SocketPath()) > 100 {
		add("control_socket", "%q is longer than a unix socket path may be", c.SocketPath())
	}
	ps.OneOf("backend", c.Backend, BackendAuto, BackendSystemd, BackendCron)
	ps.OneOf("scope", c.Scope, ScopeSystem, ScopeUser)
	atLeast := func(field string, d, min time.Duration) {
		if d < min {
			add(field, "must be at least %s", min)
		}
	}
	atLeast("sync_interval", c.SyncInterval, time.Second)
	atLeast("sync_interval_streaming", c.SyncIntervalStreaming, time.Second)
	if c.SyncIntervalStreaming > MaxSyncIntervalStreaming {
		add("sync_interval_streaming", "must be at most %s (a manifest re-signed before it expires must still be fetched in time when a SyncNow is lost)", MaxSyncIntervalStreaming)
	}
	atLeast("heartbeat_interval", c.HeartbeatInterval, time.Second)
	atLeast("max_backoff", c.MaxBackoff, time.Second)
	atLeast("request_timeout", c.RequestTimeout, time.Second)
	if c.OutboxMaxBytes < 1<<20 {
		add("outbox_max_bytes", "must be at least 1 MiB")
	}
	if c.MaxManifestBytes < 4096 {
		add("max_manifest_bytes", "must be at least 4096")
	}
	if c.MaxPayloadBytes < 1024 {
		add("max_payload_bytes", "must be at least 1024")
	}
	ps.Logging(c.LogLevel, c.LogFormat)
	return ps.Err()
}

func checkServerURL(s string) error {
	u, err := url.Parse(s)
	if err != nil || u.Scheme != "https" || u.Host == "" || u.User != nil || u.RawQuery != "" || u.Fragment != "" {
		return fmt.Errorf("%q must be an https:// URL with a host (and no user, query or fragment)", s)
	}
	return nil
}

// EnvNames returns the DROVER_* variables ApplyEnv reads, and
// DROVER_ENROLL_TOKEN.
func EnvNames() []string {
	return append([]string{"DROVER_ENROLL_TOKEN"}, config.EnvNames(&Config{})...)
}

// ResolveAgentPath fills an empty AgentPath with the running binary
// (os.Executable, symlinks evaluated) and checks that the path pipe services
// will run is an executable regular file: a unit whose ExecStart names a
// missing binary fails every run with 203/EXEC.
func (c *Config) ResolveAgentPath() error {
	if c.AgentPath == "" {
		exe, err := os.Executable()
		if err != nil {
			return fmt.Errorf("agent_path: the running binary: %w", err)
		}
		if r, err := filepath.EvalSymlinks(exe); err == nil {
			exe = r
		}
		c.AgentPath = exe
	}
	return CheckAgentPath(c.AgentPath)
}

// CheckAgentPath reports whether path is an executable regular file.
func CheckAgentPath(path string) error {
	if !filepath.IsAbs(path) {
		return fmt.Errorf("agent_path: %q must be an absolute path", path)
	}
	st, err := os.Stat(path)
	if err != nil {
		return fmt.Errorf("agent_path: %w (pipe services run `<agent_path> run <pipe>`; set agent_path or DROVER_AGENT_PATH)", err)
	}
	if !st.Mode().IsRegular() {
		return fmt.Errorf("agent_path: %s is not a regular file", path)
	}
	if err := unix.Access(path, unix.X_OK); err != nil || st.Mode()&0o111 == 0 {
		return fmt.Errorf("agent_path: %s is not executable", path)
	}
	return nil
}
