package runner

import (
	"context"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/drover/drover/manifest"
)

// BenchmarkRunnerOverhead runs a trivial script through runner.Run (lock,
// state, masking, chunking, RunStarted/LogChunk/RunFinished fsync'd into the
// spool) and by exec'ing it directly, alternately in the same loop, and
// reports both and the difference per run. "disk" keeps the spool on the
// temp dir's file system (as /var/lib is in production); "tmpfs" puts it on
// /dev/shm, which leaves the runner's own cost without fsync latency.
func BenchmarkRunnerOverhead(b *testing.B) {
	b.Run("disk", func(b *testing.B) { benchOverhead(b, b.TempDir()) })
	b.Run("tmpfs", func(b *testing.B) {
		dir, err := os.MkdirTemp("/dev/shm", "drover-bench-")
		if err != nil {
			b.Skip("no /dev/shm")
		}
		defer os.RemoveAll(dir)
		benchOverhead(b, dir)
	})
}

func benchOverhead(b *testing.B, spoolRoot string) {
	root := b.TempDir()
	f := &fixture{pipeDir: filepath.Join(root, "pipe"), spoolDir: filepath.Join(spoolRoot, "spool"), secrets: filepath.Join(root, "secrets")}
	layoutPipe(b, f, manifest.Spec{Name: "demo", Schedule: "* * * * *", Script: "echo hello\n"})
	opts := f.opts()
	opts.Stdout, opts.Stderr = io.Discard, io.Discard
	script := filepath.Join(f.pipeDir, "payload", manifest.ScriptFile)

	var direct, viaRunner time.Duration
	for b.Loop() {
		start := time.Now()
		cmd := exec.Command("/bin/sh", script)
		cmd.Dir = filepath.Dir(script)
		cmd.Stdout, cmd.Stderr = io.Discard, io.Discard
		if err := cmd.Run(); err != nil {
			b.Fatal(err)
		}
		direct += time.Since(start)

		start = time.Now()
		res, err := Run(context.Background(), opts)
		if err != nil || res.ExitCode != 0 {
			b.Fatal(res, err)
		}
		viaRunner += time.Since(start)
	}
	n := float64(b.N)
	b.ReportMetric(float64(direct.Microseconds())/n/1000, "direct-ms/run")
	b.ReportMetric(float64(viaRunner.Microseconds())/n/1000, "runner-ms/run")
	b.ReportMetric(float64((viaRunner-direct).Microseconds())/n/1000, "overhead-ms/run")
}
