// Package packaging builds Drover's .deb and .rpm packages with nfpm used as
// a library (github.com/goreleaser/nfpm/v2; no downloaded tools): the
// drover-agent, drover-server and droverctl packages for amd64 and arm64.
//
// The inputs live beside this file: nfpm/*.yaml (the package definitions),
// systemd/ (the daemons' units), config/ (the conffiles, every setting
// commented), scripts/ (maintainer scripts; #INCLUDE lines are inlined at
// build time), sysusers/. Build cross-compiles the binaries with
// CGO_ENABLED=0, generates droverctl's shell completions and the man pages
// by running the host's build of the binaries, and writes the packages and a
// packages.json index into the output directory (dist/).
//
// Entry points: `go run ./packaging/cmd/mkpkg`, scripts/packages.sh, `make
// packages`.
//
// Imported by packaging/cmd/mkpkg and, for its build tags and index, by
// the tests that use the shipped binaries (agent/e2e, packaging/pkgtest,
// server).
package packaging

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/goreleaser/nfpm/v2"
	_ "github.com/goreleaser/nfpm/v2/deb" // registers the deb packager
	_ "github.com/goreleaser/nfpm/v2/rpm" // registers the rpm packager
)

// What is built by default.
var (
	Packages = []string{"drover-agent", "drover-server", "droverctl"}
	Arches   = []string{"amd64", "arm64"}
	Formats  = []string{"deb", "rpm"}
)

// Binaries are the commands built, each from ./cmd/<name>.
var Binaries = []string{"drover-agent", "drover-server", "droverctl"}

// BuildTags are the build tags of every shipped binary (the Makefile's
// `build` uses the same). grpcnotrace drops gRPC's golang.org/x/net/trace
// import, whose html/template makes the linker keep every exported method
// of every type: −3.5 MB of binary and −3 MB of the agent's idle RSS. Drover
// never enables gRPC tracing, so nothing is lost.
const BuildTags = "grpcnotrace"

// Options configure Build. Zero values mean the defaults.
type Options struct {
	Root     string   // repository root (default: found upwards from the working directory)
	Out      string   // output directory (default Root/dist)
	Version  string   // package version (default: mapped from git, see MapVersion)
	Arches   []string // default Arches
	Formats  []string // default Formats
	Packages []string // default Packages
	// BinaryVersion is the binaries' main.version (default: git describe
	// --tags --always --dirty).
	BinaryVersion string
	// MTime is the time of every file in the packages (default:
	// $SOURCE_DATE_EPOCH, else HEAD's commit time).
	MTime time.Time
	// Prebuilt, when set, is the build directory of an earlier Build
	// (<out>/build): its <arch>/bin binaries are packaged instead of
	// compiling (e.g. to repackage the same binaries with another version).
	Prebuilt string
	Logf     func(format string, args ...any)
}

// Artifact is one built package.
type Artifact struct {
	Package string `json:"package"`
	Arch    string `json:"arch"` // Go architecture name
	Format  string `json:"format"`
	File    string `json:"file"` // base name, in the output directory
	SHA256  string `json:"sha256"`
	Size    int64  `json:"size"`
}

// Index is packages.json in the output directory.
type Index struct {
	Version       string     `json:"version"`
	BinaryVersion string     `json:"binary_version"`
	Describe      string     `json:"git_describe,omitempty"`
	Source        string     `json:"source_fingerprint,omitempty"` // SourceFingerprint at the start of the build
	Arches        []string   `json:"arches"`
	Formats       []string   `json:"formats"`
	Artifacts     []Artifact `json:"artifacts"`
}

// Path returns the artifact of pkg for arch and format, or "".
func (ix Index) Path(out, pkg, arch, format string) string {
	for _, a := range ix.Artifacts {
		if a.Package == pkg && a.Arch == arch && a.Format == format {
			return filepath.Join(out, a.File)
		}
	}
	return ""
}

// ReadIndex reads packages.json from out.
func ReadIndex(out string) (Index, error) {
	var ix Index
	b, err := os.ReadFile(filepath.Join(out, "packages.json"))
	if err != nil {
		return ix, err
	}
	return ix, json.Unmarshal(b, &ix)
}

// FindRoot returns the repository root: the nearest directory upwards from
// dir holding go.mod and packaging/nfpm.
func FindRoot(dir string) (string, error) {
	d, err := filepath.Abs(dir)
	if err != nil {
		return "", err
	}
	for {
		if fileExists(filepath.Join(d, "go.mod")) && fileExists(filepath.Join(d, "packaging", "nfpm")) {
			return d, nil
		}
		parent := filepath.Dir(d)
		if parent == d {
			return "", fmt.Errorf("no repository root (go.mod with packaging/nfpm) above %s", dir)
		}
		d = parent
	}
}

func fileExists(p string) bool { _, err := os.Stat(p); return err == nil }

// Build builds the packages and returns the index it wrote to Out.
func Build(ctx context.Context, o Options) (Index, error) {
	var ix Index
	if err := o.defaults(ctx, &ix); err != nil {
		return ix, err
	}
	logf := o.Logf
	if err := os.MkdirAll(o.Out, 0o755); err != nil {
		return ix, err
	}
	ix.Arches, ix.Formats = o.Arches, o.Formats
	if fp, err := SourceFingerprint(ctx, o.Root); err == nil {
		ix.Source = fp
	}
	if err := removeOldPackages(o.Out); err != nil {
		return ix, err
	}
	buildRoot := filepath.Join(o.Out, "build")
	if err := os.RemoveAll(buildRoot); err != nil {
		return ix, err
	}

	// The host's binaries generate the completions and man pages.
	hostDir := filepath.Join(buildRoot, runtime.GOARCH)
	if !slices.Contains(o.Arches, runtime.GOARCH) {
		hostDir = filepath.Join(buildRoot, "host")
	}
	arches := append([]string{}, o.Arches...)
	if hostDir == filepath.Join(buildRoot, "host") {
		arches = append(arches, "host")
	}
	for _, arch := range arches {
		goarch := arch
		if arch == "host" {
			goarch = runtime.GOARCH
		}
		start := time.Now()
		if o.Prebuilt != "" {
			if err := copyTree(filepath.Join(o.Prebuilt, arch, "bin"), filepath.Join(buildRoot, arch, "bin")); err != nil {
				return ix, fmt.Errorf("prebuilt binaries: %w", err)
			}
			continue
		}
		if err := goBuild(ctx, o.Root, filepath.Join(buildRoot, arch, "bin"), goarch, o.BinaryVersion); err != nil {
			return ix, err
		}
		logf("mkpkg: built %s for linux/%s in %s", strings.Join(Binaries, ", "), goarch, time.Since(start).Round(100*time.Millisecond))
	}

	gen := filepath.Join(buildRoot, "generated")
	if err := generate(ctx, o, filepath.Join(hostDir, "bin"), gen); err != nil {
		return ix, err
	}

	type job struct{ pkg, arch, format, dir string }
	var jobs []job
	for _, arch := range o.Arches {
		archDir := filepath.Join(buildRoot, arch)
		// Generated files are the same for every architecture.
		for _, d := range []string{"man", "completion", "scripts", "doc"} {
			if err := copyTree(filepath.Join(gen, d), filepath.Join(archDir, d)); err != nil {
				return ix, err
			}
		}
		for _, pkg := range o.Packages {
			for _, format := range o.Formats {
				jobs = append(jobs, job{pkg, arch, format, archDir})
			}
		}
	}
	// Compressing is most of the work: one package per CPU at a time.
	results := make([]Artifact, len(jobs))
	errs := make([]error, len(jobs))
	sem := make(chan struct{}, max(1, runtime.NumCPU()))
	var wg sync.WaitGroup
	for i, j := range jobs {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			results[i], errs[i] = pack(o, j.pkg, j.arch, j.format, j.dir)
			if errs[i] == nil {
				logf("mkpkg: %s", results[i].File)
			}
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return ix, err
	}
	ix.Artifacts = results
	b, err := json.MarshalIndent(ix, "", "  ")
	if err != nil {
		return ix, err
	}
	if err := os.WriteFile(filepath.Join(o.Out, "packages.json"), append(b, '\n'), 0o644); err != nil {
		return ix, err
	}
	return ix, nil
}

func (o *Options) defaults(ctx context.Context, ix *Index) error {
	if o.Logf == nil {
		o.Logf = func(string, ...any) {}
	}
	if o.Root == "" {
		wd, err := os.Getwd()
		if err != nil {
			return err
		}
		if o.Root, err = FindRoot(wd); err != nil {
			return err
		}
	}
	if o.Out == "" {
		o.Out = filepath.Join(o.Root, "dist")
	}
	var err error
	if o.Out, err = filepath.Abs(o.Out); err != nil {
		return err
	}
	if len(o.Arches) == 0 {
		o.Arches = Arches
	}
	if len(o.Formats) == 0 {
		o.Formats = Formats
	}
	if len(o.Packages) == 0 {
		o.Packages = Packages
	}
	for _, p := range o.Packages {
		if !slices.Contains(Packages, p) {
			return fmt.Errorf("unknown package %q (known: %s)", p, strings.Join(Packages, ", "))
		}
	}
	for _, f := range o.Formats {
		if !slices.Contains(Formats, f) {
			return fmt.Errorf("unknown format %q (known: %s)", f, strings.Join(Formats, ", "))
		}
	}
	needGit := o.Version == "" || o.BinaryVersion == "" || o.MTime.IsZero()
	var g GitInfo
	if needGit {
		g, err = ReadGit(ctx, o.Root)
		if err != nil {
			return fmt.Errorf("package version from git (or pass -version): %w", err)
		}
		ix.Describe = g.Describe
	}
	if o.Version == "" {
		if o.Version, err = MapVersion(g.Describe, g.Commits); err != nil {
			return err
		}
		if strings.HasSuffix(g.DescribeDirty, "-dirty") {
			o.Logf("mkpkg: the working tree has uncommitted changes; package version %s does not say so (the binaries' --version does)", o.Version)
		}
	} else if err := CheckVersion(o.Version); err != nil {
		return err
	}
	if o.BinaryVersion == "" {
		o.BinaryVersion = g.DescribeDirty
	}
	if o.MTime.IsZero() {
		o.MTime = g.CommitTime
		if s := os.Getenv("SOURCE_DATE_EPOCH"); s != "" {
			var sec int64
			if _, err := fmt.Sscan(s, &sec); err != nil {
				return fmt.Errorf("SOURCE_DATE_EPOCH=%q: %w", s, err)
			}
			o.MTime = time.Unix(sec, 0).UTC()
		}
	}
	ix.Version, ix.BinaryVersion = o.Version, o.BinaryVersion
	return nil
}

// removeOldPackages deletes packages an earlier build left in out.
func removeOldPackages(out string) error {
	for _, pkg := range Packages {
		for _, pat := range []string{pkg + "_*.deb", pkg + "-[0-9]*.rpm"} {
			old, _ := filepath.Glob(filepath.Join(out, pat))
			for _, f := range old {
				if err := os.Remove(f); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// goBuild cross-compiles the binaries into dir.
func goBuild(ctx context.Context, root, dir, goarch, version string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	args := []string{"build", "-trimpath", "-tags", BuildTags, "-ldflags", "-s -w -X main.version=" + version, "-o", dir + "/"}
	for _, b := range Binaries {
		if !hasGoFiles(filepath.Join(root, "cmd", b)) {
			return &MissingPartError{Part: "cmd/" + b}
		}
		args = append(args, "./cmd/"+b)
	}
	cmd := exec.CommandContext(ctx, goCommand(), args...)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+goarch)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("go build for linux/%s: %v\n%s", goarch, err, out.String())
	}
	return nil
}

// goCommand is the go command on PATH (go test and go generate put their
// own first), else the usual install location.
func goCommand() string {
	if g, err := exec.LookPath("go"); err == nil {
		return g
	}
	if fileExists("/usr/local/go/bin/go") {
		return "/usr/local/go/bin/go"
	}
	return "go"
}

func hasGoFiles(dir string) bool {
	m, _ := filepath.Glob(filepath.Join(dir, "*.go"))
	return len(m) > 0
}

// generate writes man/, completion/ and scripts/ into gen.
func generate(ctx context.Context, o Options, hostBin, gen string) error {
	for _, d := range []string{"man", "completion", "scripts/deb", "scripts/rpm", "doc"} {
		if err := os.MkdirAll(filepath.Join(gen, d), 0o755); err != nil {
			return err
		}
	}
	for _, p := range ManPages {
		path := filepath.Join(gen, "man", fmt.Sprintf("%s.%d.gz", p.Binary, p.Section))
		if err := writeManPage(ctx, p, filepath.Join(hostBin, p.Binary), path, o.Version, o.MTime); err != nil {
			return err
		}
	}
	if err := writeCompletions(ctx, filepath.Join(hostBin, "droverctl"), filepath.Join(gen, "completion")); err != nil {
		return err
	}
	if err := writeModuleLicenses(ctx, hostBin, filepath.Join(gen, "doc")); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(gen, "doc", "changelog.yaml"), Changelog(o.Version, o.BinaryVersion, o.MTime), 0o644); err != nil {
		return err
	}
	return writeScripts(filepath.Join(o.Root, "packaging", "scripts"), filepath.Join(gen, "scripts"))
}

// Maintainer is the packages' Maintainer (Debian) and changelog packager;
// packaging/nfpm/*.yaml say the same.
const Maintainer = "Drover developers <drover@drover.invalid>"

// Changelog returns the packages' changelog in nfpm's changelog format
// (github.com/goreleaser/chglog): one entry for this build, which nfpm
// writes as /usr/share/doc/<package>/changelog.Debian.gz and as the RPM
// %changelog. The entry's version is the full package version with its
// revision (1), as dpkg and rpm show it; the changes themselves are the
// project's git history.
func Changelog(version, binaryVersion string, mtime time.Time) []byte {
	type deb struct {
		Urgency       string   `json:"urgency"`
		Distributions []string `json:"distributions"`
	}
	type change struct {
		Commit string `json:"commit"`
		Note   string `json:"note"`
	}
	type entry struct {
		Semver   string   `json:"semver"`
		Date     string   `json:"date"`
		Packager string   `json:"packager"`
		Deb      deb      `json:"deb"`
		Changes  []change `json:"changes"`
	}
	e := entry{
		Semver:   version + "-1",
		Date:     mtime.UTC().Format(time.RFC3339),
		Packager: Maintainer,
		Deb:      deb{Urgency: "medium", Distributions: []string{"stable"}},
		Changes: []change{{
			Commit: binaryVersion,
			Note:   "Drover " + binaryVersion + "; the changes are in its git history.",
		}},
	}
	// JSON is YAML: the changelog parser reads it as it is.
	b, _ := json.MarshalIndent([]entry{e}, "", "  ")
	return append(b, '\n')
}

// CompletionShells are the shells droverctl's package carries completion for.
var CompletionShells = []string{"bash", "zsh", "fish"}

// writeCompletions runs `droverctl completion SHELL` for each shell. It fails
// the build when the command is missing or prints nothing.
func writeCompletions(ctx context.Context, droverctl, dir string) error {
	for _, sh := range CompletionShells {
		cctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		cmd := exec.CommandContext(cctx, droverctl, "completion", sh)
		cmd.Env = []string{"PATH=/usr/bin:/bin", "HOME=/nonexistent", "LANG=C"}
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		cancel()
		if err != nil || stdout.Len() < 100 || !strings.Contains(stdout.String(), "droverctl") {
			return fmt.Errorf("droverctl shell completion: `droverctl completion %s` did not print a completion script (err %v, %d bytes): %s\n"+
				"the droverctl package ships bash, zsh and fish completion generated from that command (cobra's default `completion` command)",
				sh, err, stdout.Len(), strings.TrimSpace(stderr.String()))
		}
		if err := os.WriteFile(filepath.Join(dir, "droverctl."+sh), stdout.Bytes(), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// writeScripts copies scripts/{deb,rpm}/* into out with every "#INCLUDE
// name" line replaced by scripts/name.
func writeScripts(src, out string) error {
	for _, kind := range []string{"deb", "rpm"} {
		entries, err := os.ReadDir(filepath.Join(src, kind))
		if err != nil {
			return err
		}
		for _, e := range entries {
			b, err := os.ReadFile(filepath.Join(src, kind, e.Name()))
			if err != nil {
				return err
			}
			b, err = inlineIncludes(src, b)
			if err != nil {
				return fmt.Errorf("%s/%s: %w", kind, e.Name(), err)
			}
			if err := os.WriteFile(filepath.Join(out, kind, e.Name()), b, 0o755); err != nil {
				return err
			}
		}
	}
	return nil
}

// InlineIncludes is exported for tests: it expands "#INCLUDE name" lines.
func InlineIncludes(dir string, script []byte) ([]byte, error) { return inlineIncludes(dir, script) }

func inlineIncludes(dir string, script []byte) ([]byte, error) {
	var b bytes.Buffer
	for _, line := range strings.SplitAfter(string(script), "\n") {
		name, ok := strings.CutPrefix(strings.TrimRight(line, "\n"), "#INCLUDE ")
		if !ok {
			b.WriteString(line)
			continue
		}
		if strings.ContainsAny(name, "/\\") || name == "" {
			return nil, fmt.Errorf("bad include %q", name)
		}
		inc, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			return nil, err
		}
		b.Write(inc)
		if !bytes.HasSuffix(inc, []byte("\n")) {
			b.WriteByte('\n')
		}
	}
	return b.Bytes(), nil
}

func copyTree(src, dst string) error {
	return filepath.WalkDir(src, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		target := filepath.Join(dst, rel)
		if d.IsDir() {
			return os.MkdirAll(target, 0o755)
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		return os.WriteFile(target, b, fi.Mode().Perm())
	})
}

// pack builds one package with nfpm.
func pack(o Options, pkg, arch, format, archDir string) (Artifact, error) {
	a := Artifact{Package: pkg, Arch: arch, Format: format}
	cfgPath := filepath.Join(o.Root, "packaging", "nfpm", pkg+".yaml")
	raw, err := os.ReadFile(cfgPath)
	if err != nil {
		return a, err
	}
	vars := map[string]string{
		"ARCH":    arch,
		"VERSION": o.Version,
		"BUILD":   archDir,
		"PKG":     filepath.Join(o.Root, "packaging"),
	}
	var unknown []string
	expanded := os.Expand(string(raw), func(k string) string {
		v, ok := vars[k]
		if !ok {
			unknown = append(unknown, k)
		}
		return v
	})
	if len(unknown) > 0 {
		return a, fmt.Errorf("%s: unknown variables %v", cfgPath, unknown)
	}
	// Everything is expanded already: nfpm's own expansion must not touch
	// the result.
	cfg, err := nfpm.ParseWithEnvMapping(strings.NewReader(expanded), func(k string) string { return "${" + k + "}" })
	if err != nil {
		return a, fmt.Errorf("%s: %w", cfgPath, err)
	}
	if err := cfg.Validate(); err != nil {
		return a, fmt.Errorf("%s: %w", cfgPath, err)
	}
	info, err := cfg.Get(format)
	if err != nil {
		return a, err
	}
	info = nfpm.WithDefaults(info)
	info.MTime = o.MTime
	info.RPM.BuildHost = "drover-build"
	for _, c := range info.Contents {
		if c.FileInfo != nil {
			c.FileInfo.MTime = o.MTime
		}
	}
	packager, err := nfpm.Get(format)
	if err != nil {
		return a, err
	}
	a.File = packager.ConventionalFileName(info)
	target := filepath.Join(o.Out, a.File)
	info.Target = target
	var buf bytes.Buffer
	if err := packager.Package(info, &buf); err != nil {
		return a, fmt.Errorf("%s %s %s: %w", pkg, arch, format, err)
	}
	b := buf.Bytes()
	if format == "rpm" {
		// ./usr/... member names, as rpmbuild writes them (rpmpayload.go).
		if b, err = RelativizeRPM(b); err != nil {
			return a, fmt.Errorf("%s %s rpm payload: %w", pkg, arch, err)
		}
	}
	if err := os.WriteFile(target, b, 0o644); err != nil {
		os.Remove(target)
		return a, err
	}
	sum := sha256.Sum256(b)
	a.SHA256, a.Size = hex.EncodeToString(sum[:]), int64(len(b))
	return a, nil
}

// MissingPartError tells that a command the packages carry does not exist
// in the tree yet.
type MissingPartError struct{ Part string }

func (e *MissingPartError) Error() string {
	return e.Part + " has no Go files yet: cannot package it"
}
