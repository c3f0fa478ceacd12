package server

import (
	"context"
	"strings"
	"testing"
	"time"
)

// TestRunLong: a run still running past its pipe's max_duration raises one
// run.long event; a pipe without max_duration raises none.
func TestRunLong(t *testing.T) {
	ts := startServer(t)
	ctx := context.Background()
	tags := map[string]string{"long": "yes"}
	a := ts.enrollAgent(tags)
	ts.putMonPipe("slow", tags, map[string]any{"schedule": "@daily", "max_duration": "5m"})
	ts.putMonPipe("unbounded", tags, map[string]any{"schedule": "@daily"})
	if r := ts.do("PUT", "/api/v1/pipes/bad", ts.admin, map[string]any{"spec": map[string]any{"script": "true", "schedule": "@daily", "max_duration": "1s"}}); r.code != 422 ||
		!strings.Contains(string(r.body), "max_duration") {
		t.Fatalf("max_duration 1s: %d %s", r.code, r.body)
	}
	st, err := a.openStream("")
	if err != nil {
		t.Fatal(err)
	}
	defer st.close()
	now := ts.clock.Now()
	sendAll(t, st, 1, started("long-1", "slow", now), started("long-2", "unbounded", now))
	if _, err := ts.s.monitor.pass(ctx); err != nil {
		t.Fatal(err)
	}
	if ev := ts.events("kind=run.long"); len(ev) != 0 {
		t.Fatalf("run.long before max_duration: %+v", ev)
	}
	ts.clock.Advance(6 * time.Minute)
	for range 2 {
		if _, err := ts.s.monitor.pass(ctx); err != nil {
			t.Fatal(err)
		}
	}
	ev := ts.events("kind=run.long")
	if len(ev) != 1 || ev[0].RunID != "long-1" || ev[0].Pipe != "slow" || ev[0].Agent != a.id || !strings.Contains(ev[0].Message, "(max_duration 5m0s)") {
		t.Fatalf("run.long events: %+v", ev)
	}
}
