package stream

import (
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/drover/drover/api"
	"github.com/drover/drover/internal/telemetry"
	agentpb "github.com/drover/drover/proto"
)

// cleanTelemetry checks the pipe telemetry of a RunFinished against the
// caps (internal/telemetry). What is over them or invalid is dropped with a
// note naming the field (e.g. `metrics[3].labels: ...`) and the rest kept:
// telemetry never costs a run its record.
func cleanTelemetry(x *agentpb.RunFinished) (output string, samples []api.MetricSample, notes []string) {
	for i, n := range x.GetTelemetryNotes() {
		if i == telemetry.MaxNotes {
			break
		}
		notes = append(notes, CleanText(n, telemetry.MaxNoteLen, false))
	}
	note := func(format string, args ...any) {
		if len(notes) < telemetry.MaxNotes+2 {
			notes = append(notes, CleanText("server: "+fmt.Sprintf(format, args...), telemetry.MaxNoteLen, false))
		}
	}
	output = x.GetOutput()
	if len(output) > telemetry.MaxOutputBytes {
		note("output: %d bytes, cut to %d", len(output), telemetry.MaxOutputBytes)
	}
	output = CleanText(output, telemetry.MaxOutputBytes, true)
	seen := map[string]bool{}
	for i, m := range x.GetMetrics() {
		if i == telemetry.MaxSamples {
			note("metrics: %d samples, kept the first %d", len(x.GetMetrics()), telemetry.MaxSamples)
			break
		}
		s, err := cleanSample(m)
		if err != nil {
			note("metrics[%d]%s", i, err)
			continue
		}
		k := sampleKey(s)
		if seen[k] {
			note("metrics[%d]: repeats an earlier sample", i)
			continue
		}
		seen[k] = true
		samples = append(samples, s)
	}
	return output, samples, notes
}

func cleanSample(m *agentpb.MetricSample) (api.MetricSample, error) {
	s := api.MetricSample{Name: m.GetName(), Value: m.GetValue(), Type: m.GetType(), Help: CleanText(m.GetHelp(), telemetry.MaxHelpLen, false)}
	if !telemetry.ValidMetricName(s.Name) {
		return s, fmt.Errorf(".name: %q is not a metric name of at most %d bytes", CleanText(s.Name, 40, false), telemetry.MaxNameLen)
	}
	if s.Type == "" {
		s.Type = telemetry.TypeUntyped
	}
	if !telemetry.ValidType(s.Type) {
		return s, fmt.Errorf(".type: %q is not counter, gauge or untyped", CleanText(s.Type, 40, false))
	}
	if math.IsNaN(s.Value) || math.IsInf(s.Value, 0) {
		return s, fmt.Errorf(".value: not finite")
	}
	if len(m.GetLabels()) > telemetry.MaxLabels {
		return s, fmt.Errorf(".labels: %d labels, at most %d", len(m.GetLabels()), telemetry.MaxLabels)
	}
	for k, v := range m.GetLabels() {
		if !telemetry.ValidLabelName(k) {
			return s, fmt.Errorf(".labels: %q is not a label name", CleanText(k, 40, false))
		}
		if len(v) > telemetry.MaxLabelValue || !utf8.ValidString(v) {
			return s, fmt.Errorf(".labels[%s]: value longer than %d bytes or not UTF-8", k, telemetry.MaxLabelValue)
		}
		if s.Labels == nil {
			s.Labels = map[string]string{}
		}
		s.Labels[k] = v
	}
	return s, nil
}

// sampleKey identifies a series: its name and label pairs, sorted.
func sampleKey(s api.MetricSample) string {
	var b strings.Builder
	b.WriteString(s.Name)
	for _, k := range slices.Sorted(maps.Keys(s.Labels)) {
		b.WriteString("\x00" + k + "\x00" + s.Labels[k])
	}
	return b.String()
}
