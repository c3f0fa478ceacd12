package manifest

// Selects reports whether targets select an agent: listed by id in Agents,
// or carrying every tag of a non-empty Tags selector. Nil targets and an
// empty selector select nothing (targets must be explicit). This is the one
// targeting rule; the compiler, dry-run, the fire-time view and droverctl
// all use it. Revoked agents are the caller's concern.
func (t *Targets) Selects(agentID string, tags map[string]string) bool {
	if t == nil {
		return false
	}
	for _, id := range t.Agents {
		if id == agentID {
			return true
		}
	}
	return t.SelectsTags(tags)
}

// SelectsTags reports whether tags carry every tag of the non-empty Tags
// selector.
func (t *Targets) SelectsTags(tags map[string]string) bool {
	if t == nil || len(t.Tags) == 0 {
		return false
	}
	for k, v := range t.Tags {
		if got, ok := tags[k]; !ok || got != v {
			return false
		}
	}
	return true
}
