package server

import (
	"context"
	"time"

	"github.com/drover/drover/api"
	"github.com/drover/drover/server/store"
)

// maxLongRunScan bounds the running runs one monitor pass looks at for
// run.long.
const maxLongRunScan = 10000

// longRuns returns a run.long event for each run still running past its
// pipe's max_duration (from its start on the agent's clock, else from when
// the server first recorded it). The event's dedupe key makes it one per
// run however many passes see it.
func (m *monitor) longRuns(ctx context.Context, pipes []*store.PipeVersion, now time.Time) ([]*store.Event, error) {
	limits := map[string]time.Duration{}
	for _, p := range pipes {
		if d := p.Spec.MaxDuration.D(); d > 0 {
			limits[p.Name] = d
		}
	}
	if len(limits) == 0 {
		return nil, nil
	}
	runs, err := m.s.store.ListRuns(ctx, store.RunFilter{Status: api.StatusRunning, Limit: maxLongRunScan})
	if err != nil {
		return nil, err
	}
	var evs []*store.Event
	for _, r := range runs {
		limit, ok := limits[r.Pipe]
		if !ok {
			continue
		}
		start := r.StartedAt
		if start.IsZero() || start.After(now) {
			start = r.CreatedAt
		}
		if now.Sub(start) <= limit {
			continue
		}
		evs = append(evs, &store.Event{At: now, Kind: EventRunLong, Pipe: r.Pipe, AgentID: r.AgentID, RunID: r.ID,
			Message: "still running after " + now.Sub(start).Truncate(time.Second).String() + " (max_duration " + limit.String() + ")",
			Dedupe:  EventRunLong + "/" + r.ID})
	}
	return evs, nil
}
