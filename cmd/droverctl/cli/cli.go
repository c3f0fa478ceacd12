// Package cli is droverctl, the operator's command line: everything but the
// process entry point, so tests run the real commands in-process.
//
// Imported only by cmd/droverctl.
package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/spf13/cobra"
)

// Version is the build's version, set by Main.
var Version = "dev"

// Exit codes.
const (
	ExitOK    = 0
	ExitError = 1
	ExitUsage = 2
)

// usageError marks a mistake in how the command was called (exit 2).
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

func usagef(format string, args ...any) error { return usageError{fmt.Errorf(format, args...)} }

// Env is what a command may read from its surroundings; tests replace it.
type Env struct {
	Stdout, Stderr io.Writer
	Getenv         func(string) string
	Now            func() time.Time
}

// Main runs droverctl with the process's arguments and returns its exit code.
func Main(version string) int {
	Version = version
	return Run(context.Background(), os.Args[1:], Env{Stdout: os.Stdout, Stderr: os.Stderr, Getenv: os.Getenv, Now: time.Now})
}

// Run executes one droverctl command line.
func Run(ctx context.Context, args []string, env Env) int {
	if env.Getenv == nil {
		env.Getenv = func(string) string { return "" }
	}
	if env.Now == nil {
		env.Now = time.Now
	}
	root := newRoot(&env)
	root.SetArgs(args)
	root.SetOut(env.Stdout)
	root.SetErr(env.Stderr)
	err := root.ExecuteContext(ctx)
	if err == nil {
		return ExitOK
	}
	fmt.Fprintln(env.Stderr, "droverctl:", err)
	var ue usageError
	if errors.As(err, &ue) {
		return ExitUsage
	}
	return ExitError
}

func newRoot(env *Env) *cobra.Command {
	root := &cobra.Command{
		Use:           "droverctl",
		Short:         "Operate a Drover control plane: pipes, agents, runs and schedules",
		SilenceUsage:  true,
		SilenceErrors: true,
		Args:          noArgs,
		Version:       Version,
		RunE:          func(cmd *cobra.Command, _ []string) error { return cmd.Help() },
	}
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err} })
	root.AddCommand(newScheduleCmd(env))
	return root
}

func noArgs(cmd *cobra.Command, args []string) error {
	if len(args) > 0 {
		return usagef("unknown command %q for %q", args[0], cmd.CommandPath())
	}
	return nil
}
