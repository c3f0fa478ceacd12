package apply

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	sddbus "github.com/coreos/go-systemd/v22/dbus"

	"github.com/drover/drover/agent/internal/sdtest"
	"github.com/drover/drover/manifest"
	"github.com/drover/drover/units"
)

// BenchmarkReload1000Corrections measures what the DST correction lines cost
// systemd: 1,000 timers in America/New_York (a quarter every 5 minutes, a
// quarter hourly, half at a fixed time) written, enabled, loaded with one
// daemon-reload and started, rendered without the correction lines and with
// them (about 6-9 more OnCalendar= lines per timer), in the same run.
func BenchmarkReload1000Corrections(b *testing.B) {
	env := sdtest.Require(b)
	ctx := context.Background()
	conn, err := sddbus.NewUserConnectionContext(ctx)
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	runtimeUnitDir := filepath.Join(env.RuntimeDir, "systemd", "user")
	dataDir := b.TempDir()
	agent := fakeRunner(b)
	render := func(noCorr bool) ([]units.File, []string, int) {
		opts := units.Options{AgentPath: agent, Scope: units.ScopeUser, DataDir: dataDir, NoCorrections: noCorr}
		var files []units.File
		var timers []string
		lines := 0
		for i := 0; i < 1000; i++ {
			sched := fmt.Sprintf("%d %d * * *", i%60, (i/60)%24)
			switch i % 4 {
			case 0:
				sched = "*/5 * * * *"
			case 1:
				sched = "0 * * * *"
			}
			s := manifest.Spec{Name: fmt.Sprintf("dstb-%04d", i), Schedule: sched, Timezone: "America/New_York",
				Script: "true\n", Hardening: manifest.HardeningNone}
			f, err := units.Render(&s, opts)
			if err != nil {
				b.Fatal(err)
			}
			lines += strings.Count(string(f[1].Content), "\nOnCalendar=")
			files = append(files, f...)
			timers = append(timers, units.TimerName(s.Name))
		}
		return files, timers, lines
	}
	wait := func(ch chan string) {
		select {
		case <-ch:
		case <-ctx.Done():
		}
	}
	for _, c := range []struct {
		name   string
		noCorr bool
	}{{"without", true}, {"with", false}} {
		files, timers, lines := render(c.noCorr)
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
		b.Run(c.name, func(b *testing.B) {
			b.ReportMetric(float64(lines)/1000, "OnCalendar/timer")
			b.StopTimer()
			for i := 0; i < b.N; i++ {
				for _, f := range files {
					if err := os.WriteFile(filepath.Join(env.UnitDir(), f.Name), f.Content, 0o644); err != nil {
						b.Fatal(err)
					}
				}
				if err := enableLinks(env.UnitDir(), timers); err != nil {
					b.Fatal(err)
				}
				if err := writeBatchTarget(runtimeUnitDir, timers); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
				if err := conn.ReloadContext(ctx); err != nil {
					b.Fatal(err)
				}
				ch := make(chan string, 1)
				if _, err := conn.StartUnitContext(ctx, batchTarget, "replace", ch); err != nil {
					b.Fatal(err)
				}
				wait(ch)
				b.StopTimer()
				clean()
			}
		})
	}
}
