package agent

import (
	"github.com/drover/drover/internal/testkit"
	"slices"
	"sync"
	"testing"
	"time"
)

// TestNotify: the daemon tells systemd READY=1 once it listens, pings the
// watchdog while its loops turn, and says STOPPING=1 on the way out.
func TestNotify(t *testing.T) {
	var mu sync.Mutex
	var states []string
	notify := func(s string) {
		mu.Lock()
		states = append(states, s)
		mu.Unlock()
	}
	count := func(s string) int {
		mu.Lock()
		defer mu.Unlock()
		n := 0
		for _, x := range states {
			if x == s {
				n++
			}
		}
		return n
	}
	cfg := testConfig(t, nil)
	ta := startAgent(t, cfg, nil, WithNotify(notify, 200*time.Millisecond))
	testkit.WaitFor(t, 5*time.Second, "READY=1", func() bool { return count("READY=1") == 1 })
	testkit.WaitFor(t, 5*time.Second, "watchdog pings", func() bool { return count("WATCHDOG=1") >= 3 })
	ta.stop()
	mu.Lock()
	defer mu.Unlock()
	if i := slices.Index(states, "STOPPING=1"); i < 0 {
		t.Fatalf("no STOPPING=1 in %v", states)
	}
}
