package runner

import (
	"context"
	"errors"
	"flag"
	"fmt"
	agentpb "github.com/drover/drover/proto"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"
)

// ParseArgs parses the arguments of `drover-agent run` (without "run"):
//
//	<pipe> [--pipe-dir DIR] [--spool-dir DIR] [--trigger T] [--request-id ID] [--scheduled-at RFC3339] [--run-id ID]
//
// Flags may come before or after the pipe name. env is the environment the
// options will read (os.Environ() for the real command).
func ParseArgs(args []string, env []string) (Options, error) {
	opts := Options{Env: env}
	fs := flag.NewFlagSet("drover-agent run", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.StringVar(&opts.PipeDir, "pipe-dir", "", "directory with pipe.json and payload/ (default $DROVER_PIPE_DIR)")
	fs.StringVar(&opts.SpoolDir, "spool-dir", "", "spool directory when systemd sets no $STATE_DIRECTORY (default $DROVER_SPOOL_DIR)")
	fs.StringVar(&opts.Trigger, "trigger", "", "force the trigger: schedule, catchup, manual or api")
	fs.StringVar(&opts.RequestID, "request-id", "", "the RunNow request this run answers (implies trigger api)")
	fs.StringVar(&opts.RunID, "run-id", "", "the run id when systemd gives none (default $DROVER_RUN_ID, else a new UUIDv7)")
	scheduledAt := fs.String("scheduled-at", "", "the fire time this run stands for (RFC 3339)")
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return opts, err
		}
		if fs.NArg() == 0 {
			break
		}
		pos = append(pos, fs.Arg(0))
		args = fs.Args()[1:]
	}
	if len(pos) != 1 {
		return opts, errors.New("usage: drover-agent run <pipe> [--pipe-dir DIR] [--spool-dir DIR] [--trigger T] [--request-id ID] [--scheduled-at TIME]")
	}
	opts.Pipe = pos[0]
	if *scheduledAt != "" {
		t, err := time.Parse(time.RFC3339, *scheduledAt)
		if err != nil {
			return opts, fmt.Errorf("--scheduled-at: %w", err)
		}
		opts.ScheduledAt = t
	}
	if opts.Trigger != "" {
		if _, err := agentpb.ParseTrigger(opts.Trigger); err != nil {
			return opts, err
		}
	}
	return opts, nil
}

// Main is `drover-agent run`: it parses args (without "run"), runs the pipe
// with SIGTERM, SIGINT and SIGHUP canceling the run, and returns the exit
// code for os.Exit. After a cancel it re-raises the signal on the process,
// so that the runner dies by it (systemd counts SIGTERM as a clean stop);
// in that case Main does not return.
func Main(args []string) int {
	opts, err := ParseArgs(args, os.Environ())
	if err != nil {
		fmt.Fprintln(os.Stderr, "drover-agent run:", err)
		return ExitRunnerFailed
	}
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	defer signal.Stop(sigs)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var got os.Signal
	gotCh := make(chan struct{})
	go func() {
		select {
		case got = <-sigs:
			close(gotCh)
			cancel()
		case <-ctx.Done():
		}
	}()
	res, err := Run(ctx, opts)
	if err != nil {
		fmt.Fprintln(os.Stderr, "drover-agent run:", err)
		return ExitRunnerFailed
	}
	select {
	case <-gotCh:
		if sig, ok := got.(syscall.Signal); ok {
			signal.Reset(sig)
			_ = syscall.Kill(os.Getpid(), sig)
			time.Sleep(time.Second)
			return 128 + int(sig)
		}
	default:
	}
	return res.ExitCode
}
