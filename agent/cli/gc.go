package cli

import (
	"os"
	"runtime/debug"
)

// daemonGCPercent is the GOGC the daemon runs with when its environment does
// not set GOGC (an operator's GOGC, e.g. Environment=GOGC=100 in a drop-in,
// wins: the runtime has already applied it).
//
// Why: the idle daemon's live heap is small (~1.7–2 MB with 100 pipes), so at
// the default GOGC=100 the runtime's 4 MB minimum heap goal, not the live
// data, decides how much heap stays resident (the scavenger keeps ~110% of
// the goal, and every heartbeat allocates enough to fill it again, so a
// one-off debug.FreeOSMemory is undone within seconds). GOGC=50 halves that
// floor; measured with BenchmarkAgentIdleRSS100 (README, Performance) the
// idle heap goal drops from ~4.2–4.5 MB to ~2.7 MB and RssAnon from 8.3 to
// 6.8 MB. The price is more GC cycles per byte allocated: idle CPU went
// from 2.4% to 3.4% of a core there, because the idle daemon allocates
// ~100 MB per 30 s (D-Bus GetAllProperties for every unit on each
// heartbeat); with that churn gone the difference would be negligible.
// Unlike a fixed memory limit, the goal stays proportional to the live heap
// at any manifest size. Only the daemon is tuned: `run` and the local tools
// are short-lived.
const daemonGCPercent = 50

// tuneDaemonGC sets the daemon's GC target (see daemonGCPercent).
func tuneDaemonGC() {
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(daemonGCPercent)
	}
}
