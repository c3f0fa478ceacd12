package api

// State is how droverctl and the agent list show an agent: revoked, online
// or offline.
func (a *Agent) State() string {
	switch {
	case a.Revoked:
		return "revoked"
	case a.Online:
		return "online"
	}
	return "offline"
}

// Actions of a DryRunResponse (and of droverctl's apply plan).
const (
	ActionCreate    = "create"
	ActionUpdate    = "update"
	ActionUnchanged = "unchanged"
	ActionDelete    = "delete"
)

// Actions of an AgentChange: how the pipe's entry in the agent's manifest
// changes.
const (
	AgentAdd    = "add"
	AgentUpdate = "update"
	AgentRemove = "remove"
)
