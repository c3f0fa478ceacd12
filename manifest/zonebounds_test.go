package manifest

import (
	"testing"
	"time"
)

// TestZoneBounds: for every half hour from 2030 to 2100 in zones with and
// without daylight saving time, the period around t contains t, ends after
// it, and holds one UTC offset; the method alone fails this on the last day
// of every leap year past the zone data (the reason ZoneBounds exists).
func TestZoneBounds(t *testing.T) {
	methodFaults := 0
	for _, name := range []string{"Europe/Berlin", "America/New_York", "Australia/Lord_Howe", "Antarctica/Troll", "Asia/Tokyo"} {
		loc, err := time.LoadLocation(name)
		if err != nil {
			t.Fatal(err)
		}
		for u := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC); u.Year() < 2100; u = u.Add(30 * time.Minute) {
			at := u.In(loc)
			if _, end := at.ZoneBounds(); !end.IsZero() && !end.After(at) {
				methodFaults++
			}
			start, end := ZoneBounds(at)
			if start.After(at) || !end.IsZero() && !end.After(at) {
				t.Fatalf("%s: ZoneBounds(%s) = [%s, %s) does not contain it", name, at, start, end)
			}
			_, off := at.Zone()
			if _, o := start.Zone(); !start.IsZero() && o != off {
				t.Fatalf("%s: ZoneBounds(%s) starts at %s with offset %d, not %d", name, at, start, o, off)
			}
			if _, o := end.Add(-time.Second).Zone(); !end.IsZero() && o != off {
				t.Fatalf("%s: ZoneBounds(%s) ends at %s, offset %d before it, not %d", name, at, end, o, off)
			}
		}
	}
	if methodFaults == 0 {
		t.Log("time.Time.ZoneBounds no longer shows the leap-year fault; ZoneBounds may become the method")
	}
}

// TestScheduleNextPastZoneData: a wildcard schedule whose next fire is years
// away, past a leap year's last day beyond the zone data, is still found
// (Next returned the zero time here while Go's ZoneBounds stood still).
func TestScheduleNextPastZoneData(t *testing.T) {
	s, err := ParseSchedule("0 */10 2 2 */7") // Feb 2 when a Sunday (cron: a '*' day-of-week ANDs)
	if err != nil {
		t.Fatal(err)
	}
	loc, err := time.LoadLocation("Europe/Berlin")
	if err != nil {
		t.Fatal(err)
	}
	got := s.Next(time.Date(2031, 2, 2, 20, 0, 0, 0, loc), loc)
	if want := time.Date(2042, 2, 2, 0, 0, 0, 0, loc); !got.Equal(want) {
		t.Fatalf("Next = %s, want %s", got, want)
	}
	for _, name := range []string{"America/New_York", "Australia/Lord_Howe"} {
		l, err := time.LoadLocation(name)
		if err != nil {
			t.Fatal(err)
		}
		got := s.Next(time.Date(2040, 12, 31, 12, 0, 0, 0, l), l)
		if want := time.Date(2042, 2, 2, 0, 0, 0, 0, l); !got.Equal(want) {
			t.Fatalf("%s: Next = %s, want %s", name, got, want)
		}
	}
}
