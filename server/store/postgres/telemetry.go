package postgres

import (
	"encoding/json"

	"github.com/drover/drover/api"
)

// The runs columns metrics and telemetry_notes hold JSON arrays ('' when
// the run wrote none).

func encodeJSONList[T any](v []T) string {
	if len(v) == 0 {
		return ""
	}
	b, err := json.Marshal(v)
	if err != nil {
		return ""
	}
	return string(b)
}

func decodeTelemetry(metrics, notes string) ([]api.MetricSample, []string) {
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
