package server

import (
	"testing"
	"time"
)

// A pipe PUT whose recompile takes longer than the wait answers with
// manifests.done false, the version stored; the recompile goes on, and the
// agent's manifest carries the new pipe once it lands. Here the recompile
// is held back by another compilation holding the compile lock (as a
// fleet-wide recompile already under way would).
func TestPutAnswersBeforeASlowRecompile(t *testing.T) {
	ts := startServer(t)
	tags := map[string]string{"role": "publish"}
	a := ts.enrollAgent(tags)

	if got := ts.putScriptPipe("quick", "echo 1", tags); got.Manifests == nil || !got.Manifests.Done || got.Manifests.Changed != 1 {
		t.Fatalf("a small change: manifests %+v, want done with 1 changed", got.Manifests)
	}

	c := ts.s.compiler.(compilerSeam).c
	c.mu.Lock()
	start := time.Now()
	got := ts.putScriptPipe("slow", "echo 2", tags)
	took := time.Since(start)
	if got.Manifests == nil || got.Manifests.Done || got.Version != 1 || !got.Created {
		c.mu.Unlock()
		t.Fatalf("while the compile lock is held: %+v (manifests %+v), want created and not done", got, got.Manifests)
	}
	if took < publishWait || took > publishWait+5*time.Second {
		t.Errorf("the PUT answered after %s (wait %s)", took, publishWait)
	}
	acc, err := a.pullManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(acc.Manifest.Pipes) != 1 {
		t.Fatalf("before the recompile: %d pipes", len(acc.Manifest.Pipes))
	}
	c.mu.Unlock()
	ts.s.publishing.Wait()
	acc, err = a.pullManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(acc.Manifest.Pipes) != 2 {
		t.Fatalf("after the background recompile: %d pipes, want 2", len(acc.Manifest.Pipes))
	}
}
