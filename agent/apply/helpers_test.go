package apply

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/drover/drover/internal/testkit"
	"github.com/drover/drover/manifest"
	"github.com/drover/drover/units"
)

// fakeRunner is the test stand-in for the agent binary (testdata/fake-runner.sh).
func fakeRunner(t testing.TB) string {
	p, err := filepath.Abs("testdata/fake-runner.sh")
	if err != nil {
		t.Fatal(err)
	}
	return p
}

type pipeOpt func(*manifest.Spec)

func spec(name, schedule string, opts ...pipeOpt) manifest.Spec {
	s := manifest.Spec{Name: name, Schedule: schedule, Script: "true\n", Hardening: manifest.HardeningNone}
	for _, o := range opts {
		o(&s)
	}
	return s
}

func withScript(sc string) pipeOpt    { return func(s *manifest.Spec) { s.Script = sc } }
func withTZ(tz string) pipeOpt        { return func(s *manifest.Spec) { s.Timezone = tz } }
func withCatchup(c string) pipeOpt    { return func(s *manifest.Spec) { s.Catchup = c } }
func withSecrets(n ...string) pipeOpt { return func(s *manifest.Spec) { s.Secrets = n } }
func disabled() pipeOpt {
	return func(s *manifest.Spec) { f := false; s.Enabled = &f }
}

// input builds a manifest and its payload source from specs.
func input(t testing.TB, specs ...manifest.Spec) Input {
	t.Helper()
	bundles := map[string][]byte{}
	m := &manifest.Manifest{AgentID: "test-agent", Serial: 1}
	for _, s := range specs {
		b, err := manifest.ScriptBundle(s.Script)
		if err != nil {
			t.Fatal(err)
		}
		d := manifest.Digest(b)
		bundles[d] = b
		m.Pipes = append(m.Pipes, manifest.Pipe{Name: s.Name, Version: 1, Spec: s,
			Payload: manifest.Payload{Digest: d, Size: int64(len(b))}})
	}
	return Input{
		Manifest: m,
		Payloads: func(p *manifest.Pipe) ([]byte, error) {
			b, ok := bundles[p.Payload.Digest]
			if !ok {
				return nil, fmt.Errorf("no bundle %s", p.Payload.Digest)
			}
			return b, nil
		},
	}
}

func userConfig(t testing.TB, dataDir string) Config {
	return Config{DataDir: dataDir, Scope: units.ScopeUser, AgentPath: fakeRunner(t), Logger: testkit.Logger(t, slog.LevelWarn)}
}

// runLine is one line of runs.log written by the fake runner.
type runLine struct {
	Pipe   string
	At     time.Time
	Fields map[string]string
	Raw    string
}

func readRuns(t testing.TB, dataDir string) []runLine {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dataDir, "runs.log"))
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	var out []runLine
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		var sec int64
		fmt.Sscan(f[1], &sec)
		r := runLine{Pipe: f[0], At: time.Unix(sec, 0), Fields: map[string]string{}, Raw: line}
		for _, kv := range f[2:] {
			k, v, _ := strings.Cut(kv, "=")
			r.Fields[k] = v
		}
		out = append(out, r)
	}
	return out
}

func runsOf(runs []runLine, pipe string) []runLine {
	var out []runLine
	for _, r := range runs {
		if r.Pipe == pipe {
			out = append(out, r)
		}
	}
	return out
}

// waitRun waits until pipe has more than n runs logged.
func waitRun(t testing.TB, dataDir, pipe string, n int, timeout time.Duration) []runLine {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		if r := runsOf(readRuns(t, dataDir), pipe); len(r) > n {
			return r
		}
		if time.Now().After(deadline) {
			t.Fatalf("pipe %s: no run %d within %v", pipe, n+1, timeout)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// assertUnitDir checks that the drover units in dir are exactly the rendered
// units of in's pipes (plus the foreign files listed), and no temp files.
func assertUnitDir(t testing.TB, dir string, in Input, opts units.Options, foreign ...string) {
	t.Helper()
	want := map[string][]byte{}
	for _, p := range in.Manifest.Pipes {
		s := p.Spec.Clone()
		s.Normalize()
		files, err := units.Render(s, opts)
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range files {
			want[f.Name] = f.Content
		}
	}
	for _, f := range foreign {
		want[f] = nil
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), ".") {
			t.Errorf("temporary file left in the unit dir: %s", e.Name())
			continue
		}
		if _, ok := pipeOfUnit(e.Name()); !ok {
			continue
		}
		got = append(got, e.Name())
		w, ok := want[e.Name()]
		if !ok {
			t.Errorf("unexpected unit %s", e.Name())
			continue
		}
		if w == nil {
			continue
		}
		b, _ := os.ReadFile(filepath.Join(dir, e.Name()))
		if !bytes.Equal(b, w) {
			t.Errorf("%s differs from the rendered unit", e.Name())
		}
	}
	if len(got) != len(want) {
		var names []string
		for n := range want {
			names = append(names, n)
		}
		sort.Strings(names)
		t.Errorf("unit dir holds %v, want %v", got, names)
	}
}

// assertDataDir checks D/pipes holds exactly a link and one generation per
// pipe of in, with no temporaries.
func assertDataDir(t testing.TB, dataDir string, in Input) {
	t.Helper()
	ents, err := os.ReadDir(filepath.Join(dataDir, pipesDir))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{}
	for _, p := range in.Manifest.Pipes {
		want[p.Name] = true
	}
	links, gens := 0, 0
	for _, e := range ents {
		n := e.Name()
		switch {
		case strings.HasPrefix(n, linkPref) || strings.HasPrefix(n, tmpPrefix):
			t.Errorf("temporary left in pipes/: %s", n)
		case strings.HasPrefix(n, "."):
			gens++
		default:
			links++
			if !want[n] {
				t.Errorf("stale pipe link %s", n)
			}
			if _, err := os.Stat(filepath.Join(dataDir, pipesDir, n, pipeJSON)); err != nil {
				t.Errorf("pipe %s: %v", n, err)
			}
		}
	}
	if links != len(want) || gens != len(want) {
		t.Errorf("pipes/ has %d links and %d generations, want %d of each", links, gens, len(want))
	}
}

func mustApply(t testing.TB, b Backend, in Input) *Result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	res, err := b.Apply(ctx, in)
	if err != nil {
		t.Fatalf("apply: %v", err)
	}
	return res
}

func changedSteps(steps []Step) []Step {
	var out []Step
	for _, s := range steps {
		if s.Changes() {
			out = append(out, s)
		}
	}
	return out
}
