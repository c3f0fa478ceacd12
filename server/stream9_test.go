package server

import "testing"

// jobAgent enrolls an agent whose manifest names the pipe "job" (agents
// may report runs only of pipes their manifest names).
func (ts *testServer) jobAgent() *testAgent {
	ts.t.Helper()
	tags := map[string]string{"job": "yes"}
	a := ts.enrollAgent(tags)
	ts.putScriptPipe("job", "echo job", tags)
	return a
}

var _ = testing.Short
