// Package command is what the command lines of drover-agent, droverctl and
// drover-server share: the exit codes, the usage error (exit 2), the cobra
// root settings, the signal context and the slog logger the configuration
// asks for.
//
// Imported by agent/cli, cmd/droverctl/cli and server.
package command

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"
)

// Exit codes.
const (
	ExitOK    = 0
	ExitError = 1
	ExitUsage = 2
)

// UsageError marks a mistake in how the command was called, or a
// configuration the command cannot start with (exit 2).
type UsageError struct{ Err error }

func (e UsageError) Error() string { return e.Err.Error() }
func (e UsageError) Unwrap() error { return e.Err }

// Usage wraps err as a UsageError.
func Usage(err error) error { return UsageError{Err: err} }

// Usagef is Usage(fmt.Errorf(format, args...)).
func Usagef(format string, args ...any) error { return Usage(fmt.Errorf(format, args...)) }

// ExitCode is ExitOK for nil, ExitUsage for a UsageError, else ExitError.
func ExitCode(err error) int {
	var ue UsageError
	switch {
	case err == nil:
		return ExitOK
	case errors.As(err, &ue):
		return ExitUsage
	}
	return ExitError
}

// SetupRoot applies the settings every root command shares: errors are
// printed by the caller, not with usage; no completion command; flag
// errors are usage errors; output goes to stdout and stderr.
func SetupRoot(root *cobra.Command, args []string, stdout, stderr io.Writer) {
	root.SilenceUsage = true
	root.SilenceErrors = true
	root.CompletionOptions.DisableDefaultCmd = true
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return Usage(err) })
	root.SetArgs(args)
	root.SetOut(stdout)
	root.SetErr(stderr)
}

// SignalContext is canceled by SIGINT or SIGTERM.
func SignalContext() (context.Context, context.CancelFunc) {
	return signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
}

// NewLogger returns the slog logger for a configuration's log_level
// (debug, info, warn, error) and log_format (text, json), writing to w.
func NewLogger(level, format string, w io.Writer) *slog.Logger {
	var lvl slog.Level
	_ = lvl.UnmarshalText([]byte(level))
	opts := &slog.HandlerOptions{Level: lvl}
	if format == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}
