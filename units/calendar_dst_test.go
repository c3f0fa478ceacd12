package units

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/drover/drover/manifest"
)

// TestCorrectionsCompact: busy schedules get a few lines per offset change,
// not one per instant, and every line is an absolute UTC value.
func TestCorrectionsCompact(t *testing.T) {
	now := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	for _, zone := range oracleDSTZones {
		loc, _ := manifest.LoadLocation(zone)
		changes := len(Transitions(loc, now.Add(-3*24*time.Hour), now.Add(CorrectionHorizon+3*24*time.Hour)))
		for _, e := range []string{"* * * * *", "*/5 * * * *", "*/7 * * * *", "30 2 * * *"} {
			corr, err := Corrections(calParse(t, e), zone, now)
			if err != nil {
				t.Fatal(err)
			}
			if len(corr) == 0 || len(corr) > 6*changes {
				t.Errorf("%q in %s: %d lines for %d changes", e, zone, len(corr), changes)
			}
			for _, l := range corr {
				if !strings.HasSuffix(l, " UTC") || len(l) > 200 || l[4] != '-' {
					t.Errorf("%q in %s: line %q", e, zone, l)
				}
			}
		}
	}
	for _, zone := range []string{"UTC", "", "Asia/Kolkata", "Asia/Tokyo"} {
		if corr, _ := Corrections(calParse(t, "*/5 * * * *"), zone, now); len(corr) != 0 {
			t.Errorf("%q: corrections %q", zone, corr)
		}
	}
	if corr, err := Corrections(calParse(t, "@every 5m"), "Europe/Berlin", now); err != nil || len(corr) != 0 {
		t.Errorf("@every: %q, %v", corr, err)
	}
}

// TestCorrectionsQuantized: only the UTC day of now matters, and the lines
// change when an offset change enters or leaves the window.
func TestCorrectionsQuantized(t *testing.T) {
	s := calParse(t, "30 2 * * *")
	day := time.Date(2027, 3, 1, 0, 0, 0, 0, time.UTC)
	a, _ := Corrections(s, "America/New_York", day)
	b, _ := Corrections(s, "America/New_York", day.Add(23*time.Hour+59*time.Minute))
	if !slices.Equal(a, b) {
		t.Errorf("same day, different lines:\n%q\n%q", a, b)
	}
	// 2027-03-14 leaves the window after its second local day has passed.
	after, _ := Corrections(s, "America/New_York", time.Date(2027, 3, 17, 0, 0, 0, 0, time.UTC))
	if !slices.Contains(a, "2027-03-14 07:00:00 UTC") || slices.Contains(after, "2027-03-14 07:00:00 UTC") {
		t.Errorf("window: %q then %q", a, after)
	}
	// The change of 2028-03-12 enters 400 days before its window ends.
	enter := time.Date(2028, 3, 12, 0, 0, 0, 0, time.UTC).Add(-CorrectionHorizon)
	before, _ := Corrections(s, "America/New_York", enter.Add(-6*24*time.Hour))
	in, _ := Corrections(s, "America/New_York", enter)
	if slices.Contains(before, "2028-03-12 07:00:00 UTC") || !slices.Contains(in, "2028-03-12 07:00:00 UTC") {
		t.Errorf("entering: %q then %q", before, in)
	}
}

// TestTimerCalendar: the translation first, then the corrections.
func TestTimerCalendar(t *testing.T) {
	s := calParse(t, "0 2 13 * 0") // Sundays: the changes in Berlin
	lines, err := TimerCalendar(s, "Europe/Berlin", time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC))
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"*-*-13 02:00:00 Europe/Berlin", "Sun *-*-* 02:00:00 Europe/Berlin"}
	if len(lines) < 3 || !slices.Equal(lines[:2], want) {
		t.Errorf("lines %q", lines)
	}
	if _, err := TimerCalendar(calParse(t, "@every 1h"), "UTC", time.Now()); err == nil {
		t.Error("@every: no error")
	}
}

// TestTransitionsPastZoneData: a span across the last day of a leap year past
// the zone data still lists the next year's changes (Go's ZoneBounds stands
// still on that day; manifest.ZoneBounds corrects it).
func TestTransitionsPastZoneData(t *testing.T) {
	loc, err := manifest.LoadLocation("Europe/Berlin")
	if err != nil {
		t.Fatal(err)
	}
	got := Transitions(loc, time.Date(2040, 12, 1, 0, 0, 0, 0, time.UTC), time.Date(2041, 12, 1, 0, 0, 0, 0, time.UTC))
	want := []time.Time{time.Date(2041, 3, 31, 1, 0, 0, 0, time.UTC), time.Date(2041, 10, 27, 1, 0, 0, 0, time.UTC)}
	if !slices.EqualFunc(got, want, time.Time.Equal) {
		t.Fatalf("Transitions = %v, want %v", got, want)
	}
}
