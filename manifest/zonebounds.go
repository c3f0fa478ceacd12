package manifest

import "time"

// ZoneBounds is t.ZoneBounds() with one fault of Go's time package corrected.
// Past the last transition listed in the zone data (2037 in today's files),
// Go derives periods from the zone's rule string one year at a time, and for
// the last day of a leap year (2040-12-31, 2044-12-31, … in UTC) it reports an
// end at the start of that day, which is not after t. Loops that step from
// period to period then stop moving. Here the end of such a period is the
// start of the next UTC year, where Go's own yearly periods begin; no zone's
// rules change its offset between those two instants.
//
// Every caller that walks zone periods in this module uses ZoneBounds instead
// of the method.
func ZoneBounds(t time.Time) (start, end time.Time) {
	start, end = t.ZoneBounds()
	if !end.IsZero() && !end.After(t) {
		u := t.UTC()
		end = time.Date(u.Year()+1, time.January, 1, 0, 0, 0, 0, time.UTC).In(t.Location())
	}
	return start, end
}
