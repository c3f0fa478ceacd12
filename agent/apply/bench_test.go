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

// BenchmarkFloor1000 is the floor under BenchmarkApply1000: writing the same
// 2,000 rendered unit files (plain writes, no sync) and one daemon-reload.
func BenchmarkFloor1000(b *testing.B) {
	env := sdtest.Require(b)
	ctx := context.Background()
	opts := units.Options{AgentPath: fakeRunner(b), Scope: units.ScopeUser, DataDir: b.TempDir()}
	var files []units.File
	for _, s := range benchSpecs(1000) {
		f, err := units.Render(&s, opts)
		if err != nil {
			b.Fatal(err)
		}
		files = append(files, f...)
	}
	conn, err := sddbus.NewUserConnectionContext(ctx)
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	b.StopTimer()
	for i := 0; i < b.N; i++ {
		b.StartTimer()
		for _, f := range files {
			if err := os.WriteFile(filepath.Join(env.UnitDir(), f.Name), f.Content, 0o644); err != nil {
				b.Fatal(err)
			}
		}
		if err := conn.ReloadContext(ctx); err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		for _, f := range files {
			os.Remove(filepath.Join(env.UnitDir(), f.Name))
		}
		if err := conn.ReloadContext(ctx); err != nil {
			b.Fatal(err)
		}
	}
}
