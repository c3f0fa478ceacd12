package units

import (
	"strings"
	"testing"
	"time"

	"github.com/drover/drover/manifest"
)

// FuzzRender feeds arbitrary names, descriptions, users, secret names, env,
// schedules and time zones to Render. It must either refuse the spec or
// produce files whose parsed options are exactly the intended ones: no
// injected option, no extra section, every value equal to what was meant
// once systemd's unescaping is applied (checkRoundTrip).
//
// Seeds are in testdata/fuzz/FuzzRender; run the fuzzer with
//
//	go test ./units -run '^$' -fuzz FuzzRender -fuzztime 60s
func FuzzRender(f *testing.F) {
	f.Add("backup-db", "Nightly database dump", "", "PGPASSWORD", "PGHOST=localhost", "30 2 * * *", "Europe/Berlin", uint8(0))
	f.Add("x", "ends\\", "root", "A,B", "A=1;B=$HOME", "@every 90m", "", uint8(0b1111_1111))
	f.Add("p", "a\nExecStartPre=/bin/sh", "-root", "A:/etc/shadow", "X=%n\n[Service]", "0 12 1 * 1", "UTC\nOnCalendar=minutely", uint8(0b0000_0101))
	f.Fuzz(func(t *testing.T, name, desc, runAs, secrets, env, schedule, tz string, flags uint8) {
		spec := &manifest.Spec{
			Name:        name,
			Description: desc,
			Schedule:    schedule,
			Timezone:    tz,
			Script:      "echo fuzz",
			RunAs:       runAs,
			Hardening:   []string{"default", "strict", "none", ""}[flags&3],
			Catchup:     []string{"", "once", "all", "skip"}[flags>>3&3],
		}
		if secrets != "" {
			spec.Secrets = strings.Split(secrets, ",")
		}
		if env != "" {
			spec.Env = map[string]string{}
			for _, kv := range strings.Split(env, ";") {
				k, v, _ := strings.Cut(kv, "=")
				spec.Env[k] = v
			}
		}
		if flags&(1<<5) != 0 {
			spec.Jitter = manifest.Duration(90 * time.Second)
			spec.Timeout = manifest.Duration(1500 * time.Millisecond)
		}
		if flags&(1<<6) != 0 {
			spec.Limits = manifest.Limits{CPUPercent: 50, MemoryMB: 512, Tasks: 64}
		}
		opts := Options{Now: goldenNow}
		if flags&(1<<2) != 0 {
			opts.Scope = ScopeUser
		}
		if flags&(1<<7) != 0 {
			opts.RunArgs = []string{"--config", "/etc/drover/agent.yaml"}
		}
		files, err := Render(spec, opts)
		if err != nil {
			return
		}
		checkRoundTrip(t, spec, opts, files)
		for _, f := range files {
			for _, v := range spec.Env {
				// Env values never reach a unit; only short values can
				// occur in the fixed text by chance.
				if len(v) >= 12 && strings.Contains(string(f.Content), v) {
					t.Errorf("%s contains the env value %q", f.Name, v)
				}
			}
		}
	})
}
