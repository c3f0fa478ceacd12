package notify

import (
	"encoding/json"
	"fmt"
	"slices"
	"time"

	"github.com/drover/drover/api"
	"github.com/drover/drover/server/store"
)

// An alerting subject is what a state belongs to: an agent's pipe (failing
// or healthy) or an agent (offline or online). The opening kinds start an
// alert for the subject unless one is open; the closing kind resolves it.
// Other kinds (manifest.*, identity.conflict, run.long, pipe.moved) are announced once
// per occurrence by the event log already and are not resolvable.
var (
	opens  = map[string]string{"run.failed": "run.recovered", "run.missed": "run.recovered", "agent.offline": "agent.online"}
	closes = map[string]bool{"run.recovered": true, "agent.online": true}
)

// alertNames are the alertname labels per event kind.
var alertNames = map[string]string{
	"run.failed": "DroverRunFailed", "run.missed": "DroverRunMissed", "run.long": "DroverRunLong",
	"agent.offline": "DroverAgentOffline", "manifest.rejected": "DroverManifestRejected",
	"manifest.expired": "DroverManifestExpired", "identity.conflict": "DroverIdentityConflict",
	"pipe.moved": "DroverPipeMoved",
}

func subject(e *store.Event) string {
	switch e.Kind {
	case "run.failed", "run.missed", "run.recovered":
		return "run/" + e.AgentID + "/" + e.Pipe
	case "agent.offline", "agent.online":
		return "agent/" + e.AgentID
	}
	return ""
}

// openAlert is the stored state of an open alert.
type openAlert struct {
	Kind      string    `json:"kind"`
	AlertName string    `json:"alertname"`
	Since     time.Time `json:"since"`
	EventID   int64     `json:"event_id"`
}

// Notification is what one channel receives for one change of state.
type Notification struct {
	// ID is unique per notification and channel: a receiver may use it to
	// drop a repeated delivery.
	ID string `json:"id"`
	// State is firing (an alert opened), resolved (it closed) or event (a
	// one-off announcement).
	State     string    `json:"state"`
	Kind      string    `json:"kind"`
	AlertName string    `json:"alertname"`
	Severity  string    `json:"severity"`
	At        time.Time `json:"at"`
	// Since is when the alert opened (resolved notifications).
	Since   time.Time `json:"since,omitzero"`
	Pipe    string    `json:"pipe,omitempty"`
	Agent   string    `json:"agent,omitempty"`
	RunID   string    `json:"run_id,omitempty"`
	Message string    `json:"message,omitempty"`
	EventID int64     `json:"event_id"`
	Channel string    `json:"channel"`
	Test    bool      `json:"test,omitempty"`
}

// Router turns events into deliveries.
type Router struct {
	Rules    []*api.NotifyRule
	Channels map[string]*store.NotifyChannel
	// TagsOf returns an agent's tags (for rules with tags).
	TagsOf func(agentID string) map[string]string
	// AlertHold is how long Alertmanager keeps a firing alert that never
	// resolves through Drover; OneOffHold that of a one-off event.
	AlertHold, OneOffHold time.Duration
}

func (rt *Router) matches(r *api.NotifyRule, e *store.Event, openKind string) bool {
	if !slices.Contains(r.Kinds, e.Kind) && (openKind == "" || !slices.Contains(r.Kinds, openKind)) {
		return false
	}
	if len(r.Pipes) > 0 && !slices.Contains(r.Pipes, e.Pipe) {
		return false
	}
	if len(r.Tags) > 0 {
		if e.AgentID == "" || rt.TagsOf == nil {
			return false
		}
		tags := rt.TagsOf(e.AgentID)
		for k, v := range r.Tags {
			if tags[k] != v {
				return false
			}
		}
	}
	return true
}

// Route decides the notifications of events (oldest first) given the open
// alerts in state, which it updates; it returns the deliveries and the
// state keys it changed (an empty value: closed).
func (rt *Router) Route(evs []*store.Event, state map[string]string, now time.Time) ([]*store.Delivery, map[string]string, error) {
	changed := map[string]string{}
	var out []*store.Delivery
	for _, e := range evs {
		n := Notification{Kind: e.Kind, At: e.At, Pipe: e.Pipe, Agent: e.AgentID, RunID: e.RunID, Message: e.Message, EventID: e.ID, State: "event", AlertName: alertNames[e.Kind]}
		openKind := ""
		if key := subject(e); key != "" {
			var cur *openAlert
			if v := state[key]; v != "" {
				cur = &openAlert{}
				if json.Unmarshal([]byte(v), cur) != nil {
					cur = nil
				}
			}
			switch {
			case closes[e.Kind]:
				if cur == nil {
					continue // nothing was open: no change of state
				}
				n.State, n.AlertName, n.Since, openKind = "resolved", cur.AlertName, cur.Since, cur.Kind
				state[key], changed[key] = "", ""
			case opens[e.Kind] != "":
				if cur != nil {
					continue // already open: the same state
				}
				n.State = "firing"
				b, _ := json.Marshal(openAlert{Kind: e.Kind, AlertName: n.AlertName, Since: e.At, EventID: e.ID})
				state[key], changed[key] = string(b), string(b)
			}
		}
		sent := map[string]bool{}
		for _, r := range rt.Rules {
			if !rt.matches(r, e, openKind) {
				continue
			}
			for _, cn := range r.Channels {
				ch := rt.Channels[cn]
				if ch == nil || sent[cn] {
					continue
				}
				sent[cn] = true
				x := n
				x.Channel, x.ID, x.Severity = cn, fmt.Sprintf("evt-%d-%s", e.ID, cn), r.Severity
				if x.Severity == "" {
					x.Severity = defaultSeverity
				}
				body, err := rt.body(ch.Kind, &x)
				if err != nil {
					return nil, nil, err
				}
				out = append(out, &store.Delivery{Channel: cn, EventID: e.ID, Body: body, CreatedAt: now, NextAt: now})
			}
		}
	}
	return out, changed, nil
}

// amAlert is one alert of the Alertmanager v2 API (POST /api/v2/alerts).
type amAlert struct {
	Labels       map[string]string `json:"labels"`
	Annotations  map[string]string `json:"annotations,omitempty"`
	StartsAt     time.Time         `json:"startsAt"`
	EndsAt       time.Time         `json:"endsAt"`
	GeneratorURL string            `json:"generatorURL,omitempty"`
}

// body is the exact request body of n for a channel kind.
func (rt *Router) body(kind string, n *Notification) ([]byte, error) {
	if kind != api.ChannelAlertmanager {
		return json.Marshal(n)
	}
	labels := map[string]string{"alertname": n.AlertName, "severity": n.Severity}
	if n.Pipe != "" {
		labels["pipe"] = n.Pipe
	}
	if n.Agent != "" {
		labels["agent"] = n.Agent
	}
	a := amAlert{Labels: labels, Annotations: map[string]string{"summary": n.Message, "kind": n.Kind}}
	if n.RunID != "" {
		a.Annotations["run_id"] = n.RunID
	}
	switch n.State {
	case "resolved":
		a.StartsAt, a.EndsAt = n.Since, n.At
	case "firing":
		a.StartsAt, a.EndsAt = n.At, n.At.Add(rt.AlertHold)
	default:
		a.StartsAt, a.EndsAt = n.At, n.At.Add(rt.OneOffHold)
	}
	return json.Marshal([]amAlert{a})
}
