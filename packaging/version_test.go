package packaging

import (
	"context"
	"github.com/drover/drover/internal/testkit"
	"os"
	"os/exec"
	"strings"
	"testing"
)

func TestMapVersion(t *testing.T) {
	for _, c := range []struct {
		describe string
		commits  int
		want     string
	}{
		{"8dd5356", 4, "0.0.0~git4.8dd5356"},
		{"8dd5356abcde", 12, "0.0.0~git12.8dd5356abcde"},
		{"v1.2.3", 40, "1.2.3"},
		{"1.2.3", 40, "1.2.3"},
		{"v1.2.3-5-gabc1234", 45, "1.2.3+git5.abc1234"},
		{"v1.3.0-rc.1", 50, "1.3.0~rc.1"},
		{"v1.3.0-rc1", 50, "1.3.0~rc1"},
		{"v1.3.0-beta-2", 50, "1.3.0~beta.2"},
		{"v1.3.0-rc.1-2-g0123abc", 52, "1.3.0~rc.1+git2.0123abc"},
		{"v2", 1, "2"},
	} {
		got, err := MapVersion(c.describe, c.commits)
		if err != nil || got != c.want {
			t.Errorf("MapVersion(%q, %d) = %q, %v; want %q", c.describe, c.commits, got, err, c.want)
		}
	}
	for _, bad := range []string{"", "release_1", "vX.Y", "v1.2.3-rc/1", "v1.2.3+meta", "v1.2.3-"} {
		if got, err := MapVersion(bad, 3); err == nil {
			t.Errorf("MapVersion(%q) = %q, want an error", bad, got)
		}
	}
	if _, err := MapVersion("abcdef1", 0); err == nil {
		t.Error("an untagged commit without a count must be refused")
	}
}

// TestVersionOrder checks with dpkg and rpm themselves that a repository's
// history maps to strictly increasing package versions.
func TestVersionOrder(t *testing.T) {
	history := []struct {
		describe string
		commits  int
	}{
		{"c60fc7f", 1}, {"61da3e9", 2}, {"8dd5356", 9}, {"ffff000", 10}, {"0000aaa", 11}, {"1234567", 100},
		{"v0.1.0-rc.1", 120}, {"v0.1.0-rc.1-1-gaaaa111", 121}, {"v0.1.0-rc.2", 125},
		{"v0.1.0", 130}, {"v0.1.0-1-gbbbb222", 131}, {"v0.1.0-10-g0000333", 140},
		{"v0.1.1", 150}, {"v0.2.0-rc.1", 160}, {"v0.2.0", 170}, {"v1.0.0", 200},
	}
	var versions []string
	for _, h := range history {
		v, err := MapVersion(h.describe, h.commits)
		if err != nil {
			t.Fatal(err)
		}
		versions = append(versions, v)
	}
	dpkg, dpkgErr := exec.LookPath("dpkg")
	rpmBin, rpmErr := exec.LookPath("rpm")
	if dpkgErr != nil && rpmErr != nil {
		testkit.Unavailable(t, "neither dpkg nor rpm here")
	}
	for i := 1; i < len(versions); i++ {
		a, b := versions[i-1], versions[i]
		if dpkgErr == nil {
			// With the Debian revision the packages carry.
			if err := exec.Command(dpkg, "--compare-versions", a+"-1", "lt", b+"-1").Run(); err != nil {
				t.Errorf("dpkg: %s is not lower than %s", a, b)
			}
		}
		if rpmErr == nil {
			out, err := exec.Command(rpmBin, "--eval", `%{lua: print(rpm.vercmp("`+a+`", "`+b+`"))}`).Output()
			if err != nil {
				t.Fatalf("rpm vercmp: %v", err)
			}
			if got := strings.TrimSpace(string(out)); got != "-1" {
				t.Errorf("rpm: vercmp(%s, %s) = %s, want -1", a, b, got)
			}
		}
	}
}

func TestReadGit(t *testing.T) {
	if _, err := exec.LookPath("git"); err != nil {
		testkit.Unavailable(t, "no git")
	}
	root, err := FindRoot(".")
	if err != nil {
		t.Fatal(err)
	}
	g, err := ReadGit(context.Background(), root)
	if err != nil {
		t.Skipf("not a git checkout: %v", err)
	}
	v, err := MapVersion(g.Describe, g.Commits)
	if err != nil {
		t.Fatalf("this repository's describe %q: %v", g.Describe, err)
	}
	if g.CommitTime.IsZero() || g.Commits < 1 {
		t.Fatalf("git info %+v", g)
	}
	t.Logf("this tree: git describe %q, %d commits -> package version %s", g.Describe, g.Commits, v)
}

// TestMakefileBuildTags: `make build` builds with the tags the packages and
// the e2e harness use.
func TestMakefileBuildTags(t *testing.T) {
	b, err := os.ReadFile("../Makefile")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), "\nTAGS := "+BuildTags+"\n") || !strings.Contains(string(b), "-tags $(TAGS)") {
		t.Errorf("the Makefile does not build with TAGS := %s", BuildTags)
	}
}
