// Package telemetry holds the caps and name rules of pipe telemetry (what a
// run writes to $DROVER_METRICS and $DROVER_OUTPUT; docs/monitoring.md,
// "Pipe telemetry"), shared by the runner that reads the files
// (agent/runner) and the server that checks and exports what arrives
// (server/stream, server). It imports nothing of Drover's.
package telemetry

import "strings"

// Caps of one run's telemetry.
const (
	MaxOutputBytes  = 64 << 10 // $DROVER_OUTPUT
	MaxSamples      = 100      // samples from $DROVER_METRICS
	MaxMetricsBytes = 1 << 20  // bytes of $DROVER_METRICS read
	MaxNameLen      = 128      // metric and label names
	MaxLabels       = 16       // labels per sample
	MaxLabelValue   = 256      // bytes per label value
	MaxHelpLen      = 256      // bytes of HELP text
	MaxNotes        = 8        // notes saying what was cut
	MaxNoteLen      = 256
)

// Sample types kept (histograms and summaries are not).
const (
	TypeCounter = "counter"
	TypeGauge   = "gauge"
	TypeUntyped = "untyped"
)

// ValidType says whether t is a kept sample type.
func ValidType(t string) bool {
	return t == TypeCounter || t == TypeGauge || t == TypeUntyped
}

// ValidMetricName says whether n is a Prometheus metric name of at most
// MaxNameLen bytes.
func ValidMetricName(n string) bool {
	if n == "" || len(n) > MaxNameLen {
		return false
	}
	for i, c := range n {
		if !(c == '_' || c == ':' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || i > 0 && c >= '0' && c <= '9') {
			return false
		}
	}
	return true
}

// ValidLabelName says whether n is a Prometheus label name of at most
// MaxNameLen bytes, not one of the reserved __ names.
func ValidLabelName(n string) bool {
	if n == "" || len(n) > MaxNameLen || strings.HasPrefix(n, "__") {
		return false
	}
	for i, c := range n {
		if !(c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || i > 0 && c >= '0' && c <= '9') {
			return false
		}
	}
	return true
}
