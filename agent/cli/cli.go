// Package cli is the drover-agent command line: the daemon, the runner entry
// point and the local tools (render, status, sync, enroll). It holds the flag
// parsing and wiring only; the work lives in the other agent packages.
//
// Imported only by cmd/drover-agent.
package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"

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

type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

func usagef(format string, args ...any) error { return usageError{fmt.Errorf(format, args...)} }

// Env is what a command may read from its surroundings; tests replace it.
type Env struct {
	Stdout, Stderr io.Writer
	Getenv         func(string) string
}

// Main runs drover-agent with the process's arguments and returns its exit code.
func Main(version string) int {
	Version = version
	return Run(context.Background(), os.Args[1:], Env{Stdout: os.Stdout, Stderr: os.Stderr, Getenv: os.Getenv})
}

// Run executes one drover-agent command line.
func Run(ctx context.Context, args []string, env Env) int {
	if env.Getenv == nil {
		env.Getenv = func(string) string { return "" }
	}
	root := &cobra.Command{
		Use:           "drover-agent",
		Short:         "Drover agent: pulls its signed manifest and runs pipes as systemd timers",
		SilenceUsage:  true,
		SilenceErrors: true,
		Version:       Version,
	}
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err} })
	root.SetArgs(args)
	root.SetOut(env.Stdout)
	root.SetErr(env.Stderr)
	root.AddCommand(newRenderCmd(&env))
	err := root.ExecuteContext(ctx)
	if err == nil {
		return ExitOK
	}
	fmt.Fprintln(env.Stderr, "drover-agent:", err)
	var ue usageError
	if errors.As(err, &ue) {
		return ExitUsage
	}
	return ExitError
}
