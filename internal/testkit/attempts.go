package testkit

import (
	"fmt"
	"strings"
	"time"
)

// AttemptTimingScript is a pipe script for retry tests: it prints when its
// attempt starts and ends ("attempt N start|end <unix ns>", N from
// $DROVER_ATTEMPT), then fails with exit 3. AttemptTimes reads the lines back.
const AttemptTimingScript = `echo "attempt $DROVER_ATTEMPT start $(date +%s%N)"
echo "attempt $DROVER_ATTEMPT end $(date +%s%N)"
exit 3
`

// AttemptTimes parses the "attempt N start|end <unix ns>" lines of a run's
// log (AttemptTimingScript's) into the start and end time of each attempt;
// other lines are skipped.
func AttemptTimes(log string) (starts, ends map[int]time.Time) {
	starts, ends = map[int]time.Time{}, map[int]time.Time{}
	for _, line := range strings.Split(log, "\n") {
		var n int
		var what string
		var ns int64
		if _, err := fmt.Sscanf(line, "attempt %d %s %d", &n, &what, &ns); err != nil {
			continue
		}
		switch what {
		case "start":
			starts[n] = time.Unix(0, ns)
		case "end":
			ends[n] = time.Unix(0, ns)
		}
	}
	return starts, ends
}
