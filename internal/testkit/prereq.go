package testkit

import (
	"fmt"
	"os"
	"os/exec"
	"testing"
)

// CI reports whether the tests run in CI (CI=true), where every
// prerequisite must be there.
func CI() bool { return os.Getenv("CI") == "true" }

// Unavailable skips t because a prerequisite is missing, or fails it when
// CI=true: in CI a missing prerequisite is a failure, not a skip.
func Unavailable(t testing.TB, format string, args ...any) {
	t.Helper()
	why := fmt.Sprintf(format, args...)
	if CI() {
		t.Fatalf("%s (CI=true, so this fails)", why)
	}
	t.Skip(why)
}

// RequireCommand returns the path of cmd, or calls Unavailable when it is
// not on $PATH; hint (may be empty) says where it comes from, e.g. "Debian
// package rpm".
func RequireCommand(t testing.TB, cmd, hint string) string {
	t.Helper()
	p, err := exec.LookPath(cmd)
	if err != nil {
		if hint != "" {
			Unavailable(t, "%s (%s) is missing", cmd, hint)
		}
		Unavailable(t, "%s is missing", cmd)
	}
	return p
}

// RequireRoot calls Unavailable unless the test runs as root; why says
// what needs it.
func RequireRoot(t testing.TB, why string) {
	t.Helper()
	if os.Geteuid() != 0 {
		Unavailable(t, "needs root (%s)", why)
	}
}
