package manifest

import "testing"

func TestTargetsSelects(t *testing.T) {
	web := map[string]string{"role": "web", "dc": "fra"}
	cases := []struct {
		name    string
		targets *Targets
		id      string
		tags    map[string]string
		want    bool
	}{
		{"nil targets", nil, "a1", web, false},
		{"empty targets", &Targets{}, "a1", web, false},
		{"listed id", &Targets{Agents: []string{"a0", "a1"}}, "a1", nil, true},
		{"unlisted id", &Targets{Agents: []string{"a0"}}, "a1", web, false},
		{"every tag", &Targets{Tags: map[string]string{"role": "web"}}, "a1", web, true},
		{"all of several tags", &Targets{Tags: map[string]string{"role": "web", "dc": "fra"}}, "a1", web, true},
		{"one tag differs", &Targets{Tags: map[string]string{"role": "web", "dc": "ams"}}, "a1", web, false},
		{"tag missing", &Targets{Tags: map[string]string{"tier": "1"}}, "a1", web, false},
		{"no tags on agent", &Targets{Tags: map[string]string{"role": "web"}}, "a1", nil, false},
		{"id or tags", &Targets{Tags: map[string]string{"role": "db"}, Agents: []string{"a1"}}, "a1", web, true},
	}
	for _, c := range cases {
		if got := c.targets.Selects(c.id, c.tags); got != c.want {
			t.Errorf("%s: Selects = %v, want %v", c.name, got, c.want)
		}
	}
}
