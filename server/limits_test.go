package server

import (
	"fmt"
	"testing"
)

// TestNoteRunRemembersRecentRuns: an agent that has run nothing holds no
// run memory; once full, the oldest run id is forgotten first.
func TestNoteRunRemembersRecentRuns(t *testing.T) {
	a := &agentMem{known: map[string]struct{}{}}
	if cap(a.ring) != 0 {
		t.Fatalf("an idle agent holds %d run slots", cap(a.ring))
	}
	for i := range knownRunsMemory + 10 {
		if !a.noteRun(fmt.Sprintf("run-%d", i)) {
			t.Fatalf("run-%d reported as known", i)
		}
		if a.noteRun(fmt.Sprintf("run-%d", i)) {
			t.Fatalf("run-%d reported as new twice", i)
		}
	}
	if len(a.known) != knownRunsMemory || len(a.ring) != knownRunsMemory {
		t.Fatalf("%d known, %d in the ring, want %d", len(a.known), len(a.ring), knownRunsMemory)
	}
	for i := range 10 {
		if !a.noteRun(fmt.Sprintf("run-%d", i)) {
			t.Fatalf("run-%d, among the oldest, still remembered", i)
		}
	}
	if a.noteRun(fmt.Sprintf("run-%d", knownRunsMemory+9)) {
		t.Fatal("the newest run forgotten")
	}
}
