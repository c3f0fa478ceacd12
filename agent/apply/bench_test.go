package apply

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	sddbus "github.com/coreos/go-systemd/v22/dbus"

	"github.com/drover/drover/agent/internal/sdtest"
	"github.com/drover/drover/manifest"
	"github.com/drover/drover/units"
)

func benchSpecs(n int) []manifest.Spec {
	specs := make([]manifest.Spec, n)
	for i := range specs {
		specs[i] = spec(fmt.Sprintf("bench-%04d", i), fmt.Sprintf("%d %d * * *", i%60, (i/60)%24))
	}
	return specs
}

// BenchmarkApply1000 applies 1,000 new pipes on the user manager: pipe
// directories, 2,000 unit files, enable, one daemon-reload, 1,000 timer
// starts. Target: 2 s.
func BenchmarkApply1000(b *testing.B) {
	sdtest.Require(b)
	ctx := context.Background()
	in := input(b, benchSpecs(1000)...)
	empty := input(b)
	b.StopTimer()
	for i := 0; i < b.N; i++ {
		be, err := NewSystemd(ctx, userConfig(b, b.TempDir()))
		if err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		res, err := be.Apply(ctx, in)
		b.StopTimer()
		if err != nil || len(res.Errors) > 0 || res.Reloads != 1 {
			b.Fatalf("apply: %v %v reloads=%d", err, res.Errors, res.Reloads)
		}
		if _, err := be.Apply(ctx, empty); err != nil {
			b.Fatal(err)
		}
		be.Close()
	}
}

// BenchmarkFloor1000 measures the floors under BenchmarkApply1000 with the
// same 2,000 rendered unit files, written plainly (no sync, no rename):
//
//   - write+reload: the files plus one daemon-reload. Nothing references the
//     new units, so the reload does not even load them;
//   - write+enable+reload+start: what any apply that leaves 1,000 running
//     timers must make systemd do: the reload now loads 2,000 units, and
//     the timers are started (one job, as Apply does).
func BenchmarkFloor1000(b *testing.B) {
	ub := newUnitBench(b)
	opts := units.Options{AgentPath: fakeRunner(b), Scope: units.ScopeUser, DataDir: b.TempDir()}
	var files []units.File
	var timers []string
	for _, s := range benchSpecs(1000) {
		f, err := units.Render(&s, opts)
		if err != nil {
			b.Fatal(err)
		}
		files = append(files, f...)
		timers = append(timers, units.TimerName(s.Name))
	}
	for _, full := range []bool{false, true} {
		name := "write+reload"
		if full {
			name = "write+enable+reload+start"
		}
		b.Run(name, func(b *testing.B) {
			b.StopTimer()
			for i := 0; i < b.N; i++ {
				b.StartTimer()
				ub.write(b, files)
				if full {
					ub.enable(b, timers)
				}
				ub.reload(b)
				if full {
					ub.startBatch(b)
				}
				b.StopTimer()
				ub.clean(b, files, timers)
			}
		})
	}
}

// unitBench drives the user manager directly, without a backend, for the
// benchmarks that measure systemd's own share: write rendered units, enable
// their timers in one batch target, reload, start, clean up.
type unitBench struct {
	ctx            context.Context
	conn           *sddbus.Conn
	unitDir        string
	runtimeUnitDir string
}

func newUnitBench(b *testing.B) *unitBench {
	env := sdtest.Require(b)
	ctx := context.Background()
	conn, err := sddbus.NewUserConnectionContext(ctx)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(conn.Close)
	return &unitBench{ctx: ctx, conn: conn, unitDir: env.UnitDir(), runtimeUnitDir: filepath.Join(env.RuntimeDir, "systemd", "user")}
}

// write writes the unit files plainly (no sync, no rename).
func (u *unitBench) write(b *testing.B, files []units.File) {
	for _, f := range files {
		if err := os.WriteFile(filepath.Join(u.unitDir, f.Name), f.Content, 0o644); err != nil {
			b.Fatal(err)
		}
	}
}

// enable enables the timers and writes the batch target that starts them.
func (u *unitBench) enable(b *testing.B, timers []string) {
	if err := enableLinks(u.unitDir, timers); err != nil {
		b.Fatal(err)
	}
	if err := writeBatchTarget(u.runtimeUnitDir, timers); err != nil {
		b.Fatal(err)
	}
}

func (u *unitBench) reload(b *testing.B) {
	if err := u.conn.ReloadContext(u.ctx); err != nil {
		b.Fatal(err)
	}
}

// startBatch starts the batch target (every enabled timer, one job) and
// waits for the job.
func (u *unitBench) startBatch(b *testing.B) {
	ch := make(chan string, 1)
	if _, err := u.conn.StartUnitContext(u.ctx, batchTarget, "replace", ch); err != nil {
		b.Fatal(err)
	}
	u.wait(ch)
}

func (u *unitBench) wait(ch chan string) {
	select {
	case <-ch:
	case <-u.ctx.Done():
	}
}

// clean stops the timers, removes the files, links and batch target, and
// reloads.
func (u *unitBench) clean(b *testing.B, files []units.File, timers []string) {
	for _, tm := range timers {
		ch := make(chan string, 1)
		if _, err := u.conn.StopUnitContext(u.ctx, tm, "replace", ch); err == nil {
			u.wait(ch)
		}
	}
	for _, f := range files {
		os.Remove(filepath.Join(u.unitDir, f.Name))
	}
	os.RemoveAll(filepath.Join(u.unitDir, "timers.target.wants"))
	os.Remove(filepath.Join(u.runtimeUnitDir, batchTarget))
	u.reload(b)
}
