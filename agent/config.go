package agent

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
	"golang.org/x/sys/unix"

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

	SyncInterval      time.Duration `yaml:"sync_interval"`
	HeartbeatInterval time.Duration `yaml:"heartbeat_interval"`
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
		DataDir:           DefaultDataDir,
		TokenFile:         DefaultTokenFile,
		Backend:           BackendAuto,
		Scope:             ScopeSystem,
		SyncInterval:      30 * time.Second,
		HeartbeatInterval: 30 * time.Second,
		OutboxMaxBytes:    256 << 20,
		MaxManifestBytes:  16 << 20,
		MaxPayloadBytes:   manifest.DefaultMaxBundleBytes,
		MaxBackoff:        5 * time.Minute,
		RequestTimeout:    60 * time.Second,
		MachineIDFile:     DefaultMachineIDFile,
		LogLevel:          "info",
		LogFormat:         "text",
	}
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
	if path != "" {
		b, err := os.ReadFile(path)
		switch {
		case err == nil:
			if err := DecodeConfig(b, &cfg); err != nil {
				return cfg, fmt.Errorf("config %s: %w", path, err)
			}
		case errors.Is(err, os.ErrNotExist) && !required:
		default:
			return cfg, fmt.Errorf("read config: %w", err)
		}
	}
	if err := cfg.ApplyEnv(env); err != nil {
		return cfg, err
	}
	return cfg, nil
}

// DecodeConfig decodes YAML over cfg, refusing unknown fields.
func DecodeConfig(b []byte, cfg *Config) error {
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	if err := dec.Decode(cfg); err != nil && !errors.Is(err, io.EOF) {
		return fmt.Errorf("decode yaml: %w", err)
	}
	return nil
}

// envVars maps each DROVER_* variable to the config field it sets. The
// enrollment token value (DROVER_ENROLL_TOKEN) is not configuration: the
// daemon reads it itself.
var envVars = []struct {
	name string
	set  func(c *Config, v string) error
}{
	{"DROVER_SERVER", func(c *Config, v string) error { c.Server = v; return nil }},
	{"DROVER_DATA_DIR", func(c *Config, v string) error { c.DataDir = v; return nil }},
	{"DROVER_TOKEN_FILE", func(c *Config, v string) error { c.TokenFile = v; return nil }},
	{"DROVER_BACKEND", func(c *Config, v string) error { c.Backend = v; return nil }},
	{"DROVER_SCOPE", func(c *Config, v string) error { c.Scope = v; return nil }},
	{"DROVER_CONTROL_SOCKET", func(c *Config, v string) error { c.ControlSocket = v; return nil }},
	{"DROVER_AGENT_PATH", func(c *Config, v string) error { c.AgentPath = v; return nil }},
	{"DROVER_SYNC_INTERVAL", func(c *Config, v string) error { return setDuration(&c.SyncInterval, v) }},
	{"DROVER_HEARTBEAT_INTERVAL", func(c *Config, v string) error { return setDuration(&c.HeartbeatInterval, v) }},
	{"DROVER_OUTBOX_MAX_BYTES", func(c *Config, v string) error { return setInt64(&c.OutboxMaxBytes, v) }},
	{"DROVER_MAX_MANIFEST_BYTES", func(c *Config, v string) error {
		var n int64
		err := setInt64(&n, v)
		c.MaxManifestBytes = int(n)
		return err
	}},
	{"DROVER_MAX_PAYLOAD_BYTES", func(c *Config, v string) error { return setInt64(&c.MaxPayloadBytes, v) }},
	{"DROVER_MAX_BACKOFF", func(c *Config, v string) error { return setDuration(&c.MaxBackoff, v) }},
	{"DROVER_REQUEST_TIMEOUT", func(c *Config, v string) error { return setDuration(&c.RequestTimeout, v) }},
	{"DROVER_MACHINE_ID_FILE", func(c *Config, v string) error { c.MachineIDFile = v; return nil }},
	{"DROVER_LOG_LEVEL", func(c *Config, v string) error { c.LogLevel = v; return nil }},
	{"DROVER_LOG_FORMAT", func(c *Config, v string) error { c.LogFormat = v; return nil }},
}

func setDuration(d *time.Duration, v string) error {
	x, err := time.ParseDuration(v)
	if err != nil {
		return err
	}
	*d = x
	return nil
}

func setInt64(n *int64, v string) error {
	x, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		return err
	}
	*n = x
	return nil
}

// ApplyEnv applies the DROVER_* variables of env (os.Environ form) that name
// agent settings. Other DROVER_ variables are ignored: the server and
// droverctl share the prefix.
func (c *Config) ApplyEnv(env []string) error {
	vars := map[string]string{}
	for _, kv := range env {
		if k, v, ok := strings.Cut(kv, "="); ok && strings.HasPrefix(k, "DROVER_") {
			vars[k] = v
		}
	}
	for _, e := range envVars {
		v, ok := vars[e.name]
		if !ok {
			continue
		}
		if err := e.set(c, v); err != nil {
			return fmt.Errorf("environment %s: %w", e.name, err)
		}
	}
	return nil
}

// Validate checks every field and returns all problems at once as a
// *manifest.ValidationError whose fields are the YAML names.
func (c *Config) Validate() error {
	var ps []manifest.FieldError
	add := func(field, format string, args ...any) {
		ps = append(ps, manifest.FieldError{Field: field, Message: fmt.Sprintf(format, args...)})
	}
	if c.Server != "" {
		if err := checkServerURL(c.Server); err != nil {
			add("server", "%v", err)
		}
	}
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
	switch c.Backend {
	case BackendAuto, BackendSystemd, BackendCron:
	default:
		add("backend", "%q is not one of auto, systemd, cron", c.Backend)
	}
	switch c.Scope {
	case ScopeSystem, ScopeUser:
	default:
		add("scope", "%q is not one of system, user", c.Scope)
	}
	atLeast := func(field string, d, min time.Duration) {
		if d < min {
			add(field, "must be at least %s", min)
		}
	}
	atLeast("sync_interval", c.SyncInterval, time.Second)
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
	switch c.LogLevel {
	case "debug", "info", "warn", "error":
	default:
		add("log_level", "%q is not one of debug, info, warn, error", c.LogLevel)
	}
	switch c.LogFormat {
	case "text", "json":
	default:
		add("log_format", "%q is not one of text, json", c.LogFormat)
	}
	if len(ps) > 0 {
		return &manifest.ValidationError{Problems: ps}
	}
	return nil
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
	names := []string{"DROVER_ENROLL_TOKEN"}
	for _, e := range envVars {
		names = append(names, e.name)
	}
	return names
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
