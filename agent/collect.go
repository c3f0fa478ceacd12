package agent

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/drover/drover/agent/spool"
	"github.com/drover/drover/internal/paths"
	"github.com/drover/drover/manifest"
	agentpb "github.com/drover/drover/proto"
)

// collectInterval is how often the spool directories are scanned.
const collectInterval = time.Second

// RunSummary is the last finished run of a pipe, for status.
type RunSummary struct {
	RunID      string    `json:"run_id"`
	Status     string    `json:"status"`
	Trigger    string    `json:"trigger"`
	ExitCode   int32     `json:"exit_code"`
	Signal     string    `json:"signal,omitempty"`
	Reason     string    `json:"reason,omitempty"`
	WrittenBy  string    `json:"written_by,omitempty"`
	StartedAt  time.Time `json:"started_at,omitzero"`
	FinishedAt time.Time `json:"finished_at,omitzero"`
}

// WithSpoolRoots replaces the directories whose <pipe>/spool
// subdirectories the daemon drains (see DefaultSpoolRoots).
func WithSpoolRoots(roots ...string) Option {
	return func(a *Agent) { a.spoolRoots = roots }
}

// DefaultSpoolRoots returns where runners spool their records: every pipe
// has <root>/<pipe>/spool. System scope: /var/lib/drover-runs (the
// per-pipe StateDirectory=); user scope: <base>/drover-runs, where the user
// manager puts StateDirectory= — $XDG_CONFIG_HOME up to systemd 253,
// $XDG_STATE_HOME from 254 on (systemd.exec(5)), so both are drained; the
// cron backend and runs outside systemd: <data dir>/runs.
func DefaultSpoolRoots(cfg Config) []string {
	roots := []string{filepath.Join(cfg.DataDir, "runs")}
	switch cfg.Scope {
	case ScopeUser:
		home, _ := os.UserHomeDir()
		for _, b := range []struct{ env, def string }{{"XDG_CONFIG_HOME", ".config"}, {"XDG_STATE_HOME", ".local/state"}} {
			base := os.Getenv(b.env)
			if base == "" && home != "" {
				base = filepath.Join(home, b.def)
			}
			if base != "" && !slices.Contains(roots, filepath.Join(base, paths.RunsName)) {
				roots = append(roots, filepath.Join(base, paths.RunsName))
			}
		}
	default:
		roots = append(roots, paths.SystemRunsDir)
	}
	return roots
}

// collectLoop moves runner records from the spool directories into the
// outbox, continuously.
func (a *Agent) collectLoop(ctx context.Context) {
	t := time.NewTicker(collectInterval)
	defer t.Stop()
	for {
		a.collectOnce()
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-a.spoolCh:
		}
	}
}

func (a *Agent) kickSpool() {
	select {
	case a.spoolCh <- struct{}{}:
	default:
	}
}

// collectOnce drains every spool once; it reports whether every spool was
// drained without an error.
func (a *Agent) collectOnce() bool {
	a.collectMu.Lock()
	defer a.collectMu.Unlock()
	ok := true
	for _, root := range a.spoolRoots {
		ents, err := os.ReadDir(root)
		if err != nil {
			continue
		}
		for _, e := range ents {
			pipe := e.Name()
			if !manifest.ValidName(pipe) {
				continue
			}
			dir := filepath.Join(root, pipe, "spool")
			if !a.drainSpool(dir, pipe) {
				ok = false
			}
		}
	}
	return ok
}

// drainSpool commits one spool's records to the outbox (at most once each)
// and deletes their files.
func (a *Agent) drainSpool(dir, pipe string) bool {
	r := spool.Reader{Dir: dir, Pipe: pipe, OnBad: func(name string, err error) {
		a.log.Warn("spool: set aside a bad record", "dir", dir, "file", name, "err", err)
	}}
	n, err := r.DrainBatch(func(recs []spool.Record) error {
		if err := a.store.EnqueueSpooled(dir, recs); err != nil {
			return err
		}
		for _, rec := range recs {
			a.noteRecord(rec.Msg)
		}
		a.kickOutbox()
		return nil
	})
	if err != nil {
		a.log.Error("spool: drain", "dir", dir, "err", err)
	}
	if n > 0 {
		names, lerr := spool.List(dir)
		if lerr != nil {
			return err == nil
		}
		present := map[string]bool{}
		for _, name := range names {
			present[name] = true
		}
		if err := a.store.PruneSpooled(dir, func(name string) bool { return present[name] }); err != nil {
			a.log.Warn("spool: prune", "dir", dir, "err", err)
		}
	}
	return err == nil
}

// noteRecord remembers run ids (for CancelRun) and last results (for status).
func (a *Agent) noteRecord(msg *agentpb.AgentMessage) {
	a.mu.Lock()
	defer a.mu.Unlock()
	switch b := msg.GetBody().(type) {
	case *agentpb.AgentMessage_RunStarted:
		a.runPipes[b.RunStarted.GetRunId()] = b.RunStarted.GetPipe()
	case *agentpb.AgentMessage_RunFinished:
		f := b.RunFinished
		delete(a.runPipes, f.GetRunId())
		a.lastRuns[f.GetPipe()] = RunSummary{
			RunID: f.GetRunId(), Status: f.GetStatus().Name(), Trigger: f.GetTrigger().Name(),
			ExitCode: f.GetExitCode(), Signal: f.GetSignal(), Reason: f.GetReason(), WrittenBy: f.GetWrittenBy(),
			StartedAt: f.GetStartedAt().AsTime(), FinishedAt: f.GetFinishedAt().AsTime(),
		}
	}
}

func (a *Agent) pipeOfRun(runID string) string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.runPipes[runID]
}
