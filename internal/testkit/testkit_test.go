package testkit

import (
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

func TestEventually(t *testing.T) {
	var n atomic.Int32
	if !Eventually(5*time.Second, func() bool { return n.Add(1) == 3 }) {
		t.Fatal("a condition holding on the third check did not hold")
	}
	if n.Load() != 3 {
		t.Fatalf("checked %d times, want 3", n.Load())
	}
	start := time.Now()
	n.Store(0)
	if Eventually(50*time.Millisecond, func() bool { n.Add(1); return false }) {
		t.Fatal("a condition that never holds held")
	}
	if time.Since(start) < 50*time.Millisecond || n.Load() < 2 {
		t.Fatalf("gave up after %s and %d checks", time.Since(start), n.Load())
	}
}

func TestWaitForHolds(t *testing.T) {
	done := time.Now().Add(30 * time.Millisecond)
	WaitFor(t, 5*time.Second, "a deadline", func() bool { return time.Now().After(done) })
}

func TestUnavailableOutsideCI(t *testing.T) {
	t.Setenv("CI", "")
	skipped := false
	t.Run("skip", func(t *testing.T) {
		defer func() { skipped = t.Skipped() }()
		Unavailable(t, "no %s", "thing")
	})
	if !skipped {
		t.Fatal("a missing prerequisite did not skip outside CI")
	}
}

func TestShortTempDirAndBuffer(t *testing.T) {
	d := ShortTempDir(t, "tk")
	if !strings.HasPrefix(filepath.Base(d), "tk") || len(d) > 40 {
		t.Fatalf("dir %q", d)
	}
	if fi, err := os.Stat(d); err != nil || !fi.IsDir() {
		t.Fatalf("stat %s: %v", d, err)
	}
	var b Buffer
	b.Write([]byte("a"))
	b.Write([]byte("b"))
	if b.String() != "ab" {
		t.Fatalf("buffer %q", b.String())
	}
	var c Clock
	before := c.Now()
	c.Advance(time.Hour)
	if c.Now().Sub(before) < time.Hour {
		t.Fatal("Advance did not move the clock")
	}
	if p := FreePort(t); p <= 0 {
		t.Fatalf("port %d", p)
	}
	if root, err := ModuleRoot(); err != nil {
		t.Fatal(err)
	} else if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatal(err)
	}
}

// TestCgroups: the mounted hierarchies are listed, and a cgroup tree
// (here a plain directory tree: the walk is the same) is removed deepest
// first.
func TestCgroups(t *testing.T) {
	ms, err := CgroupMounts()
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range ms {
		if m.Path == "" || m.Root == "" {
			t.Errorf("mount %+v", m)
		}
	}
	d := filepath.Join(t.TempDir(), "cg")
	if err := os.MkdirAll(filepath.Join(d, "a", "b"), 0o755); err != nil {
		t.Fatal(err)
	}
	KillCgroups(time.Millisecond, d) // no cgroup.procs: nothing to kill
	RemoveCgroups(d)
	if _, err := os.Stat(d); !os.IsNotExist(err) {
		t.Fatalf("tree left: %v", err)
	}
}

func TestAttemptTimes(t *testing.T) {
	log := "attempt 1 start 1000\nattempt 1 end 2000\n--- drover: attempt 2 of 2 after 1s (previous: exit 3) ---\n" +
		"attempt 2 start 3000\nattempt 2 says hello\nattempt 2 end 4000\n"
	starts, ends := AttemptTimes(log)
	want := func(m map[int]time.Time, n int, ns int64) {
		t.Helper()
		if got, ok := m[n]; !ok || !got.Equal(time.Unix(0, ns)) {
			t.Errorf("attempt %d: %v (present %v), want %d ns", n, got, ok, ns)
		}
	}
	want(starts, 1, 1000)
	want(ends, 1, 2000)
	want(starts, 2, 3000)
	want(ends, 2, 4000)
	if len(starts) != 2 || len(ends) != 2 {
		t.Fatalf("starts %v ends %v, want two each", starts, ends)
	}
}
