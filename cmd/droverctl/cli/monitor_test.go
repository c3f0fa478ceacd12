package cli

import (
	"strings"
	"testing"
	"time"

	agentpb "github.com/drover/drover/proto"
)

// monitoredPipe is a server with two agents tagged role=mon and the pipe
// nightly on both, every minute; fire is a fire time three minutes ago.
func monitoredPipe(t *testing.T) (ts *testServer, a, b *fakeAgent, fire time.Time) {
	t.Helper()
	ts = startServer(t)
	tags := map[string]string{"role": "mon"}
	a = ts.enroll("mon-1", tags, true)
	b = ts.enroll("mon-2", tags, true)
	if code, body := ts.api("PUT", "/api/v1/pipes/nightly", map[string]any{"spec": map[string]any{
		"schedule": "* * * * *", "script": "true", "targets": map[string]any{"tags": tags}}}); code != 201 {
		t.Fatalf("put pipe: %d %s", code, body)
	}
	return ts, a, b, time.Now().UTC().Truncate(time.Minute).Add(-3 * time.Minute)
}

// get fires prints one line per fire time with the agents expected and
// their runs per status; get events lists the failure, filtered by kind.
func TestGetFiresAndEvents(t *testing.T) {
	ts, a, b, fire := monitoredPipe(t)
	a.runFinished("r-a", "nightly", 1, agentpb.RunStatus_RUN_STATUS_SUCCEEDED, 0, fire, time.Second, 0)
	b.runFinished("r-b", "nightly", 1, agentpb.RunStatus_RUN_STATUS_FAILED, 1, fire, time.Second, 0)

	// droverctl's clock in tests is not the server's: give the window.
	since := fire.Add(-10 * time.Minute).Format(time.RFC3339)
	r := ts.ctlOK("get", "fires", "nightly", "--since", since)
	want := fire.Format("15:04") + "  2 expected  1 succeeded  1 failed"
	if !strings.Contains(r.stdout, want+"\n") {
		t.Fatalf("get fires: want a line %q:\n%s", want, r)
	}
	r = ts.ctlOK("get", "fires", "nightly", "--since", since, "-o", "json")
	if !strings.Contains(r.stdout, `"expected": 2`) {
		t.Fatalf("get fires -o json:\n%s", r)
	}
	r = ts.ctlOK("get", "events", "--kind", "run.failed")
	if !strings.Contains(r.stdout, "run.failed") || !strings.Contains(r.stdout, "r-b") || strings.Contains(r.stdout, "r-a") {
		t.Fatalf("get events --kind run.failed:\n%s", r)
	}
	r = ts.ctlOK("get", "events", "--pipe", "other")
	if strings.Contains(r.stdout, "r-b") {
		t.Fatalf("get events --pipe other:\n%s", r)
	}
	for _, args := range [][]string{{"get", "events", "--kind", "bogus"}, {"get", "fires"}, {"get", "fires", "Bad_Name"},
		{"get", "fires", "nightly", "--kind", "run.failed"}, {"get", "events", "--status", "failed"}} {
		if r := ts.ctl(args...); r.code == 0 {
			t.Errorf("%v succeeded:\n%s", args, r)
		}
	}
	if r := ts.ctl("get", "fires", "nope"); r.code == 0 || !strings.Contains(r.stderr, "not found") {
		t.Errorf("get fires nope:\n%s", r)
	}
}
