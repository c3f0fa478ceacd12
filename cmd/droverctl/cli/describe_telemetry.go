package cli

import (
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/drover/drover/api"
)

// writeRunTelemetry prints what a run wrote to $DROVER_OUTPUT and
// $DROVER_METRICS (samples in the Prometheus text form, label values
// quoted) and the notes saying what was cut.
func writeRunTelemetry(w io.Writer, r *api.Run) error {
	var b strings.Builder
	if r.Output != "" {
		b.WriteString("Output:\n")
		for _, line := range strings.Split(strings.TrimSuffix(r.Output, "\n"), "\n") {
			b.WriteString("  " + line + "\n")
		}
	}
	if len(r.Metrics) > 0 {
		b.WriteString("Metrics:\n")
		for _, m := range r.Metrics {
			b.WriteString("  " + m.Name)
			if len(m.Labels) > 0 {
				for i, k := range slices.Sorted(maps.Keys(m.Labels)) {
					sep := ","
					if i == 0 {
						sep = "{"
					}
					b.WriteString(sep + k + "=" + strconv.Quote(m.Labels[k]))
				}
				b.WriteString("}")
			}
			fmt.Fprintf(&b, " %s  (%s)\n", strconv.FormatFloat(m.Value, 'g', -1, 64), m.Type)
		}
	}
	if len(r.TelemetryNotes) > 0 {
		b.WriteString("Telemetry notes:\n")
		for _, n := range r.TelemetryNotes {
			b.WriteString("  " + n + "\n")
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}
