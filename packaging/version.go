package packaging

import (
	"context"
	"fmt"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// Package versions
//
// The package version comes from `git describe --tags --always` and is
// mapped so that dpkg and rpm both order every later commit higher:
//
//	describe                   package version          when
//	v1.2.3                     1.2.3                    on a release tag
//	v1.2.3-5-gabc1234          1.2.3+git5.abc1234       5 commits after it
//	v1.3.0-rc.1                1.3.0~rc.1               on a pre-release tag
//	v1.3.0-rc.1-2-gabc1234     1.3.0~rc.1+git2.abc1234  after it
//	abc1234 (no tag yet)       0.0.0~git<N>.abc1234     N = git rev-list --count HEAD
//
// "~" sorts before anything (so 1.3.0~rc.1 < 1.3.0, and every untagged
// build < 0.0.0 < the first tag) and "+gitN" after the version it extends
// (1.2.3 < 1.2.3+git5 < 1.2.4), in dpkg and in rpm ≥ 4.10; N is compared as
// a number by both, so builds order by commit count. The package release is
// always 1 (Debian revision -1, RPM Release 1). Uncommitted changes do not
// show in the package version (only in the binaries' --version, which is
// `git describe --tags --always --dirty`): build release packages from a
// clean tree. A version given explicitly (mkpkg -version) is used as is.

var (
	describeSuffix = regexp.MustCompile(`^(.+)-([0-9]+)-g([0-9a-f]+)$`)
	bareHash       = regexp.MustCompile(`^[0-9a-f]{4,40}$`)
	releasePart    = regexp.MustCompile(`^[0-9]+(\.[0-9]+)*$`)
	prePart        = regexp.MustCompile(`^[0-9A-Za-z]+([.-][0-9A-Za-z]+)*$`)
	validVersion   = regexp.MustCompile(`^[0-9][0-9A-Za-z.+~]*$`)
)

// MapVersion turns the output of `git describe --tags --always` and the
// commit count into a package version valid for dpkg and rpm.
func MapVersion(describe string, commits int) (string, error) {
	describe = strings.TrimSpace(describe)
	if describe == "" {
		return "", fmt.Errorf("empty git describe output")
	}
	if bareHash.MatchString(describe) {
		if commits <= 0 {
			return "", fmt.Errorf("untagged commit %s: commit count %d", describe, commits)
		}
		return fmt.Sprintf("0.0.0~git%d.%s", commits, describe), nil
	}
	tag, suffix := describe, ""
	if m := describeSuffix.FindStringSubmatch(describe); m != nil {
		tag, suffix = m[1], "+git"+m[2]+"."+m[3]
	}
	t := strings.TrimPrefix(tag, "v")
	rel, pre, hasPre := strings.Cut(t, "-")
	if !releasePart.MatchString(rel) {
		return "", fmt.Errorf("tag %q is not a version (want v1.2.3 or v1.2.3-rc.1); pass -version", tag)
	}
	v := rel
	if hasPre {
		if !prePart.MatchString(pre) {
			return "", fmt.Errorf("tag %q has an unusable pre-release part %q; pass -version", tag, pre)
		}
		v += "~" + strings.ReplaceAll(pre, "-", ".")
	}
	v += suffix
	if err := CheckVersion(v); err != nil {
		return "", err
	}
	return v, nil
}

// CheckVersion reports whether v can be a dpkg upstream version without a
// revision and an rpm Version: it starts with a digit and holds only
// letters, digits and . + ~.
func CheckVersion(v string) error {
	if !validVersion.MatchString(v) {
		return fmt.Errorf("package version %q: must start with a digit and hold only letters, digits and . + ~", v)
	}
	return nil
}

// GitInfo is what the build takes from git.
type GitInfo struct {
	Describe      string    // git describe --tags --always
	DescribeDirty string    // git describe --tags --always --dirty (the binaries' version)
	Commits       int       // git rev-list --count HEAD
	CommitTime    time.Time // of HEAD: the packages' file times
}

// ReadGit queries the repository at dir.
func ReadGit(ctx context.Context, dir string) (GitInfo, error) {
	var g GitInfo
	run := func(args ...string) (string, error) {
		cmd := exec.CommandContext(ctx, "git", args...)
		cmd.Dir = dir
		out, err := cmd.Output()
		if err != nil {
			if ee, ok := err.(*exec.ExitError); ok {
				return "", fmt.Errorf("git %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(ee.Stderr)))
			}
			return "", fmt.Errorf("git %s: %w", strings.Join(args, " "), err)
		}
		return strings.TrimSpace(string(out)), nil
	}
	var err error
	if g.Describe, err = run("describe", "--tags", "--always"); err != nil {
		return g, err
	}
	if g.DescribeDirty, err = run("describe", "--tags", "--always", "--dirty"); err != nil {
		return g, err
	}
	n, err := run("rev-list", "--count", "HEAD")
	if err != nil {
		return g, err
	}
	if g.Commits, err = strconv.Atoi(n); err != nil {
		return g, fmt.Errorf("git rev-list --count: %q", n)
	}
	ct, err := run("log", "-1", "--format=%ct")
	if err != nil {
		return g, err
	}
	sec, err := strconv.ParseInt(ct, 10, 64)
	if err != nil {
		return g, fmt.Errorf("git log: commit time %q", ct)
	}
	g.CommitTime = time.Unix(sec, 0).UTC()
	return g, nil
}
