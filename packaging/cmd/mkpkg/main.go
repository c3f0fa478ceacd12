// Command mkpkg builds Drover's .deb and .rpm packages into dist/ (see
// package packaging). Run it from the repository: `go run
// ./packaging/cmd/mkpkg`, or scripts/packages.sh, or `make packages`.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/drover/drover/packaging"
)

func main() {
	var (
		out      = flag.String("out", "", "output directory (default: <repository>/dist)")
		version  = flag.String("version", "", "package version (default: from git describe, see packaging/version.go)")
		arches   = flag.String("arch", strings.Join(packaging.Arches, ","), "comma-separated Go architectures")
		formats  = flag.String("format", strings.Join(packaging.Formats, ","), "comma-separated formats: deb, rpm")
		packages = flag.String("package", strings.Join(packaging.Packages, ","), "comma-separated packages")
		quiet    = flag.Bool("q", false, "print only errors")
	)
	flag.Usage = func() {
		fmt.Fprintf(os.Stderr, "usage: mkpkg [flags]\n\nBuilds %s as .deb and .rpm into dist/.\n\n", strings.Join(packaging.Packages, ", "))
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() > 0 {
		flag.Usage()
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	logf := func(format string, args ...any) { fmt.Fprintf(os.Stderr, format+"\n", args...) }
	if *quiet {
		logf = func(string, ...any) {}
	}
	start := time.Now()
	ix, err := packaging.Build(ctx, packaging.Options{
		Out:      *out,
		Version:  *version,
		Arches:   split(*arches),
		Formats:  split(*formats),
		Packages: split(*packages),
		Logf:     logf,
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "mkpkg:", err)
		os.Exit(1)
	}
	logf("mkpkg: %d packages, version %s, in %s", len(ix.Artifacts), ix.Version, time.Since(start).Round(100*time.Millisecond))
}

func split(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}
