package apply

import (
	"fmt"
	"strings"
	"testing"

	"github.com/drover/drover/manifest"
	"github.com/drover/drover/units"
)

// BenchmarkReload1000Corrections measures what the DST correction lines cost
// systemd: 1,000 timers in America/New_York (a quarter every 5 minutes, a
// quarter hourly, half at a fixed time) written, enabled, loaded with one
// daemon-reload and started, rendered without the correction lines and with
// them (about 6-9 more OnCalendar= lines per timer), in the same run.
func BenchmarkReload1000Corrections(b *testing.B) {
	ub := newUnitBench(b)
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
	for _, c := range []struct {
		name   string
		noCorr bool
	}{{"without", true}, {"with", false}} {
		files, timers, lines := render(c.noCorr)
		b.Run(c.name, func(b *testing.B) {
			b.ReportMetric(float64(lines)/1000, "OnCalendar/timer")
			b.StopTimer()
			for i := 0; i < b.N; i++ {
				ub.write(b, files)
				ub.enable(b, timers)
				b.StartTimer()
				ub.reload(b)
				ub.startBatch(b)
				b.StopTimer()
				ub.clean(b, files, timers)
			}
		})
	}
}
