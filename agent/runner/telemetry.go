package runner

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"unicode/utf8"

	"github.com/drover/drover/internal/telemetry"
	agentpb "github.com/drover/drover/proto"
)

// Pipe telemetry (docs/monitoring.md, "Pipe telemetry"): each run gets two
// empty files in a private directory of its own inside the spool directory
// (so that a dynamic user's run can write them):
//
//   - $DROVER_METRICS, Prometheus text-format samples, at most
//     MaxMetricSamples of them (the file is read up to MaxMetricsBytes);
//   - $DROVER_OUTPUT, key=value lines, at most MaxOutputBytes.
//
// After the run the runner reads them, cuts what is over the caps or
// malformed (saying so in a note, in the run's log and in
// RunFinished.telemetry_notes) and ships them with RunFinished. Telemetry
// never changes a run's status.
const (
	MaxOutputBytes   = telemetry.MaxOutputBytes
	MaxMetricSamples = telemetry.MaxSamples
	MaxMetricsBytes  = telemetry.MaxMetricsBytes
	maxNotes         = telemetry.MaxNotes

	// OutputTruncatedMarker starts the line that ends a cut output.
	OutputTruncatedMarker = "# drover: output truncated"

	telemetryDirPrefix = ".telemetry-"
	metricsFile        = "metrics.prom"
	outputFile         = "output"
)

// runTelemetry is what one run wrote to its telemetry files.
type runTelemetry struct {
	output  string
	metrics []*agentpb.MetricSample
	notes   []string
}

func (t *runTelemetry) notef(format string, args ...any) {
	if len(t.notes) < maxNotes {
		t.notes = append(t.notes, fmt.Sprintf(format, args...))
	}
}

// newTelemetryDir makes the run's private telemetry directory with its two
// empty files.
func (r *runner) newTelemetryDir() (dir string, err error) {
	dir, err = os.MkdirTemp(r.dir, telemetryDirPrefix)
	if err != nil {
		return "", err
	}
	for _, f := range []string{metricsFile, outputFile} {
		fh, err := os.OpenFile(filepath.Join(dir, f), os.O_WRONLY|os.O_CREATE|os.O_EXCL|noFollow, 0o600)
		if err != nil {
			os.RemoveAll(dir)
			return "", err
		}
		fh.Close()
	}
	return dir, nil
}

// removeStaleTelemetry removes the telemetry directories of runs that a
// crash left behind (called with the overlap lock held: no run is going).
func (r *runner) removeStaleTelemetry() {
	ents, err := os.ReadDir(r.dir)
	if err != nil {
		return
	}
	for _, e := range ents {
		if e.IsDir() && strings.HasPrefix(e.Name(), telemetryDirPrefix) {
			_ = os.RemoveAll(filepath.Join(r.dir, e.Name()))
		}
	}
}

// readTelemetry reads and removes a run's telemetry directory.
func readTelemetry(dir string) runTelemetry {
	var t runTelemetry
	defer os.RemoveAll(dir)
	out, over, err := readCapped(filepath.Join(dir, outputFile), MaxOutputBytes)
	if err != nil {
		t.notef("output: %v", err)
	}
	t.output = cleanOutput(&t, out, over)
	met, over, err := readCapped(filepath.Join(dir, metricsFile), MaxMetricsBytes)
	if err != nil {
		t.notef("metrics: %v", err)
	}
	if over {
		t.notef("metrics: the file is larger than %d bytes; only its first %d bytes were read", MaxMetricsBytes, MaxMetricsBytes)
		if i := bytes.LastIndexByte(met, '\n'); i >= 0 {
			met = met[:i+1]
		}
	}
	t.metrics = parseMetrics(&t, met)
	return t
}

// readCapped reads up to n bytes of a regular file; over says it is longer.
func readCapped(path string, n int) (b []byte, over bool, err error) {
	f, err := os.OpenFile(path, os.O_RDONLY|noFollow|syscall.O_NONBLOCK, 0)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, false, nil // the pipe removed it: nothing written
		}
		return nil, false, errors.New("cannot be read (not a regular file?)")
	}
	defer f.Close()
	if st, err := f.Stat(); err != nil || !st.Mode().IsRegular() {
		return nil, false, errors.New("not a regular file")
	}
	b, err = io.ReadAll(io.LimitReader(f, int64(n)+1))
	if err != nil {
		return nil, false, err
	}
	if len(b) > n {
		return b[:n], true, nil
	}
	return b, false, nil
}

// cleanOutput makes b valid UTF-8 and, when the file was longer than the
// cap, cuts it at a line end and appends the marker line.
func cleanOutput(t *runTelemetry, b []byte, over bool) string {
	if over {
		marker := fmt.Sprintf("%s at %d bytes\n", OutputTruncatedMarker, MaxOutputBytes)
		b = b[:MaxOutputBytes-len(marker)]
		if i := bytes.LastIndexByte(b, '\n'); i >= 0 {
			b = b[:i+1]
		} else {
			b = b[:0]
		}
		b = append(b, marker...)
		t.notef("output: larger than %d bytes, cut", MaxOutputBytes)
	}
	if !utf8.Valid(b) {
		b = bytes.ToValidUTF8(b, []byte("\uFFFD"))
		t.notef("output: invalid UTF-8 replaced")
	}
	bad := 0
	for _, line := range strings.Split(string(b), "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if k, _, ok := strings.Cut(line, "="); !ok || k == "" {
			bad++
		}
	}
	if bad > 0 {
		t.notef("output: %d lines are not key=value", bad)
	}
	return string(b)
}

// parseMetrics reads the Prometheus text format leniently: a malformed line
// is dropped with a note, the rest is kept. Histograms and summaries are
// not supported (dropped), nor non-finite values.
func parseMetrics(t *runTelemetry, b []byte) []*agentpb.MetricSample {
	types, helps := map[string]string{}, map[string]string{}
	var out []*agentpb.MetricSample
	index := map[string]int{}
	bad, dropped, skipped := 0, 0, 0
	for n, line := range strings.Split(string(b), "\n") {
		line = strings.TrimSpace(line)
		if line == "" {
			continue
		}
		if strings.HasPrefix(line, "#") {
			f := strings.Fields(line)
			if len(f) >= 3 && (f[1] == "TYPE" || f[1] == "HELP") && telemetry.ValidMetricName(f[2]) {
				if f[1] == "TYPE" && len(f) == 4 {
					types[f[2]] = f[3]
				} else if f[1] == "HELP" {
					_, help, _ := strings.Cut(strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(line[1:]), "HELP")), " ")
					helps[f[2]] = truncUTF8(strings.ToValidUTF8(help, "\uFFFD"), telemetry.MaxHelpLen)
				}
			}
			continue
		}
		s, err := parseSample(line)
		if err != nil {
			if bad == 0 {
				t.notef("metrics: line %d dropped: %v", n+1, err)
			}
			bad++
			continue
		}
		typ := types[s.Name]
		for _, suf := range []string{"_bucket", "_sum", "_count"} {
			if base, ok := strings.CutSuffix(s.Name, suf); ok && typ == "" && (types[base] == "histogram" || types[base] == "summary") {
				typ = types[base]
			}
		}
		switch typ {
		case "", "untyped":
			typ = "untyped"
		case "counter", "gauge":
		default:
			skipped++
			continue
		}
		s.Type, s.Help = typ, helps[s.Name]
		key := sampleKey(s)
		if i, ok := index[key]; ok {
			out[i] = s // the last value written wins
			continue
		}
		if len(out) == MaxMetricSamples {
			dropped++
			continue
		}
		index[key] = len(out)
		out = append(out, s)
	}
	if bad > 1 {
		t.notef("metrics: %d malformed lines dropped in all", bad)
	}
	if skipped > 0 {
		t.notef("metrics: %d histogram or summary samples dropped (only counter, gauge and untyped are kept)", skipped)
	}
	if dropped > 0 {
		t.notef("metrics: %d samples over the limit of %d dropped", dropped, MaxMetricSamples)
	}
	return out
}

func sampleKey(s *agentpb.MetricSample) string {
	var b strings.Builder
	b.WriteString(s.Name)
	for _, k := range slices.Sorted(maps.Keys(s.Labels)) {
		b.WriteString("\x00" + k + "\x00" + s.Labels[k])
	}
	return b.String()
}

// parseSample parses `name{label="value",...} value [timestamp]`.
func parseSample(line string) (*agentpb.MetricSample, error) {
	i := strings.IndexAny(line, "{ \t")
	if i < 0 {
		return nil, errors.New("no value")
	}
	s := &agentpb.MetricSample{Name: line[:i]}
	if !telemetry.ValidMetricName(s.Name) {
		return nil, fmt.Errorf("invalid metric name %q", truncUTF8(strings.ToValidUTF8(s.Name, "?"), 40))
	}
	rest := line[i:]
	if rest[0] == '{' {
		labels, after, err := parseLabels(rest[1:])
		if err != nil {
			return nil, err
		}
		s.Labels, rest = labels, after
	}
	f := strings.Fields(rest)
	if len(f) < 1 || len(f) > 2 {
		return nil, errors.New("expected a value and an optional timestamp")
	}
	v, err := strconv.ParseFloat(f[0], 64)
	if err != nil {
		return nil, fmt.Errorf("invalid value %q", truncUTF8(strings.ToValidUTF8(f[0], "?"), 40))
	}
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return nil, errors.New("value is not finite")
	}
	s.Value = v
	return s, nil
}

func parseLabels(s string) (map[string]string, string, error) {
	labels := map[string]string{}
	for {
		s = strings.TrimLeft(s, " \t")
		if strings.HasPrefix(s, "}") {
			return labels, s[1:], nil
		}
		eq := strings.IndexByte(s, '=')
		if eq < 0 {
			return nil, "", errors.New("label without a value")
		}
		name := strings.TrimSpace(s[:eq])
		if !telemetry.ValidLabelName(name) {
			return nil, "", fmt.Errorf("invalid label name %q", truncUTF8(strings.ToValidUTF8(name, "?"), 40))
		}
		s = strings.TrimLeft(s[eq+1:], " \t")
		if !strings.HasPrefix(s, `"`) {
			return nil, "", errors.New("label value not quoted")
		}
		var v strings.Builder
		j := 1
		for ; j < len(s) && s[j] != '"'; j++ {
			if s[j] == '\\' && j+1 < len(s) {
				j++
				switch s[j] {
				case 'n':
					v.WriteByte('\n')
				default:
					v.WriteByte(s[j])
				}
				continue
			}
			v.WriteByte(s[j])
		}
		if j >= len(s) {
			return nil, "", errors.New("unterminated label value")
		}
		val := v.String()
		if len(val) > telemetry.MaxLabelValue || !utf8.ValidString(val) {
			return nil, "", fmt.Errorf("label %s: value longer than %d bytes or not UTF-8", name, telemetry.MaxLabelValue)
		}
		if _, dup := labels[name]; dup {
			return nil, "", fmt.Errorf("label %s repeated", name)
		}
		labels[name] = val
		if len(labels) > telemetry.MaxLabels {
			return nil, "", fmt.Errorf("more than %d labels", telemetry.MaxLabels)
		}
		s = strings.TrimPrefix(strings.TrimLeft(s[j+1:], " \t"), ",")
	}
}

func truncUTF8(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}
