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
}

// DryRun says which agents' manifests gain, lose or update a pipe when its
// version in force, cur (nil for none), is replaced by next (nil to delete
// it), with the selection and the entries a compilation would use. Revoked
// agents are skipped; changes come in the order of agents.
func DryRun(agents []Agent, cur, next *Pipe) ([]Change, error) {
	var was, will *Compilation
	var oldEntry, newEntry []byte
	prepare := func(p *Pipe) (*Compilation, []byte, error) {
		if p == nil {
			return &Compilation{}, nil, nil
		}
		c, err := New([]Pipe{*p}, 0, time.Time{}, 0)
		if err != nil {
			return nil, nil, err
		}
		return c, c.entries[0].json, nil
	}
	var err error
	if was, oldEntry, err = prepare(cur); err != nil {
		return nil, err
	}
	if will, newEntry, err = prepare(next); err != nil {
		return nil, err
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
			c.Action, c.Diff = ActionRemove, entryDiff(oldEntry, nil)
		case !w && n:
			c.Action, c.Diff = ActionAdd, entryDiff(nil, newEntry)
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
