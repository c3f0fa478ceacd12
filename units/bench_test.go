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
//
// "zones" renders with the DST correction lines, "zones-nocorr" without them
// (as before they existed), "zones-cold" with them but the corrections cache
// emptied before every iteration (an agent's first apply).
func BenchmarkRender1000(b *testing.B) {
	zones := []string{"UTC", "Europe/Berlin", "America/New_York", "Asia/Kolkata"}
	b.Run("zones", func(b *testing.B) { benchRender(b, zones, false, false) })
	b.Run("zones-nocorr", func(b *testing.B) { benchRender(b, zones, true, false) })
	b.Run("zones-cold", func(b *testing.B) { benchRender(b, zones, false, true) })
	b.Run("utc", func(b *testing.B) { benchRender(b, []string{""}, false, false) })
}

func benchRender(b *testing.B, zones []string, noCorr, cold bool) {
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
	opts := Options{RunArgs: []string{"--config", "/etc/drover/agent.yaml"}, NoCorrections: noCorr,
		Now: time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)}
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		if cold {
			corrCache.Clear()
			corrCacheSize.Store(0)
		}
		for _, s := range specs {
			if _, err := Render(s, opts); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N)/1000, "µs/pipe")
}
