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
