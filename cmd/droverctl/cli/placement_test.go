package cli

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/drover/drover/api"
)

// describe pipe shows a placement: one pipe's holder and lease; pipes move
// hands it over by the lease rules (the holder loses it now, the target
// gains it after the lease plus the margin), and refuses what cannot move.
func TestPipesMoveAndDescribePlacement(t *testing.T) {
	ts := startServer(t)
	ts.requireEndpoint("POST", "/api/v1/pipes/none/move", map[string]string{"to": "x"}, "pipes move")
	a := ts.enroll("db-1", map[string]string{"role": "db"}, true)
	b := ts.enroll("db-2", map[string]string{"role": "db"}, true)
	web := ts.enroll("web-1", map[string]string{"role": "web"}, true)
	spec := map[string]any{"schedule": "@daily", "script": "true", "placement": "one", "targets": map[string]any{"tags": map[string]string{"role": "db"}}}
	if code, body := ts.api("PUT", "/api/v1/pipes/solo", map[string]any{"spec": spec}); code != 201 && code != 200 {
		t.Fatalf("PUT: %d %s", code, body)
	}
	_, raw := ts.api("GET", "/api/v1/pipes/solo", nil)
	var p api.Pipe
	if err := json.Unmarshal(raw, &p); err != nil || p.Placement == nil || (p.Placement.Holder != a.id && p.Placement.Holder != b.id) {
		t.Fatalf("GET pipe: %s", raw)
	}
	holder, other := p.Placement.Holder, a.id
	if holder == a.id {
		other = b.id
	}
	r := ts.ctlOK("describe", "pipe", "solo")
	for _, want := range []string{"Placement:", "one (a single holder under a lease)", "Holder:", holder + " since", "Lease until:", "Holder reports:", "(holder)"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("describe pipe lacks %q:\n%s", want, r.stdout)
		}
	}

	if r := ts.ctl("pipes", "move", "solo"); r.code != 2 {
		t.Fatalf("pipes move without --to: %s", r)
	}
	if r := ts.ctl("pipes", "move", "solo", "--to", web.id); r.code != 1 || !strings.Contains(r.stderr, "does not target") {
		t.Fatalf("pipes move to an untargeted agent: %s", r)
	}
	r = ts.ctlOK("pipes", "move", "solo", "--to", other)
	if !strings.Contains(r.stdout, holder+" lost it; "+other+" gains it after") {
		t.Fatalf("pipes move:\n%s", r.stdout)
	}
	r = ts.ctlOK("describe", "pipe", "solo")
	if !strings.Contains(r.stdout, "handing over from "+holder) || !strings.Contains(r.stdout, "Move requested:") {
		t.Fatalf("describe pipe after the move:\n%s", r.stdout)
	}
}
