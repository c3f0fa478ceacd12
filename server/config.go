package server

import (
	"fmt"
	"net"
	"net/url"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/drover/drover/api"
	"github.com/drover/drover/internal/config"
	"github.com/drover/drover/manifest"
	agentpb "github.com/drover/drover/proto"
	"github.com/drover/drover/server/notify"
	"github.com/drover/drover/signing"
)

// Default paths and addresses (docs/design.md, "Paths and names").
const (
	DefaultConfigFile = "/etc/drover-server/server.yaml"
	DefaultDataDir    = "/var/lib/drover-server"
	DefaultKEKFile    = "/etc/drover-server/kek"
	DefaultHTTPAddr   = ":8443"
	DefaultGRPCAddr   = ":8444"
)

// Config is the server configuration. Zero values are not defaults: start
// from DefaultConfig and decode YAML over it (LoadConfig does both).
type Config struct {
	// DataDir holds keys, certificates and the database (see doc.go).
	DataDir string `yaml:"data_dir"`
	// KEKFile is the key-encryption key (32 random bytes as 64 hex digits,
	// mode 0600 or stricter; drover-server kek generate writes one). With
	// store.driver postgres the server's keys live in the database sealed
	// by it, and every replica reads the same file; with sqlite it is not
	// read (the keys stay files in the data dir). docs/postgres.md.
	KEKFile string `yaml:"kek_file"`
	// HTTPAddr and GRPCAddr are the listen addresses.
	HTTPAddr string `yaml:"http_addr"`
	GRPCAddr string `yaml:"grpc_addr"`
	// PublicURL is how agents reach the HTTPS API (e.g. https://drover.example:8443).
	// Its host goes into the server certificate's SANs.
	PublicURL string `yaml:"public_url"`
	// GRPCPublicAddr is the host:port agents are told to dial for the stream.
	// Empty: the host of PublicURL (or of the enrollment request) with the
	// gRPC listener's port.
	GRPCPublicAddr string `yaml:"grpc_public_addr"`
	// PublicURLs are the HTTPS base URLs of every replica, in the order
	// agents should prefer them; GRPCPublicAddrs their stream addresses.
	// Agents receive both lists at enrollment and on every manifest poll
	// and fail over along them (docs/postgres.md, "Agents and replicas").
	// public_url, when also set, comes first. At most api.MaxReplicaAddrs
	// each; all their hosts go into the server certificate's SANs.
	PublicURLs      []string `yaml:"public_urls"`
	GRPCPublicAddrs []string `yaml:"grpc_public_addrs"`
	// TLSSANs are extra DNS names or IPs for the server certificate; the
	// hostname, localhost, 127.0.0.1 and ::1 are always included.
	TLSSANs []string `yaml:"tls_sans"`
	// LogLevel is debug, info, warn or error.
	LogLevel string `yaml:"log_level"`
	// LogFormat is text or json.
	LogFormat string `yaml:"log_format"`
	// MetricsPublic serves GET /metrics without authentication; otherwise
	// it needs a viewer (or stronger) API token.
	MetricsPublic bool `yaml:"metrics_public"`

	HTTP       HTTPConfig       `yaml:"http"`
	GRPC       GRPCConfig       `yaml:"grpc"`
	Enrollment EnrollmentConfig `yaml:"enrollment"`
	Signing    SigningConfig    `yaml:"signing"`
	Store      StoreConfig      `yaml:"store"`
	Runs       RunsConfig       `yaml:"runs"`
	// Notify bounds notification delivery (docs/monitoring.md).
	Notify notify.Config `yaml:"notify"`
	// Agents bounds what one agent may make the server store and serve
	// (limits.go).
	Agents AgentLimits `yaml:"agents"`
	// InternalAgent runs a drover-agent for the server's own host as a
	// child process, enrolled through the ordinary token path.
	InternalAgent InternalAgentConfig `yaml:"internal_agent"`
	// Privileged governs specs that give a job more than the sandbox
	// (policy.go): only admin tokens, and the tokens listed here, may
	// write them.
	Privileged PrivilegedConfig `yaml:"privileged"`
	// LiveLogs bounds the followers of live logs.
	LiveLogs LiveLogsConfig `yaml:"live_logs"`
	// Placement sets the leases of placement: one pipes (docs/placement.md).
	Placement PlacementConfig `yaml:"placement"`
	// Runtime tunes the Go runtime of the server process (server.go, applyRuntime).
	Runtime RuntimeConfig `yaml:"runtime"`
}

// RuntimeConfig tunes the server's garbage collector: what an idle agent
// costs in memory against what collecting costs in CPU (README, "What an
// idle agent costs the server").
type RuntimeConfig struct {
	// GCPercent is GOGC: how far, in percent of the live heap and the
	// goroutine stacks, the heap may grow before the next collection; 50
	// by default, where Go's is 100: an idle agent's stacks count twice
	// at 100 (held, and as room for the heap to grow), and a collection
	// at rest is cheap. 0 leaves Go's setting alone (the GOGC environment
	// variable, else 100).
	GCPercent int `yaml:"gc_percent"`
	// MemoryLimitBytes is a soft limit on the memory the Go runtime holds
	// (GOMEMLIMIT): near it the collector runs more often, whatever
	// gc_percent says. 0 leaves Go's setting alone (GOMEMLIMIT, else none).
	MemoryLimitBytes int64 `yaml:"memory_limit_bytes"`
	// ProfileAddr, when set, serves Go's profiles (net/http/pprof, under
	// /debug/pprof/) on this loopback address, plain HTTP without
	// authentication: every local user of the host can read them, so set
	// it only while measuring. Empty (the default) serves nothing. Only a
	// loopback IP or "localhost" with a port is accepted.
	ProfileAddr string `yaml:"profile_addr"`
}

// PlacementConfig sets the leases of placement: one pipes.
type PlacementConfig struct {
	// Lease is how long a holder runs a pipe without a fresh manifest; the
	// server renews it once less than two thirds is left.
	Lease time.Duration `yaml:"lease"`
	// SkewMargin is added to a lease's end before another agent gains the
	// pipe: the bound on clock differences between hosts that the
	// at-most-one-holder guarantee assumes.
	SkewMargin time.Duration `yaml:"skew_margin"`
}

// PrivilegedConfig is the allow-list of the privileged-spec policy.
type PrivilegedConfig struct {
	// AllowTokens are API token ids or names that may write privileged
	// specs besides admin tokens.
	AllowTokens []string `yaml:"allow_tokens"`
}

// LiveLogsConfig bounds GET /api/v1/runs/{id}/logs/stream.
type LiveLogsConfig struct {
	// MaxFollowers is the fleet-wide cap; MaxPerToken the cap per API token.
	MaxFollowers int `yaml:"max_followers"`
	MaxPerToken  int `yaml:"max_per_token"`
	// IdleTimeout ends a stream whose run wrote no chunk and changed no
	// status for this long (the client may reconnect with Last-Event-ID).
	IdleTimeout time.Duration `yaml:"idle_timeout"`
}

// InternalAgentConfig configures the agent the server may run for its own host.
type InternalAgentConfig struct {
	Enabled bool `yaml:"enabled"`
	// AgentPath is the drover-agent binary; empty: the one beside
	// drover-server, else /usr/bin/drover-agent.
	AgentPath string `yaml:"agent_path"`
	// DataDir is the agent's data directory; empty: <data_dir>/internal-agent.
	DataDir string `yaml:"data_dir"`
	// Backend is auto, systemd or cron; Scope is system or user (empty:
	// system when running as root, else user).
	Backend string `yaml:"backend"`
	Scope   string `yaml:"scope"`
	// User is the unprivileged user a root server runs a cron-backend
	// internal agent (and its jobs) as; default nobody. Its data dir must
	// then lie outside the server's (default: <data_dir>-internal-agent).
	User string `yaml:"user"`
}

// HTTPConfig bounds the HTTPS listener.
type HTTPConfig struct {
	ReadHeaderTimeout time.Duration `yaml:"read_header_timeout"`
	ReadTimeout       time.Duration `yaml:"read_timeout"`
	WriteTimeout      time.Duration `yaml:"write_timeout"`
	IdleTimeout       time.Duration `yaml:"idle_timeout"`
	MaxHeaderBytes    int           `yaml:"max_header_bytes"`
	// MaxBodyBytes caps JSON request bodies except pipe uploads.
	MaxBodyBytes int64 `yaml:"max_body_bytes"`
	// MaxConcurrent bounds requests in flight that carry an API token; more
	// wait briefly, then get 503. Agents (a verified client certificate) and
	// unauthenticated requests have pools of their own, so that neither
	// operators nor anonymous clients can starve the agents' polls.
	MaxConcurrent int `yaml:"max_concurrent"`
	// MaxConcurrentPerToken bounds the requests in flight of one API token
	// (a viewer's slow dry-runs cannot take the whole token pool).
	MaxConcurrentPerToken int `yaml:"max_concurrent_per_token"`
	// AgentMaxConcurrent bounds agents' requests in flight.
	AgentMaxConcurrent int `yaml:"agent_max_concurrent"`
	// PublicMaxConcurrent bounds unauthenticated requests in flight
	// (enrollment, health, the OpenAPI document).
	PublicMaxConcurrent int `yaml:"public_max_concurrent"`
	// BodyTimeout is how long a client has to send a request body, counted
	// from the start of the request, whatever the handler does (for agents
	// and API tokens plus one second per 64 KiB of declared length);
	// PublicBodyTimeout the same for unauthenticated requests (flat).
	BodyTimeout       time.Duration `yaml:"body_timeout"`
	PublicBodyTimeout time.Duration `yaml:"public_body_timeout"`
	// PublicMaxBodyBytes caps the body of an unauthenticated request.
	PublicMaxBodyBytes int64 `yaml:"public_max_body_bytes"`
	// ShutdownTimeout bounds draining on SIGTERM.
	ShutdownTimeout time.Duration `yaml:"shutdown_timeout"`
}

// GRPCConfig bounds the telemetry listener.
type GRPCConfig struct {
	MaxStreams   int `yaml:"max_streams"`
	MaxRecvBytes int `yaml:"max_recv_bytes"`
	// KeepaliveTime is how long a stream reads nothing before the server
	// PINGs the agent (KeepaliveWait to answer). It is longer than the
	// agents' 30 s heartbeat, so a live agent is never pinged, and long
	// enough that each stream's keepalive timer wakes the server rarely.
	// At 5,000 idle agents PINGing every 2 min (one run each), 2 min cost
	// 1.31% of a core per 1,000 agents and 45 s 1.57%; 30 s here and in the
	// agents, as before, 1.90%.
	// A stream that went silent (a stopped or hung agent) ends after
	// KeepaliveTime + KeepaliveWait.
	KeepaliveTime  time.Duration `yaml:"keepalive_time"`
	KeepaliveWait  time.Duration `yaml:"keepalive_timeout"`
	ConnectTimeout time.Duration `yaml:"connect_timeout"`
	// IdleTimeout closes connections without streams.
	IdleTimeout time.Duration `yaml:"idle_timeout"`
	// OfflineAfter: an agent is online while it has a live stream and was
	// heard from (any message, heartbeats included) within this time.
	OfflineAfter time.Duration `yaml:"offline_after"`
	// CarryManifestBytes: a SyncNow carries the agent's signed manifest
	// when it is at most this large (the agent then needs no poll); 0
	// never carries one. At most agentpb.MaxSyncNowManifestBytes, which
	// agents accept.
	CarryManifestBytes int `yaml:"carry_manifest_bytes"`
}

// EnrollmentConfig governs tokens and agent certificates.
type EnrollmentConfig struct {
	DefaultTTL   time.Duration `yaml:"default_ttl"`
	MaxTTL       time.Duration `yaml:"max_ttl"`
	CertLifetime time.Duration `yaml:"cert_lifetime"`
	// RatePerMinute and Burst limit enrollment attempts per source address.
	RatePerMinute int `yaml:"rate_per_minute"`
	Burst         int `yaml:"burst"`
	// RenewInterval and RenewBurst limit certificate renewals per agent:
	// RenewBurst at once, then one per RenewInterval.
	RenewInterval time.Duration `yaml:"renew_interval"`
	RenewBurst    int           `yaml:"renew_burst"`
}

// SigningConfig governs manifest and key-list signing.
type SigningConfig struct {
	Algorithm        string        `yaml:"algorithm"`
	ManifestLifetime time.Duration `yaml:"manifest_lifetime"`
	KeyListLifetime  time.Duration `yaml:"key_list_lifetime"`
	// MaxPayloadBytes caps one pipe bundle.
	MaxPayloadBytes int64 `yaml:"max_payload_bytes"`
}

// StoreConfig configures the store: the embedded SQLite file in the data
// dir (driver sqlite) or a PostgreSQL database (driver postgres, see
// docs/postgres.md).
type StoreConfig struct {
	// Driver is sqlite or postgres.
	Driver string `yaml:"driver"`
	// DSN is the PostgreSQL connection string (postgres://user:pw@host/db
	// or key=value); only with driver postgres. It is never logged.
	DSN string `yaml:"dsn"`
	// MaxConns, MinConns, MaxConnLifetime and MaxConnIdleTime size the
	// PostgreSQL connection pool.
	MaxConns        int           `yaml:"max_conns"`
	MinConns        int           `yaml:"min_conns"`
	MaxConnLifetime time.Duration `yaml:"max_conn_lifetime"`
	MaxConnIdleTime time.Duration `yaml:"max_conn_idle_time"`
	// Synchronous is SQLite's synchronous mode: full (acks survive power
	// loss) or normal (acks survive a process crash).
	Synchronous string `yaml:"synchronous"`
	// IngestBatch caps the records committed in one transaction.
	IngestBatch int `yaml:"ingest_batch"`
	// IngestDelay is how long a batch of agent records gathers after its
	// first record before it is committed (group commit: one fsync for the
	// records of many agents); acks wait at most this much longer, or,
	// while records keep coming, until 100 ms after the last commit began
	// (stream.commitGap).
	IngestDelay time.Duration `yaml:"ingest_delay"`
}

// RunsConfig governs run history and logs.
type RunsConfig struct {
	MaxLogBytes       int64         `yaml:"max_log_bytes"`
	MaxChunkBytes     int           `yaml:"max_chunk_bytes"`
	RetentionAge      time.Duration `yaml:"retention_age"`
	RetentionPerPipe  int           `yaml:"retention_per_pipe"`
	RetentionInterval time.Duration `yaml:"retention_interval"`
}

// DefaultConfig returns the configuration used with no file and no environment.
func DefaultConfig() Config {
	return Config{
		DataDir:   DefaultDataDir,
		KEKFile:   DefaultKEKFile,
		HTTPAddr:  DefaultHTTPAddr,
		GRPCAddr:  DefaultGRPCAddr,
		LogLevel:  "info",
		LogFormat: "text",
		HTTP: HTTPConfig{
			ReadHeaderTimeout:     10 * time.Second,
			ReadTimeout:           60 * time.Second,
			WriteTimeout:          60 * time.Second,
			IdleTimeout:           120 * time.Second,
			MaxHeaderBytes:        64 << 10,
			MaxBodyBytes:          1 << 20,
			MaxConcurrent:         512,
			AgentMaxConcurrent:    512,
			MaxConcurrentPerToken: 32,
			PublicMaxConcurrent:   64,
			BodyTimeout:           20 * time.Second,
			PublicBodyTimeout:     5 * time.Second,
			PublicMaxBodyBytes:    64 << 10,
			ShutdownTimeout:       15 * time.Second,
		},
		GRPC: GRPCConfig{
			MaxStreams:         20000,
			MaxRecvBytes:       4 << 20,
			KeepaliveTime:      2 * time.Minute,
			KeepaliveWait:      10 * time.Second,
			ConnectTimeout:     20 * time.Second,
			IdleTimeout:        5 * time.Minute,
			OfflineAfter:       90 * time.Second,
			CarryManifestBytes: agentpb.MaxSyncNowManifestBytes,
		},
		Placement: PlacementConfig{Lease: 5 * time.Minute, SkewMargin: time.Minute},
		Runtime:   RuntimeConfig{GCPercent: 50},
		Enrollment: EnrollmentConfig{
			DefaultTTL:    time.Hour,
			MaxTTL:        30 * 24 * time.Hour,
			CertLifetime:  30 * 24 * time.Hour,
			RatePerMinute: 60,
			Burst:         100,
			RenewInterval: 10 * time.Minute,
			RenewBurst:    3,
		},
		Signing: SigningConfig{
			Algorithm:        string(signing.Ed25519),
			ManifestLifetime: manifest.DefaultLifetime,
			KeyListLifetime:  365 * 24 * time.Hour,
			MaxPayloadBytes:  manifest.DefaultMaxBundleBytes,
		},
		Store: StoreConfig{
			Driver:          "sqlite",
			MaxConns:        16,
			MinConns:        0,
			MaxConnLifetime: time.Hour,
			MaxConnIdleTime: 30 * time.Minute,
			Synchronous:     "full",
			IngestBatch:     2000,
			IngestDelay:     20 * time.Millisecond,
		},
		LiveLogs: LiveLogsConfig{
			MaxFollowers: 256,
			MaxPerToken:  8,
			IdleTimeout:  10 * time.Minute,
		},
		Notify: notify.DefaultConfig(),
		Runs: RunsConfig{
			MaxLogBytes:       1 << 20,
			MaxChunkBytes:     256 << 10,
			RetentionAge:      30 * 24 * time.Hour,
			RetentionPerPipe:  1000,
			RetentionInterval: time.Hour,
		},
		Agents: defaultAgentLimits(),
	}
}

// LoadConfig returns DefaultConfig overlaid with the YAML file at path (if
// path is not empty; a missing file is an error only when required) and then
// with DROVER_* environment variables from env (os.Environ form), and
// validates the result.
func LoadConfig(path string, required bool, env []string) (Config, error) {
	cfg := DefaultConfig()
	if err := config.Load(path, required, env, &cfg); err != nil {
		return cfg, err
	}
	if err := cfg.Validate(); err != nil {
		return cfg, err
	}
	return cfg, nil
}

// checkPublicURL checks an address agents are given for the HTTPS API.
func checkPublicURL(s string) error {
	u, err := url.Parse(s)
	if err != nil || u.Scheme != "https" || u.Host == "" || u.Hostname() == "" || u.User != nil || u.RawQuery != "" || u.Fragment != "" || strings.ContainsAny(s, ", ") {
		return fmt.Errorf("%q must be an https:// URL with a host (and no user, query, fragment, comma or space)", s)
	}
	if p := u.Port(); p != "" {
		if n, err := strconv.Atoi(p); err != nil || n < 1 || n > 65535 {
			return fmt.Errorf("%q has an invalid port", s)
		}
	}
	return nil
}

// checkPublicAddr checks a stream address agents are given.
func checkPublicAddr(s string) error {
	h, p, err := net.SplitHostPort(s)
	if err != nil || h == "" {
		return fmt.Errorf("%q is not host:port", s)
	}
	if n, err := strconv.Atoi(p); err != nil || n < 1 || n > 65535 {
		return fmt.Errorf("%q has an invalid port", s)
	}
	if strings.ContainsAny(h, " /,") {
		return fmt.Errorf("%q is not host:port", s)
	}
	return nil
}

// normalURL is u as compared for duplicates: no trailing slash, the
// scheme and host in lower case.
func normalURL(s string) string {
	s = strings.TrimSuffix(s, "/")
	if u, err := url.Parse(s); err == nil {
		u.Host = strings.ToLower(u.Host)
		return u.String()
	}
	return s
}

// ReplicaURLs is the list of HTTPS base URLs agents are given: public_url
// first (when set), then public_urls without it; empty when neither is
// set.
func (c *Config) ReplicaURLs() []string {
	return mergeAddrs(c.PublicURL, c.PublicURLs, func(s string) string { return strings.TrimSuffix(s, "/") }, normalURL)
}

// ReplicaGRPCAddrs is the list of stream addresses agents are given:
// grpc_public_addr first (when set), then grpc_public_addrs without it.
func (c *Config) ReplicaGRPCAddrs() []string {
	return mergeAddrs(c.GRPCPublicAddr, c.GRPCPublicAddrs, func(s string) string { return s }, strings.ToLower)
}

func mergeAddrs(one string, list []string, clean, norm func(string) string) []string {
	var out []string
	seen := map[string]bool{}
	for _, v := range append([]string{one}, list...) {
		if v == "" || seen[norm(v)] {
			continue
		}
		seen[norm(v)] = true
		out = append(out, clean(v))
	}
	return out
}

// DecodeConfig decodes YAML over cfg, refusing unknown fields.
func DecodeConfig(b []byte, cfg *Config) error { return config.Decode(b, cfg) }

// ApplyEnv applies DROVER_<PATH> variables, where PATH is the upper-cased
// YAML path joined by '_': DROVER_HTTP_ADDR, DROVER_DATA_DIR,
// DROVER_ENROLLMENT_CERT_LIFETIME, DROVER_TLS_SANS (comma-separated). Unknown
// DROVER_ variables are ignored: the agent and droverctl share the prefix.
func (c *Config) ApplyEnv(env []string) error { return config.ApplyEnv(c, env) }

// Validate checks every field and returns all problems at once as a
// *manifest.ValidationError with YAML field paths.
func (c *Config) Validate() error {
	var ps config.Problems
	add := ps.Add
	if c.DataDir == "" {
		add("data_dir", "required")
	}
	if c.KEKFile == "" {
		add("kek_file", "required")
	} else if !filepath.IsAbs(c.KEKFile) {
		add("kek_file", "%q must be an absolute path", c.KEKFile)
	}
	for _, a := range []struct{ f, v string }{{"http_addr", c.HTTPAddr}, {"grpc_addr", c.GRPCAddr}} {
		if _, port, err := net.SplitHostPort(a.v); err != nil {
			add(a.f, "%q is not host:port", a.v)
		} else if n, err := strconv.Atoi(port); err != nil || n < 0 || n > 65535 {
			add(a.f, "%q has an invalid port", a.v)
		}
	}
	if c.PublicURL != "" {
		if err := checkPublicURL(c.PublicURL); err != nil {
			add("public_url", "%v", err)
		}
	}
	if c.GRPCPublicAddr != "" {
		if err := checkPublicAddr(c.GRPCPublicAddr); err != nil {
			add("grpc_public_addr", "%v", err)
		}
	}
	checkList := func(field string, list []string, check func(string) error, norm func(string) string) {
		if len(list) > api.MaxReplicaAddrs {
			add(field, "%d entries; at most %d", len(list), api.MaxReplicaAddrs)
			return
		}
		seen := map[string]int{}
		for i, v := range list {
			f := fmt.Sprintf("%s[%d]", field, i)
			if err := check(v); err != nil {
				add(f, "%v", err)
				continue
			}
			if j, dup := seen[norm(v)]; dup {
				add(f, "%q repeats %s[%d]", v, field, j)
				continue
			}
			seen[norm(v)] = i
		}
	}
	checkList("public_urls", c.PublicURLs, checkPublicURL, normalURL)
	checkList("grpc_public_addrs", c.GRPCPublicAddrs, checkPublicAddr, strings.ToLower)
	for i, s := range c.TLSSANs {
		if s == "" || strings.ContainsAny(s, " /:") && net.ParseIP(s) == nil {
			add(fmt.Sprintf("tls_sans[%d]", i), "%q is not a DNS name or IP address", s)
		}
	}
	if ia := c.InternalAgent; ia.Enabled {
		for _, p := range []struct{ f, v string }{{"internal_agent.agent_path", ia.AgentPath}, {"internal_agent.data_dir", ia.DataDir}} {
			if p.v != "" && !filepath.IsAbs(p.v) {
				add(p.f, "%q must be an absolute path", p.v)
			}
		}
		switch ia.Backend {
		case "", "auto", "systemd", "cron":
		default:
			add("internal_agent.backend", "%q is not one of auto, systemd, cron", ia.Backend)
		}
		switch ia.Scope {
		case "", "system", "user":
		default:
			add("internal_agent.scope", "%q is not one of system, user", ia.Scope)
		}
	}
	ps.Logging(c.LogLevel, c.LogFormat)
	positive := func(field string, d time.Duration) {
		if d <= 0 {
			add(field, "must be a positive duration")
		}
	}
	positive("http.read_header_timeout", c.HTTP.ReadHeaderTimeout)
	for f, d := range map[string]time.Duration{"poll": c.Notify.Poll, "retry_min": c.Notify.RetryMin, "retry_max": c.Notify.RetryMax, "max_age": c.Notify.MaxAge, "timeout": c.Notify.Timeout, "alert_hold": c.Notify.AlertHold, "one_off_hold": c.Notify.OneOffHold} {
		positive("notify."+f, d)
	}
	positive("http.read_timeout", c.HTTP.ReadTimeout)
	positive("http.write_timeout", c.HTTP.WriteTimeout)
	positive("http.idle_timeout", c.HTTP.IdleTimeout)
	positive("http.shutdown_timeout", c.HTTP.ShutdownTimeout)
	positive("grpc.keepalive_time", c.GRPC.KeepaliveTime)
	positive("grpc.keepalive_timeout", c.GRPC.KeepaliveWait)
	positive("grpc.connect_timeout", c.GRPC.ConnectTimeout)
	positive("grpc.idle_timeout", c.GRPC.IdleTimeout)
	positive("grpc.offline_after", c.GRPC.OfflineAfter)
	if n := c.GRPC.CarryManifestBytes; n < 0 || n > agentpb.MaxSyncNowManifestBytes {
		add("grpc.carry_manifest_bytes", "%d is not 0 (never) to %d", n, agentpb.MaxSyncNowManifestBytes)
	}
	positive("enrollment.default_ttl", c.Enrollment.DefaultTTL)
	positive("enrollment.max_ttl", c.Enrollment.MaxTTL)
	positive("runs.retention_age", c.Runs.RetentionAge)
	positive("http.body_timeout", c.HTTP.BodyTimeout)
	positive("http.public_body_timeout", c.HTTP.PublicBodyTimeout)
	positive("enrollment.renew_interval", c.Enrollment.RenewInterval)
	positive("live_logs.idle_timeout", c.LiveLogs.IdleTimeout)
	for _, n := range []struct {
		f string
		v int64
	}{{"http.agent_max_concurrent", int64(c.HTTP.AgentMaxConcurrent)}, {"http.max_concurrent_per_token", int64(c.HTTP.MaxConcurrentPerToken)}, {"http.public_max_concurrent", int64(c.HTTP.PublicMaxConcurrent)},
		{"http.public_max_body_bytes", c.HTTP.PublicMaxBodyBytes}, {"enrollment.renew_burst", int64(c.Enrollment.RenewBurst)},
		{"live_logs.max_followers", int64(c.LiveLogs.MaxFollowers)}, {"live_logs.max_per_token", int64(c.LiveLogs.MaxPerToken)}} {
		if n.v <= 0 {
			add(n.f, "must be positive")
		}
	}
	for i, t := range c.Privileged.AllowTokens {
		if strings.TrimSpace(t) == "" {
			add(fmt.Sprintf("privileged.allow_tokens[%d]", i), "must not be empty")
		}
	}
	positive("runs.retention_interval", c.Runs.RetentionInterval)
	if l := c.Placement.Lease; l < 10*time.Second || l > 24*time.Hour {
		add("placement.lease", "%s out of range 10s-24h", l)
	}
	if m := c.Placement.SkewMargin; m < time.Second || m > c.Placement.Lease {
		add("placement.skew_margin", "%s out of range 1s-placement.lease", m)
	}
	if c.Enrollment.DefaultTTL > c.Enrollment.MaxTTL {
		add("enrollment.default_ttl", "longer than enrollment.max_ttl")
	}
	if c.Enrollment.CertLifetime < time.Hour || c.Enrollment.CertLifetime > 397*24*time.Hour {
		add("enrollment.cert_lifetime", "must be between 1h and 397 days")
	}
	if c.Store.IngestDelay < 0 || c.Store.IngestDelay > time.Second {
		add("store.ingest_delay", "must be between 0 and 1s")
	}
	if c.Signing.ManifestLifetime < 2*time.Minute || c.Signing.ManifestLifetime > 90*24*time.Hour {
		add("signing.manifest_lifetime", "must be between 2m and 90 days")
	}
	if c.Signing.KeyListLifetime < 24*time.Hour || c.Signing.KeyListLifetime < 2*c.Signing.ManifestLifetime {
		add("signing.key_list_lifetime", "must be at least 24h and twice signing.manifest_lifetime")
	}
	switch signing.Algorithm(c.Signing.Algorithm) {
	case signing.Ed25519, signing.ECDSAP256:
	default:
		add("signing.algorithm", "%q is not one of %s, %s", c.Signing.Algorithm, signing.Ed25519, signing.ECDSAP256)
	}
	atLeast := func(field string, v, min int64) {
		if v < min {
			add(field, "must be at least %d", min)
		}
	}
	atLeast("http.max_header_bytes", int64(c.HTTP.MaxHeaderBytes), 4096)
	atLeast("http.max_body_bytes", c.HTTP.MaxBodyBytes, 4096)
	atLeast("http.max_concurrent", int64(c.HTTP.MaxConcurrent), 1)
	atLeast("grpc.max_streams", int64(c.GRPC.MaxStreams), 1)
	c.Agents.validate(atLeast)
	atLeast("grpc.max_recv_bytes", int64(c.GRPC.MaxRecvBytes), 64<<10)
	atLeast("enrollment.rate_per_minute", int64(c.Enrollment.RatePerMinute), 1)
	atLeast("enrollment.burst", int64(c.Enrollment.Burst), 1)
	atLeast("signing.max_payload_bytes", c.Signing.MaxPayloadBytes, 1024)
	atLeast("store.ingest_batch", int64(c.Store.IngestBatch), 1)
	atLeast("runs.max_log_bytes", c.Runs.MaxLogBytes, 1024)
	atLeast("runs.max_chunk_bytes", int64(c.Runs.MaxChunkBytes), 1024)
	atLeast("runs.retention_per_pipe", int64(c.Runs.RetentionPerPipe), 1)
	ps.OneOf("store.synchronous", c.Store.Synchronous, "full", "normal")
	switch c.Store.Driver {
	case "sqlite":
		if c.Store.DSN != "" {
			add("store.dsn", "is only used with store.driver postgres")
		}
	case "postgres":
		if c.Store.DSN == "" {
			add("store.dsn", "is required with store.driver postgres")
		}
	default:
		add("store.driver", "%q is not one of sqlite, postgres", c.Store.Driver)
	}
	atLeast("store.max_conns", int64(c.Store.MaxConns), 1)
	atLeast("store.min_conns", int64(c.Store.MinConns), 0)
	if c.Store.MinConns > c.Store.MaxConns {
		add("store.min_conns", "%d is more than store.max_conns (%d)", c.Store.MinConns, c.Store.MaxConns)
	}
	if c.Store.MaxConns > 10000 {
		add("store.max_conns", "must be at most 10000")
	}
	if c.Store.MaxConnLifetime < time.Second {
		add("store.max_conn_lifetime", "must be at least 1s")
	}
	if c.Store.MaxConnIdleTime < time.Second {
		add("store.max_conn_idle_time", "must be at least 1s")
	}
	if g := c.Runtime.GCPercent; g != 0 && (g < 10 || g > 1000) {
		add("runtime.gc_percent", "%d is not 0 (Go's setting) or 10 to 1000", g)
	}
	if m := c.Runtime.MemoryLimitBytes; m != 0 && m < 64<<20 {
		add("runtime.memory_limit_bytes", "%d is not 0 (none) or at least 64 MiB (67108864)", m)
	}
	if a := c.Runtime.ProfileAddr; a != "" {
		if err := checkLoopbackAddr(a); err != nil {
			add("runtime.profile_addr", "%v", err)
		}
	}
	return ps.Err()
}

// checkLoopbackAddr accepts host:port (checkPublicAddr) where host is a
// loopback IP address or "localhost".
func checkLoopbackAddr(a string) error {
	if err := checkPublicAddr(a); err != nil {
		return err
	}
	h, _, _ := net.SplitHostPort(a)
	if ip := net.ParseIP(h); h != "localhost" && (ip == nil || !ip.IsLoopback()) {
		return fmt.Errorf("host %q is not a loopback address (127.0.0.1, ::1 or localhost): profiles are not for the network", h)
	}
	return nil
}
