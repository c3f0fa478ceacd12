package units

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"
	"golang.org/x/tools/txtar"

	"github.com/drover/drover/manifest"
)

// Golden files: testdata/golden/<case>.txtar, one case each. The archive's
// comment says what the case covers; then come spec.yaml (the pipe as an
// operator writes it), optionally options.yaml (the agent's Options), and the
// expected drover-pipe-<name>.service and .timer. Regenerate the expected
// files with
//
//	go test ./units -run Golden -update

var update = flag.Bool("update", false, "rewrite the expected files in testdata/golden")

type goldenOptions struct {
	AgentPath string   `yaml:"agent_path"`
	Scope     string   `yaml:"scope"`
	DataDir   string   `yaml:"data_dir"`
	RunArgs   []string `yaml:"run_args"`
	// Now is the render time (RFC 3339); default goldenNow.
	Now string `yaml:"now"`
}

// goldenNow is the render time of golden cases that do not set one, so that
// their correction lines do not change with the date the tests run.
var goldenNow = time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)

type goldenCase struct {
	name string
	path string
	ar   *txtar.Archive
	spec *manifest.Spec
	opts Options
}

func (c *goldenCase) file(name string) ([]byte, bool) {
	for _, f := range c.ar.Files {
		if f.Name == name {
			return f.Data, true
		}
	}
	return nil, false
}

func loadGolden(t *testing.T) []*goldenCase {
	t.Helper()
	paths, err := filepath.Glob(filepath.Join("testdata", "golden", "*.txtar"))
	if err != nil {
		t.Fatal(err)
	}
	if len(paths) < 15 {
		t.Fatalf("only %d golden cases in testdata/golden, want at least 15", len(paths))
	}
	var cases []*goldenCase
	for _, p := range paths {
		ar, err := txtar.ParseFile(p)
		if err != nil {
			t.Fatal(err)
		}
		c := &goldenCase{name: strings.TrimSuffix(filepath.Base(p), ".txtar"), path: p, ar: ar, opts: Options{Now: goldenNow}}
		specYAML, ok := c.file("spec.yaml")
		if !ok {
			t.Fatalf("%s: no spec.yaml", p)
		}
		dec := yaml.NewDecoder(bytes.NewReader(specYAML))
		dec.KnownFields(true)
		c.spec = new(manifest.Spec)
		if err := dec.Decode(c.spec); err != nil {
			t.Fatalf("%s: spec.yaml: %v", p, err)
		}
		if optYAML, ok := c.file("options.yaml"); ok {
			var o goldenOptions
			dec := yaml.NewDecoder(bytes.NewReader(optYAML))
			dec.KnownFields(true)
			if err := dec.Decode(&o); err != nil {
				t.Fatalf("%s: options.yaml: %v", p, err)
			}
			c.opts = Options{AgentPath: o.AgentPath, Scope: Scope(o.Scope), DataDir: o.DataDir, RunArgs: o.RunArgs, Now: goldenNow}
			if o.Now != "" {
				if c.opts.Now, err = time.Parse(time.RFC3339, o.Now); err != nil {
					t.Fatalf("%s: options.yaml: now: %v", p, err)
				}
			}
		}
		cases = append(cases, c)
	}
	return cases
}

func TestGolden(t *testing.T) {
	for _, c := range loadGolden(t) {
		t.Run(c.name, func(t *testing.T) {
			files, err := Render(c.spec, c.opts)
			if err != nil {
				t.Fatal(err)
			}
			checkRoundTrip(t, c.spec, c.opts, files)
			if *update {
				kept := []txtar.File{}
				for _, f := range c.ar.Files {
					if f.Name == "spec.yaml" || f.Name == "options.yaml" {
						kept = append(kept, f)
					}
				}
				for _, f := range files {
					kept = append(kept, txtar.File{Name: f.Name, Data: f.Content})
				}
				c.ar.Files = kept
				if err := os.WriteFile(c.path, txtar.Format(c.ar), 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			for _, f := range files {
				want, ok := c.file(f.Name)
				if !ok {
					t.Errorf("%s: no expected %s (run with -update)", c.path, f.Name)
					continue
				}
				if !bytes.Equal(f.Content, want) {
					t.Errorf("%s: %s differs from the golden file (run with -update and review the diff)\n--- got\n%s--- want\n%s", c.path, f.Name, f.Content, want)
				}
			}
			if _, hasOpts := c.file("options.yaml"); hasOpts {
				if n := len(c.ar.Files) - 1; n != 3 {
					t.Errorf("%s: %d files besides spec.yaml, want options.yaml, service and timer", c.path, n)
				}
			} else if n := len(c.ar.Files) - 1; n != 2 {
				t.Errorf("%s: %d files besides spec.yaml, want service and timer", c.path, n)
			}
		})
	}
}

// verifyAllowed are systemd-analyze verify messages that are not errors in
// the files: the run_as case uses an existing user for realism, and verify
// warns about "nobody" should anyone use it.
var verifyAllowed = []string{
	"Special user nobody configured, this is not safe!",
}

// TestGoldenVerify loads every golden pair with `systemd-analyze verify`,
// after pointing ExecStart= at an executable that exists. Any message it
// prints fails the case, as does a non-zero exit.
func TestGoldenVerify(t *testing.T) {
	analyze := oracleAnalyze(t) // skips, or fails when CI=true, without systemd-analyze
	cases := loadGolden(t)
	root := t.TempDir()
	agent := fakeAgent(t, root)
	runtimeDir := filepath.Join(root, "runtime")
	if err := os.Mkdir(runtimeDir, 0o700); err != nil {
		t.Fatal(err)
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			agentPath := c.opts.AgentPath
			if agentPath == "" {
				agentPath = DefaultAgentPath
			}
			var paths []string
			for _, f := range c.ar.Files {
				if !strings.HasPrefix(f.Name, "drover-pipe-") {
					continue
				}
				data := bytes.Replace(f.Data, []byte("\nExecStart="+agentPath+" "), []byte("\nExecStart="+agent+" "), 1)
				if filepath.Ext(f.Name) == ".service" && bytes.Equal(data, f.Data) {
					t.Fatalf("%s: ExecStart=%s not found", f.Name, agentPath)
				}
				p := filepath.Join(dir, f.Name)
				if err := os.WriteFile(p, data, 0o644); err != nil {
					t.Fatal(err)
				}
				paths = append(paths, p)
			}
			if len(paths) != 2 {
				t.Fatalf("%d unit files in %s (run TestGolden -update first)", len(paths), c.path)
			}
			args := []string{"verify", "--man=no"}
			if c.opts.Scope == ScopeUser {
				args = append(args, "--user")
			}
			out, err := runAnalyze(t, analyze, runtimeDir, append(args, paths...)...)
			var bad []string
			for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
				if line == "" || allowedVerifyLine(line) {
					continue
				}
				bad = append(bad, line)
			}
			if err != nil || len(bad) > 0 {
				t.Errorf("systemd-analyze %s: %v\n%s", strings.Join(args, " "), err, strings.Join(bad, "\n"))
			}
		})
	}
}

func allowedVerifyLine(line string) bool {
	for _, a := range verifyAllowed {
		if strings.HasSuffix(line, a) {
			return true
		}
	}
	return false
}

// runAnalyze runs systemd-analyze with a private runtime directory (the
// --user manager it simulates needs one) and returns its combined output.
func runAnalyze(t testing.TB, analyze, runtimeDir string, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, analyze, args...)
	cmd.Env = append(os.Environ(), "XDG_RUNTIME_DIR="+runtimeDir, "SYSTEMD_LOG_COLOR=0", "SYSTEMD_PAGER=", "LC_ALL=C.UTF-8")
	out, err := cmd.CombinedOutput()
	if ctx.Err() != nil {
		return string(out), fmt.Errorf("timed out: %w", ctx.Err())
	}
	return string(out), err
}
