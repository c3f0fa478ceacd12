package notify

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/drover/drover/api"
	"github.com/drover/drover/server/store"
)

func TestValidation(t *testing.T) {
	short, long := "short", strings.Repeat("x", MaxSecretBytes+1)
	cases := []struct {
		c     api.NotifyChannel
		field string
	}{
		{api.NotifyChannel{Name: "Bad_Name", Kind: "webhook", URL: "http://x", Secret: &long}, "name"},
		{api.NotifyChannel{Name: "a", Kind: "email", URL: "http://x"}, "kind"},
		{api.NotifyChannel{Name: "a", Kind: "alertmanager", URL: "ftp://x"}, "url"},
		{api.NotifyChannel{Name: "a", Kind: "alertmanager", URL: "http://u:p@x"}, "url"},
		{api.NotifyChannel{Name: "a", Kind: "webhook", URL: "https://x"}, "secret"},
		{api.NotifyChannel{Name: "a", Kind: "webhook", URL: "https://x", Secret: &short}, "secret"},
	}
	for _, c := range cases {
		ds := ValidateChannel(&c.c, false)
		found := false
		for _, d := range ds {
			found = found || d.Field == c.field
		}
		if !found {
			t.Errorf("%+v: details %v, want one for %s", c.c, ds, c.field)
		}
	}
	ok := strings.Repeat("s", 32)
	if ds := ValidateChannel(&api.NotifyChannel{Name: "hook", Kind: "webhook", URL: "https://x/y", Secret: &ok}, false); len(ds) != 0 {
		t.Errorf("valid webhook: %v", ds)
	}
	if ds := ValidateChannel(&api.NotifyChannel{Name: "hook", Kind: "webhook", URL: "https://x/y"}, true); len(ds) != 0 {
		t.Errorf("webhook keeping its stored secret: %v", ds)
	}
	ds := ValidateRule(&api.NotifyRule{Name: "r", Kinds: []string{"run.failed", "run.exploded"}, Channels: []string{"hook", "nope"}, Severity: "LOUD"}, map[string]bool{"hook": true})
	want := map[string]bool{"kinds[1]": true, "channels[1]": true, "severity": true}
	for _, d := range ds {
		delete(want, d.Field)
	}
	if len(want) != 0 {
		t.Errorf("rule details %v miss %v", ds, want)
	}
}

func TestBackoffAndSignature(t *testing.T) {
	if d := Backoff(0, time.Second, time.Minute, 0); d != 500*time.Millisecond {
		t.Errorf("first wait %v", d)
	}
	if d := Backoff(3, time.Second, time.Minute, 0.999); d <= 7*time.Second || d > 8*time.Second {
		t.Errorf("fourth wait %v", d)
	}
	if d := Backoff(100, time.Second, time.Minute, 0.999); d > time.Minute || d < 59*time.Second {
		t.Errorf("capped wait %v", d)
	}
	// echo -n body | openssl dgst -sha256 -hmac key
	if s := Sign([]byte("key"), []byte("body")); s != "sha256=515aae133b435d4000956731f68ae5cf5eb85d4f0dc6a546d2bfcd3595ec1ae1" {
		t.Errorf("signature %s", s)
	}
}

// One notification per change of state: a pipe failing three times on one
// agent fires once, its recovery resolves it once (and goes to a rule that
// names only run.failed), a second failure fires again; filters apply.
func TestRouteOncePerChange(t *testing.T) {
	at := time.Date(2026, 12, 1, 2, 30, 0, 0, time.UTC)
	rt := &Router{
		Rules: []*api.NotifyRule{
			{Name: "all", Kinds: []string{"run.failed", "run.missed", "agent.offline"}, Channels: []string{"am", "hook"}, Severity: "critical"},
			{Name: "prod", Kinds: []string{"run.failed"}, Tags: map[string]string{"env": "prod"}, Pipes: []string{"backup"}, Channels: []string{"hook"}},
		},
		Channels: map[string]*store.NotifyChannel{"am": {Name: "am", Kind: "alertmanager"}, "hook": {Name: "hook", Kind: "webhook"}},
		TagsOf: func(id string) map[string]string {
			return map[string]string{"env": map[string]string{"a1": "prod"}[id]}
		},
		AlertHold: time.Hour, OneOffHold: time.Minute,
	}
	ev := func(id int64, kind, agent, pipe string) *store.Event {
		return &store.Event{ID: id, Kind: kind, AgentID: agent, Pipe: pipe, At: at.Add(time.Duration(id) * time.Minute), Message: kind}
	}
	state := map[string]string{}
	ds, changed, err := rt.Route([]*store.Event{
		ev(1, "run.failed", "a1", "backup"), ev(2, "run.failed", "a1", "backup"), ev(3, "run.missed", "a1", "backup"),
		ev(4, "run.recovered", "a1", "backup"), ev(5, "run.recovered", "a1", "backup"), ev(6, "run.failed", "a1", "backup"),
		ev(7, "manifest.rejected", "a2", ""), ev(8, "run.recovered", "a2", "other"),
	}, state, at)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, d := range ds {
		got = append(got, d.Channel+"/"+string(rune('0'+d.EventID)))
	}
	if want := "am/1 hook/1 am/4 hook/4 am/6 hook/6"; strings.Join(got, " ") != want {
		t.Fatalf("deliveries %v, want %s", got, want)
	}
	if len(changed) != 1 || state["run/a1/backup"] == "" {
		t.Errorf("state after a new failure: %v", changed)
	}
	var alerts []amAlert
	if err := json.Unmarshal(ds[2].Body, &alerts); err != nil || len(alerts) != 1 {
		t.Fatalf("alertmanager body %s: %v", ds[2].Body, err)
	}
	a := alerts[0]
	if a.Labels["alertname"] != "DroverRunFailed" || a.Labels["pipe"] != "backup" || a.Labels["agent"] != "a1" || a.Labels["severity"] != "critical" ||
		!a.StartsAt.Equal(at.Add(time.Minute)) || !a.EndsAt.Equal(at.Add(4*time.Minute)) {
		t.Errorf("resolved alert %+v", a)
	}
	var n Notification
	if err := json.Unmarshal(ds[1].Body, &n); err != nil || n.State != "firing" || n.ID != "evt-1-hook" || n.Severity != "critical" {
		t.Errorf("webhook body %s: %v", ds[1].Body, err)
	}
}
