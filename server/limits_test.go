package server

import (
	"fmt"
	"runtime"
	"testing"
)

// TestNoteRunRemembersRecentRuns: an agent that has run nothing holds no
// run memory; once full, the oldest run id is forgotten first.
func TestNoteRunRemembersRecentRuns(t *testing.T) {
	a := &agentMem{}
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
	if len(a.ring) != knownRunsMemory {
		t.Fatalf("%d in the ring, want %d", len(a.ring), knownRunsMemory)
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

// TestRunMemoryPerAgent: a full run-id memory costs an agent 8 bytes per
// run, not the ~110 of the id string in a map.
func TestRunMemoryPerAgent(t *testing.T) {
	const agents = 100
	as := make([]*agentMem, agents)
	var ms runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&ms)
	before := ms.HeapAlloc
	for i := range as {
		as[i] = &agentMem{}
		for j := range knownRunsMemory {
			as[i].noteRun(fmt.Sprintf("01JH%022d", i*10000+j)) // the length of the agent's run ids
		}
	}
	runtime.GC()
	runtime.ReadMemStats(&ms)
	per := float64(int64(ms.HeapAlloc)-int64(before)) / agents
	t.Logf("%.1f KiB per agent with %d runs remembered", per/1024, knownRunsMemory)
	if per > 12<<10 {
		t.Errorf("%.1f KiB per agent for its run-id memory, want at most 12", per/1024)
	}
	runtime.KeepAlive(as)
}

// BenchmarkNoteRunKnown is the cost of a log chunk of a run the full
// memory holds, found newest first, and of one it does not hold.
func BenchmarkNoteRunKnown(b *testing.B) {
	a := &agentMem{}
	for j := range knownRunsMemory {
		a.noteRun(fmt.Sprintf("01JH%022d", j))
	}
	latest := fmt.Sprintf("01JH%022d", knownRunsMemory-1)
	b.Run("latest", func(b *testing.B) {
		for b.Loop() {
			a.noteRun(latest)
		}
	})
	b.Run("absent", func(b *testing.B) {
		a := &agentMem{ring: append([]uint64(nil), a.ring...), ringNext: a.ringNext}
		for i := 0; b.Loop(); i++ {
			a.noteRun(latest)
			a.ring[(a.ringNext+knownRunsMemory-1)%knownRunsMemory] = uint64(i) // forget it again
		}
	})
}
