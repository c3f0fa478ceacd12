package apply

import (
	"context"
	"encoding/json"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/drover/drover/agent/internal/sdtest"
	"github.com/drover/drover/manifest"
)

const (
	crashSpecsEnv = "DROVER_APPLY_CRASH_SPECS"
	crashDataEnv  = "DROVER_APPLY_CRASH_DATA"
)

type crashInput struct {
	Specs   []manifest.Spec
	Secrets map[string]map[string]string
}

func (c crashInput) input(t testing.TB) Input {
	in := input(t, c.Specs...)
	in.Secrets = c.Secrets
	return in
}

// TestCrashHelper is the apply process TestSystemdCrashSafety kills: the
// test binary run again, applying the specs named by the environment.
func TestCrashHelper(t *testing.T) {
	path := os.Getenv(crashSpecsEnv)
	if path == "" {
		t.Skip("helper process for TestSystemdCrashSafety")
	}
	var ci crashInput
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &ci); err != nil {
		t.Fatal(err)
	}
	sb, err := NewSystemd(context.Background(), userConfig(t, os.Getenv(crashDataEnv)))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sb.Apply(context.Background(), ci.input(t)); err != nil {
		t.Fatal(err)
	}
}

// TestSystemdCrashSafety SIGKILLs an apply at random points, 50 times, each
// time moving between three manifests; after each kill, a restarted agent's
// apply must leave the unit dir equal to the manifest, the timers in the
// state it asks for, and no temporary file anywhere.
func TestSystemdCrashSafety(t *testing.T) {
	sdtest.Require(t)
	t.Parallel()
	// A manager of its own: this test runs beside the minute-long ones.
	data := t.TempDir()
	b, env := newOwnSystemd(t, data)
	never := "0 0 1 1 *"
	variants := []crashInput{
		{Specs: []manifest.Spec{
			spec("c-a", "0 1 * * *"), spec("c-b", "0 2 * * *", withSecrets("PW")),
			spec("c-c", "@hourly"), spec("c-d", never, disabled()), spec("c-e", "*/10 * * * *"),
		}, Secrets: map[string]map[string]string{"c-b": {"PW": "one"}}},
		{Specs: []manifest.Spec{
			spec("c-a", "0 3 * * *"), spec("c-b", "0 2 * * *", withSecrets("PW", "KEY"), withScript("echo 2\n")),
			spec("c-d", never), spec("c-f", "30 * * * *", withCatchup(manifest.CatchupSkip)),
			spec("c-g", "0 0 * * 0", withTZ("Europe/Paris")),
		}, Secrets: map[string]map[string]string{"c-b": {"PW": "two", "KEY": "k"}}},
		{Specs: []manifest.Spec{
			spec("c-a", "0 3 * * *", disabled()), spec("c-c", "@daily"),
			spec("c-h", "15 * * * *"), spec("c-i", "45 6 * * 1-5"),
		}},
	}
	for i := range 6 {
		variants[i%3].Specs = append(variants[i%3].Specs, spec("c-bulk-"+string(rune('a'+i)), "0 4 * * *", withScript("echo "+strings.Repeat("x", i+1)+"\n")))
	}
	n := 50
	if testing.Short() {
		n = 10
	}
	seed := time.Now().UnixNano()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(uint64(seed), 0))
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	specsFile := filepath.Join(t.TempDir(), "specs.json")
	completed := 0
	// The kill comes at a uniformly random time within the length of a
	// whole helper run (process start included), measured on the first
	// one, which is let finish.
	var window time.Duration
	for i := range n {
		target := variants[i%len(variants)]
		raw, _ := json.Marshal(target)
		if err := os.WriteFile(specsFile, raw, 0o644); err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(self, "-test.run=^TestCrashHelper$", "-test.count=1")
		cmd.Env = append(append(os.Environ(), env.Environ()...), crashSpecsEnv+"="+specsFile, crashDataEnv+"="+data)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		exited := make(chan error, 1)
		go func() { exited <- cmd.Wait() }()
		if window == 0 {
			started := time.Now()
			if err := <-exited; err != nil {
				t.Fatalf("helper: %v", err)
			}
			window = time.Since(started) * 11 / 10
			t.Logf("a helper apply takes %v", window*10/11)
			exited <- nil
		}
		select {
		case err := <-exited:
			if err != nil {
				t.Fatalf("helper failed before the kill: %v", err)
			}
			completed++
		case <-time.After(time.Duration(rng.Int64N(int64(window)))):
			cmd.Process.Kill()
			<-exited
		}

		// The agent restarts and applies the manifest it had accepted.
		in := target.input(t)
		res := mustApply(t, b, in)
		if len(res.Errors) > 0 {
			t.Fatalf("iteration %d: apply after the kill: %v", i, res.Errors)
		}
		assertUnitDir(t, env.UnitDir(), in, b.cfg.renderOptions())
		assertDataDir(t, data, in)
		if m, _ := filepath.Glob(filepath.Join(b.runtimeUnitDir, "*", guardDropIn)); len(m) > 0 {
			t.Errorf("guard drop-ins left: %v", m)
		}
		if _, err := os.Stat(filepath.Join(b.runtimeUnitDir, batchTarget)); err == nil {
			t.Errorf("batch target left")
		}
		status, err := b.Status(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if len(status) != len(target.Specs) {
			t.Errorf("iteration %d: status lists %d pipes, want %d", i, len(status), len(target.Specs))
		}
		byName := map[string]PipeState{}
		for _, ps := range status {
			byName[ps.Name] = ps
		}
		for _, s := range target.Specs {
			ps := byName[s.Name]
			if ps.Scheduled != s.IsEnabled() || ps.Enabled != s.IsEnabled() {
				t.Errorf("iteration %d: %s scheduled=%v enabled=%v, pipe enabled=%v", i, s.Name, ps.Scheduled, ps.Enabled, s.IsEnabled())
			}
		}
		secrets, _ := filepath.Glob(filepath.Join(data, "secrets", "*", "*"))
		want := 0
		for _, m := range target.Secrets {
			want += len(m)
		}
		if len(secrets) != want {
			t.Errorf("iteration %d: secret files %v, want %d", i, secrets, want)
		}
		if t.Failed() {
			t.Fatalf("iteration %d failed (seed %d)", i, seed)
		}
	}
	t.Logf("%d of %d helper applies completed before the kill", completed, n)
}
