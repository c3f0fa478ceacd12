// Package cli is droverctl, the operator's command line: everything but the
// process entry point, so tests run the real commands in-process.
//
// Imported only by cmd/droverctl.
package cli

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/drover/drover/internal/command"
)

// Version is the build's version, set by Main.
var Version = "dev"

// reportedError is an error whose details were already written to stderr;
// Run prints only its summary.
type reportedError struct{ summary string }

func (e reportedError) Error() string { return e.summary }

// Env is what a command may read from its surroundings; tests replace it.
type Env struct {
	Stdout, Stderr io.Writer
	Stdin          io.Reader
	Getenv         func(string) string
	Now            func() time.Time
}

// Main runs droverctl with the process's arguments and returns its exit code.
func Main(version string) int {
	Version = version
	ctx, stop := command.SignalContext()
	defer stop()
	return Run(ctx, os.Args[1:], Env{Stdout: os.Stdout, Stderr: os.Stderr, Stdin: os.Stdin, Getenv: os.Getenv, Now: time.Now})
}

// Run executes one droverctl command line.
func Run(ctx context.Context, args []string, env Env) int {
	if env.Getenv == nil {
		env.Getenv = func(string) string { return "" }
	}
	if env.Now == nil {
		env.Now = time.Now
	}
	if env.Stdin == nil {
		env.Stdin = strings.NewReader("")
	}
	if env.Stdout == nil {
		env.Stdout = io.Discard
	}
	if env.Stderr == nil {
		env.Stderr = io.Discard
	}
	a := &app{env: &env}
	root := a.newRoot()
	command.SetupRoot(root, args, env.Stdout, env.Stderr)
	root.CompletionOptions.DisableDefaultCmd = false // droverctl completion bash|zsh|fish
	root.SetIn(env.Stdin)
	err := root.ExecuteContext(ctx)
	if a.client != nil {
		a.client.close()
	}
	if err != nil {
		fmt.Fprintln(env.Stderr, "droverctl:", sanitizeText(err.Error()))
	}
	return command.ExitCode(err)
}

// app holds the global flags and the lazily built API client of one run.
type app struct {
	env    *Env
	server string
	token  string
	ca     string
	config string
	output string
	client *client
	// rawLogs (logs --raw) prints logs without escaping control
	// characters; logw is the escaper otherwise (sanitize.go).
	rawLogs bool
	logw    *termWriter
}

func (a *app) newRoot() *cobra.Command {
	root := &cobra.Command{
		Use:   "droverctl",
		Short: "Operate a Drover control plane: pipes, agents, runs and schedules",
		Long: `droverctl operates a Drover control plane.

The server, token and CA come from --server, --token and --ca, else from
DROVER_SERVER, DROVER_TOKEN and DROVER_CA, else from the file written by
"droverctl login" ($XDG_CONFIG_HOME/drover/config.yaml, by default
~/.config/drover/config.yaml).

Every command prints a table (or text) by default and the API's own objects
with -o json or -o yaml. Exit status: 0 success, 1 error, 2 usage error.`,
		Args:    noArgs,
		Version: Version,
		RunE:    func(cmd *cobra.Command, _ []string) error { return cmd.Help() },
		PersistentPreRunE: func(cmd *cobra.Command, _ []string) error {
			switch a.output {
			case "", "table", "wide", "json", "yaml", "name":
				return nil
			}
			return command.Usagef("-o %q: use table, wide, json, yaml or name", a.output)
		},
	}
	pf := root.PersistentFlags()
	pf.StringVar(&a.server, "server", "", "server URL, e.g. https://drover.example:8443 (env DROVER_SERVER)")
	pf.StringVar(&a.token, "token", "", "API bearer token (env DROVER_TOKEN); prefer the environment or login")
	pf.StringVar(&a.ca, "ca", "", "PEM file with the CA that signed the server's certificate, e.g. the server's ca.crt (env DROVER_CA)")
	pf.StringVar(&a.config, "config", "", "config file (default $XDG_CONFIG_HOME/drover/config.yaml)")
	pf.StringVarP(&a.output, "output", "o", "", "output format: table (default), wide (a table with more columns), json, yaml or name (kind/name per object)")
	root.AddCommand(
		newScheduleCmd(a),
		a.newApplyCmd(),
		a.newDiffCmd(),
		a.newGetCmd(),
		a.newDescribeCmd(),
		a.newHistoryCmd(),
		a.newRestoreCmd(),
		a.newLogsCmd(),
		a.newRunCmd(),
		a.newPipesCmd(),
		a.newCancelCmd(),
		a.newTokensCmd(),
		a.newAPITokensCmd(),
		a.newAgentsCmd(),
		a.newSecretsCmd(),
		a.newAuditCmd(),
		a.newCompletionCmd(root),
		a.newLoginCmd(),
		a.newNotifyCmd(),
		a.newDeleteCmd(),
		a.newVersionCmd(),
	)
	return root
}

func noArgs(cmd *cobra.Command, args []string) error {
	if len(args) > 0 {
		return command.Usagef("unknown command %q for %q", args[0], cmd.CommandPath())
	}
	return nil
}

// exactArgs wants n arguments, named in what (e.g. "RUN").
func exactArgs(n int, what string) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if len(args) != n {
			return command.Usagef("%s wants %s (got %d arguments)", cmd.CommandPath(), what, len(args))
		}
		return nil
	}
}

// groupCmd is a command that only holds subcommands.
func groupCmd(use, short string, subs ...*cobra.Command) *cobra.Command {
	c := &cobra.Command{Use: use, Short: short, Args: noArgs, RunE: func(cmd *cobra.Command, _ []string) error { return cmd.Help() }}
	c.AddCommand(subs...)
	return c
}

// listCmd is the "ls" of a command group: get kind.
func (a *app) listCmd(short, kind string) *cobra.Command {
	return &cobra.Command{
		Use:     "ls",
		Aliases: []string{"list"},
		Short:   short,
		Args:    noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return a.get(cmd.Context(), kind, nil, listOpts{})
		},
	}
}

// deleteCmd is the command "use" (e.g. "rm ID") that deletes one object,
// named by its one argument (described by arg), with DELETE base+name
// (deleteObj).
func (a *app) deleteCmd(use string, aliases []string, short, arg, base, what, verb string) *cobra.Command {
	return &cobra.Command{
		Use:     use,
		Aliases: aliases,
		Short:   short,
		Args:    exactArgs(1, arg),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.deleteObj(cmd, base, what, args[0], verb)
		},
	}
}

// stdout and stderr of the running command.
func (a *app) stdout() io.Writer { return a.env.Stdout }
func (a *app) stderr() io.Writer { return a.env.Stderr }

// warnf writes a warning to stderr.
func (a *app) warnf(format string, args ...any) {
	fmt.Fprintf(a.env.Stderr, "warning: "+format+"\n", args...)
}

// format is the chosen output format ("table" when unset).
func (a *app) format() string {
	if a.output == "" || a.output == "wide" {
		return "table"
	}
	return a.output
}

// wide reports whether -o wide asked for a table with more columns.
func (a *app) wide() bool { return a.output == "wide" }
