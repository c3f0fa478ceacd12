package runner

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/drover/drover/internal/testkit"
	"github.com/drover/drover/manifest"
	agentpb "github.com/drover/drover/proto"
)

// retries is a policy for the runner tests. The runner does not validate
// (the server did), so the tests may use delays below the 1 s minimum.
func retries(attempts int, delay time.Duration, backoff float64) *manifest.Retries {
	return &manifest.Retries{Attempts: attempts, Delay: manifest.Duration(delay), Backoff: backoff}
}

func marker(n, of int, after time.Duration, prev string) string {
	return fmt.Sprintf(MarkerFormat, n, of, manifest.Duration(after), prev)
}

// inOrder fails unless every part appears in log, in this order.
func inOrder(t *testing.T, log string, parts ...string) {
	t.Helper()
	rest := log
	for _, p := range parts {
		i := strings.Index(rest, p)
		if i < 0 {
			t.Fatalf("%q missing or out of order in the log:\n%s", p, log)
		}
		rest = rest[i+len(p):]
	}
}

// A script failing twice then succeeding: one run record, three attempts
// started (RunStarted 1, 2, 3), status succeeded, every attempt's output and
// the two marker lines in its log in order, the final attempt's
// $DROVER_OUTPUT shipped, and the run's duration covering the delays.
func TestRetriesFailTwiceThenSucceed(t *testing.T) {
	f := newPipe(t, manifest.Spec{
		Script: `echo "attempt $DROVER_ATTEMPT of $DROVER_MAX_ATTEMPTS says hello"
echo "attempt=$DROVER_ATTEMPT" >> "$DROVER_OUTPUT"
echo "drover_test_attempt $DROVER_ATTEMPT" >> "$DROVER_METRICS"
[ "$DROVER_ATTEMPT" -ge 3 ] || { echo "attempt $DROVER_ATTEMPT failing" >&2; exit 7; }
`,
		Retries: retries(3, 200*time.Millisecond, 2),
	})
	res := f.run(f.opts())
	r := only(t, f)
	if res.ExitCode != 0 || r.finished.Status != agentpb.RunStatus_RUN_STATUS_SUCCEEDED || r.finished.Attempts != 3 ||
		r.finished.ExitCode != 0 || r.finished.Reason != "" || r.finished.Error != "" || len(r.attempts) != 3 {
		t.Fatalf("exit %d, %d RunStarted, finished %v", res.ExitCode, len(r.attempts), r.finished)
	}
	inOrder(t, r.log(),
		"attempt 1 of 3 says hello\n", "attempt 1 failing\n", marker(2, 3, 200*time.Millisecond, "exit 7"),
		"attempt 2 of 3 says hello\n", "attempt 2 failing\n", marker(3, 3, 400*time.Millisecond, "exit 7"),
		"attempt 3 of 3 says hello\n")
	if strings.Count(r.log(), "--- drover: attempt") != 2 || strings.Contains(r.log(), "attempt 3 failing") {
		t.Fatalf("log:\n%s", r.log())
	}
	// The markers are runner lines (stream system), on the runner's stderr
	// (the journal) too.
	if sys := r.text(agentpb.LogStream_LOG_STREAM_SYSTEM); sys != marker(2, 3, 200*time.Millisecond, "exit 7")+marker(3, 3, 400*time.Millisecond, "exit 7") {
		t.Fatalf("system stream %q", sys)
	}
	if !strings.Contains(f.stderr.String(), marker(3, 3, 400*time.Millisecond, "exit 7")) {
		t.Fatalf("stderr %q", f.stderr.String())
	}
	if r.finished.Output != "attempt=3\n" || len(r.finished.Metrics) != 1 || r.finished.Metrics[0].Value != 3 {
		t.Fatalf("telemetry: output %q, metrics %v", r.finished.Output, r.finished.Metrics)
	}
	if d := time.Duration(r.finished.DurationMs) * time.Millisecond; d < 600*time.Millisecond {
		t.Fatalf("duration %s does not cover the delays", d)
	}
}

// A script that always fails with attempts 3: failed after the third, with
// the third's exit code, and the waits between attempts (from the end of
// one to the start of the next, as the script saw them) within 10% of
// delay × backoff^(n-2).
func TestRetriesAlwaysFailingBacksOff(t *testing.T) {
	f := newPipe(t, manifest.Spec{Script: testkit.AttemptTimingScript, Retries: retries(3, time.Second, 2)})
	res := f.run(f.opts())
	r := only(t, f)
	if res.ExitCode != 3 || r.finished.Status != agentpb.RunStatus_RUN_STATUS_FAILED || r.finished.Attempts != 3 ||
		r.finished.ExitCode != 3 || r.finished.Reason != "exit 3" {
		t.Fatalf("exit %d, finished %v", res.ExitCode, r.finished)
	}
	starts, ends := testkit.AttemptTimes(r.log())
	if len(starts) != 3 || len(ends) != 3 {
		t.Fatalf("log:\n%s", r.log())
	}
	for n, want := range map[int]time.Duration{2: time.Second, 3: 2 * time.Second} {
		got := starts[n].Sub(ends[n-1])
		if got < want || got > want+want/10 {
			t.Errorf("wait before attempt %d: %s, want %s within 10%%", n, got, want)
		}
	}
}

// A cancel during the delay ends the run canceled at once: no further
// attempt, the attempt's output never appears.
func TestRetriesCancelDuringDelay(t *testing.T) {
	ran := filepath.Join(t.TempDir(), "ran")
	f := newPipe(t, manifest.Spec{
		Script:  "echo \"attempt $DROVER_ATTEMPT ran\"\necho $DROVER_ATTEMPT >> " + ran + "\nexit 1\n",
		Retries: retries(3, 2*time.Second, 2),
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		for !strings.Contains(f.stderr.String(), marker(3, 3, 4*time.Second, "exit 1")) {
			time.Sleep(10 * time.Millisecond)
		}
		cancel()
	}()
	start := time.Now()
	res, err := Run(ctx, f.opts())
	if err != nil {
		t.Fatal(err)
	}
	if el := time.Since(start); el > 4*time.Second {
		t.Fatalf("the cancel during the 4 s delay took until %s", el)
	}
	r := only(t, f)
	if r.finished.Status != agentpb.RunStatus_RUN_STATUS_CANCELED || r.finished.Attempts != 2 || r.finished.Reason != "canceled" ||
		!strings.Contains(r.finished.Error, "canceled during the delay before attempt 3 of 3 (attempt 2: exit 1)") || res.ExitCode != 128+15 {
		t.Fatalf("exit %d, finished %v", res.ExitCode, r.finished)
	}
	time.Sleep(500 * time.Millisecond)
	if b, _ := os.ReadFile(ran); string(b) != "1\n2\n" {
		t.Fatalf("attempts that ran: %q", b)
	}
	if strings.Contains(r.log(), "attempt 3 ran") || !strings.Contains(r.log(), "no further attempt") {
		t.Fatalf("log:\n%s", r.log())
	}
}

// timeout bounds each attempt: a timed-out attempt is retried, and a run
// whose final attempt timed out is timed_out.
func TestRetriesTimeoutPerAttempt(t *testing.T) {
	f := newPipe(t, manifest.Spec{
		Script:  "echo \"attempt $DROVER_ATTEMPT\"\n[ \"$DROVER_ATTEMPT\" -ge 2 ] && exit 0\nsleep 100\n",
		Timeout: manifest.Duration(time.Second),
		Retries: retries(3, 200*time.Millisecond, 2),
	})
	res := f.run(f.opts())
	r := only(t, f)
	if res.ExitCode != 0 || r.finished.Status != agentpb.RunStatus_RUN_STATUS_SUCCEEDED || r.finished.Attempts != 2 {
		t.Fatalf("exit %d, finished %v", res.ExitCode, r.finished)
	}
	inOrder(t, r.log(), "attempt 1\n", "timed out after 1s", marker(2, 3, 200*time.Millisecond, "timeout"), "attempt 2\n")

	f = newPipe(t, manifest.Spec{Script: "sleep 100\n", Timeout: manifest.Duration(time.Second), Retries: retries(2, 200*time.Millisecond, 2)})
	start := time.Now()
	res = f.run(f.opts())
	r = only(t, f)
	if res.ExitCode != ExitTimedOut || r.finished.Status != agentpb.RunStatus_RUN_STATUS_TIMED_OUT || r.finished.Attempts != 2 || r.finished.Reason != "timeout" {
		t.Fatalf("exit %d, finished %v", res.ExitCode, r.finished)
	}
	if el := time.Since(start); el < 2200*time.Millisecond || el > 8*time.Second {
		t.Fatalf("two 1 s attempts and a delay took %s", el)
	}
}

// The payload's digest is checked before every attempt: an attempt that
// changed its own payload is not followed by one running the changed bytes.
func TestRetriesPayloadCheckedBeforeEachAttempt(t *testing.T) {
	ran := filepath.Join(t.TempDir(), "ran")
	f := newPipe(t, manifest.Spec{
		Script:  "echo $DROVER_ATTEMPT >> " + ran + "\necho '# edited' >> \"$0\"\nexit 1\n",
		Retries: retries(3, 100*time.Millisecond, 1),
	})
	res := f.run(f.opts())
	r := only(t, f)
	if res.ExitCode != ExitRunnerFailed || r.finished.Status != agentpb.RunStatus_RUN_STATUS_FAILED || r.finished.Reason != ReasonPayloadMismatch ||
		r.finished.Attempts != 2 || len(r.attempts) != 1 {
		t.Fatalf("exit %d, finished %v", res.ExitCode, r.finished)
	}
	if b, _ := os.ReadFile(ran); string(b) != "1\n" || !strings.Contains(r.log(), "attempt 2 of 3 not run") {
		t.Fatalf("ran %q, log:\n%s", b, r.log())
	}
}

// Without retries nothing changes: one attempt, no marker, DROVER_ATTEMPT=1;
// a success on the first attempt of a pipe with retries is one attempt.
func TestRetriesNoneOrFirstAttemptSucceeds(t *testing.T) {
	for _, rt := range []*manifest.Retries{nil, retries(5, time.Second, 2)} {
		f := newPipe(t, manifest.Spec{Script: "echo \"$DROVER_ATTEMPT/$DROVER_MAX_ATTEMPTS\"\n", Retries: rt})
		f.run(f.opts())
		r := only(t, f)
		s := manifest.Spec{Retries: rt}
		want := "1/" + strconv.Itoa(s.AttemptsOrOne())
		if r.finished.Status != agentpb.RunStatus_RUN_STATUS_SUCCEEDED || r.finished.Attempts != 1 || r.started.Attempt != 1 ||
			r.log() != want+"\n" {
			t.Fatalf("retries %+v: finished %v, log %q", rt, r.finished, r.log())
		}
	}
	// A failure without retries is final.
	f := newPipe(t, manifest.Spec{Script: "exit 4\n"})
	f.run(f.opts())
	if r := only(t, f); r.finished.Attempts != 1 || r.finished.ExitCode != 4 || strings.Contains(r.log(), "--- drover") {
		t.Fatalf("finished %v, log %q", r.finished, r.log())
	}
}

// The marker writes the delay as the spec does.
func TestRetriesMarkerLine(t *testing.T) {
	if got := fmt.Sprintf(MarkerFormat, 3, 5, manifest.Duration(90*time.Second), "exit 1"); got != "--- drover: attempt 3 of 5 after 1m30s (previous: exit 1) ---\n" {
		t.Fatalf("marker %q", got)
	}
	if got := fmt.Sprintf(MarkerFormat, 2, 3, manifest.Duration(time.Minute), "timeout"); got != "--- drover: attempt 2 of 3 after 1m (previous: timeout) ---\n" {
		t.Fatalf("marker %q", got)
	}
}
