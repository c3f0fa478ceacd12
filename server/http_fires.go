package server

import (
	"fmt"
	"net/http"
	"slices"
	"sort"
	"strconv"
	"time"

	"github.com/drover/drover/api"
	"github.com/drover/drover/server/errs"
	"github.com/drover/drover/server/store"
)

// The fire-time view: for each fire time of a pipe, how many agents were
// expected to serve it and what became of their runs (docs/monitoring.md,
// "The fire-time view"). Fire times are the evaluator's in the pipe's time zone
// plus any fire time a run reports (an "@every" pipe's, or the previous
// schedule's). Expected agents are those that hold the pipe now and had
// enrolled before the fire time, when the pipe version in force existed,
// plus any other agent that reported a run for it. Drill down with GET
// /api/v1/runs?pipe=NAME&scheduled_since=T&scheduled_until=T+1s.

const (
	// maxFiresWindow bounds the since-until window of the view.
	maxFiresWindow = 31 * 24 * time.Hour
	// defaultFires and maxFires bound the fire times listed (the newest).
	defaultFires = 100
	maxFires     = 1000
	// maxFireScan bounds the evaluator steps of one request.
	maxFireScan = 100000
	// maxUnreportedShown bounds the agents listed per fire time.
	maxUnreportedShown = 100
)

func (s *Server) handlePipeFires(w http.ResponseWriter, r *http.Request) error {
	name, err := pipeName(r)
	if err != nil {
		return err
	}
	limit, since, until, err := fireQuery(r, s.clock.Now())
	if err != nil {
		return err
	}
	pipes, agents, err := s.store.MonitorInputs(r.Context(), false)
	if err != nil {
		return err
	}
	var p *store.PipeVersion
	for _, x := range pipes {
		if x.Name == name {
			p = x
		}
	}
	if p == nil {
		if _, err := s.store.GetPipe(r.Context(), name); err != nil {
			return err
		}
		return errs.NotFound("pipe")
	}
	sc, tz, loc, err := storedSchedule(name, &p.Spec)
	if err != nil {
		return err
	}

	fires := map[int64]time.Time{}
	if _, every := sc.Every(); !every {
		steps := 0
		start := since.Add(-time.Nanosecond)
		if p.CreatedAt.After(start) {
			start = p.CreatedAt // a pipe version expects nothing before it existed
		}
		for f := sc.Next(start, loc); !f.IsZero() && f.Before(until) && steps < maxFireScan; f = sc.Next(f, loc) {
			fires[f.Unix()] = f
			steps++
		}
	}
	runs, err := s.store.ScheduledRuns(r.Context(), name, since, until)
	if err != nil {
		return err
	}
	ran := map[int64]map[string]string{} // fire -> agent -> status
	for _, x := range runs {
		if _, ok := fires[x.ScheduledAt]; !ok {
			fires[x.ScheduledAt] = time.Unix(x.ScheduledAt, 0).In(loc)
		}
		m := ran[x.ScheduledAt]
		if m == nil {
			m = map[string]string{}
			ran[x.ScheduledAt] = m
		}
		m[x.Agent] = x.Status
	}
	keys := make([]int64, 0, len(fires))
	for k := range fires {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	out := api.FireList{Pipe: name, Schedule: p.Spec.Schedule, Timezone: tz, Since: since.UTC(), Until: until.UTC(), Fires: []api.Fire{}}
	if len(keys) > limit {
		keys, out.Truncated = keys[len(keys)-limit:], true
	}

	var holders []*store.MonitorAgent
	if p.Spec.IsEnabled() {
		if t := p.Spec.Targets; t != nil {
			for _, a := range agents {
				if err := a.Decode(false); err != nil {
					return err
				}
				if t.Selects(a.ID, a.Tags) {
					holders = append(holders, a)
				}
			}
		}
	}
	sort.Slice(holders, func(i, j int) bool { return holders[i].ID < holders[j].ID })
	for _, k := range keys {
		out.Fires = append(out.Fires, fireCounts(fires[k], p, holders, ran[k]))
	}
	return writeJSON(w, http.StatusOK, out)
}

// fireQuery reads the limit and the since-until window of a fire-time
// query: by default the 24 hours before now, at most maxFiresWindow.
func fireQuery(r *http.Request, now time.Time) (limit int, since, until time.Time, err error) {
	var details []api.Detail
	limit = defaultFires
	if c := r.URL.Query().Get("limit"); c != "" {
		n, err := strconv.Atoi(c)
		if err != nil || n < 1 || n > maxFires {
			details = append(details, api.Detail{Field: "limit", Message: fmt.Sprintf("must be 1-%d", maxFires)})
		}
		limit = n
	}
	since, err1 := queryTime(r, "since")
	until, err2 := queryTime(r, "until")
	for _, err := range []error{err1, err2} {
		details = append(details, errs.Details(err)...)
	}
	if until.IsZero() {
		until = now
	}
	if since.IsZero() {
		since = until.Add(-24 * time.Hour)
	}
	if err1 == nil && err2 == nil {
		if !since.Before(until) {
			details = append(details, api.Detail{Field: "until", Message: "must be after since"})
		} else if until.Sub(since) > maxFiresWindow {
			details = append(details, api.Detail{Field: "since", Message: "the window may span at most 31 days"})
		}
	}
	if len(details) > 0 {
		return 0, since, until, errs.New(errs.ErrInvalidRequest, "invalid fire-time query", details...)
	}
	return limit, since, until, nil
}

// fireCounts counts one fire time of p: the runs reported for it (got:
// agent -> status) and the holders expected to serve it that did not
// report.
func fireCounts(f time.Time, p *store.PipeVersion, holders []*store.MonitorAgent, got map[string]string) api.Fire {
	fj := api.Fire{At: f, Counts: map[string]int{}}
	for _, a := range holders {
		if !f.After(a.CreatedAt) || !f.After(p.CreatedAt) {
			continue
		}
		if _, ok := got[a.ID]; !ok {
			fj.Expected++
			fj.Unreported++
			if len(fj.UnreportedAgents) < maxUnreportedShown {
				fj.UnreportedAgents = append(fj.UnreportedAgents, a.ID)
			}
		}
	}
	for _, st := range got {
		fj.Expected++
		fj.Counts[st]++
	}
	return fj
}
