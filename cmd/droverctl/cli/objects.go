package cli

import (
	"github.com/drover/drover/api"
	"github.com/drover/drover/manifest"
)

// The tables read the API's objects (package api). -o json and -o yaml
// print what the server sent, unchanged, so fields added to the API show
// there without a change here.

// agentErrors counts an agent's problems: a manifest error and pipe apply
// errors.
func agentErrors(a *api.Agent) int {
	n := 0
	if a.ManifestError != "" {
		n++
	}
	for _, p := range a.Pipes {
		if p.ApplyError != "" {
			n++
		}
	}
	return n
}

// runExit is a run's EXIT column: its signal, its exit code once it has
// ended, else empty.
func runExit(r *api.Run) string {
	switch {
	case r.Signal != "":
		return r.Signal
	case r.FinishedAt == nil && !api.Terminal(r.Status):
		return ""
	}
	return itoa(r.ExitCode)
}

// targets reports whether t selects an agent that is not revoked
// (manifest.Targets.Selects, the server's rule).
func targets(t *manifest.Targets, a *api.Agent) bool {
	return !a.Revoked && t.Selects(a.ID, a.Tags)
}
