package server

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/drover/drover/api"
	"github.com/drover/drover/internal/tick"
	"github.com/drover/drover/server/store"

	"github.com/drover/drover/manifest"
)

// Missed runs (docs/monitoring.md, "Missed runs"). For every agent that holds
// a pipe and every fire time the agent was expected to serve, a run must
// have started within the pipe's grace after the fire time plus its
// jitter (the stable per-host delay is at most the jitter). A detection
// pass records each fire time that has no run by then as a run with status
// missed; a real record for the same agent, pipe and fire time replaces it
// when it arrives (ingestion deletes the missed row in the same
// transaction, see dropMissed), however late.
//
// Expected fire times: while the agent is online, the next fire times it
// reported in its last ManifestStatus, and the evaluator's outside the span
// those cover; while it is offline, the evaluator's (schedule Next in the
// pipe's time zone). "@every" schedules count from the timer's activation,
// which only the host knows: they are checked against reported fire times
// only. Nothing is expected of a disabled pipe, before the pipe version in
// force was created or the agent enrolled, or of an offline agent for a
// pipe with catchup: skip (the host drops those fire times by design).
//
// A placement: one pipe (docs/placement.md) is expected of the agent that
// held it at each fire time only, and served by a run of any agent; a fire
// time that fell while nobody held it under a valid lease, served by
// nobody, is missed with reason "no holder" and agent "" (a catch-up run
// of the next holder replaces it).
//
// Each pass looks at the fire times whose deadline fell since the last
// pass (a watermark kept in the store, so a restart continues where the
// server stopped, up to maxMissedLookback back).

const (
	// missedInterval is how often a detection pass runs.
	missedInterval = 30 * time.Second
	// maxMissedLookback bounds how far back the first pass after a long
	// stop looks.
	maxMissedLookback = 24 * time.Hour
	// maxFiresPerPass bounds the fire times of one pipe in one pass.
	maxFiresPerPass = 2000

	reasonNotReported = "not reported"
	reasonOffline     = "agent offline"
	reasonNoHolder    = "no holder"

	stateWatermark = "missed/watermark"
)

// leader runs fn while this server is the one that does fleet-wide
// periodic work. With one server it always is; several replicas wrap fn in
// a lock (docs/design.md, "Planned") without changing the loop.
type leader interface {
	lead(ctx context.Context, name string, fn func(context.Context))
	// leading reports whether this server runs the singletons now.
	leading() bool
}

// soleLeader is the leader of a server that runs alone; lockLeader
// (leader.go) that of replicas on PostgreSQL.
type soleLeader struct{}

func (soleLeader) lead(ctx context.Context, _ string, fn func(context.Context)) { fn(ctx) }
func (soleLeader) leading() bool                                                { return true }

// monitor detects missed runs and records events.
type monitor struct {
	s     *Server
	store interface {
		store.MonitorStore
		GetRun(ctx context.Context, id string) (*store.Run, error)
		Holders(ctx context.Context) ([]*store.Holder, error)
	}
	interval time.Duration

	passMu sync.Mutex // one pass at a time
	scheds map[string]*manifest.Schedule
	locs   map[string]*time.Location

	decoded map[string]*store.MonitorAgent // by agent id: tags and pipe status decoded (under passMu)

	stateMu sync.Mutex
	state   map[string]string // nil until loaded

	lastPrune time.Time // events are kept as long as runs (runs.retention_age)
}

func newMonitor(s *Server) *monitor {
	return &monitor{s: s, store: s.store, interval: missedInterval, scheds: map[string]*manifest.Schedule{}, locs: map[string]*time.Location{},
		decoded: map[string]*store.MonitorAgent{}}
}

// run runs a detection pass every interval until ctx ends. The first
// waits one interval too, so that after a restart the agents have
// reconnected before anything is judged.
func (m *monitor) run(ctx context.Context) {
	tick.Every(ctx, m.interval, nil, func() {
		if _, err := m.pass(ctx); err != nil && ctx.Err() == nil {
			m.s.log.Error("missed-run detection", "err", err)
		}
	})
}

// passStats is what one pass did.
type passStats struct {
	Pairs    int // (agent, pipe) pairs looked at
	Expected int // fire times expected
	Missed   int // missed runs stored
}

// loadState loads the durable state once.
func (m *monitor) loadState(ctx context.Context) error {
	m.stateMu.Lock()
	defer m.stateMu.Unlock()
	if m.state != nil {
		return nil
	}
	st, err := m.store.MonitorState(ctx)
	if err != nil {
		return err
	}
	m.state = st
	return nil
}

// swap sets key to value in the state ("" removes it: healthy states are
// not kept) and reports the previous value; changed keys are added to
// dirty.
func (m *monitor) swap(key, value string, dirty map[string]string) string {
	m.stateMu.Lock()
	defer m.stateMu.Unlock()
	old := m.state[key]
	if old != value {
		if value == "" {
			delete(m.state, key)
		} else {
			m.state[key] = value
		}
		dirty[key] = value
	}
	return old
}

func (m *monitor) schedule(p *store.PipeVersion) (*manifest.Schedule, *time.Location, error) {
	sc, ok := m.scheds[p.Spec.Schedule]
	if !ok {
		var err error
		if sc, err = manifest.ParseSchedule(p.Spec.Schedule); err != nil {
			return nil, nil, err
		}
		m.scheds[p.Spec.Schedule] = sc
	}
	tz := p.Spec.Timezone
	if tz == "" {
		tz = manifest.DefaultTimezone
	}
	loc, ok := m.locs[tz]
	if !ok {
		var err error
		if loc, err = manifest.LoadLocation(tz); err != nil {
			return nil, nil, err
		}
		m.locs[tz] = loc
	}
	return sc, loc, nil
}

type fireKey struct {
	agent, pipe string
	at          int64 // Unix seconds
}

// agentOffline: the agent has no live stream and was not heard from
// within the offline grace (a reconnect blip is not offline).
func (m *monitor) agentOffline(a *store.MonitorAgent, now time.Time) bool {
	return !m.s.hub.Online(a.ID) && now.Sub(a.LastSeenAt) >= m.s.cfg.GRPC.OfflineAfter
}

// pass runs one detection pass at the server's clock.
func (m *monitor) pass(ctx context.Context) (passStats, error) {
	m.passMu.Lock()
	defer m.passMu.Unlock()
	var stats passStats
	if err := m.loadState(ctx); err != nil {
		return stats, err
	}
	now := m.s.clock.Now()
	dirty := map[string]string{}
	from := m.windowStart(now)

	pipes, agents, err := m.store.MonitorInputs(ctx, true)
	if err != nil {
		return stats, err
	}
	agents = m.decodeAgents(agents)
	offline := make(map[string]bool, len(agents))
	byID := make(map[string]*store.MonitorAgent, len(agents))
	var events []*store.Event
	for _, a := range agents {
		byID[a.ID] = a
		off := m.agentOffline(a, now)
		offline[a.ID] = off
		events = m.onlineChange(a, off, now, dirty, events)
	}

	var holders map[string]*store.Holder
	for _, p := range pipes {
		if p.Spec.Placement == manifest.PlacementOne {
			hs, err := m.store.Holders(ctx)
			if err != nil {
				return stats, err
			}
			holders = make(map[string]*store.Holder, len(hs))
			for _, h := range hs {
				holders[h.Pipe] = h
			}
			break
		}
	}
	plans, winLo, winHi := m.plan(pipes, agents, byID, holders, from, now)
	var missed []*store.Run
	if len(plans) > 0 {
		runs, err := m.store.ScheduledRuns(ctx, "", winLo, winHi.Add(time.Second))
		if err != nil {
			return stats, err
		}
		missed = m.findMissed(plans, runs, offline, now, &stats)
	}
	if len(missed) > 0 {
		stored, err := m.store.InsertMissed(ctx, missed)
		if err != nil {
			return stats, err
		}
		stats.Missed = len(stored)
		m.s.metrics.pipes.runsMissed(stored)
		for _, r := range stored {
			m.swap(runStateKey(r.AgentID, r.Pipe), "failing", dirty)
			events = append(events, &store.Event{At: now, Kind: EventRunMissed, Pipe: r.Pipe, AgentID: r.AgentID, RunID: r.ID,
				Message: "fire time " + r.ScheduledAt.UTC().Format(time.RFC3339) + " missed: " + r.Reason, Dedupe: EventRunMissed + "/" + r.ID})
		}
	}
	long, err := m.longRuns(ctx, pipes, now)
	if err != nil {
		return stats, err
	}
	events = append(events, long...)
	if err := m.store.AddEvents(ctx, events); err != nil {
		return stats, err
	}
	if now.Sub(m.lastPrune) >= m.s.cfg.Runs.RetentionInterval {
		if n, err := m.store.PruneEvents(ctx, now.Add(-m.s.cfg.Runs.RetentionAge)); err != nil {
			return stats, err
		} else if n > 0 {
			m.s.log.Info("pruned events", "events", n)
		}
		m.lastPrune = now
	}
	m.swap(stateWatermark, fmt.Sprint(now.UnixNano()), dirty)
	if err := m.store.SetMonitorState(ctx, dirty, now); err != nil {
		return stats, err
	}
	return stats, nil
}

// windowStart is where this pass's window starts: the watermark of the
// last pass, at most maxMissedLookback ago; a new server expects nothing
// from before it started.
func (m *monitor) windowStart(now time.Time) time.Time {
	m.stateMu.Lock()
	mark := m.state[stateWatermark]
	m.stateMu.Unlock()
	from := now
	if mark != "" {
		if n, err := parseNS(mark); err == nil {
			from = n
		}
	}
	if from.Before(now.Add(-maxMissedLookback)) {
		from = now.Add(-maxMissedLookback)
	}
	return from
}

// decodeAgents fills the agents' tags and pipe status, decoding them only
// when they changed since the last pass; an agent whose state cannot be
// decoded is left out.
func (m *monitor) decodeAgents(agents []*store.MonitorAgent) []*store.MonitorAgent {
	decoded := make(map[string]*store.MonitorAgent, len(agents))
	for i, a := range agents {
		if d := m.decoded[a.ID]; d != nil && d.TagsJSON == a.TagsJSON && d.StatusSeq == a.StatusSeq && d.PipesJSON == a.PipesJSON {
			a.Tags, a.Pipes = d.Tags, d.Pipes
		} else if err := a.Decode(true); err != nil {
			m.s.log.Error("missed-run detection: skipping an agent", "err", err)
			agents[i] = nil
			continue
		}
		decoded[a.ID] = a
	}
	m.decoded = decoded
	return slices.DeleteFunc(agents, func(a *store.MonitorAgent) bool { return a == nil })
}

// firePlan is what one pass checks of one pipe.
type firePlan struct {
	p       *store.PipeVersion
	fires   []time.Time // evaluator fire times in the window
	lo, hi  time.Time   // the window of fire times: (lo, hi]
	every   bool
	holders []*store.MonitorAgent
	// placement: one: the holder state (nil for none yet); a fire time is
	// expected of the agent that held the pipe at that instant only.
	one    bool
	holder *store.Holder
}

// plan lists, for every enabled pipe held by an agent, the window of fire
// times whose runs are due by now (the pass window shifted back by the
// pipe's jitter and grace) and the agents that hold it; winLo and winHi
// span every window.
func (m *monitor) plan(pipes []*store.PipeVersion, agents []*store.MonitorAgent, byID map[string]*store.MonitorAgent, holders map[string]*store.Holder,
	from, now time.Time) (plans []firePlan, winLo, winHi time.Time) {
	for _, p := range pipes {
		if !p.Spec.IsEnabled() {
			continue
		}
		sc, loc, err := m.schedule(p)
		if err != nil {
			m.s.log.Error("missed-run detection: pipe schedule", "pipe", p.Name, "err", err)
			continue
		}
		lag := p.Spec.Jitter.D() + p.Spec.GraceOrDefault()
		pl := firePlan{p: p, lo: from.Add(-lag), hi: now.Add(-lag)}
		if !pl.hi.After(pl.lo) {
			continue
		}
		if _, pl.every = sc.Every(); !pl.every {
			start := pl.lo
			if c := p.CreatedAt; c.After(start) {
				start = c
			}
			for f := sc.Next(start, loc); !f.IsZero() && !f.After(pl.hi) && len(pl.fires) < maxFiresPerPass; f = sc.Next(f, loc) {
				pl.fires = append(pl.fires, f)
			}
		}
		if pl.one = p.Spec.Placement == manifest.PlacementOne; pl.one {
			pl.holder = holders[p.Name]
			pl.holders = nil
			if h := pl.holder; h != nil {
				for _, id := range []string{h.Agent, h.Prev} {
					if a := byID[id]; a != nil && id != "" {
						pl.holders = append(pl.holders, a)
					}
				}
			}
			if len(pl.holders) == 0 && (len(pl.fires) == 0 || len(targetedAgents(p.Spec.Targets, agents, byID)) == 0) {
				continue // nobody to expect it of (a pipe that targets no agent expects nothing)
			}
		} else if pl.holders = targetedAgents(p.Spec.Targets, agents, byID); len(pl.holders) == 0 {
			continue
		}
		if winLo.IsZero() || pl.lo.Before(winLo) {
			winLo = pl.lo
		}
		if pl.hi.After(winHi) {
			winHi = pl.hi
		}
		plans = append(plans, pl)
	}
	return plans, winLo, winHi
}

// targetedAgents lists the agents a pipe's targets select: those named,
// then those whose tags match.
func targetedAgents(t *manifest.Targets, agents []*store.MonitorAgent, byID map[string]*store.MonitorAgent) []*store.MonitorAgent {
	if t == nil {
		return nil
	}
	var out []*store.MonitorAgent
	seen := map[string]bool{}
	for _, id := range t.Agents {
		if a := byID[id]; a != nil && !seen[id] {
			seen[id] = true
			out = append(out, a)
		}
	}
	if len(t.Tags) > 0 {
		for _, a := range agents {
			if !seen[a.ID] && t.SelectsTags(a.Tags) {
				out = append(out, a)
			}
		}
	}
	return out
}

// findMissed returns a missed run for every expected fire time of the
// plans that none of runs serves.
func (m *monitor) findMissed(plans []firePlan, runs []store.ScheduledRun, offline map[string]bool, now time.Time, stats *passStats) []*store.Run {
	have := make(map[fireKey]struct{}, len(runs))
	for _, r := range runs {
		have[fireKey{r.Agent, r.Pipe, r.ScheduledAt}] = struct{}{}
		have[fireKey{"", r.Pipe, r.ScheduledAt}] = struct{}{} // served by someone (placement: one)
	}
	var missed []*store.Run
	var exp []time.Time
	for _, pl := range plans {
		p := pl.p
		if pl.one {
			missed = m.noHolder(missed, &pl, have, now, stats)
		}
		for _, a := range pl.holders {
			stats.Pairs++
			off := offline[a.ID]
			if off && p.Spec.Catchup == manifest.CatchupSkip {
				continue
			}
			exp = m.expected(exp[:0], pl.fires, pl.lo, pl.hi, pl.every, p, a, off)
			floor := a.CreatedAt
			if p.CreatedAt.After(floor) {
				floor = p.CreatedAt
			}
			for _, f := range exp {
				if !f.After(floor) {
					continue
				}
				key := fireKey{a.ID, p.Name, f.Unix()}
				if pl.one {
					if h, known := holderAt(pl.holder, f); !known || h != a.ID {
						continue // another holder's, or nobody's (noHolder)
					}
					key.agent = "" // whoever served it
				}
				stats.Expected++
				if _, ok := have[key]; ok {
					continue
				}
				reason := reasonNotReported
				if off {
					reason = reasonOffline
				}
				missed = append(missed, &store.Run{ID: store.MissedRunID(a.ID, p.Name, f), AgentID: a.ID, Pipe: p.Name, PipeVersion: p.Version,
					Trigger: api.TriggerSchedule, Status: api.StatusMissed, Reason: reason, WrittenBy: "server", ScheduledAt: f, CreatedAt: now,
					Error: fmt.Sprintf("no run started within %s (grace) after this fire time plus its jitter of %s", p.Spec.GraceOrDefault(), p.Spec.Jitter.D())})
			}
		}
	}
	return missed
}

// noHolder appends a missed run (agent "", reason no holder) for every
// evaluator fire time of a placement: one pipe in its window that fell
// while nobody held it and that nobody served.
func (m *monitor) noHolder(missed []*store.Run, pl *firePlan, have map[fireKey]struct{}, now time.Time, stats *passStats) []*store.Run {
	p := pl.p
	for _, f := range pl.fires {
		if !f.After(p.CreatedAt) {
			continue
		}
		if h, known := holderAt(pl.holder, f); !known || h != "" {
			continue
		}
		stats.Expected++
		if _, ok := have[fireKey{"", p.Name, f.Unix()}]; ok {
			continue
		}
		missed = append(missed, &store.Run{ID: store.MissedRunID("", p.Name, f), AgentID: "", Pipe: p.Name, PipeVersion: p.Version,
			Trigger: api.TriggerSchedule, Status: api.StatusMissed, Reason: reasonNoHolder, WrittenBy: "server", ScheduledAt: f, CreatedAt: now,
			Error: "no agent held this placement: one pipe at its fire time (a hand-over waits for the lease of the holder before to end)"})
	}
	return missed
}

// holderAt returns the agent that held a placement: one pipe at fire time
// f under a valid lease ("" for nobody), and whether the stored state
// knows (it keeps the current holder and the one before).
func holderAt(h *store.Holder, f time.Time) (string, bool) {
	if h == nil || (h.Agent == "" && h.Prev == "") {
		return "", true // never held
	}
	switch {
	case h.Agent != "" && !f.Before(h.Since):
		if f.After(h.LeaseUntil) {
			return "", true // its lease ended unrenewed
		}
		return h.Agent, true
	case h.Prev != "" && !f.Before(h.PrevSince) && f.Before(h.ReleasedAt):
		if f.After(h.PrevLeaseUntil) {
			return "", true
		}
		return h.Prev, true
	case h.Prev != "" && !f.Before(h.ReleasedAt):
		return "", true // between the release and the next holder
	}
	return "", false // before what the state remembers
}

// expected appends to dst the fire times in (lo, hi] that agent a was
// expected to serve for pipe p: the evaluator's, except that while the
// agent is online the next fire times it reported replace the evaluator's
// over the span they cover.
func (m *monitor) expected(dst, fires []time.Time, lo, hi time.Time, every bool, p *store.PipeVersion, a *store.MonitorAgent, offline bool) []time.Time {
	var reported []time.Time
	if !offline {
		for i := range a.Pipes {
			if a.Pipes[i].Name == p.Name {
				reported = a.Pipes[i].NextFireTimes
				break
			}
		}
	}
	if len(reported) == 0 {
		if every {
			return dst
		}
		return append(dst, fires...)
	}
	last := reported[0]
	for _, f := range reported {
		if f.After(last) {
			last = f
		}
	}
	covered := func(f time.Time) bool { return !f.Before(a.StatusAt) && !f.After(last) }
	if !every {
		for _, f := range fires {
			if !covered(f) {
				dst = append(dst, f)
			}
		}
	}
	n := len(dst)
	for _, f := range reported {
		if f.After(lo) && !f.After(hi) && !slices.ContainsFunc(dst[:n], func(g time.Time) bool { return g.Unix() == f.Unix() }) {
			dst = append(dst, f)
		}
	}
	return dst
}

func runStateKey(agent, pipe string) string { return "run/" + agent + "/" + pipe }

func parseNS(s string) (time.Time, error) {
	var n int64
	if _, err := fmt.Sscan(s, &n); err != nil {
		return time.Time{}, err
	}
	return time.Unix(0, n), nil
}
