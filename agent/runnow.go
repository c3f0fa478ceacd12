package agent

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/drover/drover/agent/apply"
	agentpb "github.com/drover/drover/proto"
)

// runNowSyncWait bounds the sync the agent makes when asked to run a pipe it
// does not have yet (the usual race: `droverctl apply` then `droverctl run`).
const runNowSyncWait = time.Minute

// runNow carries out RunNow. Every request the server sent ends in a run
// record the operator can see: the run the runner reports, or, when no run
// could start, a RunFinished the agent writes itself — skipped when a run of
// the pipe is in progress (no overlap, as for a scheduled tick), failed with
// the reason otherwise.
func (a *Agent) runNow(ctx context.Context, pipe, req string) {
	err := a.backend.RunNow(ctx, pipe, req)
	if errors.Is(err, apply.ErrUnknownPipe) {
		// The manifest that adds the pipe may not have reached this host yet.
		a.log.Info("run now: pipe not installed; syncing first", "pipe", pipe, "request_id", req)
		wctx, cancel := context.WithTimeout(ctx, runNowSyncWait)
		select {
		case res := <-a.RequestSync():
			a.log.Debug("run now: sync", "outcome", res.Outcome)
			err = a.backend.RunNow(ctx, pipe, req)
		case <-wctx.Done():
		}
		cancel()
	}
	if ctx.Err() != nil {
		return
	}
	if err == nil {
		a.log.Info("run started on request", "pipe", pipe, "request_id", req)
		a.kickSpool()
		return
	}
	status, exit := agentpb.RunStatus_RUN_STATUS_FAILED, int32(-1) // -1: nothing ran
	reason := fmt.Sprintf("run now: %v", err)
	short := "run now: start failed"
	switch {
	case errors.Is(err, apply.ErrAlreadyRunning):
		status, exit = agentpb.RunStatus_RUN_STATUS_SKIPPED, 0 // as the runner records a skipped tick
		reason, short = "run now: a run of this pipe is in progress (runs never overlap)", "overlap"
		a.log.Info("run now skipped: a run is in progress", "pipe", pipe, "request_id", req)
	case errors.Is(err, apply.ErrUnknownPipe):
		reason, short = "run now: the pipe is not installed on this host (the manifest in force does not have it)", "unknown pipe"
		a.log.Error("run now", "pipe", pipe, "request_id", req, "err", err)
	default:
		a.log.Error("run now", "pipe", pipe, "request_id", req, "err", err)
	}
	now := timestamppb.New(time.Now())
	msg := &agentpb.AgentMessage{Body: &agentpb.AgentMessage_RunFinished{RunFinished: &agentpb.RunFinished{
		RunId: newRunID(), Pipe: pipe, PipeVersion: a.pipeVersion(pipe), Trigger: agentpb.Trigger_TRIGGER_API,
		Status: status, ExitCode: exit, StartedAt: now, FinishedAt: now, Error: reason, RequestId: req,
		Reason: short, Attempts: 1, WrittenBy: WrittenByDaemon,
	}}}
	a.noteRecord(msg)
	if err := a.store.Settle(pipe, nil, msg); err != nil {
		a.log.Error("outbox enqueue", "err", err)
		return
	}
	a.kickOutbox()
}

// pipeVersion is the version of pipe in the manifest in force, or 0.
func (a *Agent) pipeVersion(pipe string) uint64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.current == nil {
		return 0
	}
	for i := range a.current.Pipes {
		if a.current.Pipes[i].Name == pipe {
			return a.current.Pipes[i].Version
		}
	}
	return 0
}

// newRunID is a UUIDv7, as the runner makes outside systemd.
func newRunID() string {
	if id, err := uuid.NewV7(); err == nil {
		return id.String()
	}
	return uuid.NewString()
}
