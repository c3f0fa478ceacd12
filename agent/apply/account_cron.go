package apply

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// The cron backend's account of its spawns: every spawn is a file
// D/cron-runs/<run id>.json written when the runner starts and completed
// when it exits (or could not start). The daemon settles the completed ones
// and Forgets them (the file goes); a file left incomplete by an agent that
// stopped is settled at the next start once its runner is gone (exit
// status unknown: reason "runner lost").

const cronRunsDir = "cron-runs"

type cronRun struct {
	Pipe        string    `json:"pipe"`
	RunID       string    `json:"run_id"`
	Trigger     string    `json:"trigger"`
	ScheduledAt time.Time `json:"scheduled_at,omitzero"`
	RequestID   string    `json:"request_id,omitempty"`
	StartedAt   time.Time `json:"started_at"`
	PID         int       `json:"pid,omitempty"`
	// Set when the runner exited or could not start.
	Ended      bool      `json:"ended,omitempty"`
	FinishedAt time.Time `json:"finished_at,omitzero"`
	Result     string    `json:"result,omitempty"`
	ExitCode   int       `json:"exit_code"`
	Signal     string    `json:"signal,omitempty"`
	Reason     string    `json:"reason,omitempty"`
}

func (b *Cron) runPath(runID string) string {
	return filepath.Join(b.cfg.DataDir, cronRunsDir, runID+".json")
}

func (b *Cron) saveRun(r cronRun) {
	if err := os.MkdirAll(filepath.Join(b.cfg.DataDir, cronRunsDir), 0o700); err != nil {
		b.cfg.Logger.Warn("cron run account", "err", err)
		return
	}
	data, err := json.Marshal(r)
	if err != nil {
		return
	}
	if err := replaceFile(b.runPath(r.RunID), append(data, '\n'), 0o600); err != nil {
		b.cfg.Logger.Warn("cron run account", "run_id", r.RunID, "err", err)
	}
	b.changes.notify()
}

// Changes implements Accounter.
func (b *Cron) Changes() <-chan struct{} { return b.changes }

// Forget implements Accounter.
func (b *Cron) Forget(keys ...string) {
	for _, k := range keys {
		if k != "" && !strings.ContainsAny(k, "/\\") {
			_ = os.Remove(b.runPath(k))
		}
	}
}

// Ended implements Accounter.
func (b *Cron) Ended(context.Context) ([]Ended, error) {
	dir := filepath.Join(b.cfg.DataDir, cronRunsDir)
	ents, err := os.ReadDir(dir)
	if os.IsNotExist(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []Ended
	for _, e := range ents {
		if !strings.HasSuffix(e.Name(), ".json") || strings.HasPrefix(e.Name(), ".") {
			continue
		}
		data, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			continue
		}
		var r cronRun
		if json.Unmarshal(data, &r) != nil || r.RunID+".json" != e.Name() {
			continue
		}
		if !r.Ended {
			b.mu.Lock()
			p := b.pipes[r.Pipe]
			ours := p != nil && p.procs[r.RunID] != nil
			b.mu.Unlock()
			if ours || runnerAlive(r.PID, r.Pipe) {
				continue // still running
			}
			// Started by an agent that stopped; its runner is gone and its
			// exit status with it.
			r.Ended, r.FinishedAt, r.ExitCode, r.Reason = true, b.cfg.Now(), -1, "runner lost (it ended while the agent was down)"
		}
		out = append(out, Ended{
			Key: r.RunID, Pipe: r.Pipe, RunID: r.RunID, StartedAt: r.StartedAt, FinishedAt: r.FinishedAt,
			Result: r.Result, ExitCode: r.ExitCode, Signal: r.Signal, Reason: r.Reason,
			Trigger: r.Trigger, RequestID: r.RequestID, ScheduledAt: r.ScheduledAt,
		})
	}
	return out, nil
}

// runnerAlive reports whether pid is a live `drover-agent run <pipe>`.
func runnerAlive(pid int, pipe string) bool {
	if pid <= 0 || syscall.Kill(pid, 0) != nil && !os.IsPermission(syscall.Kill(pid, 0)) {
		return false
	}
	cmdline, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	if err != nil {
		return false
	}
	// A zombie of ours has an empty command line: it is gone.
	return bytes.Contains(cmdline, []byte("\x00run\x00"+pipe+"\x00")) || bytes.HasSuffix(cmdline, []byte("\x00run\x00"+pipe))
}

// cronReason is the reason of a runner's exit as the cron backend saw it.
func cronReason(res string, code int) string {
	switch res {
	case "success":
		return ""
	case "signal":
		return "signal " + signalName(code)
	case "exit-code":
		return fmt.Sprintf("exit %d", code)
	}
	return res
}
