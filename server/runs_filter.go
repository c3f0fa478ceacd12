package server

import (
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/drover/drover/api"
	"github.com/drover/drover/server/errs"
	"github.com/drover/drover/server/store"
	"github.com/drover/drover/server/stream"
)

// checkRunFilter validates the query parameters of GET /api/v1/runs that
// RunFilter does not parse itself: status (one of the run statuses), reason
// (at most 256 printable characters), since/until and
// scheduled_since/scheduled_until (RFC 3339, since before until). Every
// problem is reported with its parameter.
func checkRunFilter(r *http.Request, f *store.RunFilter) error {
	var details []api.Detail
	if f.Status != "" && !slices.Contains(api.RunStatuses, f.Status) {
		details = append(details, api.Detail{Field: "status", Message: "not a run status (" + strings.Join(api.RunStatuses, ", ") + ")"})
	}
	if len(f.Reason) > stream.MaxReasonLen || stream.CleanText(f.Reason, stream.MaxReasonLen, false) != f.Reason {
		details = append(details, api.Detail{Field: "reason", Message: "at most 256 printable characters"})
	}
	times := []struct {
		name string
		dst  *time.Time
	}{{"since", &f.Since}, {"until", &f.Until}, {"scheduled_since", &f.ScheduledSince}, {"scheduled_until", &f.ScheduledUntil}}
	for _, t := range times {
		v, err := queryTime(r, t.name)
		if err != nil {
			details = append(details, errs.Details(err)...)
			continue
		}
		*t.dst = v
	}
	if !f.Since.IsZero() && !f.Until.IsZero() && !f.Since.Before(f.Until) {
		details = append(details, api.Detail{Field: "until", Message: "must be after since"})
	}
	if !f.ScheduledSince.IsZero() && !f.ScheduledUntil.IsZero() && !f.ScheduledSince.Before(f.ScheduledUntil) {
		details = append(details, api.Detail{Field: "scheduled_until", Message: "must be after scheduled_since"})
	}
	if len(details) > 0 {
		return errs.New(errs.ErrInvalidRequest, "invalid run filter", details...)
	}
	return nil
}
