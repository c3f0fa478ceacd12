package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/drover/drover/agent/runner"
	"github.com/drover/drover/api"
	"github.com/drover/drover/internal/testkit"
)

// retrySpec is a pipe with a retries block.
type retrySpec struct {
	pipeSpec
	Retries map[string]any `json:"retries"`
}

func (s *serverProc) putRetryPipe(name string, spec retrySpec) {
	s.t.Helper()
	var out api.PutPipeResponse
	s.api("PUT", "/api/v1/pipes/"+name, map[string]any{"spec": spec}, &out)
}

// retryMarker is the runner's line before attempt n of a run's log (its
// exact text is pinned by the runner's tests).
func retryMarker(n, of int, after, prev string) string {
	return fmt.Sprintf(runner.MarkerFormat, n, of, after, prev)
}

// TestRetriesBothBackends proves retries on a systemd user-manager agent and
// a cron-backend agent of one real server, with the same pipes run through
// RunNow on each:
//
//   - a script failing twice then succeeding is one run on the server with
//     attempts 3 and status succeeded, its log holding all three attempts'
//     output and the two marker lines; no run.failed event is raised for it;
//   - a script always failing with attempts 3 (delay 2 s, backoff 2) fails
//     after the third attempt, the waits between attempts (as the script
//     saw them) within 10% of 2 s and 4 s, and exactly one run.failed event
//     per run;
//   - an attempt that times out is retried;
//   - during the delay before the third attempt the server shows the run
//     running with attempts 2; a cancel through the API then ends it
//     canceled at once, and the third attempt never runs;
//   - droverctl describe run and get runs -o wide show the attempts.
func TestRetriesBothBackends(t *testing.T) {
	mgr, srv, tags := userScenario(t, "retries")
	sys, crn, sysID, cronID := systemdAndCronAgents(t, srv, &mgr, tags)

	specs := map[string]retrySpec{
		"r-flaky": {pipeSpec{Schedule: far, Script: "echo \"attempt $DROVER_ATTEMPT of $DROVER_MAX_ATTEMPTS ran\"\n[ \"$DROVER_ATTEMPT\" -ge 3 ] || exit 7\n"},
			map[string]any{"attempts": 3, "delay": "1s"}},
		"r-fail": {pipeSpec{Schedule: far, Script: testkit.AttemptTimingScript},
			map[string]any{"attempts": 3, "delay": "2s", "backoff": 2}},
		// The first attempt runs past its timeout, the second succeeds.
		// Three timed-out attempts would outlast a deadline of one timeout
		// plus grace: the cron backend's deadline covers all of them.
		"r-timeout": {pipeSpec{Schedule: far, Timeout: "2s", Script: "echo \"attempt $DROVER_ATTEMPT\"\n[ \"$DROVER_ATTEMPT\" -ge 2 ] && exit 0\nsleep 100\n"},
			map[string]any{"attempts": 2, "delay": "1s"}},
		// Two quick failures, then a long delay before the third attempt.
		"r-cancel": {pipeSpec{Schedule: far, Script: "echo \"attempt $DROVER_ATTEMPT ran\"\nexit 1\n"},
			map[string]any{"attempts": 3, "delay": "3s", "backoff": 10}},
	}
	var names []string
	for name, sp := range specs {
		sp.Targets = byTags(tags)
		srv.putRetryPipe(name, sp)
		names = append(names, name)
	}
	sys.waitPipes(60*time.Second, names...)
	crn.waitPipes(60*time.Second, names...)

	agents := map[string]string{"systemd": sysID, "cron": cronID}
	type started struct{ backend, pipe, request string }
	var runs []started
	for backend, id := range agents {
		for _, pipe := range []string{"r-flaky", "r-fail", "r-timeout"} {
			runs = append(runs, started{backend, pipe, srv.runNow(pipe, id).RequestID})
		}
	}
	final := []string{"succeeded", "failed", "timed_out", "canceled", "skipped"}
	got := map[string]api.Run{} // backend/pipe -> run
	for _, s := range runs {
		r := srv.runOfRequest(s.request, 90*time.Second, final...)
		got[s.backend+"/"+s.pipe] = r
		log := srv.logText(r.ID)
		switch s.pipe {
		case "r-flaky":
			if r.Status != "succeeded" || r.Attempts != 3 || r.ExitCode != 0 || r.Reason != "" {
				t.Fatalf("%s: flaky run %+v", s.backend, r)
			}
			want := []string{"attempt 1 of 3 ran\n", retryMarker(2, 3, "1s", "exit 7"), "attempt 2 of 3 ran\n", retryMarker(3, 3, "2s", "exit 7"), "attempt 3 of 3 ran\n"}
			assertInOrder(t, s.backend+": flaky run's log", log, want...)
			if strings.Count(log, "--- drover: attempt") != 2 {
				t.Fatalf("%s: flaky run's log:\n%s", s.backend, log)
			}
		case "r-fail":
			if r.Status != "failed" || r.Attempts != 3 || r.ExitCode != 3 || r.Reason != "exit 3" {
				t.Fatalf("%s: failing run %+v", s.backend, r)
			}
			assertInOrder(t, s.backend+": failing run's log", log, retryMarker(2, 3, "2s", "exit 3"), retryMarker(3, 3, "4s", "exit 3"))
			starts, ends := testkit.AttemptTimes(log)
			if len(starts) != 3 || len(ends) != 3 {
				t.Fatalf("%s: failing run's log:\n%s", s.backend, log)
			}
			for n, want := range map[int]time.Duration{2: 2 * time.Second, 3: 4 * time.Second} {
				wait := starts[n].Sub(ends[n-1])
				t.Logf("%s: wait before attempt %d: %s (backoff says %s)", s.backend, n, wait, want)
				if wait < want || wait > want+want/10 {
					t.Errorf("%s: wait before attempt %d: %s, want %s within 10%%", s.backend, n, wait, want)
				}
			}
		case "r-timeout":
			if r.Status != "succeeded" || r.Attempts != 2 {
				t.Fatalf("%s: timeout run %+v\n%s", s.backend, r, log)
			}
			assertInOrder(t, s.backend+": timeout run's log", log, "attempt 1\n", "timed out after 2s", retryMarker(2, 2, "1s", "timeout"), "attempt 2\n")
		}
	}

	// Cancel during the delay: the first delay is 3 s, the second 30 s.
	for backend, id := range agents {
		req := srv.runNow("r-cancel", id)
		r := srv.runOfRequest(req.RequestID, 60*time.Second, append(final, "running")...)
		testkit.WaitFor(t, 30*time.Second, backend+": the marker before the third attempt", func() bool {
			return strings.Contains(srv.logText(r.ID), retryMarker(3, 3, "30s", "exit 1"))
		})
		// While it waits, the server shows the run running with its
		// second attempt made (each attempt's RunStarted raises it).
		if live := waitRun(t, srv, "r-cancel", id, r.ID, 30*time.Second, "running"); live.Attempts != 2 {
			t.Fatalf("%s: the run during its delay: %+v", backend, live)
		}
		t0 := time.Now()
		var cancel api.CancelResponse
		srv.api("POST", "/api/v1/runs/"+r.ID+"/cancel", nil, &cancel)
		if !cancel.Sent || cancel.AgentID != id {
			t.Fatalf("%s: cancel %+v", backend, cancel)
		}
		r = srv.runOfRequest(req.RequestID, 60*time.Second, final...)
		if el := time.Since(t0); r.Status != "canceled" || r.Attempts != 2 || el > 15*time.Second {
			t.Fatalf("%s: canceled run after %s: %+v", backend, el, r)
		}
		got[backend+"/r-cancel"] = r
	}
	// The runners have ended (the canceled record is theirs); a moment
	// later the third attempt has still not run on either backend.
	time.Sleep(3 * time.Second)
	for backend := range agents {
		r := got[backend+"/r-cancel"]
		if log := srv.logText(r.ID); strings.Contains(log, "attempt 3 ran") || !strings.Contains(log, "attempt 2 ran") {
			t.Fatalf("%s: canceled run's log:\n%s", backend, log)
		}
		if runs := srv.runs("r-cancel", agents[backend]); len(runs) != 1 {
			t.Fatalf("%s: %d runs of r-cancel", backend, len(runs))
		}
	}

	// Notifications only on the final failure: one run.failed per failing
	// run, none for the run that succeeded on its third attempt.
	events := func(pipe string) []api.Event {
		var l api.EventList
		srv.api("GET", "/api/v1/events?kind=run.failed&pipe="+pipe, nil, &l)
		return l.Events
	}
	testkit.WaitFor(t, 30*time.Second, "run.failed for both failing runs", func() bool { return len(events("r-fail")) >= 2 })
	per := map[string]int{}
	for _, e := range events("r-fail") {
		per[e.RunID]++
	}
	if len(per) != 2 || per[got["systemd/r-fail"].ID] != 1 || per[got["cron/r-fail"].ID] != 1 {
		t.Fatalf("run.failed events of r-fail: %v", per)
	}
	if ev := events("r-flaky"); len(ev) != 0 {
		t.Fatalf("run.failed for a run that succeeded on a retry: %+v", ev)
	}

	// droverctl shows the attempts.
	for backend, id := range agents {
		r := got[backend+"/r-flaky"]
		out := srv.droverctl("describe", "run", r.ID)
		if !strings.Contains(out, "Attempts:") || !strings.Contains(strings.Join(strings.Fields(out), " "), "Attempts: 3") {
			t.Fatalf("%s: describe run:\n%s", backend, out)
		}
		wide := srv.droverctl("get", "runs", "-o", "wide", "--pipe", "r-flaky", "--agent", id)
		if !strings.Contains(wide, "ATTEMPTS") || !rowHas(wide, r.ID, "3") {
			t.Fatalf("%s: get runs -o wide:\n%s", backend, wide)
		}
	}
}

// assertInOrder fails unless every part appears in text, in this order.
func assertInOrder(t *testing.T, what, text string, parts ...string) {
	t.Helper()
	rest := text
	for _, p := range parts {
		i := strings.Index(rest, p)
		if i < 0 {
			t.Fatalf("%s: %q missing or out of order in:\n%s", what, p, text)
		}
		rest = rest[i+len(p):]
	}
}

// rowHas reports whether a table line holds id and the cell value.
func rowHas(table, id, value string) bool {
	for _, line := range strings.Split(table, "\n") {
		if strings.Contains(line, id) {
			for _, f := range strings.Fields(line) {
				if f == value {
					return true
				}
			}
		}
	}
	return false
}
