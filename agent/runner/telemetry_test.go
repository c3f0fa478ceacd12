package runner

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/drover/drover/internal/telemetry"
	"github.com/drover/drover/internal/testkit"
	"github.com/drover/drover/manifest"
	agentpb "github.com/drover/drover/proto"
)

func sampleMap(ms []*agentpb.MetricSample) map[string]*agentpb.MetricSample {
	out := map[string]*agentpb.MetricSample{}
	for _, m := range ms {
		out[m.Name+"/"+m.Labels["table"]] = m
	}
	return out
}

// TestTelemetryShipsWithRunFinished: a pipe writes $DROVER_METRICS and
// $DROVER_OUTPUT; their contents are in RunFinished and the files are gone.
func TestTelemetryShipsWithRunFinished(t *testing.T) {
	f := newPipe(t, manifest.Spec{Script: `set -e
test -f "$DROVER_METRICS" && test -f "$DROVER_OUTPUT"
echo "$DROVER_METRICS" > ` + filepath.Join(t.TempDir(), "x") + `
cat >> "$DROVER_METRICS" <<'M'
# HELP backup_rows_total Rows copied.
# TYPE backup_rows_total counter
backup_rows_total{table="users"} 42
backup_rows_total{table="orders",note="a \"quoted\" value"} 7 1700000000000
# TYPE backup_size_bytes gauge
backup_size_bytes 1.5e+09
M
echo "dump=/srv/backup/2026.tar" >> "$DROVER_OUTPUT"
echo "rows=49" >> "$DROVER_OUTPUT"
`})
	res := f.run(f.opts())
	if res.ExitCode != 0 {
		t.Fatalf("result %+v, stderr %s", res, f.stderr)
	}
	r := only(t, f)
	fin := r.finished
	if fin.Output != "dump=/srv/backup/2026.tar\nrows=49\n" || len(fin.TelemetryNotes) != 0 {
		t.Fatalf("output %q notes %q", fin.Output, fin.TelemetryNotes)
	}
	m := sampleMap(fin.Metrics)
	if len(fin.Metrics) != 3 || m["backup_rows_total/users"].GetValue() != 42 || m["backup_rows_total/users"].Type != "counter" ||
		m["backup_rows_total/users"].Help != "Rows copied." || m["backup_rows_total/orders"].Labels["note"] != `a "quoted" value` ||
		m["backup_size_bytes/"].GetValue() != 1.5e9 || m["backup_size_bytes/"].Type != "gauge" {
		t.Fatalf("metrics %v", fin.Metrics)
	}
	// The run's telemetry directory is removed after the run.
	ents, _ := os.ReadDir(f.spoolDir)
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), telemetryDirPrefix) {
			t.Fatalf("telemetry dir %s left behind", e.Name())
		}
	}
	// The payload does not see the runner's own DROVER_METRICS.
	f2 := newPipe(t, manifest.Spec{Script: "echo $DROVER_METRICS\n"})
	f2.run(f2.opts("DROVER_METRICS=/etc/passwd"))
	if out := f2.stdout.String(); !strings.Contains(out, telemetryDirPrefix) {
		t.Fatalf("DROVER_METRICS %q", out)
	}
}

// TestTelemetryCapsAndMalformed: oversized output, too many samples and
// malformed lines are cut with markers; the run still succeeds, and so does
// a failing run keep its telemetry.
func TestTelemetryCapsAndMalformed(t *testing.T) {
	f := newPipe(t, manifest.Spec{Script: `
i=0; while [ $i -lt 150 ]; do echo "job_items{n=\"$i\"} $i" >> "$DROVER_METRICS"; i=$((i+1)); done
echo 'not a metric line at all' >> "$DROVER_METRICS"
echo 'bad{x="1"} notanumber' >> "$DROVER_METRICS"
echo 'nan_value NaN' >> "$DROVER_METRICS"
printf '# TYPE lat histogram\nlat_bucket{le="1"} 3\n' >> "$DROVER_METRICS"
head -c 100000 /dev/zero | tr '\0' 'a' | fold -w 99 | sed 's/^/k=/' >> "$DROVER_OUTPUT"
printf 'bin=\377\n' >> "$DROVER_OUTPUT"
exit 3
`})
	res := f.run(f.opts())
	if res.Runs[0].Status != agentpb.RunStatus_RUN_STATUS_FAILED || res.Runs[0].ExitCode != 3 {
		t.Fatalf("result %+v", res.Runs[0])
	}
	r := only(t, f)
	fin := r.finished
	if len(fin.Output) > MaxOutputBytes || !strings.HasSuffix(fin.Output, OutputTruncatedMarker+" at 65536 bytes\n") || !strings.HasPrefix(fin.Output, "k=aaa") {
		t.Fatalf("output: %d bytes, ends %q", len(fin.Output), fin.Output[max(0, len(fin.Output)-80):])
	}
	if len(fin.Metrics) != MaxMetricSamples {
		t.Fatalf("%d samples", len(fin.Metrics))
	}
	notes := strings.Join(fin.TelemetryNotes, "\n")
	for _, want := range []string{"output: larger than 65536 bytes, cut", "metrics: line 151 dropped", "3 malformed lines", "1 histogram or summary", "50 samples over the limit of 100"} {
		if !strings.Contains(notes, want) {
			t.Errorf("notes lack %q:\n%s", want, notes)
		}
	}
	// The notes are in the run's log too.
	if log := r.text(agentpb.LogStream_LOG_STREAM_SYSTEM); !strings.Contains(log, "drover-agent: telemetry: metrics: 50 samples over the limit") {
		t.Errorf("system log %q", log)
	}

	// Invalid UTF-8 in a small output is replaced, with a note.
	f = newPipe(t, manifest.Spec{Script: `printf 'bin=\377\nplain line\n' >> "$DROVER_OUTPUT"; rm -f "$DROVER_METRICS"; mkfifo "$DROVER_METRICS"`})
	f.run(f.opts())
	fin = only(t, f).finished
	if fin.Status != agentpb.RunStatus_RUN_STATUS_SUCCEEDED || fin.Output != "bin=\uFFFD\nplain line\n" {
		t.Fatalf("finished %v", fin)
	}
	notes = strings.Join(fin.TelemetryNotes, "\n")
	for _, want := range []string{"invalid UTF-8 replaced", "1 lines are not key=value", "metrics: not a regular file"} {
		if !strings.Contains(notes, want) {
			t.Errorf("notes lack %q: %q", want, notes)
		}
	}
}

// TestTelemetryAsUnprivilegedUser: under a dynamic user (here uid 65534
// with a StateDirectory= of its own) the run can write both files.
func TestTelemetryAsUnprivilegedUser(t *testing.T) {
	if os.Geteuid() != 0 {
		testkit.Unavailable(t, "needs root")
	}
	const uid = 65534
	f := newPipe(t, manifest.Spec{Script: "echo 'up 1' > $DROVER_METRICS\necho who=$(id -u) >> $DROVER_OUTPUT\n"})
	cmd, state := f.runnerAsUser(uid)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("runner as uid %d: %v\n%s", uid, err, out)
	}
	f.spoolDir = filepath.Join(state, "spool")
	fin := only(t, f).finished
	if fin.Output != "who=65534\n" || len(fin.Metrics) != 1 || fin.Metrics[0].Name != "up" || fin.Metrics[0].Value != 1 {
		t.Fatalf("finished %v", fin)
	}
}

// TestStaleTelemetryRemoved: a directory a crashed run left is removed by
// the next run.
func TestStaleTelemetryRemoved(t *testing.T) {
	f := newPipe(t, manifest.Spec{Script: "true\n"})
	stale := filepath.Join(f.spoolDir, telemetryDirPrefix+"old")
	if err := os.MkdirAll(stale, 0o700); err != nil {
		t.Fatal(err)
	}
	f.run(f.opts())
	if _, err := os.Stat(stale); !os.IsNotExist(err) {
		t.Fatalf("stale dir: %v", err)
	}
}

// TestTelemetryUnderCronBackend: the cron backend's environment (the
// spool in D/runs/<name>/spool) gives the run its telemetry files too.
func TestTelemetryUnderCronBackend(t *testing.T) {
	data := t.TempDir()
	f := &fixture{t: t, pipeDir: filepath.Join(data, "pipes", "demo"), secrets: filepath.Join(data, "secrets", "demo"),
		stdout: &testkit.Buffer{}, stderr: &testkit.Buffer{}}
	layoutPipe(t, f, manifest.Spec{Name: "demo", Schedule: "* * * * *", Script: "echo 'cron_up 1' >> $DROVER_METRICS\necho via=cron >> $DROVER_OUTPUT\n"})
	opts := f.opts("DROVER_PIPE_DIR="+f.pipeDir, "DROVER_TRIGGER=api", "DROVER_RUN_ID=cron-run-1", "DROVER_REQUEST_ID=req-1")
	opts.PipeDir, opts.SpoolDir = "", ""
	f.run(opts)
	f.spoolDir = filepath.Join(data, "runs", "demo", "spool")
	fin := only(t, f).finished
	if fin.Output != "via=cron\n" || len(fin.Metrics) != 1 || fin.Metrics[0].Name != "cron_up" {
		t.Fatalf("finished %v", fin)
	}
}

// FuzzParseMetrics: any file content yields valid samples within the caps,
// never a panic.
func FuzzParseMetrics(f *testing.F) {
	f.Add([]byte("# TYPE a counter\na_total{x=\"1\\\"\\n\",y=\"\"} 3 17\nb 1e3\n"))
	f.Add([]byte("c{ } 1\nd{x=\"unterminated} 2\n# HELP\n{} 1\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		var rt runTelemetry
		for _, s := range parseMetrics(&rt, b) {
			if !telemetryValid(s) {
				t.Fatalf("invalid sample %v", s)
			}
		}
		if len(rt.notes) > maxNotes {
			t.Fatalf("%d notes", len(rt.notes))
		}
		if out := cleanOutput(&rt, b, false); !utf8.ValidString(out) {
			t.Fatalf("output %q is not UTF-8", out)
		}
	})
}

func telemetryValid(s *agentpb.MetricSample) bool {
	if !telemetry.ValidMetricName(s.Name) || !telemetry.ValidType(s.Type) || len(s.Labels) > telemetry.MaxLabels {
		return false
	}
	for k, v := range s.Labels {
		if !telemetry.ValidLabelName(k) || len(v) > telemetry.MaxLabelValue || !utf8.ValidString(v) {
			return false
		}
	}
	return utf8.ValidString(s.Help)
}
