package server

import (
	"context"
	"strconv"
	"time"

	"github.com/drover/drover/api"
	"github.com/drover/drover/server/store"
	"github.com/drover/drover/server/stream"
)

// Event kinds (docs/monitoring.md, "Events").
const (
	EventRunFailed        = "run.failed"
	EventRunMissed        = "run.missed"
	EventRunLong          = "run.long"
	EventRunRecovered     = "run.recovered"
	EventAgentOffline     = "agent.offline"
	EventAgentOnline      = "agent.online"
	EventManifestRejected = "manifest.rejected"
	EventManifestExpired  = "manifest.expired"
	EventIdentityConflict = "identity.conflict"
	EventPipeMoved        = "pipe.moved" // a placement: one pipe lost or gained its holder (placement.go)
)

// eventKinds lists every event kind.
var eventKinds = []string{EventRunFailed, EventRunMissed, EventRunLong, EventRunRecovered, EventAgentOffline, EventAgentOnline,

	EventManifestRejected, EventManifestExpired, EventIdentityConflict, EventPipeMoved}

// Events are recorded per occurrence (every final failed run, every missed
// fire time, every refused identity) but a state is announced once per
// change: run.recovered only after a failed or missed run of the same agent
// and pipe, agent.offline and agent.online only when the agent's state
// flips, manifest.rejected and manifest.expired only when the agent's
// report turns to them. The states live in the store, so a restart does not
// repeat them.

// observe records the events of a committed batch of agent records and
// says whether it recorded any.
func (m *monitor) observe(recs []*store.Record) bool {
	ctx := context.Background()
	if err := m.loadState(ctx); err != nil {
		m.s.log.Error("events: loading monitor state", "err", err)
		return false
	}
	var evs []*store.Event
	dirty := map[string]string{}
	for _, r := range recs {
		at := r.Received
		switch {
		case r.RunFinished != nil:
			x := r.RunFinished
			key := runStateKey(r.AgentID, x.Pipe)
			switch x.Status {
			case api.StatusFailed, api.StatusTimedOut:
				m.swap(key, "failing", dirty)
				msg := x.Status
				if x.Reason != "" {
					msg += ": " + x.Reason
				}
				evs = append(evs, &store.Event{At: at, Kind: EventRunFailed, Pipe: x.Pipe, AgentID: r.AgentID, RunID: x.ID, Message: msg, Dedupe: EventRunFailed + "/" + x.ID})
			case api.StatusSucceeded:
				if m.swap(key, "", dirty) == "failing" { // healthy is the absence of state
					evs = append(evs, &store.Event{At: at, Kind: EventRunRecovered, Pipe: x.Pipe, AgentID: r.AgentID, RunID: x.ID,
						Message: "succeeded after a failed or missed run", Dedupe: EventRunRecovered + "/" + x.ID})
				}
			}
		case r.Settle != nil:
			for _, id := range r.Settle.Settled { // rare: the pipe is looked up
				pipe := ""
				if run, err := m.store.GetRun(ctx, id); err == nil {
					pipe = run.Pipe
					m.swap(runStateKey(r.AgentID, pipe), "failing", dirty)
				}
				evs = append(evs, &store.Event{At: at, Kind: EventRunFailed, Pipe: pipe, AgentID: r.AgentID, RunID: id, Message: "failed: " + store.ReasonLost, Dedupe: EventRunFailed + "/" + id})
			}
		case r.Status != nil:
			st := r.Status
			if old := m.swap("manifest/"+r.AgentID, st.State, dirty); st.State == "rejected" && old != "rejected" {
				evs = append(evs, &store.Event{At: at, Kind: EventManifestRejected, AgentID: r.AgentID, Message: stream.CleanText(st.Error, 512, false),
					Dedupe: EventManifestRejected + "/" + r.AgentID + "/" + strconv.FormatInt(at.UnixNano(), 10)})
			}
			exp := ""
			if st.Expired {
				exp = "1"
			}
			if old := m.swap("expired/"+r.AgentID, exp, dirty); exp == "1" && old != "1" {
				evs = append(evs, &store.Event{At: at, Kind: EventManifestExpired, AgentID: r.AgentID,
					Message: "the manifest in force on the host expired at " + st.ExpiresAt.UTC().Format(time.RFC3339),
					Dedupe:  EventManifestExpired + "/" + r.AgentID + "/" + strconv.FormatInt(at.UnixNano(), 10)})
			}
		}
	}
	added := len(evs) > 0
	if err := m.store.AddEvents(ctx, evs); err != nil {
		m.s.log.Error("recording events", "err", err)
		added = false
	}
	if err := m.store.SetMonitorState(ctx, dirty, m.s.clock.Now()); err != nil {
		m.s.log.Error("recording monitor state", "err", err)
	}
	return added
}

// onlineChange appends agent.offline or agent.online when the agent's
// state flipped: offline once it has had no stream for the offline grace,
// online again only with a live stream (between the two, as just after a
// restart, the state stays). An agent never seen online has no state to
// leave.
func (m *monitor) onlineChange(a *store.MonitorAgent, offline bool, now time.Time, dirty map[string]string, evs []*store.Event) []*store.Event {
	live := m.s.hub.Online(a.ID)
	key := "agent/" + a.ID
	m.stateMu.Lock()
	old := m.state[key]
	m.stateMu.Unlock()
	switch {
	case offline && old == "online":
		m.swap(key, "offline", dirty)
		return append(evs, &store.Event{At: now, Kind: EventAgentOffline, AgentID: a.ID,
			Message: "no stream since " + a.LastSeenAt.UTC().Format(time.RFC3339), Dedupe: EventAgentOffline + "/" + a.ID + "/" + strconv.FormatInt(now.UnixNano(), 10)})
	case live && old == "offline":
		m.swap(key, "online", dirty)
		return append(evs, &store.Event{At: now, Kind: EventAgentOnline, AgentID: a.ID, Message: "stream re-established",
			Dedupe: EventAgentOnline + "/" + a.ID + "/" + strconv.FormatInt(now.UnixNano(), 10)})
	case live && old == "":
		m.swap(key, "online", dirty)
	}
	return evs
}

// identityConflict records an identity.conflict event (the caller throttles).
func (m *monitor) identityConflict(agentID, machineID string, now time.Time) {
	e := &store.Event{At: now, Kind: EventIdentityConflict, AgentID: agentID, Message: "machine " + machineID + " presented this agent's certificate",
		Dedupe: EventIdentityConflict + "/" + agentID + "/" + strconv.FormatInt(now.UnixNano(), 10)}
	if err := m.store.AddEvents(context.Background(), []*store.Event{e}); err != nil {
		m.s.log.Error("recording an event", "err", err)
	}
}
