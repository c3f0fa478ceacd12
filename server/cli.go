package server

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/drover/drover/api"
	"github.com/drover/drover/internal/command"
	"github.com/drover/drover/server/errs"
	"github.com/drover/drover/server/pki"
	"github.com/drover/drover/server/store"
	"github.com/drover/drover/server/store/postgres"
	"github.com/drover/drover/server/store/sqlite"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/drover/drover/signing"
)

// Main is drover-server's command line; it returns the exit code: 0, 1 when
// a command failed, 2 for a usage or configuration error.
func Main(version string, args, env []string, stdout, stderr io.Writer) int {
	buildVersion = version
	var cf cliFlags
	root := &cobra.Command{
		Use:   "drover-server [serve] [flags]",
		Short: "Drover control plane: the HTTPS API and the agents' telemetry stream",
		Long: `Without a command, drover-server serves (drover-server serve).

Environment variables DROVER_<SETTING> (e.g. DROVER_DATA_DIR) override the
configuration file; flags override both.`,
		Version: version,
		Args:    noArgs,
		RunE:    func(cmd *cobra.Command, _ []string) error { return cf.run(cmd, env, serve) },
	}
	command.SetupRoot(root, doubleDash(args), stdout, stderr)
	cf.register(root.PersistentFlags())
	root.AddCommand(
		&cobra.Command{Use: "serve", Short: "Run the control plane (the default)", Args: noArgs,
			RunE: func(cmd *cobra.Command, _ []string) error { return cf.run(cmd, env, serve) }},
		&cobra.Command{Use: "version", Short: "Print the version", Args: noArgs,
			RunE: func(cmd *cobra.Command, _ []string) error {
				fmt.Fprintln(cmd.OutOrStdout(), "drover-server", version)
				return nil
			}},
		group("keys", "Manage the manifest signing keys", newRotateCmd(&cf, env)),
		group("tokens", "Manage enrollment tokens", newTokensCreateCmd(&cf, env)),
		group("api-tokens", "Manage API tokens", newAPITokensCreateCmd(&cf, env)),
		newMigrateCmd(&cf, env),
		newKEKCmd(&cf, env),
	)
	ctx, stop := command.SignalContext()
	defer stop()
	err := root.ExecuteContext(ctx)
	var ue command.UsageError
	switch {
	case errors.As(err, &ue):
		fmt.Fprintf(stderr, "drover-server: %v\n", ue.Err)
	case err != nil:
		fmt.Fprintf(stderr, "drover-server: %s\n", describe(err))
	}
	return command.ExitCode(err)
}

// longFlags are the flags a single dash also names ("-data-dir"), as it
// did when the command line was parsed by the standard flag package.
var longFlags = map[string]bool{"config": true, "data-dir": true, "http-addr": true, "grpc-addr": true, "internal-agent": true,
	"ttl": true, "name": true, "tag": true, "output": true, "role": true, "help": true, "out": true, "new": true}

// doubleDash rewrites "-flag" and "-flag=value" of longFlags to "--flag".
func doubleDash(args []string) []string {
	out := make([]string, 0, len(args))
	for i, a := range args {
		if a == "--" {
			return append(out, args[i:]...)
		}
		name, _, _ := strings.Cut(strings.TrimPrefix(a, "-"), "=")
		if strings.HasPrefix(a, "-") && !strings.HasPrefix(a, "--") && longFlags[name] {
			a = "-" + a
		}
		out = append(out, a)
	}
	return out
}

func noArgs(cmd *cobra.Command, args []string) error {
	if len(args) > 0 {
		if cmd.HasSubCommands() {
			name := args[0]
			if cmd.HasParent() {
				name = cmd.Name() + " " + name
			}
			return command.Usage(fmt.Errorf("unknown command %q", name))
		}
		return command.Usage(fmt.Errorf("unexpected argument %q", args[0]))
	}
	return nil
}

// group is a command that only holds subcommands.
func group(name, short string, subs ...*cobra.Command) *cobra.Command {
	c := &cobra.Command{Use: name, Short: short, Args: noArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			return command.Usage(fmt.Errorf("unknown command %q", cmd.Name()))
		}}
	c.AddCommand(subs...)
	return c
}

// cliFlags are the flags every command shares.
type cliFlags struct {
	configFile, dataDir, httpAddr, grpcAddr string
	internalAgent                           bool
}

func (f *cliFlags) register(fs *pflag.FlagSet) {
	fs.StringVar(&f.configFile, "config", "", "YAML configuration (default "+DefaultConfigFile+", optional)")
	fs.StringVar(&f.dataDir, "data-dir", "", "state directory (default "+DefaultDataDir+")")
	fs.StringVar(&f.httpAddr, "http-addr", "", "HTTPS listen address (default "+DefaultHTTPAddr+")")
	fs.StringVar(&f.grpcAddr, "grpc-addr", "", "gRPC listen address (default "+DefaultGRPCAddr+")")
	fs.BoolVar(&f.internalAgent, "internal-agent", false, "also run a drover-agent for this host (serve only)")
}

// config loads the configuration: the file, then the environment, then the
// flags.
func (f *cliFlags) config(env []string) (Config, error) {
	path, required := DefaultConfigFile, false
	if f.configFile != "" {
		path, required = f.configFile, true
	}
	cfg, err := LoadConfig(path, required, env)
	if err != nil {
		return cfg, command.Usage(err)
	}
	for _, o := range []struct {
		v  string
		to *string
	}{{f.dataDir, &cfg.DataDir}, {f.httpAddr, &cfg.HTTPAddr}, {f.grpcAddr, &cfg.GRPCAddr}} {
		if o.v != "" {
			*o.to = o.v
		}
	}
	if f.internalAgent {
		cfg.InternalAgent.Enabled = true
	}
	if err := cfg.Validate(); err != nil {
		return cfg, command.Usage(err)
	}
	return cfg, nil
}

// run loads the configuration and runs fn with it.
func (f *cliFlags) run(cmd *cobra.Command, env []string, fn func(context.Context, Config, io.Writer, io.Writer) error) error {
	cfg, err := f.config(env)
	if err != nil {
		return err
	}
	return fn(cmd.Context(), cfg, cmd.OutOrStdout(), cmd.ErrOrStderr())
}

func newRotateCmd(cf *cliFlags, env []string) *cobra.Command {
	return &cobra.Command{Use: "rotate", Short: "Add a new manifest signing key", Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return cf.run(cmd, env, rotateCommand) }}
}

func newTokensCreateCmd(cf *cliFlags, env []string) *cobra.Command {
	var ttl, name string
	tags := tagFlag{}
	c := createCmd(cf, env, "create", "Print a new enrollment token", func(ctx context.Context, cfg Config) (any, string, error) {
		resp, err := createTokenOffline(ctx, cfg, api.EnrollmentTokenRequest{TTL: ttl, Name: name, Tags: tags})
		if err != nil {
			return nil, "", err
		}
		return resp, resp.Token, nil
	})
	c.Flags().StringVar(&ttl, "ttl", "", "token lifetime, e.g. 1h (default from the config)")
	c.Flags().StringVar(&name, "name", "", "preset agent name")
	c.Flags().Var(tags, "tag", "preset agent tag key=value (repeatable)")
	return c
}

func newAPITokensCreateCmd(cf *cliFlags, env []string) *cobra.Command {
	var ttl, name, roleName string
	c := createCmd(cf, env, "create --name N --role viewer|operator|admin [--ttl D]",
		"Print a new API token (e.g. to recover after admin.token was revoked)", func(ctx context.Context, cfg Config) (any, string, error) {
			resp, err := createAPITokenOffline(ctx, cfg, api.APITokenRequest{Name: name, Role: roleName, TTL: ttl})
			if err != nil {
				return nil, "", err
			}
			return resp, resp.Token, nil
		})
	c.Flags().StringVar(&ttl, "ttl", "", "token lifetime, e.g. 720h (default: no expiry)")
	c.Flags().StringVar(&name, "name", "", "who or what uses the token")
	c.Flags().StringVar(&roleName, "role", "", "viewer, operator or admin")
	return c
}

// createCmd is a command that creates a token in the data dir and prints
// it (--output token|json).
func createCmd(cf *cliFlags, env []string, use, short string, create func(context.Context, Config) (resp any, token string, err error)) *cobra.Command {
	var format string
	c := &cobra.Command{Use: use, Short: short, Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return cf.run(cmd, env, func(ctx context.Context, cfg Config, stdout, _ io.Writer) error {
				resp, token, err := create(ctx, cfg)
				if err != nil {
					return err
				}
				printCreated(stdout, format, resp, token)
				return nil
			})
		}}
	c.Flags().StringVar(&format, "output", "token", "token (just the token) or json")
	return c
}

// printCreated prints a created token: just the token, or the whole answer
// as JSON.
func printCreated(w io.Writer, format string, resp any, token string) {
	if format == "json" {
		b, _ := json.MarshalIndent(resp, "", "  ")
		fmt.Fprintln(w, string(b))
		return
	}
	fmt.Fprintln(w, token)
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

func serve(ctx context.Context, cfg Config, _, stderr io.Writer) error {
	s, err := New(cfg, command.NewLogger(cfg.LogLevel, cfg.LogFormat, stderr), SystemClock())
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

func (t tagFlag) Type() string { return "key=value" }

func (t tagFlag) Set(s string) error {
	k, v, ok := strings.Cut(s, "=")
	if !ok || k == "" {
		return fmt.Errorf("%q is not key=value", s)
	}
	t[k] = v
	return nil
}

// createTokenOffline creates an enrollment token directly in the data dir's
// database. It works whether or not the server is running (SQLite allows
// several processes), which suits packaging scripts and config management.
func createTokenOffline(ctx context.Context, cfg Config, req api.EnrollmentTokenRequest) (*api.EnrollmentTokenCreated, error) {
	certPEM, err := os.ReadFile(filepath.Join(cfg.DataDir, "ca.crt"))
	if err != nil {
		return nil, fmt.Errorf("read the CA certificate (has the server started once?): %w", err)
	}
	cert, err := pki.ParseCertPEM(certPEM)
	if err != nil {
		return nil, fmt.Errorf("ca.crt: %w", err)
	}
	st, err := openOffline(ctx, cfg)
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

// openOffline opens the configured store for a command run beside the
// server: the data dir's SQLite file, or the PostgreSQL database.
func openOffline(ctx context.Context, cfg Config) (store.Store, error) {
	if cfg.Store.Driver == "postgres" {
		return postgres.Open(ctx, cfg.Store.DSN, postgres.Pool{MaxConns: 2})
	}
	return sqlite.Open(ctx, filepath.Join(cfg.DataDir, "server.db"), cfg.Store.Synchronous)
}

// localAudit is the audit entry of a command run on the server's host.
func localAudit(action, target string, after any) *store.AuditEntry {
	return &store.AuditEntry{At: time.Now(), ActorID: "local", ActorName: "drover-server (command line)", Role: roleAdmin.String(),
		Action: action, Target: target, AfterDigest: digestOf(after), Source: "local"}
}

// createAPITokenOffline creates an API token directly in the data dir's
// database, whether or not the server is running: the way back in when
// admin.token was revoked and no admin token is at hand (whoever can run
// it can read the data dir anyway).
func createAPITokenOffline(ctx context.Context, cfg Config, req api.APITokenRequest) (*api.APITokenCreated, error) {
	rl, ttl, err := checkAPITokenRequest(req)
	if err != nil {
		return nil, err
	}
	if _, err := os.Stat(filepath.Join(cfg.DataDir, "server.db")); err != nil && !keysInStore(&cfg) {
		return nil, fmt.Errorf("the data dir has no database (has the server started once?): %w", err)
	}
	st, err := openOffline(ctx, cfg)
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
func rotateCommand(ctx context.Context, cfg Config, stdout, _ io.Writer) error {
	var resp *api.RotateResponse
	var err error
	if keysInStore(&cfg) {
		// The keys are shared in the database: the replica on this host
		// rotates them and re-signs every manifest; the others sync.
		resp, err = rotateViaAPI(ctx, cfg)
	} else if resp, err = rotateKeysOffline(cfg); errors.Is(err, errLocked) {
		resp, err = rotateViaAPI(ctx, cfg)
	}
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "manifest key %s now signs manifests (key list version %d)\n", resp.KeyID, resp.KeyListVersion)
	return nil
}

// rotateKeysOffline rotates the manifest key of a data dir no server is
// using; the server re-signs every manifest when it next starts. It fails
// with an error wrapping errLocked when a server holds the data dir.
func rotateKeysOffline(cfg Config) (*api.RotateResponse, error) {
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
