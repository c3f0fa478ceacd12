package units

import (
	"fmt"
	"testing"
	"time"

	"github.com/drover/drover/manifest"
)

// BenchmarkRender1000 renders 1,000 varied pipes per iteration, as an agent
// with a large manifest does on every apply. "zones" spreads the pipes over
// four time zones; "utc" leaves them in UTC, which shows what loading zone
// files (twice per pipe: validation and OnCalendar) costs.
func BenchmarkRender1000(b *testing.B) {
	b.Run("zones", func(b *testing.B) {
		benchRender(b, []string{"UTC", "Europe/Berlin", "America/New_York", "Asia/Kolkata"})
	})
	b.Run("utc", func(b *testing.B) { benchRender(b, []string{""}) })
}

func benchRender(b *testing.B, zones []string) {
	schedules := []string{"30 2 * * *", "*/5 * * * *", "0 12 1 * 1", "@daily", "@every 90m", "0 9-17 * * mon-fri"}
	profiles := []string{"default", "strict", "none"}
	specs := make([]*manifest.Spec, 1000)
	for i := range specs {
		specs[i] = &manifest.Spec{
			Name:        fmt.Sprintf("pipe-%04d", i),
			Description: fmt.Sprintf("Job %d: 50%% of $WORK, ends\\", i),
			Schedule:    schedules[i%len(schedules)],
			Timezone:    zones[i%len(zones)],
			Script:      "echo hi",
			Secrets:     []string{"PGPASSWORD", "API_TOKEN"}[:i%3%2+1],
			Hardening:   profiles[i%len(profiles)],
			Jitter:      manifest.Duration(time.Duration(i%4) * time.Minute),
			Limits:      manifest.Limits{MemoryMB: 512},
		}
	}
	opts := Options{RunArgs: []string{"--config", "/etc/drover/agent.yaml"}}
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		for _, s := range specs {
			if _, err := Render(s, opts); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N)/1000, "µs/pipe")
}
