package agent

import (
	"context"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/drover/drover/agent/apply"
	"github.com/drover/drover/agent/runner"
	"github.com/drover/drover/manifest"
	agentpb "github.com/drover/drover/proto"
)

// Every run accounted for. Every start of a pipe's service ends in exactly
// one run record: the runner writes its own, and when it could not (systemd
// could not start it: 203/EXEC, 217/USER, ...; it died: SIGKILL, an OOM
// kill; the cron backend could not spawn it), the daemon writes a failed
// RunFinished from the backend's account of the invocation (apply.Ended),
// with run id = the runner's run id for that invocation (systemd's
// InvocationID), written_by "daemon".
//
// Exactly once: before judging an ended invocation the daemon drains the
// spools, so a final record the runner wrote is in the outbox and in the
// pipe's run book (BoltStore.RunBook); only when the book has no final
// record for the run id does the daemon write one, and it marks the
// invocation settled in the same transaction. The server upserts runs by
// run id, so even a runner record arriving later replaces the daemon's
// rather than adding a run.

// WrittenByDaemon is RunFinished.written_by of records the daemon writes.
const WrittenByDaemon = "daemon"

// accountInterval bounds how long an ended invocation waits for a pass when
// no signal came (the heartbeat's status pass also kicks one).
const accountInterval = 30 * time.Second

// WithLoadAvgPath sets the file host load is read from (tests; default
// /proc/loadavg).
func WithLoadAvgPath(p string) Option { return func(a *Agent) { a.loadAvg = p } }

func (a *Agent) kickAccount() {
	select {
	case a.accountCh <- struct{}{}:
	default:
	}
}

// accountLoop settles ended invocations at start, when the backend says a
// service changed state, on every status pass and every accountInterval.
func (a *Agent) accountLoop(ctx context.Context) {
	acc, ok := a.backend.(apply.Accounter)
	if !ok {
		return
	}
	if done, err := a.store.AccountBaseline(); err == nil && !done {
		// First start with run books: what the manager remembers from
		// before was reported by the agent that ran then.
		if ended, err := acc.Ended(ctx); err == nil {
			var keys []string
			for _, e := range ended {
				keys = append(keys, e.Key)
				_ = a.store.Settle(e.Pipe, []string{e.Key})
			}
			acc.Forget(keys...)
		}
	}
	t := time.NewTicker(accountInterval)
	defer t.Stop()
	for {
		a.accountOnce(ctx, acc)
		select {
		case <-ctx.Done():
			return
		case <-acc.Changes():
		case <-a.accountCh:
		case <-t.C:
		}
	}
}

// accountOnce settles every ended invocation the backend reports.
func (a *Agent) accountOnce(ctx context.Context, acc apply.Accounter) {
	a.accountMu.Lock()
	defer a.accountMu.Unlock()
	ended, err := acc.Ended(ctx)
	if err != nil {
		if ctx.Err() == nil {
			a.log.Warn("run accounting: read the backend's account", "err", err)
		}
		return
	}
	if len(ended) == 0 {
		return
	}
	// The runner's own records first: a final record in a spool counts.
	if !a.collectOnce() {
		return // a spool could not be drained: judge nothing this time
	}
	var forget []string
	for _, e := range ended {
		if err := a.settle(e); err != nil {
			a.log.Error("run accounting: settle", "pipe", e.Pipe, "run_id", e.RunID, "err", err)
			continue
		}
		forget = append(forget, e.Key)
	}
	acc.Forget(forget...)
}

// settle writes the records an ended invocation still lacks.
func (a *Agent) settle(e apply.Ended) error {
	book, err := a.store.RunBook(e.Pipe)
	if err != nil {
		return err
	}
	if book.IsAccounted(e.Key) {
		return nil
	}
	var msgs []*agentpb.AgentMessage
	if !book.HasFinal(e.RunID) {
		msgs = append(msgs, a.daemonRecord(e, e.RunID, book.AttemptsOf(e.RunID)))
	}
	if e.OneAtATime {
		// Runs of this pipe begun during the invocation (catch-up runs
		// have their own ids) and never finished died with it.
		for id, at := range book.Open {
			if id == e.RunID || book.HasFinal(id) {
				continue
			}
			if !e.StartedAt.IsZero() && at.Before(e.StartedAt.Add(-time.Second)) {
				continue
			}
			if !e.FinishedAt.IsZero() && at.After(e.FinishedAt) {
				continue
			}
			r := a.daemonRecord(e, id, book.AttemptsOf(id))
			r.GetRunFinished().StartedAt = timestamppb.New(at)
			r.GetRunFinished().Trigger = agentpb.Trigger_TRIGGER_CATCHUP
			r.GetRunFinished().ScheduledAt = nil
			msgs = append(msgs, r)
		}
	}
	if err := a.store.Settle(e.Pipe, []string{e.Key}, msgs...); err != nil {
		return err
	}
	for _, m := range msgs {
		f := m.GetRunFinished()
		a.log.Warn("run ended without the runner's record; recorded from the service manager's account",
			"pipe", f.GetPipe(), "run_id", f.GetRunId(), "status", f.GetStatus().Name(), "reason", f.GetReason())
		a.noteRecord(m)
	}
	if len(msgs) > 0 {
		a.kickOutbox()
	}
	return nil
}

// daemonRecord is the RunFinished the daemon writes for run id of e, which
// had started attempts attempts (retries).
func (a *Agent) daemonRecord(e apply.Ended, runID string, attempts uint32) *agentpb.AgentMessage {
	status := agentpb.RunStatus_RUN_STATUS_FAILED
	reason := e.Reason
	if reason == "" {
		// The service manager says it succeeded, but its record never
		// reached the daemon (a spool the daemon cannot read).
		status, reason = agentpb.RunStatus_RUN_STATUS_SUCCEEDED, "runner record missing"
	}
	if e.Result == "timeout" {
		status = agentpb.RunStatus_RUN_STATUS_TIMED_OUT
	}
	f := &agentpb.RunFinished{
		RunId: runID, Pipe: e.Pipe, PipeVersion: a.pipeVersion(e.Pipe),
		Status: status, ExitCode: int32(e.ExitCode), Signal: e.Signal,
		Error:  "the runner wrote no record of this run; the service manager reports: " + reason,
		Reason: reason, Attempts: attempts, WrittenBy: WrittenByDaemon, RequestId: e.RequestID,
	}
	if status == agentpb.RunStatus_RUN_STATUS_SUCCEEDED {
		f.Error = ""
	}
	if !e.StartedAt.IsZero() {
		f.StartedAt = timestamppb.New(e.StartedAt)
	}
	if !e.FinishedAt.IsZero() {
		f.FinishedAt = timestamppb.New(e.FinishedAt)
		if !e.StartedAt.IsZero() {
			f.DurationMs = e.FinishedAt.Sub(e.StartedAt).Milliseconds()
		}
	}
	f.Trigger = agentpb.Trigger_TRIGGER_MANUAL
	if t, err := agentpb.ParseTrigger(e.Trigger); err == nil {
		f.Trigger = t
	}
	if e.RequestID != "" {
		f.Trigger = agentpb.Trigger_TRIGGER_API
	}
	at := e.ScheduledAt
	if at.IsZero() && !e.TriggeredAt.IsZero() {
		if spec := a.pipeSpec(e.Pipe); spec != nil {
			var late bool
			at, late = runner.ScheduledFor(spec, e.TriggeredAt)
			if late {
				f.Trigger = agentpb.Trigger_TRIGGER_CATCHUP
			}
		}
	}
	if !at.IsZero() && (f.Trigger == agentpb.Trigger_TRIGGER_SCHEDULE || f.Trigger == agentpb.Trigger_TRIGGER_CATCHUP) {
		f.ScheduledAt = timestamppb.New(at)
	}
	return &agentpb.AgentMessage{Body: &agentpb.AgentMessage_RunFinished{RunFinished: f}}
}

// pipeSpec is the normalised spec of pipe in the manifest in force, or nil.
func (a *Agent) pipeSpec(pipe string) *manifest.Spec {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.current == nil {
		return nil
	}
	for i := range a.current.Pipes {
		if a.current.Pipes[i].Name == pipe {
			s := a.current.Pipes[i].Spec.Clone()
			s.Normalize()
			return s
		}
	}
	return nil
}
