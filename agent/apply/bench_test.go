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
	env := sdtest.Require(b)
	ctx := context.Background()
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
	conn, err := sddbus.NewUserConnectionContext(ctx)
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	runtimeUnitDir := filepath.Join(env.RuntimeDir, "systemd", "user")
	wait := func(ch chan string) {
		select {
		case <-ch:
		case <-ctx.Done():
		}
	}
	clean := func() {
		for _, tm := range timers {
			ch := make(chan string, 1)
			if _, err := conn.StopUnitContext(ctx, tm, "replace", ch); err == nil {
				wait(ch)
			}
		}
		for _, f := range files {
			os.Remove(filepath.Join(env.UnitDir(), f.Name))
		}
		os.RemoveAll(filepath.Join(env.UnitDir(), "timers.target.wants"))
		os.Remove(filepath.Join(runtimeUnitDir, batchTarget))
		if err := conn.ReloadContext(ctx); err != nil {
			b.Fatal(err)
		}
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
				for _, f := range files {
					if err := os.WriteFile(filepath.Join(env.UnitDir(), f.Name), f.Content, 0o644); err != nil {
						b.Fatal(err)
					}
				}
				if full {
					if err := enableLinks(env.UnitDir(), timers); err != nil {
						b.Fatal(err)
					}
					if err := writeBatchTarget(runtimeUnitDir, timers); err != nil {
						b.Fatal(err)
					}
				}
				if err := conn.ReloadContext(ctx); err != nil {
					b.Fatal(err)
				}
				if full {
					ch := make(chan string, 1)
					if _, err := conn.StartUnitContext(ctx, batchTarget, "replace", ch); err != nil {
						b.Fatal(err)
					}
					wait(ch)
				}
				b.StopTimer()
				clean()
			}
		})
	}
}
