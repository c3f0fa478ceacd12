package e2e

import (
	"fmt"
	"github.com/drover/drover/api"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/drover/drover/internal/testkit"
	"github.com/drover/drover/units"
)

// offlineLines is how many lines each run prints: about 45 KB, so that
// every run ships several log chunks (16 KiB each).
const offlineLines = 700

func offlineLog(n int) string {
	var b strings.Builder
	for i := 1; i <= offlineLines; i++ {
		fmt.Fprintf(&b, "run %d line %04d ................................................\n", n, i)
	}
	return b.String()
}

// TestOfflineRunsArriveExactlyOnce stops the server process while 105 runs
// happen on the host (`systemctl --user start`, trigger manual), restarts
// it on the same addresses, and checks that every run and every log chunk
// arrives exactly once and in order: 110 distinct run ids, each run's
// number (counted by the script itself) exactly once, chunk seqs gap-free,
// the log byte for byte, and the server's arrival order the runs' order.
func TestOfflineRunsArriveExactlyOnce(t *testing.T) {
	mgr, srv, tags := userScenario(t, "offline")
	ag, id := enrolledAgent(t, srv, agentOpts{name: "agent-offline", backend: "systemd", mgr: &mgr, tags: tags})

	counter := filepath.Join(t.TempDir(), "counter")
	script := fmt.Sprintf("n=$(( $(cat %s 2>/dev/null || echo 0) + 1 ))\necho $n > %s\nseq -f \"run $n line %%04g ................................................\" 1 %d\n",
		counter, counter, offlineLines)
	srv.putPipe("off", pipeSpec{Schedule: far, Script: script, Targets: byTags(tags)})
	ag.waitPipes(60*time.Second, "off")
	svc := units.ServiceName("off")

	// systemd refuses a sixth start of a unit within 10 s (the default
	// StartLimitBurst=5 per StartLimitIntervalSec=10s; the rendered units
	// do not change it): reset-failed resets that counter, as an operator
	// starting a pipe by hand in a loop would have to.
	start := func() {
		mgr.Systemctl(t, "reset-failed", svc)
		mgr.Systemctl(t, "start", svc)
	}
	const online, offline = 5, 105
	for range online {
		start()
	}
	testkit.WaitFor(t, 60*time.Second, "the online runs on the server", func() bool {
		return countStatus(srv.runs("off", id), "succeeded") == online
	})

	srv.stop()
	testkit.WaitFor(t, 30*time.Second, "the agent to notice the server is gone", func() bool {
		st := ag.status()
		return st != nil && !st.StreamConnected
	})
	t0 := time.Now()
	for range offline {
		start()
	}
	took := time.Since(t0)
	testkit.WaitFor(t, 30*time.Second, "every offline run in the outbox", func() bool {
		// RunStarted, RunFinished and the chunks of each run.
		st := ag.status()
		return st != nil && st.OutboxRecords >= 3*offline
	})
	queued := ag.status()
	t.Logf("%d runs while the server was down (%s, %.0f ms a run); outbox %d records, %d bytes",
		offline, took.Round(time.Millisecond), float64(took.Milliseconds())/offline, queued.OutboxRecords, queued.OutboxBytes)

	srv.start(srv.https, srv.grpc)
	t1 := time.Now()
	var runs []api.Run
	testkit.WaitFor(t, 120*time.Second, "every run on the server", func() bool {
		runs = srv.runs("off", id)
		return countStatus(runs, "succeeded") == online+offline
	})
	testkit.WaitFor(t, 30*time.Second, "an empty outbox", func() bool {
		st := ag.status()
		return st != nil && st.OutboxRecords == 0
	})
	t.Logf("the backlog reached the server %s after its restart", time.Since(t1).Round(time.Millisecond))

	if len(runs) != online+offline {
		t.Fatalf("%d runs on the server, want %d", len(runs), online+offline)
	}
	ids := map[string]bool{}
	byNum := map[int]api.Run{}
	chunks := 0
	for _, r := range runs {
		if ids[r.ID] {
			t.Fatalf("run %s twice", r.ID)
		}
		ids[r.ID] = true
		if r.Trigger != "manual" || r.Status != "succeeded" || r.LogTruncated {
			t.Fatalf("run %+v", r)
		}
		logs := srv.logs(r.ID)
		var text strings.Builder
		for i, c := range logs.Chunks {
			if c.Seq != uint64(i) {
				t.Fatalf("run %s: chunk %d has seq %d (a gap or a duplicate)", r.ID, i, c.Seq)
			}
			if i > 0 && c.At.Before(logs.Chunks[i-1].At) {
				t.Fatalf("run %s: chunk %d is older than chunk %d", r.ID, i, i-1)
			}
			text.WriteString(string(c.Data))
		}
		if uint64(len(logs.Chunks)) != r.LogChunks || len(logs.Chunks) < 3 {
			t.Fatalf("run %s: %d chunks stored, the run says %d", r.ID, len(logs.Chunks), r.LogChunks)
		}
		chunks += len(logs.Chunks)
		first, _, _ := strings.Cut(text.String(), " line ")
		n, err := strconv.Atoi(strings.TrimPrefix(first, "run "))
		if err != nil {
			t.Fatalf("run %s: log starts %.40q", r.ID, text.String())
		}
		if _, dup := byNum[n]; dup {
			t.Fatalf("run number %d reported twice", n)
		}
		if text.String() != offlineLog(n) {
			t.Fatalf("run %s (number %d): the log differs from what the script printed (%d bytes, want %d)", r.ID, n, text.Len(), len(offlineLog(n)))
		}
		byNum[n] = r
	}
	nums := make([]int, 0, len(byNum))
	for n := range byNum {
		nums = append(nums, n)
	}
	sort.Ints(nums)
	for i, n := range nums {
		if n != i+1 {
			t.Fatalf("run numbers %v: missing %d", nums, i+1)
		}
		if i > 0 {
			prev, cur := byNum[n-1], byNum[n]
			if cur.StartedAt.Before(*prev.StartedAt) || cur.CreatedAt.Before(prev.CreatedAt) {
				t.Fatalf("run %d arrived before run %d (created %s, %s)", n, n-1, cur.CreatedAt, prev.CreatedAt)
			}
		}
	}
	t.Logf("%d runs, %d log chunks, each exactly once, in order", len(runs), chunks)
}

func countStatus(runs []api.Run, status string) int {
	n := 0
	for _, r := range runs {
		if r.Status == status {
			n++
		}
	}
	return n
}
