package store

import (
	"encoding/json"

	"github.com/drover/drover/api"
)

// A run's metrics and telemetry notes are kept as JSON arrays in one text
// column each ("" when the run wrote none), in every store.

// EncodeTelemetry returns the stored form of a run's metrics and notes.
func EncodeTelemetry(metrics []api.MetricSample, notes []string) (string, string) {
	return jsonList(metrics), jsonList(notes)
}

func jsonList[T any](v []T) string {
	if len(v) == 0 {
		return ""
	}
	b, err := json.Marshal(v)
	if err != nil {
		return ""
	}
	return string(b)
}

// DecodeTelemetry reads what EncodeTelemetry stored.
func DecodeTelemetry(metrics, notes string) ([]api.MetricSample, []string) {
	var m []api.MetricSample
	var n []string
	if metrics != "" {
		_ = json.Unmarshal([]byte(metrics), &m)
	}
	if notes != "" {
		_ = json.Unmarshal([]byte(notes), &n)
	}
	return m, n
}
