package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	sddaemon "github.com/coreos/go-systemd/v22/daemon"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/drover/drover/agent"
	"github.com/drover/drover/agent/apply"
	"github.com/drover/drover/agent/runner"
	"github.com/drover/drover/internal/command"
	"github.com/drover/drover/units"
)

// configFlags are the flags every command that reads the configuration has.
type configFlags struct {
	file                                       string
	server, dataDir, tokenFile, backend, scope string
	logLevel                                   string
	flags                                      *pflag.FlagSet
}

func (f *configFlags) register(fs *pflag.FlagSet) {
	f.flags = fs
	fs.StringVar(&f.file, "config", "", "configuration file (default "+agent.DefaultConfigFile+", optional)")
	fs.StringVar(&f.server, "server", "", "drover-server URL, e.g. https://drover.example:8443 (DROVER_SERVER)")
	fs.StringVar(&f.dataDir, "data-dir", "", "data directory (DROVER_DATA_DIR, default "+agent.DefaultDataDir+")")
	fs.StringVar(&f.tokenFile, "token-file", "", "enrollment token file (DROVER_TOKEN_FILE, default "+agent.DefaultTokenFile+")")
	fs.StringVar(&f.backend, "backend", "", "auto, systemd or cron (DROVER_BACKEND, default auto)")
	fs.StringVar(&f.scope, "scope", "", "system or user (DROVER_SCOPE, default system)")
	fs.StringVar(&f.logLevel, "log-level", "", "debug, info, warn or error (DROVER_LOG_LEVEL)")
}

// load builds the configuration: defaults, the file, DROVER_* variables,
// then the flags that were given.
func (f *configFlags) load(env *Env) (agent.Config, error) {
	path, required := agent.DefaultConfigFile, false
	if f.file != "" {
		path, required = f.file, true
	} else if v := env.Getenv("DROVER_CONFIG"); v != "" {
		path, required = v, true
	}
	var vars []string
	for _, name := range agent.EnvNames() {
		if v := env.Getenv(name); v != "" {
			vars = append(vars, name+"="+v)
		}
	}
	cfg, err := agent.LoadConfig(path, required, vars)
	if err != nil {
		return cfg, err
	}
	set := func(name string, dst *string, v string) {
		if f.flags != nil && f.flags.Changed(name) {
			*dst = v
		}
	}
	set("server", &cfg.Server, f.server)
	set("data-dir", &cfg.DataDir, f.dataDir)
	set("token-file", &cfg.TokenFile, f.tokenFile)
	set("backend", &cfg.Backend, f.backend)
	set("scope", &cfg.Scope, f.scope)
	set("log-level", &cfg.LogLevel, f.logLevel)
	return cfg, nil
}

func newLogger(cfg agent.Config, w io.Writer) *slog.Logger {
	return command.NewLogger(cfg.LogLevel, cfg.LogFormat, w)
}

// runDaemon is `drover-agent [flags]`: the daemon, until SIGINT or SIGTERM.
func runDaemon(ctx context.Context, env *Env, cf *configFlags) error {
	cfg, err := cf.load(env)
	if err != nil {
		return err
	}
	if err := cfg.Validate(); err != nil {
		return command.Usage(fmt.Errorf("configuration: %w", err))
	}
	if err := cfg.ResolveAgentPath(); err != nil {
		return err
	}
	log := newLogger(cfg, env.Stderr)
	ctx, stop := signal.NotifyContext(ctx, syscall.SIGINT, syscall.SIGTERM)
	defer stop()

	if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
		return fmt.Errorf("data dir: %w", err)
	}
	st, err := agent.OpenStore(cfg.DataDir, cfg.OutboxMaxBytes, nil)
	if err != nil {
		return err
	}
	defer st.Close()
	backend, err := apply.Select(ctx, cfg.Backend, apply.Config{
		DataDir: cfg.DataDir, Scope: units.Scope(cfg.Scope), AgentPath: cfg.AgentPath, Logger: log,
	})
	if err != nil {
		return fmt.Errorf("backend: %w", err)
	}
	defer backend.Close()
	watchdog, _ := sddaemon.SdWatchdogEnabled(false)
	sdVersion := ""
	if backend.Name() == agent.BackendSystemd {
		sdVersion = systemdVersion(ctx)
	}
	a, err := agent.New(cfg, log,
		agent.WithStore(st),
		agent.WithBackend(backend),
		agent.WithEnrollToken(env.Getenv("DROVER_ENROLL_TOKEN")),
		agent.WithSystemdVersion(sdVersion),
		agent.WithNotify(func(state string) { _, _ = sddaemon.SdNotify(false, state) }, watchdog),
	)
	if err != nil {
		return err
	}
	return a.Run(ctx)
}

func newRunCmd() *cobra.Command {
	return &cobra.Command{
		Use:                "run <pipe> [runner flags]",
		Short:              "Run one pipe now (the ExecStart of every pipe service)",
		DisableFlagParsing: true,
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) > 0 && (args[0] == "-h" || args[0] == "--help") {
				return cmd.Help()
			}
			os.Exit(runner.Main(args))
			return nil
		},
	}
}

func newStatusCmd(env *Env) *cobra.Command {
	var cf configFlags
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "status [--json]",
		Short: "Show the running agent's enrollment, server, backend, manifest and pipes",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := cf.load(env)
			if err != nil {
				return err
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), 30*time.Second)
			defer cancel()
			st, err := agent.QueryStatus(ctx, cfg.SocketPath())
			if err != nil {
				return err
			}
			if asJSON {
				enc := json.NewEncoder(env.Stdout)
				enc.SetIndent("", "  ")
				return enc.Encode(st)
			}
			printStatus(env.Stdout, st, time.Now())
			return nil
		},
	}
	cf.register(cmd.Flags())
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the status as JSON")
	return cmd
}

func newSyncCmd(env *Env) *cobra.Command {
	var cf configFlags
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "sync",
		Short: "Make the running agent pull its manifest now, and wait for the result",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := cf.load(env)
			if err != nil {
				return err
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
			defer cancel()
			res, err := agent.TriggerSync(ctx, cfg.SocketPath())
			if err != nil {
				return err
			}
			fmt.Fprintf(env.Stdout, "sync %s (serial %d)\n", res.Outcome, res.Serial)
			return nil
		},
	}
	cf.register(cmd.Flags())
	cmd.Flags().DurationVar(&timeout, "timeout", 5*time.Minute, "how long to wait for the sync")
	return cmd
}

func newEnrollCmd(env *Env) *cobra.Command {
	var cf configFlags
	var token string
	cmd := &cobra.Command{
		Use:   "enroll --token TOKEN",
		Short: "Enroll this host with a one-time token (through the running agent, or directly)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if token == "" {
				token = env.Getenv("DROVER_ENROLL_TOKEN")
			}
			if token == "" {
				return command.Usagef("--token is required")
			}
			if _, err := agent.ParseToken(token); err != nil {
				return command.Usage(err)
			}
			cfg, err := cf.load(env)
			if err != nil {
				return err
			}
			if err := cfg.Validate(); err != nil {
				return command.Usage(fmt.Errorf("configuration: %w", err))
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), 2*time.Minute)
			defer cancel()
			err = agent.EnrollVia(ctx, cfg.SocketPath(), token)
			if err == nil {
				fmt.Fprintln(env.Stdout, "enrolled (through the running agent)")
				return nil
			}
			if !errors.Is(err, agent.ErrNoDaemon) {
				return err
			}
			st, err := agent.OpenStore(cfg.DataDir, cfg.OutboxMaxBytes, nil)
			if err != nil {
				return err
			}
			defer st.Close()
			id, err := agent.Enroll(ctx, cfg, st, token, agent.DefaultHostInfo(), newLogger(cfg, env.Stderr))
			if err != nil {
				return err
			}
			fmt.Fprintf(env.Stdout, "enrolled as %s (certificate expires %s)\n", id.AgentID, id.NotAfter().UTC().Format(time.RFC3339))
			return nil
		},
	}
	cf.register(cmd.Flags())
	cmd.Flags().StringVar(&token, "token", "", "enrollment token drv1.<id>.<secret>.<ca-pin> (or DROVER_ENROLL_TOKEN)")
	return cmd
}

// printStatus renders st for a terminal.
func printStatus(w io.Writer, st *agent.Status, now time.Time) {
	ago := func(t time.Time) string {
		if t.IsZero() {
			return "never"
		}
		return fmt.Sprintf("%s (%s ago)", t.Local().Format(time.RFC3339), now.Sub(t).Round(time.Second))
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	if st.Enrolled {
		fmt.Fprintf(tw, "Agent:\t%s (version %s)\n", st.AgentID, st.Version)
		stream := "disconnected"
		if st.StreamConnected {
			stream = "connected"
		}
		fmt.Fprintf(tw, "Server:\t%s (stream %s)\n", st.Server, stream)
		if r := st.Replicas; r != nil {
			since := func(t time.Time) string {
				if t.IsZero() {
					return "not answered yet"
				}
				return "since " + ago(t)
			}
			fmt.Fprintf(tw, "Replica:\t%s, %s\n", st.Server, since(r.ServerSince))
			fmt.Fprintf(tw, "Stream:\t%s, %s\n", st.GRPCAddr, since(r.GRPCSince))
			src := "from the server"
			if r.Override {
				src = "from agent.yaml"
			}
			fmt.Fprintf(tw, "Replicas:\t%d known (%s), %d failovers\n", max(len(r.ServerURLs), len(r.GRPCAddrs)), src, r.Failovers)
			for i := range max(len(r.ServerURLs), len(r.GRPCAddrs)) {
				u, g, mark := "-", "-", " "
				if i < len(r.ServerURLs) {
					u = r.ServerURLs[i]
				}
				if i < len(r.GRPCAddrs) {
					g = r.GRPCAddrs[i]
				}
				if i == r.ServerIndex || i == r.GRPCIndex {
					mark = "*"
				}
				fmt.Fprintf(tw, "\t%s %d  %s  %s\n", mark, i, u, g)
			}
		}
		fmt.Fprintf(tw, "Certificate:\texpires %s\n", st.CertExpiresAt.Local().Format(time.RFC3339))
		if st.IdentityError != "" {
			fmt.Fprintf(tw, "Identity:\tNOT WORKING: %s; write a new enrollment token to the token file to enroll again\n", st.IdentityError)
			if st.EnrollError != "" {
				fmt.Fprintf(tw, "Enrollment:\t%s\n", st.EnrollError)
			}
		}
	} else {
		fmt.Fprintf(tw, "Agent:\tnot enrolled (version %s)\n", st.Version)
		if st.EnrollError != "" {
			fmt.Fprintf(tw, "Enrollment:\t%s\n", st.EnrollError)
		}
	}
	backend := st.Backend + ", " + st.Scope + " scope"
	if st.SystemdVersion != "" {
		backend += ", systemd " + st.SystemdVersion
	}
	fmt.Fprintf(tw, "Backend:\t%s\n", backend)
	fmt.Fprintf(tw, "Manifest:\tserial %d, applied %d\n", st.Serial, st.AppliedSerial)
	if st.ManifestExpired {
		fmt.Fprintf(tw, "Manifest:\tEXPIRED at %s: the server sends nothing newer; pipes keep running, the agent keeps asking\n", st.ManifestExpiresAt.Local().Format(time.RFC3339))
	}
	last := ago(st.LastSync)
	if st.LastSyncError != "" {
		last += ": " + st.LastSyncError
	}
	fmt.Fprintf(tw, "Last sync:\t%s\n", last)
	fmt.Fprintf(tw, "Outbox:\t%d records, %d bytes\n", st.OutboxRecords, st.OutboxBytes)
	tw.Flush()
	if len(st.Pipes) == 0 {
		fmt.Fprintln(w, "\nNo pipes.")
		return
	}
	fmt.Fprintln(w)
	printPipes(w, st.Pipes)
}

// printPipes prints the pipe table of `drover-agent status`.
func printPipes(w io.Writer, pipes []agent.PipeInfo) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "PIPE\tVERSION\tNEXT RUN\tLAST RUN\tNOTE")
	for _, p := range pipes {
		next := "-"
		if !p.NextRun.IsZero() {
			next = p.NextRun.Local().Format("2006-01-02 15:04:05 MST")
		}
		if !p.Enabled && p.Version > 0 {
			next = "disabled"
		} else if p.LeaseEnded {
			next = "lease ended"
		}
		lastRun := "-"
		if p.LastRun != nil {
			lastRun = p.LastRun.Status
			if p.LastRun.Reason != "" {
				lastRun += " (" + p.LastRun.Reason + ")"
			}
			if !p.LastRun.FinishedAt.IsZero() {
				lastRun += " " + p.LastRun.FinishedAt.Local().Format("2006-01-02 15:04:05")
			}
		} else if p.LastResult != "" {
			lastRun = p.LastResult
		}
		var notes []string
		switch {
		case p.LeaseEnded:
			notes = append(notes, "lease ended "+p.LeaseUntil.Local().Format("2006-01-02 15:04:05")+": not run here until renewed")
		case !p.LeaseUntil.IsZero():
			notes = append(notes, "lease active until "+p.LeaseUntil.Local().Format("2006-01-02 15:04:05"))
		}
		if p.Running {
			notes = append(notes, "running "+p.RunID)
		}
		if p.ElapseMismatch != "" {
			notes = append(notes, "elapse mismatch: "+p.ElapseMismatch)
		}
		if p.ApplyError != "" {
			notes = append(notes, "apply error: "+p.ApplyError)
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\n", p.Name, p.Version, next, lastRun, strings.Join(notes, "; "))
	}
	tw.Flush()
}

// systemdVersion returns the installed systemd's version number ("252"),
// from the first line of `systemctl --version` ("systemd 252 (252.39-1)").
func systemdVersion(ctx context.Context) string {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, "systemctl", "--version").Output()
	if err != nil {
		return ""
	}
	f := strings.Fields(string(out))
	if len(f) >= 2 && f[0] == "systemd" {
		return f[1]
	}
	return ""
}
