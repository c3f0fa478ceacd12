package units

import (
	"errors"

	"github.com/drover/drover/manifest"
)

// STUB: replaced by the calendar translation.

// OnCalendar translates a cron schedule into systemd OnCalendar= values with
// the time zone appended. It returns two values when both day fields restrict.
// "@every" schedules have no calendar form and return an error.
func OnCalendar(s *manifest.Schedule, tz string) ([]string, error) {
	return nil, errors.New("not implemented")
}
