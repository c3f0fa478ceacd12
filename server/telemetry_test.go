package server

import (
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/drover/drover/api"
	"github.com/drover/drover/internal/testkit"
	agentpb "github.com/drover/drover/proto"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// promtoolCheck runs promtool check metrics on a scrape.
func promtoolCheck(t *testing.T, text string) {
	t.Helper()
	promtool := testkit.RequireCommand(t, "promtool", "Debian package prometheus")
	cmd := exec.Command(promtool, "check", "metrics")
	cmd.Stdin = strings.NewReader(text)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("promtool check metrics: %v\n%s", err, out)
	}
}

func finishedRun(id string, status agentpb.RunStatus, at time.Time, output string, samples ...*agentpb.MetricSample) []*agentpb.AgentMessage {
	return []*agentpb.AgentMessage{
		{Body: &agentpb.AgentMessage_RunStarted{RunStarted: &agentpb.RunStarted{RunId: id, Pipe: "job", StartedAt: timestamppb.New(at.Add(-time.Second))}}},
		{Body: &agentpb.AgentMessage_RunFinished{RunFinished: &agentpb.RunFinished{RunId: id, Pipe: "job", Status: status, DurationMs: 1000,
			StartedAt: timestamppb.New(at.Add(-time.Second)), FinishedAt: timestamppb.New(at), Output: output, Metrics: samples,
			TelemetryNotes: []string{"metrics: 3 samples over the limit of 100 dropped"}}}},
	}
}

// TestPipeTelemetry: what a run wrote to $DROVER_METRICS and
// $DROVER_OUTPUT, sent over a real agent stream, is on the run (invalid
// samples dropped with a note naming the field), on /metrics (promtool
// clean), and gone from /metrics with the pipe.
func TestPipeTelemetry(t *testing.T) {
	ts := startServer(t)
	viewer, _ := ts.apiToken("prometheus", "viewer", "")
	a, st := ts.jobStream()
	at := time.Date(2026, 5, 1, 2, 30, 0, 0, time.UTC)
	msgs := finishedRun("t1", agentpb.RunStatus_RUN_STATUS_SUCCEEDED, at, "dump=/srv/a.tar\nrows=49\n",
		&agentpb.MetricSample{Name: "backup_rows_total", Type: "counter", Help: "Rows copied.", Value: 42, Labels: map[string]string{"table": "users", "pipe": "theirs"}},
		&agentpb.MetricSample{Name: "bad name", Value: 1},
		&agentpb.MetricSample{Name: "backup_size_bytes", Type: "gauge", Value: 1.5e9},
		&agentpb.MetricSample{Name: "weird", Type: "histogram", Value: 1},
	)
	seq := sendAll(t, st, 1, msgs...)

	var run api.Run
	ts.as(viewer, 200, "GET", "/api/v1/runs/t1", nil, &run)
	if run.Output != "dump=/srv/a.tar\nrows=49\n" || len(run.Metrics) != 2 || run.Metrics[0].Name != "backup_rows_total" || run.Metrics[0].Labels["table"] != "users" ||
		run.Metrics[0].Type != "counter" || run.Metrics[1].Value != 1.5e9 {
		t.Fatalf("run telemetry %+v", run)
	}
	notes := strings.Join(run.TelemetryNotes, "\n")
	for _, want := range []string{"metrics: 3 samples over the limit", `server: metrics[1].name: "bad name" is not a metric name`, `server: metrics[3].type: "histogram"`} {
		if !strings.Contains(notes, want) {
			t.Errorf("notes lack %q: %q", want, notes)
		}
	}
	seq = sendAll(t, st, seq, finishedRun("t2", agentpb.RunStatus_RUN_STATUS_FAILED, at.Add(time.Hour), "")...)

	text := ts.scrape(viewer)
	for _, want := range []string{
		`# TYPE drover_pipe_backup_rows_total counter`,
		`# HELP drover_pipe_backup_rows_total Rows copied.`,
		`drover_pipe_backup_rows_total{agent="` + a.id + `",exported_pipe="theirs",pipe="job",table="users"} 42`,
		`drover_pipe_backup_size_bytes{agent="` + a.id + `",pipe="job"} 1.5e+09`,
		`drover_pipe_last_success_timestamp_seconds{agent="` + a.id + `",pipe="job"} 1.7776026e+09`,
		`drover_pipe_runs_failed_total{pipe="job"} 1`,
		`drover_pipe_series_dropped_total 0`,
		`drover_run_duration_seconds_count{pipe="job"} 2`,
	} {
		if !strings.Contains(text, want) {
			t.Errorf("metrics lack %q", want)
		}
	}
	if t.Failed() {
		t.Log(text)
	}
	promtoolCheck(t, text)

	// The series cap: samples over it are dropped and counted.
	ts.s.metrics.pipes.mu.Lock()
	ts.s.metrics.pipes.maxSeries = 1
	ts.s.metrics.pipes.mu.Unlock()
	sendAll(t, st, seq, finishedRun("t3", agentpb.RunStatus_RUN_STATUS_SUCCEEDED, at.Add(2*time.Hour), "",
		&agentpb.MetricSample{Name: "a_total", Type: "counter", Value: 1}, &agentpb.MetricSample{Name: "b", Value: 2},
		&agentpb.MetricSample{Name: "last_success_timestamp_seconds", Value: 3})...)
	text = ts.scrape(viewer)
	if !strings.Contains(text, `drover_pipe_series_dropped_total 2`) || !strings.Contains(text, `drover_pipe_a_total{agent="`+a.id+`",pipe="job"} 1`) ||
		strings.Contains(text, "drover_pipe_b{") || strings.Contains(text, "drover_pipe_backup_rows_total{") {
		t.Fatalf("series cap:\n%s", text)
	}
	promtoolCheck(t, text)

	// A deleted pipe's series vanish, drover_run_duration_seconds included.
	ts.as(ts.admin, 204, "DELETE", "/api/v1/pipes/job", nil, nil)
	text = ts.scrape(viewer)
	if m := regexp.MustCompile(`(?m)^.*pipe="job".*$`).FindString(text); m != "" {
		t.Fatalf("a series of the deleted pipe: %s", m)
	}
}

// TestDeletedAgentSeriesGo: the per-agent pipe series of a deleted agent
// vanish from /metrics; another agent's stay.
func TestDeletedAgentSeriesGo(t *testing.T) {
	ts := startServer(t)
	a, st := ts.jobStream()
	b := ts.enrollAgent(map[string]string{"job": "yes"})
	stb, err := b.openStream("")
	if err != nil {
		t.Fatal(err)
	}
	defer stb.close()
	at := time.Date(2026, 5, 1, 2, 30, 0, 0, time.UTC)
	sendAll(t, st, 1, finishedRun("da", agentpb.RunStatus_RUN_STATUS_SUCCEEDED, at, "", &agentpb.MetricSample{Name: "up", Value: 1})...)
	sendAll(t, stb, 1, finishedRun("db", agentpb.RunStatus_RUN_STATUS_SUCCEEDED, at, "", &agentpb.MetricSample{Name: "up", Value: 2})...)
	text := ts.scrape(ts.admin)
	for _, id := range []string{a.id, b.id} {
		if !strings.Contains(text, `drover_pipe_up{agent="`+id+`",pipe="job"}`) || !strings.Contains(text, `drover_pipe_last_success_timestamp_seconds{agent="`+id+`"`) {
			t.Fatalf("series of %s missing:\n%s", id, text)
		}
	}
	ts.as(ts.admin, 204, "DELETE", "/api/v1/agents/"+a.id, nil, nil)
	text = ts.scrape(ts.admin)
	if strings.Contains(text, a.id) || !strings.Contains(text, `drover_pipe_up{agent="`+b.id+`",pipe="job"} 2`) {
		t.Fatalf("after deleting %s:\n%s", a.id, text)
	}
}
