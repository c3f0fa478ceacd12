package server

import (
	"fmt"
	"mime"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/drover/drover/api"
	"github.com/drover/drover/server/errs"
	"github.com/drover/drover/server/store"
	"github.com/drover/drover/server/stream"
)

func runJSON(r *store.Run) api.Run {
	return api.Run{ID: r.ID, AgentID: r.AgentID, Pipe: r.Pipe, PipeVersion: r.PipeVersion, Trigger: r.Trigger, Status: r.Status,
		ExitCode: r.ExitCode, Signal: r.Signal, Error: r.Error, RequestID: r.RequestID, Reason: r.Reason, Attempts: r.Attempts, WrittenBy: r.WrittenBy,
		ScheduledAt: optTime(r.ScheduledAt),
		StartedAt:   optTime(r.StartedAt), FinishedAt: optTime(r.FinishedAt), DurationMS: r.DurationMS, LogChunks: r.LogChunks,
		LogBytes: r.LogBytes, LogTruncated: r.LogTruncated, CreatedAt: r.CreatedAt, UpdatedAt: r.UpdatedAt,
		Output: r.Output, Metrics: r.Metrics, TelemetryNotes: r.TelemetryNotes}
}

func (s *Server) handleListRuns(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	pg, err := parsePage(r)
	if err != nil {
		return err
	}
	f := store.RunFilter{Pipe: q.Get("pipe"), Agent: q.Get("agent"), Status: q.Get("status"), RequestID: q.Get("request_id"), Reason: q.Get("reason"), Limit: pg.limit + 1}
	if err := checkRunFilter(r, &f); err != nil {
		return err
	}
	if pg.cursor != "" {
		at, id, ok := strings.Cut(pg.cursor, "/")
		n, err := strconv.ParseInt(at, 10, 64)
		if !ok || err != nil || n <= 0 || id == "" {
			return errBadCursor
		}
		f.BeforeAt, f.BeforeID = time.Unix(0, n).UTC(), id
	}
	runs, err := s.store.ListRuns(r.Context(), f)
	if err != nil {
		return err
	}
	runs, next := cutPage(runs, pg, func(x *store.Run) string { return timeKey(x.CreatedAt) + "/" + x.ID })
	return writeJSON(w, http.StatusOK, api.RunList{Runs: mapList(runs, runJSON), NextCursor: next})
}

func (s *Server) handleGetRun(w http.ResponseWriter, r *http.Request) error {
	run, err := s.store.GetRun(r.Context(), r.PathValue("id"))
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, runJSON(run))
}

func chunkJSON(c *store.LogChunk) api.LogChunk {
	return api.LogChunk{Seq: c.Seq, Stream: c.Stream, At: c.At, Data: c.Data}
}

// wantsJSON: the first media type the client accepts is application/json.
func wantsJSON(r *http.Request) bool {
	first, _, _ := strings.Cut(r.Header.Get("Accept"), ",")
	mt, _, err := mime.ParseMediaType(strings.TrimSpace(first))
	return err == nil && mt == "application/json"
}

// handleRunLogs returns the run's output as text/plain (chunks in order), or
// as JSON chunks when the client accepts only application/json.
func (s *Server) handleRunLogs(w http.ResponseWriter, r *http.Request) error {
	run, err := s.store.GetRun(r.Context(), r.PathValue("id"))
	if err != nil {
		return err
	}
	chunks, err := s.store.GetLogs(r.Context(), run.ID)
	if err != nil {
		return err
	}
	w.Header().Set("X-Drover-Log-Truncated", strconv.FormatBool(run.LogTruncated))
	w.Header().Set("Vary", "Accept")
	if wantsJSON(r) {
		return writeJSON(w, http.StatusOK, api.Logs{RunID: run.ID, Truncated: run.LogTruncated, Chunks: mapList(chunks, chunkJSON)})
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(http.StatusOK)
	for _, c := range chunks {
		if _, err := w.Write(c.Data); err != nil {
			return nil
		}
	}
	return nil
}

func (s *Server) handleCancelRun(w http.ResponseWriter, r *http.Request) error {
	var none struct{}
	if err := decodeOptionalJSON(w, r, s.cfg.HTTP.MaxBodyBytes, &none); err != nil {
		return err
	}
	run, err := s.store.GetRun(r.Context(), r.PathValue("id"))
	if err != nil {
		return err
	}
	if run.Status != api.StatusPending && run.Status != api.StatusRunning {
		why := run.Status
		if run.Reason != "" {
			why += ", reason " + run.Reason
		}
		return errs.New(errs.ErrConflict, fmt.Sprintf("run %s has ended (%s): there is nothing to cancel", run.ID, why))
	}
	if !s.hub.Cancel(r.Context(), run.AgentID, run.ID) {
		return errs.New(errs.ErrConflict, fmt.Sprintf("agent %s, which runs %s, is not connected; retry when it is online", run.AgentID, run.ID))
	}
	s.log.Info("run cancel requested", "run", run.ID, "agent", run.AgentID)
	out := api.CancelResponse{RunID: run.ID, AgentID: run.AgentID, Sent: true}
	setAudit(r, "run/"+run.ID, runJSON(run), out)
	return writeJSON(w, http.StatusAccepted, out)
}

// checkRunFilter validates the query parameters of GET /api/v1/runs that
// RunFilter does not parse itself: status (one of the run statuses), reason
// (at most 256 printable characters), since/until and
// scheduled_since/scheduled_until (RFC 3339, since before until). Every
// problem is reported with its parameter.
func checkRunFilter(r *http.Request, f *store.RunFilter) error {
	var details []api.Detail
	if f.Status != "" && !slices.Contains(api.RunStatuses, f.Status) {
		details = append(details, api.Detail{Field: "status", Message: "not a run status (" + strings.Join(api.RunStatuses, ", ") + ")"})
	}
	if len(f.Reason) > stream.MaxReasonLen || stream.CleanText(f.Reason, stream.MaxReasonLen, false) != f.Reason {
		details = append(details, api.Detail{Field: "reason", Message: "at most 256 printable characters"})
	}
	times := []struct {
		name string
		dst  *time.Time
	}{{"since", &f.Since}, {"until", &f.Until}, {"scheduled_since", &f.ScheduledSince}, {"scheduled_until", &f.ScheduledUntil}}
	for _, t := range times {
		v, err := queryTime(r, t.name)
		if err != nil {
			details = append(details, errs.Details(err)...)
			continue
		}
		*t.dst = v
	}
	if !f.Since.IsZero() && !f.Until.IsZero() && !f.Since.Before(f.Until) {
		details = append(details, api.Detail{Field: "until", Message: "must be after since"})
	}
	if !f.ScheduledSince.IsZero() && !f.ScheduledUntil.IsZero() && !f.ScheduledSince.Before(f.ScheduledUntil) {
		details = append(details, api.Detail{Field: "scheduled_until", Message: "must be after scheduled_since"})
	}
	if len(details) > 0 {
		return errs.New(errs.ErrInvalidRequest, "invalid run filter", details...)
	}
	return nil
}
