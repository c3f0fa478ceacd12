package cli

import (
	"encoding/json"
	"fmt"

	"github.com/drover/drover/internal/command"
)

// -o name prints one kind/name line per object, as kubectl does:
// pipe/backup-db, agent/<id>, run/<id>.

// nameKinds maps the key of a list answer to the kind an object is named
// with and the field that names it.
var nameKinds = map[string]struct{ kind, field string }{
	"pipes":    {"pipe", "name"},
	"agents":   {"agent", "id"},
	"runs":     {"run", "id"},
	"events":   {"event", "id"},
	"tokens":   {"token", "id"},
	"secrets":  {"secret", "name"},
	"channels": {"channel", "name"},
	"rules":    {"rule", "name"},
}

// names is what -o name prints for a list answer {"<key>": [...]}: one
// "kind/name" per item.
func names(key string, items []json.RawMessage) ([]string, error) {
	nk, ok := nameKinds[key]
	if !ok {
		return nil, command.Usagef("-o name: %s have no names; use -o json", key)
	}
	out := make([]string, 0, len(items))
	for _, it := range items {
		var fields map[string]json.RawMessage
		if err := json.Unmarshal(it, &fields); err != nil {
			return nil, fmt.Errorf("unexpected object from the server: %w", err)
		}
		s := unquoteID(fields[nk.field])
		if s == "" {
			return nil, fmt.Errorf("unexpected %s from the server: no %s", nk.kind, nk.field)
		}
		out = append(out, nk.kind+"/"+s)
	}
	return out, nil
}

// printNames writes the -o name form of an answer: a list answer (an
// object holding one of nameKinds' lists) or one object of kind key.
func (a *app) printNames(raw []byte) error {
	var top map[string]json.RawMessage
	if err := json.Unmarshal(raw, &top); err != nil {
		return command.Usagef("-o name: this command prints no objects; use -o json")
	}
	for key := range nameKinds {
		list, ok := top[key]
		if !ok {
			continue
		}
		var items []json.RawMessage
		if err := json.Unmarshal(list, &items); err != nil {
			continue
		}
		return a.printNameLines(key, items)
	}
	return command.Usagef("-o name: this command prints no named objects; use -o json")
}

func (a *app) printNameLines(key string, items []json.RawMessage) error {
	ns, err := names(key, items)
	if err != nil {
		return err
	}
	for _, n := range ns {
		fmt.Fprintln(a.stdout(), sanitizeLine(n))
	}
	return nil
}

// unquoteID reads a JSON string or number as text ("" when neither).
func unquoteID(raw json.RawMessage) string {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	var n json.Number
	if json.Unmarshal(raw, &n) == nil {
		return n.String()
	}
	return ""
}
