package manifest

import (
	"strings"
	"testing"
	"time"
	"unicode"
)

// FuzzParseSchedule: ParseSchedule never panics; errors are one lowercase
// line; anything accepted round-trips through String, and its fire times from
// around DST changes are strictly increasing, on :00, matching the fields and
// equal to the minute-scan reference. The seed corpus is in
// testdata/fuzz/FuzzParseSchedule.
func FuzzParseSchedule(f *testing.F) {
	for _, e := range []string{"*/5 * * * *", "0 12 1 * 1", "@every 90s", "30 2 * * sun", "0 0 29 2 */7"} {
		f.Add(e)
	}
	zones := []*time.Location{time.UTC}
	for _, z := range []string{"Europe/Berlin", "Australia/Lord_Howe", "Antarctica/Troll"} {
		loc, err := time.LoadLocation(z)
		if err != nil {
			f.Fatal(err)
		}
		zones = append(zones, loc)
	}
	bases := []time.Time{
		time.Date(2026, 3, 29, 0, 50, 0, 0, time.UTC),   // Europe and Troll spring forward at 01:00Z
		time.Date(2026, 10, 24, 23, 50, 0, 0, time.UTC), // and fall back at 01:00Z
		time.Date(2026, 10, 3, 14, 50, 30, 0, time.UTC), // Lord Howe forward at 15:30Z
		time.Date(2026, 4, 4, 14, 20, 0, 0, time.UTC),   // Lord Howe back at 15:00Z
		time.Date(2027, 12, 31, 23, 58, 0, 1, time.UTC),
	}
	f.Fuzz(func(t *testing.T, expr string) {
		s, err := ParseSchedule(expr)
		if err != nil {
			msg := err.Error()
			if msg == "" || strings.ContainsAny(msg, "\n\r") || strings.HasPrefix(msg, "schedule") {
				t.Fatalf("ParseSchedule(%q): bad message %q", expr, msg)
			}
			if r := []rune(msg)[0]; unicode.IsUpper(r) {
				t.Fatalf("ParseSchedule(%q): message %q starts upper case", expr, msg)
			}
			if s != nil {
				t.Fatalf("ParseSchedule(%q) returned a schedule and an error", expr)
			}
			return
		}
		if s.String() != strings.TrimSpace(expr) {
			t.Fatalf("String() = %q for %q", s.String(), expr)
		}
		again, err := ParseSchedule(s.String())
		if err != nil {
			t.Fatalf("%q does not parse again: %v", s.String(), err)
		}
		f1, ok1 := s.Fields()
		f2, ok2 := again.Fields()
		if f1 != f2 || ok1 != ok2 {
			t.Fatalf("%q parses differently the second time", s.String())
		}
		if d, ok := s.Every(); ok {
			if d < time.Minute || d%time.Second != 0 || ok1 {
				t.Fatalf("%q: Every() = %v, Fields ok %v", expr, d, ok1)
			}
			if got := s.Next(bases[0], zones[1]); !got.Equal(bases[0].Add(d)) {
				t.Fatalf("%q: Next = %v, want after+%v", expr, got, d)
			}
			return
		}
		if !ok1 || f1.Minute == 0 || f1.Hour == 0 || f1.Dom == 0 || f1.Month == 0 || f1.Dow == 0 ||
			f1.Minute&^AllMinutes != 0 || f1.Hour&^AllHours != 0 || f1.Dom&^AllDoms != 0 || f1.Month&^AllMonths != 0 || f1.Dow&^AllDows != 0 {
			t.Fatalf("%q: bad fields %+v", expr, f1)
		}
		for _, loc := range zones {
			for _, base := range bases {
				at := base
				for i := 0; i < 4; i++ {
					got := s.Next(at, loc)
					if got.IsZero() || !got.After(at) {
						t.Fatalf("%q in %s: Next(%s) = %s, not after it", expr, loc, at, got)
					}
					w := got.In(loc)
					if w.Second() != 0 || w.Nanosecond() != 0 || !refMatches(s, w) && !gapEndInstant(got, loc) {
						t.Fatalf("%q in %s: Next(%s) = %s does not match", expr, loc, at, w)
					}
					if i == 0 {
						const window = 2 * 24 * 60
						want := refNext(s, at, loc, window)
						if !want.IsZero() && !got.Equal(want) || want.IsZero() && got.Sub(at) <= window*time.Minute {
							t.Fatalf("%q in %s: Next(%s) = %s, reference %s", expr, loc, at, w, want)
						}
					}
					at = got
				}
			}
		}
	})
}

// gapEndInstant reports whether t is an instant at which the clocks of loc
// moved forward: a fixed-time entry whose time fell in the gap fires there.
func gapEndInstant(t time.Time, loc *time.Location) bool {
	start, _ := t.In(loc).ZoneBounds()
	if !start.Equal(t) {
		return false
	}
	_, before := t.Add(-time.Second).In(loc).Zone()
	_, after := t.In(loc).Zone()
	return after > before
}
