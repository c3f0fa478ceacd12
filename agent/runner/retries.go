package runner

import (
	"context"
	"fmt"
	"time"

	"github.com/drover/drover/internal/tick"
	"github.com/drover/drover/manifest"
	agentpb "github.com/drover/drover/proto"
)

// Retries (docs/design.md, "Retries"): a pipe with retries.attempts N runs
// its payload up to N times inside one run, one run id and one run record.
//
//   - An attempt that failed or timed out (timeout bounds each attempt) is
//     followed, unless it was the last, by a marker line in the run's log
//     (MarkerFormat, stream system, after the attempt's output) and a wait
//     of Retries.DelayBefore(n); then the payload's digest is checked again
//     and attempt n starts with $DROVER_ATTEMPT=n. A RunStarted with
//     attempt n goes to the spool as it starts, so the server shows the
//     attempt of a run that is still going.
//   - A cancel (CancelRun, systemctl stop, the cron backend's Cancel) ends
//     the run canceled: during an attempt as without retries, during a delay
//     at once, with no further attempt.
//   - The final attempt alone decides the run's status, exit code, reason,
//     output and metrics ($DROVER_METRICS and $DROVER_OUTPUT are fresh
//     files for every attempt; those of the final one ship). A payload that
//     no longer matches its digest is refused (failed, payload_mismatch) and
//     ends the run: retrying cannot make those bytes trustworthy.
//   - RunFinished.attempts is the number of attempts made (a refused one
//     counts); duration is the whole run's, delays included, once there
//     was more than one attempt.

// MarkerFormat is the line written into a run's log before each attempt
// after the first: the attempt, the attempts in all, the delay before it
// (as the spec writes durations: 30s, 1m, 1h30m) and how the previous attempt ended (its reason, e.g. "exit 1",
// "timeout").
const MarkerFormat = "--- drover: attempt %d of %d after %s (previous: %s) ---\n"

// attempts makes the attempts of one run and fills rr with the outcome of
// the final one.
func (r *runner) attempts(ctx context.Context, p *plannedRun, rr *RunResult, c *chunker) {
	total := r.spec.AttemptsOrOne()
	began := time.Now()
	defer func() {
		if rr.Attempts > 1 {
			rr.Duration = time.Since(began)
		}
	}()
	for n := 1; ; n++ {
		p.attempt = n
		var ar RunResult
		ar.ExitCode = -1
		r.runAttempt(ctx, p, &ar, c)
		rr.Attempts = n
		rr.Status, rr.ExitCode, rr.Signal, rr.Error, rr.Reason = ar.Status, ar.ExitCode, ar.Signal, ar.Error, ar.Reason
		rr.Duration, rr.Output, rr.Metrics, rr.TelemetryNotes = ar.Duration, ar.Output, ar.Metrics, ar.TelemetryNotes
		if n >= total || ctx.Err() != nil || !retryable(ar.Status) {
			return
		}
		previous := ar.Reason
		if previous == "" {
			previous = runReason(ar)
		}
		delay := r.spec.Retries.DelayBefore(n + 1)
		msg := fmt.Sprintf(MarkerFormat, n+1, total, manifest.Duration(delay), previous)
		_, _ = r.opts.Stderr.Write([]byte(msg))
		c.in <- piece{stream: agentpb.LogStream_LOG_STREAM_SYSTEM, data: []byte(msg)}
		if !tick.Sleep(ctx, delay) {
			rr.Status, rr.ExitCode, rr.Signal, rr.Reason = agentpb.RunStatus_RUN_STATUS_CANCELED, -1, "", "canceled"
			rr.Error = fmt.Sprintf("canceled during the delay before attempt %d of %d (attempt %d: %s)", n+1, total, n, previous)
			r.note(c, "%s; no further attempt", rr.Error)
			return
		}
		if err := VerifyPayload(r.pdir, r.pipe.Payload.Digest); err != nil {
			rr.Attempts = n + 1
			rr.Status, rr.ExitCode, rr.Signal = agentpb.RunStatus_RUN_STATUS_FAILED, ExitRunnerFailed, ""
			rr.Error, rr.Reason = err.Error(), ReasonPayloadMismatch
			rr.Output, rr.Metrics, rr.TelemetryNotes = "", nil, nil
			r.note(c, "attempt %d of %d not run: %s", n+1, total, rr.Error)
			return
		}
		r.recordAttempt(p, rr, n+1)
	}
}

// retryable reports whether an attempt that ended so is followed by
// another (when any is left).
func retryable(st agentpb.RunStatus) bool {
	return st == agentpb.RunStatus_RUN_STATUS_FAILED || st == agentpb.RunStatus_RUN_STATUS_TIMED_OUT
}

// recordAttempt writes the RunStarted of attempt n of the run (the run's
// own start time: only the attempt differs).
func (r *runner) recordAttempt(p *plannedRun, rr *RunResult, n int) {
	_ = r.record(&agentpb.AgentMessage{Body: &agentpb.AgentMessage_RunStarted{RunStarted: &agentpb.RunStarted{
		RunId: p.runID, Pipe: r.opts.Pipe, PipeVersion: r.pipeVersion(), Trigger: p.trigger,
		StartedAt: ts(rr.StartedAt), ScheduledAt: ts(p.scheduledAt), RequestId: p.requestID,
		Attempt: uint32(n),
	}}}, false)
}
