package compile

import (
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"time"
)

// Actions of a Change.
const (
	ActionAdd    = "add"
	ActionRemove = "remove"
	ActionUpdate = "update"
)

// Change is what replacing one pipe does to one agent's manifest.
type Change struct {
	AgentID string
	Action  string // ActionAdd, ActionRemove or ActionUpdate
	// Diff compares the pipe's manifest entries field by field (the spec's
	// fields flattened to spec.<field>): "- field: old" and "+ field: new".
	Diff string
	// Reason says why a placement: one pipe is added or removed; After,
	// when set, says the agent gains it only then (once the lease of the
	// holder before has ended plus the skew margin), not at once.
	Reason string
	After  time.Time
}

// Placing is what a dry-run of a placement: one pipe needs: the stored
// holders, the latest fire times served, the time and the lease settings
// (the agents carry their health).
type Placing struct {
	Holders []Holder
	Served  map[string]time.Time
	Now     time.Time
	Leases  Leases
}

// DryRun says which agents' manifests gain, lose or update a pipe when its
// version in force, cur (nil for none), is replaced by next (nil to delete
// it), with the selection and the entries a compilation would use. Revoked
// agents are skipped; changes come in the order of agents.
func DryRun(agents []Agent, cur, next *Pipe) ([]Change, error) {
	return DryRunPlaced(agents, cur, next, Placing{})
}

// DryRunPlaced is DryRun knowing the placement: a placement: one pipe is
// in its holder's manifest alone, so a change of its targets (or of its
// placement) says which agent gains it, when, and which loses it.
func DryRunPlaced(agents []Agent, cur, next *Pipe, pl Placing) ([]Change, error) {
	var was, will *Compilation
	var oldEntry, newEntry []byte
	var wasPl, willPl Placement
	prepare := func(p *Pipe, out *Placement) (*Compilation, []byte, error) {
		if p == nil {
			return &Compilation{}, nil, nil
		}
		c, err := New([]Pipe{*p}, 0, pl.Now, 0)
		if err != nil {
			return nil, nil, err
		}
		if c.placed {
			ps, _ := Place([]Pipe{*p}, agents, pl.Holders, pl.Served, pl.Now, pl.Leases)
			*out = ps[0]
			// The entries compare without the lease: a renewal is no change.
			hold := ps[0]
			hold.LeaseUntil, hold.LastFireServed = c.now.Add(time.Hour), time.Time{}
			if err := c.Hold([]Placement{hold}); err != nil {
				return nil, nil, err
			}
			if h := c.held[0]; h != nil {
				h.json = c.entries[0].json
			}
		}
		return c, c.entries[0].json, nil
	}
	var err error
	if was, oldEntry, err = prepare(cur, &wasPl); err != nil {
		return nil, err
	}
	if will, newEntry, err = prepare(next, &willPl); err != nil {
		return nil, err
	}
	reason := func(p *Placement) string {
		if p.Pipe == "" {
			return ""
		}
		return strings.Join(p.Reasons, ", ")
	}
	var out []Change
	for i := range agents {
		a := &agents[i]
		if a.Revoked {
			continue
		}
		w, n := len(was.selected(a)) > 0, len(will.selected(a)) > 0
		c := Change{AgentID: a.ID}
		switch {
		case w && !n:
			c.Action, c.Diff, c.Reason = ActionRemove, entryDiff(oldEntry, nil), reason(&willPl)
		case !w && n:
			c.Action, c.Diff, c.Reason = ActionAdd, entryDiff(nil, newEntry), reason(&willPl)
		case !n && willPl.Next == a.ID:
			c.Action, c.Diff, c.Reason, c.After = ActionAdd, entryDiff(nil, newEntry), reason(&willPl), willPl.NextAt
		case w && n && string(oldEntry) != string(newEntry):
			c.Action, c.Diff = ActionUpdate, entryDiff(oldEntry, newEntry)
		default:
			continue
		}
		out = append(out, c)
	}
	return out, nil
}

// entryDiff compares two manifest entries field by field (the spec's
// fields flattened to spec.<field>): "- field: old" and "+ field: new".
func entryDiff(old, new []byte) string {
	a, b := flattenEntry(old), flattenEntry(new)
	keys := make([]string, 0, len(a)+len(b))
	for k := range a {
		keys = append(keys, k)
	}
	for k := range b {
		if _, ok := a[k]; !ok {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	var sb strings.Builder
	for _, k := range keys {
		va, ina := a[k]
		vb, inb := b[k]
		if ina && inb && va == vb {
			continue
		}
		if ina {
			fmt.Fprintf(&sb, "- %s: %s\n", k, va)
		}
		if inb {
			fmt.Fprintf(&sb, "+ %s: %s\n", k, vb)
		}
	}
	return sb.String()
}

// flattenEntry maps a manifest entry's fields to their compact JSON, with
// spec and payload fields as spec.<field> and payload.<field>.
func flattenEntry(b []byte) map[string]string {
	out := map[string]string{}
	if b == nil {
		return out
	}
	var top map[string]json.RawMessage
	if json.Unmarshal(b, &top) != nil {
		return out
	}
	for k, v := range top {
		var sub map[string]json.RawMessage
		if (k == "spec" || k == "payload") && json.Unmarshal(v, &sub) == nil {
			for sk, sv := range sub {
				out[k+"."+sk] = string(sv)
			}
			continue
		}
		out[k] = string(v)
	}
	return out
}
