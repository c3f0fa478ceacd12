package server

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/drover/drover/api"
	"github.com/drover/drover/server/errs"
	"github.com/drover/drover/server/pki"
	"github.com/drover/drover/server/store"
	"github.com/drover/drover/server/store/sqlite"

	"github.com/drover/drover/signing"
)

const usage = `Usage:
  drover-server [serve] [flags]          run the control plane (the default)
  drover-server keys rotate [flags]      add a new manifest signing key
  drover-server tokens create [flags]    print a new enrollment token
  drover-server api-tokens create --name N --role viewer|operator|admin [--ttl D]
                                         print a new API token (e.g. to recover
                                         after admin.token was revoked)
  drover-server version

Flags shared by every command:
  --config FILE     YAML configuration (default ` + DefaultConfigFile + `, optional)
  --data-dir DIR    state directory (default ` + DefaultDataDir + `)
  --http-addr ADDR  HTTPS listen address (default ` + DefaultHTTPAddr + `)
  --grpc-addr ADDR  gRPC listen address (default ` + DefaultGRPCAddr + `)
  --internal-agent  also run a drover-agent for this host (serve only)
Environment variables DROVER_<SETTING> (e.g. DROVER_DATA_DIR) override the file;
flags override both.
`

// Main is drover-server's command line; it returns the exit code.
func Main(version string, args, env []string, stdout, stderr io.Writer) int {
	cmd := "serve"
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		cmd, args = args[0], args[1:]
		if (cmd == "keys" || cmd == "tokens" || cmd == "api-tokens") && len(args) > 0 && !strings.HasPrefix(args[0], "-") {
			cmd, args = cmd+" "+args[0], args[1:]
		}
	}
	fs := flag.NewFlagSet("drover-server "+cmd, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, usage) }
	configFile := fs.String("config", "", "")
	dataDir := fs.String("data-dir", "", "")
	httpAddr := fs.String("http-addr", "", "")
	grpcAddr := fs.String("grpc-addr", "", "")
	internalAgent := fs.Bool("internal-agent", false, "")
	var ttl, name, format, roleName string
	tags := tagFlag{}
	if cmd == "api-tokens create" {
		fs.StringVar(&ttl, "ttl", "", "token lifetime, e.g. 720h (default: no expiry)")
		fs.StringVar(&name, "name", "", "who or what uses the token")
		fs.StringVar(&roleName, "role", "", "viewer, operator or admin")
		fs.StringVar(&format, "output", "token", "token (just the token) or json")
	}
	if cmd == "tokens create" {
		fs.StringVar(&ttl, "ttl", "", "token lifetime, e.g. 1h (default from the config)")
		fs.StringVar(&name, "name", "", "preset agent name")
		fs.Var(tags, "tag", "preset agent tag key=value (repeatable)")
		fs.StringVar(&format, "output", "token", "token (just the token) or json")
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "drover-server: unexpected argument %q\n%s", fs.Arg(0), usage)
		return 2
	}
	path, required := DefaultConfigFile, false
	if *configFile != "" {
		path, required = *configFile, true
	}
	cfg, err := LoadConfig(path, required, env)
	if err == nil {
		for _, f := range []struct{ v, to *string }{{dataDir, &cfg.DataDir}, {httpAddr, &cfg.HTTPAddr}, {grpcAddr, &cfg.GRPCAddr}} {
			if *f.v != "" {
				*f.to = *f.v
			}
		}
		if *internalAgent {
			cfg.InternalAgent.Enabled = true
		}
		err = cfg.Validate()
	}
	if err != nil {
		fmt.Fprintf(stderr, "drover-server: %v\n", err)
		return 2
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	switch cmd {
	case "serve":
		err = serve(ctx, cfg, stderr)
	case "keys rotate":
		err = rotateCommand(ctx, cfg, stdout)
	case "tokens create":
		var resp *api.EnrollmentTokenCreated
		resp, err = CreateTokenOffline(ctx, cfg, api.EnrollmentTokenRequest{TTL: ttl, Name: name, Tags: tags})
		if err == nil {
			if format == "json" {
				b, _ := json.MarshalIndent(resp, "", "  ")
				fmt.Fprintln(stdout, string(b))
			} else {
				fmt.Fprintln(stdout, resp.Token)
			}
		}
	case "api-tokens create":
		var resp *api.APITokenCreated
		resp, err = CreateAPITokenOffline(ctx, cfg, api.APITokenRequest{Name: name, Role: roleName, TTL: ttl})
		if err == nil {
			if format == "json" {
				b, _ := json.MarshalIndent(resp, "", "  ")
				fmt.Fprintln(stdout, string(b))
			} else {
				fmt.Fprintln(stdout, resp.Token)
			}
		}
	case "version":
		fmt.Fprintln(stdout, "drover-server", version)
	default:
		fmt.Fprintf(stderr, "drover-server: unknown command %q\n%s", cmd, usage)
		return 2
	}
	if err != nil {
		fmt.Fprintf(stderr, "drover-server: %s\n", describe(err))
		return 1
	}
	return 0
}

// describe renders an error with its details for the terminal.
func describe(err error) string {
	k, body := errs.Public(err)
	if k.Err == errs.ErrInternal {
		return err.Error()
	}
	msg := body.Error.Message
	for _, d := range body.Error.Details {
		msg += "\n  " + d.Field + ": " + d.Message
	}
	return msg
}

// NewLogger returns the slog logger the configuration asks for, on w.
func NewLogger(cfg Config, w io.Writer) *slog.Logger {
	var level slog.Level
	_ = level.UnmarshalText([]byte(cfg.LogLevel))
	opts := &slog.HandlerOptions{Level: level}
	if cfg.LogFormat == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

func serve(ctx context.Context, cfg Config, stderr io.Writer) error {
	s, err := New(cfg, NewLogger(cfg, stderr), SystemClock())
	if err != nil {
		return err
	}
	return s.Run(ctx)
}

// tagFlag collects --tag key=value.
type tagFlag map[string]string

func (t tagFlag) String() string {
	keys := make([]string, 0, len(t))
	for k, v := range t {
		keys = append(keys, k+"="+v)
	}
	sort.Strings(keys)
	return strings.Join(keys, ",")
}

func (t tagFlag) Set(s string) error {
	k, v, ok := strings.Cut(s, "=")
	if !ok || k == "" {
		return fmt.Errorf("%q is not key=value", s)
	}
	t[k] = v
	return nil
}

// CreateTokenOffline creates an enrollment token directly in the data dir's
// database. It works whether or not the server is running (SQLite allows
// several processes), which suits packaging scripts and config management.
func CreateTokenOffline(ctx context.Context, cfg Config, req api.EnrollmentTokenRequest) (*api.EnrollmentTokenCreated, error) {
	certPEM, err := os.ReadFile(filepath.Join(cfg.DataDir, "ca.crt"))
	if err != nil {
		return nil, fmt.Errorf("read the CA certificate (has the server started once?): %w", err)
	}
	cert, err := pki.ParseCertPEM(certPEM)
	if err != nil {
		return nil, fmt.Errorf("ca.crt: %w", err)
	}
	st, err := sqlite.Open(ctx, filepath.Join(cfg.DataDir, "server.db"), cfg.Store.Synchronous)
	if err != nil {
		return nil, err
	}
	defer st.Close()
	resp, err := createToken(ctx, st, cfg.Enrollment, pki.CAPin(cert), time.Now(), req)
	if err != nil {
		return nil, err
	}
	t, err := st.GetToken(ctx, resp.ID)
	if err != nil {
		return nil, err
	}
	after := tokenJSON(t, time.Now())
	return resp, st.AddAudit(ctx, localAudit("enrollment_tokens.create", "enrollment-token/"+resp.ID, after))
}

// localAudit is the audit entry of a command run on the server's host.
func localAudit(action, target string, after any) *store.AuditEntry {
	return &store.AuditEntry{At: time.Now(), ActorID: "local", ActorName: "drover-server (command line)", Role: roleAdmin.String(),
		Action: action, Target: target, AfterDigest: digestOf(after), Source: "local"}
}

// CreateAPITokenOffline creates an API token directly in the data dir's
// database, whether or not the server is running: the way back in when
// admin.token was revoked and no admin token is at hand (whoever can run
// it can read the data dir anyway).
func CreateAPITokenOffline(ctx context.Context, cfg Config, req api.APITokenRequest) (*api.APITokenCreated, error) {
	rl, ttl, err := checkAPITokenRequest(req)
	if err != nil {
		return nil, err
	}
	if _, err := os.Stat(filepath.Join(cfg.DataDir, "server.db")); err != nil {
		return nil, fmt.Errorf("the data dir has no database (has the server started once?): %w", err)
	}
	st, err := sqlite.Open(ctx, filepath.Join(cfg.DataDir, "server.db"), cfg.Store.Synchronous)
	if err != nil {
		return nil, err
	}
	defer st.Close()
	token, t := newAPIToken(req.Name, rl, "local", time.Now(), ttl)
	if err := st.CreateAPIToken(ctx, t); err != nil {
		return nil, err
	}
	out := &api.APITokenCreated{APIToken: apiTokenJSON(t), Token: token}
	return out, st.AddAudit(ctx, localAudit("api_tokens.create", "api-token/"+t.ID, out.APIToken))
}

// rotateCommand rotates in the data dir when no server runs on it, and asks
// the running server otherwise, so that it re-signs every manifest at once.
func rotateCommand(ctx context.Context, cfg Config, stdout io.Writer) error {
	resp, err := RotateKeysOffline(cfg)
	if errors.Is(err, errLocked) {
		resp, err = rotateViaAPI(ctx, cfg)
	}
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "manifest key %s now signs manifests (key list version %d)\n", resp.KeyID, resp.KeyListVersion)
	return nil
}

// RotateKeysOffline rotates the manifest key of a data dir no server is
// using; the server re-signs every manifest when it next starts. It fails
// with an error wrapping errLocked when a server holds the data dir.
func RotateKeysOffline(cfg Config) (*api.RotateResponse, error) {
	lock, err := lockDataDir(cfg.DataDir)
	if err != nil {
		return nil, err
	}
	defer lock.release()
	now := time.Now()
	k, err := pki.LoadOrCreateKeyring(cfg.DataDir, signing.Algorithm(cfg.Signing.Algorithm), now, cfg.Signing.KeyListLifetime)
	if err != nil {
		return nil, err
	}
	if err := k.Rotate(now, cfg.Signing.KeyListLifetime); err != nil {
		return nil, err
	}
	s, v := k.Signer()
	return &api.RotateResponse{KeyID: s.KeyID(), KeyListVersion: v}, nil
}

func rotateViaAPI(ctx context.Context, cfg Config) (*api.RotateResponse, error) {
	token, err := ReadAdminToken(cfg.DataDir)
	if err != nil {
		return nil, err
	}
	caPEM, err := os.ReadFile(filepath.Join(cfg.DataDir, "ca.crt"))
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	host, port, err := net.SplitHostPort(cfg.HTTPAddr)
	if err != nil {
		return nil, err
	}
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		host = "127.0.0.1"
	}
	client := &http.Client{Timeout: 2 * time.Minute, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, ServerName: "localhost", MinVersion: tls.VersionTLS12, CipherSuites: signing.TLSCipherSuites()}}}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "https://"+net.JoinHostPort(host, port)+"/api/v1/keys/rotate", bytes.NewReader(nil))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("the server holds the data dir but cannot be reached: %w", err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if resp.StatusCode != http.StatusOK {
		var eb api.ErrorBody
		_ = json.Unmarshal(body, &eb)
		return nil, fmt.Errorf("rotate keys: %s: %s", resp.Status, eb.Error.Message)
	}
	var out api.RotateResponse
	if err := json.Unmarshal(body, &out); err != nil {
		return nil, fmt.Errorf("rotate keys: %w", err)
	}
	return &out, nil
}
