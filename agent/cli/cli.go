// Package cli is the drover-agent command line: the daemon, the runner entry
// point and the local tools (render, status, sync, enroll). It holds the flag
// parsing and wiring only; the work lives in the other agent packages.
//
// Imported only by cmd/drover-agent.
package cli

import (
	"context"
	"fmt"
	"io"
	"os"

	"github.com/spf13/cobra"

	"github.com/drover/drover/agent"
	"github.com/drover/drover/internal/command"
)

// Version is the build's version, set by Main.
var Version = "dev"

// Env is what a command may read from its surroundings; tests replace it.
type Env struct {
	Stdout, Stderr io.Writer
	Getenv         func(string) string
}

// Main runs drover-agent with the process's arguments and returns its exit code.
func Main(version string) int {
	Version = version
	agent.Version = version
	return Run(context.Background(), os.Args[1:], Env{Stdout: os.Stdout, Stderr: os.Stderr, Getenv: os.Getenv})
}

// Run executes one drover-agent command line.
func Run(ctx context.Context, args []string, env Env) int {
	if env.Getenv == nil {
		env.Getenv = func(string) string { return "" }
	}
	var cf configFlags
	root := &cobra.Command{
		Use:   "drover-agent [--config FILE] [flags]",
		Short: "Drover agent: pulls its signed manifest and runs pipes as systemd timers",
		Long: `Without a command, drover-agent runs the daemon: it enrolls with the token in
/etc/drover/enroll.token (or DROVER_ENROLL_TOKEN) when not enrolled, pulls and
verifies its signed manifest, installs the pipes as systemd timers (or runs them
on its internal cron scheduler), and reports runs to the server.`,
		Version: Version,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) > 0 {
				return command.Usagef("unknown command %q", args[0])
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, _ []string) error {
			tuneDaemonGC()
			return runDaemon(cmd.Context(), &env, &cf)
		},
	}
	command.SetupRoot(root, args, env.Stdout, env.Stderr)
	cf.register(root.Flags())
	root.AddCommand(newRenderCmd(&env), newRunCmd(), newStatusCmd(&env), newSyncCmd(&env), newEnrollCmd(&env))
	err := root.ExecuteContext(ctx)
	if err != nil {
		fmt.Fprintln(env.Stderr, "drover-agent:", err)
	}
	return command.ExitCode(err)
}
