package server

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/drover/drover/api"
	"github.com/drover/drover/server/errs"
	"github.com/drover/drover/server/store"
)

// Live logs: GET /api/v1/runs/{id}/logs/stream answers text/event-stream.
//
//	id: <chunk seq>
//	event: chunk
//	data: {"seq":3,"stream":"stdout","at":"...","data":"<base64>"}
//
//	event: end
//	data: <the run, as GET /api/v1/runs/{id}>
//
// Chunks already stored come first, then each chunk as soon as the batch
// that carries it is committed (the ingester wakes the streams of the runs
// it touched). The stream ends with "end" once the run has finished and its
// chunks are all in (as many as RunFinished reported, the log was
// truncated, or 3 s passed). A reconnecting client sends Last-Event-ID and
// gets the chunks after it. Comments (": ping") keep idle connections
// alive every 15 s. An error after the headers is an "error" event whose
// data is the usual error body. The server's write timeout does not apply.
// Followers are capped per API token (live_logs.max_per_token, default 8)
// and in all (live_logs.max_followers, 256); a run that shows no progress
// for live_logs.idle_timeout (10m) ends the stream with an "idle" event
// (data: {"run": id, "after": last seq}).

// logWatchers wakes live-log streams when chunks of their run commit.
type logWatchers struct {
	mu sync.Mutex
	m  map[string]map[chan struct{}]struct{}
}

func newLogWatchers() *logWatchers {
	return &logWatchers{m: map[string]map[chan struct{}]struct{}{}}
}

// watch subscribes to a run; stop unsubscribes.
func (l *logWatchers) watch(runID string) (ch chan struct{}, stop func()) {
	ch = make(chan struct{}, 1)
	l.mu.Lock()
	set := l.m[runID]
	if set == nil {
		set = map[chan struct{}]struct{}{}
		l.m[runID] = set
	}
	set[ch] = struct{}{}
	l.mu.Unlock()
	return ch, func() {
		l.mu.Lock()
		delete(set, ch)
		if len(set) == 0 {
			delete(l.m, runID)
		}
		l.mu.Unlock()
	}
}

// notify wakes the streams of the runs touched by committed records.
func (l *logWatchers) notify(recs []*store.Record) {
	l.mu.Lock()
	idle := len(l.m) == 0
	l.mu.Unlock()
	if !idle {
		l.wake(touchedRuns(recs))
	}
}

// wake wakes the streams of the runs.
func (l *logWatchers) wake(runIDs []string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, id := range runIDs {
		for ch := range l.m[id] {
			select {
			case ch <- struct{}{}:
			default:
			}
		}
	}
}

// wakeAll wakes every stream (signals from other replicas may have been
// missed).
func (l *logWatchers) wakeAll() { l.wake(l.runs()) }

// runs lists the runs followed.
func (l *logWatchers) runs() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]string, 0, len(l.m))
	for id := range l.m {
		out = append(out, id)
	}
	return out
}

// touchedRuns lists the runs whose records were committed.
func touchedRuns(recs []*store.Record) []string {
	var ids []string
	for _, r := range recs {
		switch {
		case r.Chunk != nil:
			ids = append(ids, r.Chunk.RunID)
		case r.RunFinished != nil:
			ids = append(ids, r.RunFinished.ID)
		case r.RunStarted != nil:
			ids = append(ids, r.RunStarted.ID)
		case r.Settle != nil:
			ids = append(ids, r.Settle.Settled...) // runs settled lost have ended
		}
	}
	slices.Sort(ids)
	return slices.Compact(ids)
}

const (
	sseKeepalive   = 15 * time.Second
	sseEndGrace    = 3 * time.Second
	sseChunksBatch = 256
)

func terminalStatus(st string) bool {
	switch st {
	case api.StatusSucceeded, api.StatusFailed, api.StatusTimedOut, api.StatusCanceled, api.StatusSkipped:
		return true
	}
	return false
}

func (s *Server) handleRunLogStream(w http.ResponseWriter, r *http.Request) error {
	ctx := r.Context()
	id := r.PathValue("id")
	if _, err := s.store.GetRun(ctx, id); err != nil {
		return err
	}
	after, err := lastEventID(r)
	if err != nil {
		return err
	}
	release, err := s.takeFollower(w, r)
	if err != nil {
		return err
	}
	defer release()
	wake, stop := s.logWatch.watch(id) // before the first read: no commit is missed
	defer stop()

	// The server's read and write timeouts bound ordinary requests; a live
	// log lasts as long as its run (HTTP/1.1 would otherwise cancel the
	// request when the read deadline passes).
	rc := http.NewResponseController(w)
	_ = rc.SetWriteDeadline(time.Time{})
	_ = rc.SetReadDeadline(time.Time{})
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	if _, err := fmt.Fprintf(w, ": live log of run %s\n\n", id); err != nil {
		return nil
	}
	_ = rc.Flush()
	f := &logFollower{s: s, w: w, rc: rc, runID: id, after: after}
	return f.follow(ctx, wake)
}

// lastEventID is the chunk seq a reconnecting client saw last (-1: none).
func lastEventID(r *http.Request) (int64, error) {
	le := strings.TrimSpace(r.Header.Get("Last-Event-ID"))
	if le == "" {
		return -1, nil
	}
	n, err := strconv.ParseInt(le, 10, 64)
	if err != nil || n < 0 {
		return 0, errs.New(errs.ErrInvalidRequest, "invalid Last-Event-ID", api.Detail{Field: "Last-Event-ID", Message: "a chunk seq from an earlier event"})
	}
	return n, nil
}

// takeFollower takes a live-log slot: followers are capped per API token
// (one viewer cannot hold every slot) and in all.
func (s *Server) takeFollower(w http.ResponseWriter, r *http.Request) (release func(), err error) {
	tokenID := ""
	if p := principalOf(r); p != nil {
		tokenID = p.ID
	}
	releaseToken, ok := s.guard.follow(tokenID)
	if !ok {
		w.Header().Set("Retry-After", "5")
		return nil, errs.New(errs.ErrRateLimited, fmt.Sprintf("this token already follows %d live logs (live_logs.max_per_token)", s.cfg.LiveLogs.MaxPerToken))
	}
	select {
	case s.logStreams <- struct{}{}:
		return func() { <-s.logStreams; releaseToken() }, nil
	default:
		releaseToken()
		w.Header().Set("Retry-After", "5")
		return nil, errs.New(errs.ErrUnavailable, "too many live log streams; retry shortly")
	}
}

// logFollower writes one run's live log as Server-Sent Events.
type logFollower struct {
	s     *Server
	w     http.ResponseWriter
	rc    *http.ResponseController
	runID string
	after int64 // the last chunk seq sent
	// endedAt is when the follower first saw the run ended.
	endedAt time.Time
}

// follow sends chunks as they are committed until the run has ended and
// its log is complete, the run is idle, or the client or server goes away.
// Every error is told to the client as an "error" event.
func (f *logFollower) follow(ctx context.Context, wake <-chan struct{}) error {
	keepalive := time.NewTicker(sseKeepalive)
	defer keepalive.Stop()
	// A run that makes no progress (no chunk, no change of status) for
	// live_logs.idle_timeout ends its followers with an "idle" event; the
	// client may reconnect with Last-Event-ID.
	idleTimeout := f.s.cfg.LiveLogs.IdleTimeout
	idle := time.NewTimer(idleTimeout)
	defer idle.Stop()
	lastStatus := ""
	for {
		progressed, gone, err := f.sendChunks(ctx)
		if gone {
			return nil
		}
		if err != nil {
			return f.fail(err)
		}
		if err := f.rc.Flush(); err != nil {
			return nil
		}
		run, err := f.s.store.GetRun(ctx, f.runID)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return f.fail(err)
		}
		if run.Status != lastStatus {
			lastStatus, progressed = run.Status, true
		}
		if progressed {
			if !idle.Stop() {
				select {
				case <-idle.C:
				default:
				}
			}
			idle.Reset(idleTimeout)
		}
		var grace <-chan time.Time
		if terminalStatus(run.Status) {
			done, err := f.complete(ctx, run)
			if err != nil {
				return f.fail(err)
			}
			if done {
				// Chunks committed between this pass's read of the log and
				// its read of the run would otherwise be left out: send
				// them before the end.
				if _, gone, err := f.sendChunks(ctx); gone {
					return nil
				} else if err != nil {
					return f.fail(err)
				}
				b, _ := json.Marshal(runJSON(run))
				fmt.Fprintf(f.w, "event: end\ndata: %s\n\n", b)
				_ = f.rc.Flush()
				return nil
			}
			grace = time.After(sseEndGrace - time.Since(f.endedAt))
		}
		select {
		case <-wake:
		case <-grace:
		case <-keepalive.C:
			if _, err := fmt.Fprint(f.w, ": ping\n\n"); err != nil {
				return nil
			}
			_ = f.rc.Flush()
		case <-idle.C:
			fmt.Fprintf(f.w, "event: idle\ndata: {\"run\":%q,\"after\":%d}\n\n", f.runID, f.after)
			_ = f.rc.Flush()
			return nil
		case <-ctx.Done():
			return nil
		case <-f.s.quit:
			return nil
		}
	}
}

// sendChunks sends every chunk committed after f.after. gone reports that
// the client or the request went away (nothing more to say).
func (f *logFollower) sendChunks(ctx context.Context) (progressed, gone bool, err error) {
	for {
		chunks, err := f.s.store.GetLogsAfter(ctx, f.runID, f.after, sseChunksBatch)
		if err != nil {
			return progressed, ctx.Err() != nil, err
		}
		for _, c := range chunks {
			b, err := json.Marshal(chunkJSON(c))
			if err != nil {
				return progressed, false, err
			}
			if _, err := fmt.Fprintf(f.w, "id: %d\nevent: chunk\ndata: %s\n\n", c.Seq, b); err != nil {
				return progressed, true, nil
			}
			f.after = int64(c.Seq)
			progressed = true
		}
		if len(chunks) < sseChunksBatch {
			return progressed, false, nil
		}
	}
}

// complete reports whether an ended run's log is all stored (or the grace
// for its last chunks has passed).
func (f *logFollower) complete(ctx context.Context, run *store.Run) (bool, error) {
	if f.endedAt.IsZero() {
		f.endedAt = time.Now()
	}
	if run.LogTruncated || run.LogChunks == 0 || time.Since(f.endedAt) >= sseEndGrace {
		return true, nil
	}
	n, err := f.s.store.CountLogChunks(ctx, f.runID)
	if err != nil {
		return false, err
	}
	return n >= run.LogChunks, nil
}

// fail tells the client err as an "error" event and ends the stream.
func (f *logFollower) fail(err error) error {
	_, body := errs.Public(err)
	b, _ := json.Marshal(body)
	fmt.Fprintf(f.w, "event: error\ndata: %s\n\n", b)
	_ = f.rc.Flush()
	if errs.KindOf(err).Err == errs.ErrInternal {
		f.s.log.Error("live log stream failed", "run", f.runID, "err", err)
	}
	return nil
}
