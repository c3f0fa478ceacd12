package manifest

import (
	"fmt"
	"math/rand"
	"strings"
	"testing"
	"time"
)

const supportedMsg = "use five fields (minute hour day-of-month month day-of-week), " +
	"@hourly, @daily, @midnight, @weekly, @monthly, @yearly, @annually or @every <duration>"

func TestParseScheduleErrors(t *testing.T) {
	quartz := func(elem, field string) string {
		return fmt.Sprintf("%q in the %s field is a Quartz extension: L, W, # and ? are not supported "+
			"(use numbers, names, ranges a-b, lists a,b and steps */n or a-b/n)", elem, field)
	}
	for _, c := range []struct{ expr, msg string }{
		{"", "empty schedule: " + supportedMsg},
		{"   \t ", "empty schedule: " + supportedMsg},
		{"@reboot", "@reboot is not supported: schedules are time based; " + supportedMsg},
		{"@REBOOT", "@reboot is not supported: schedules are time based; " + supportedMsg},
		{"@foo", `unknown descriptor "@foo": ` + supportedMsg},
		{"@", `unknown descriptor "@": ` + supportedMsg},
		{"@daily 5", `@daily takes no arguments, got "5"`},
		{"0 0 * * * *", "6 fields: a seconds (or year) field is not supported; use five fields: minute hour day-of-month month day-of-week"},
		{"0 0 0 * * ? 2026", "7 fields (Quartz seconds and year) are not supported; use five fields: minute hour day-of-month month day-of-week"},
		{"0 0 1 1", "4 fields: " + supportedMsg},
		{"0", "1 field: " + supportedMsg},
		{"0 0 * * */10000", "step 10000 in the day-of-week field is too large: at most 9999"},
		{"* * * * * * * *", "8 fields: " + supportedMsg},
		{"0 0 L * *", quartz("L", "day-of-month")},
		{"0 0 LW * *", quartz("LW", "day-of-month")},
		{"0 0 L-3 * *", quartz("L-3", "day-of-month")},
		{"0 0 15W * *", quartz("15W", "day-of-month")},
		{"0 0 * * 5L", quartz("5L", "day-of-week")},
		{"0 0 * * 1#2", quartz("1#2", "day-of-week")},
		{"0 0 ? * 1", quartz("?", "day-of-month")},
		{"0 0 * * ?", quartz("?", "day-of-week")},
		{"0 0 * * 8", "day-of-week 8 out of range 0-7"},
		{"60 * * * *", "minute 60 out of range 0-59"},
		{"0 24 * * *", "hour 24 out of range 0-23"},
		{"0 0 0 * *", "day-of-month 0 out of range 1-31"},
		{"0 0 32 * *", "day-of-month 32 out of range 1-31"},
		{"0 0 * 0 *", "month 0 out of range 1-12"},
		{"0 0 * 13 *", "month 13 out of range 1-12"},
		{"0 0 1-40 * *", "day-of-month 40 out of range 1-31"},
		{"99999999999 * * * *", "minute 99999999999 out of range 0-59"},
		{"*/0 * * * *", "step 0 in the minute field: a step must be at least 1"},
		{"0 1-5/0 * * *", "step 0 in the hour field: a step must be at least 1"},
		{"*/a * * * *", `invalid step in "*/a" in the minute field: a step is a whole number, as in */5`},
		{"5/ * * * *", `invalid step in "5/" in the minute field: a step is a whole number, as in */5`},
		{"/5 * * * *", `invalid element "/5" in the minute field: a step follows '*' or a range, as in */5 or 0-30/5`},
		{"5-1 * * * *", "reversed range 5-1 in the minute field: write the smaller value first"},
		{"0 0 * dec-jan *", "reversed range dec-jan in the month field: write the smaller value first"},
		{"* * * * mon-sun", "reversed range mon-sun in the day-of-week field: write the smaller value first (Sunday at the end of a range is 7, as in 1-7)"},
		{"1- * * * *", `invalid element "1-" in the minute field: a range is written a-b`},
		{"*-5 * * * *", `invalid element "*-5" in the minute field: '*' may only be followed by a step, as in */5`},
		{"1,,2 * * * *", `empty element in the minute field "1,,2"`},
		{"1, * * * *", `empty element in the minute field "1,"`},
		{"x * * * *", `invalid minute "x": use numbers 0-59`},
		{"-1 * * * *", `invalid element "-1" in the minute field: a range is written a-b`},
		{"+1 * * * *", `invalid minute "+1": use numbers 0-59`},
		{"0 mon * * *", `invalid hour "mon": use numbers 0-23`},
		{"* * * foo *", `invalid month "foo": use 1-12 or the names jan-dec`},
		{"0 0 * * monday", `invalid day-of-week "monday": use 0-7 or the names sun-sat`},
		{"0 0 * mon *", `invalid month "mon": use 1-12 or the names jan-dec`},
		{"0 0 30 2 *", "day-of-month 30 never occurs in month 2, so the schedule would never fire"},
		{"0 0 31 4,6,9,11 *", "day-of-month 31 never occurs in month 4,6,9,11, so the schedule would never fire"},
		{"0 0 30,31 feb *", "day-of-month 30,31 never occurs in month feb, so the schedule would never fire"},
		{"0 0 31 2 */2", "day-of-month 31 never occurs in month 2, so the schedule would never fire"},
		{"0 0 * * *\n0 1 * * *", `unexpected character '\n': a schedule is printable ASCII on one line`},
		{"0 0 * * ä", `unexpected character 'ä': a schedule is printable ASCII on one line`},
		{"@every", "@every needs a duration, e.g. @every 15m or @every 1h30m"},
		{"@every 5x", `@every: "5x" is not a duration (use e.g. 90s, 15m, 1h30m)`},
		{"@every 1h 2h", `@every takes one duration, got "1h 2h"`},
		{"@every 30s", "@every 30s is too short: the minimum interval is 1m"},
		{"@every 59.999s", "@every 59.999s is too short: the minimum interval is 1m"},
		{"@every -5m", "@every -5m is too short: the minimum interval is 1m"},
		{"@every 1m0.5s", "@every 1m0.5s has a fraction of a second: use whole seconds"},
		{"@every 90001ms", "@every 90001ms has a fraction of a second: use whole seconds"},
	} {
		s, err := ParseSchedule(c.expr)
		if err == nil {
			t.Errorf("ParseSchedule(%q) = %v, want error %q", c.expr, s, c.msg)
			continue
		}
		if err.Error() != c.msg {
			t.Errorf("ParseSchedule(%q):\n got %q\nwant %q", c.expr, err.Error(), c.msg)
		}
	}
}

// bitsOf builds a bitset from values.
func bitsOf(vals ...int) uint64 {
	var b uint64
	for _, v := range vals {
		b |= 1 << v
	}
	return b
}

func rangeBits(lo, hi, step int) uint64 {
	var b uint64
	for v := lo; v <= hi; v += step {
		b |= 1 << v
	}
	return b
}

func TestParseScheduleFields(t *testing.T) {
	all := Fields{Minute: AllMinutes, Hour: AllHours, Dom: AllDoms, Month: AllMonths, Dow: AllDows, DomStar: true, DowStar: true}
	with := func(mod func(*Fields)) Fields { f := all; mod(&f); return f }
	for _, c := range []struct {
		expr string
		want Fields
	}{
		{"* * * * *", all},
		{"  * * * * *  ", all},
		{"*\t*  * * *", all},
		{"*/15 * * * *", with(func(f *Fields) { f.Minute = bitsOf(0, 15, 30, 45) })},
		{"5/15 * * * *", with(func(f *Fields) { f.Minute = bitsOf(5, 20, 35, 50) })},
		{"10-40/10 * * * *", with(func(f *Fields) { f.Minute = bitsOf(10, 20, 30, 40) })},
		{"1,2,5-7,58-59 * * * *", with(func(f *Fields) { f.Minute = bitsOf(1, 2, 5, 6, 7, 58, 59) })},
		{"007 * * * *", with(func(f *Fields) { f.Minute = bitsOf(7) })},
		{"0 0-23/6 * * *", with(func(f *Fields) { f.Minute = 1; f.Hour = uint32(bitsOf(0, 6, 12, 18)) })},
		{"0 1/4 * * *", with(func(f *Fields) { f.Minute = 1; f.Hour = uint32(bitsOf(1, 5, 9, 13, 17, 21)) })},
		{"0 0 */10 * *", with(func(f *Fields) {
			f.Minute, f.Hour, f.Dom = 1, 1, uint32(bitsOf(1, 11, 21, 31))
		})},
		{"0 0 * jan,JUL,Dec *", with(func(f *Fields) { f.Minute, f.Hour, f.Month = 1, 1, uint16(bitsOf(1, 7, 12)) })},
		{"0 0 * feb-apr/2 *", with(func(f *Fields) { f.Minute, f.Hour, f.Month = 1, 1, uint16(bitsOf(2, 4)) })},
		{"0 0 * * 7", with(func(f *Fields) { f.Minute, f.Hour, f.Dow, f.DowStar = 1, 1, 1, false })},
		{"0 0 * * 0,7", with(func(f *Fields) { f.Minute, f.Hour, f.Dow, f.DowStar = 1, 1, 1, false })},
		{"0 0 * * 5-7", with(func(f *Fields) { f.Minute, f.Hour, f.Dow, f.DowStar = 1, 1, uint8(bitsOf(0, 5, 6)), false })},
		{"0 0 * * MON-fri", with(func(f *Fields) { f.Minute, f.Hour, f.Dow, f.DowStar = 1, 1, uint8(rangeBits(1, 5, 1)), false })},
		{"0 0 * * 1/2", with(func(f *Fields) { f.Minute, f.Hour, f.Dow, f.DowStar = 1, 1, uint8(bitsOf(0, 1, 3, 5)), false })},
		{"0 0 * * */1", with(func(f *Fields) { f.Minute, f.Hour = 1, 1 })},
		{"0 12 1 * 1", Fields{Minute: 1, Hour: 1 << 12, Dom: 1 << 1, Month: AllMonths, Dow: 1 << 1}},
		{"0 0 */2 * 1", Fields{Minute: 1, Hour: 1, Dom: uint32(rangeBits(1, 31, 2)), Month: AllMonths, Dow: 1 << 1, DomStar: true}},
		{"@yearly", Fields{Minute: 1, Hour: 1, Dom: 1 << 1, Month: 1 << 1, Dow: AllDows, DowStar: true}},
		{"@annually", Fields{Minute: 1, Hour: 1, Dom: 1 << 1, Month: 1 << 1, Dow: AllDows, DowStar: true}},
		{"@monthly", Fields{Minute: 1, Hour: 1, Dom: 1 << 1, Month: AllMonths, Dow: AllDows, DowStar: true}},
		{"@weekly", Fields{Minute: 1, Hour: 1, Dom: AllDoms, Month: AllMonths, Dow: 1, DomStar: true}},
		{"@daily", with(func(f *Fields) { f.Minute, f.Hour = 1, 1 })},
		{"@Midnight", with(func(f *Fields) { f.Minute, f.Hour = 1, 1 })},
		{"@hourly", with(func(f *Fields) { f.Minute = 1 })},
	} {
		s, err := ParseSchedule(c.expr)
		if err != nil {
			t.Errorf("ParseSchedule(%q): %v", c.expr, err)
			continue
		}
		got, ok := s.Fields()
		got.Wildcard = false // TestScheduleWildcard
		if !ok || got != c.want {
			t.Errorf("ParseSchedule(%q).Fields() = %+v, %v\nwant %+v", c.expr, got, ok, c.want)
		}
		if s.String() != strings.TrimSpace(c.expr) {
			t.Errorf("String() = %q, want %q", s.String(), strings.TrimSpace(c.expr))
		}
		if _, ok := s.Every(); ok {
			t.Errorf("%q: Every() reports an interval", c.expr)
		}
	}
}

func TestScheduleEvery(t *testing.T) {
	for _, c := range []struct {
		expr string
		d    time.Duration
	}{
		{"@every 1m", time.Minute},
		{"@every 90s", 90 * time.Second},
		{" @every  1h30m ", 90 * time.Minute},
		{"@EVERY 24h", 24 * time.Hour},
		{"@every 60000ms", time.Minute},
	} {
		s, err := ParseSchedule(c.expr)
		if err != nil {
			t.Fatalf("%q: %v", c.expr, err)
		}
		d, ok := s.Every()
		if !ok || d != c.d {
			t.Errorf("%q: Every() = %v, %v; want %v", c.expr, d, ok, c.d)
		}
		if _, ok := s.Fields(); ok {
			t.Errorf("%q: Fields() ok for @every", c.expr)
		}
		if s.String() != strings.TrimSpace(c.expr) {
			t.Errorf("String() = %q", s.String())
		}
		after := time.Date(2026, 3, 29, 1, 59, 30, 5, mustLoc(t, "Europe/Berlin"))
		if got := s.Next(after, after.Location()); !got.Equal(after.Add(c.d)) {
			t.Errorf("%q: Next = %v, want %v", c.expr, got, after.Add(c.d))
		}
	}
}

func mustLoc(t testing.TB, name string) *time.Location {
	t.Helper()
	loc, err := time.LoadLocation(name)
	if err != nil {
		t.Fatal(err)
	}
	return loc
}

// TestScheduleNext checks hand-computed fire times, the DST days of 2026
// included. "Z" times are UTC.
func TestScheduleNext(t *testing.T) {
	utc := func(s string) time.Time {
		tm, err := time.Parse("2006-01-02 15:04:05Z", s)
		if err != nil {
			t.Fatal(err)
		}
		return tm
	}
	for _, c := range []struct {
		expr, zone, after string   // after in UTC
		want              []string // successive fire times in UTC
	}{
		// Plain.
		{"*/5 * * * *", "UTC", "2026-05-01 10:02:59Z", []string{"2026-05-01 10:05:00Z", "2026-05-01 10:10:00Z"}},
		{"*/5 * * * *", "UTC", "2026-05-01 10:05:00Z", []string{"2026-05-01 10:10:00Z"}},
		{"* * * * *", "UTC", "2026-12-31 23:59:00Z", []string{"2027-01-01 00:00:00Z", "2027-01-01 00:01:00Z"}},
		{"@hourly", "Asia/Kolkata", "2026-05-01 10:29:59Z", []string{"2026-05-01 10:30:00Z", "2026-05-01 11:30:00Z"}},
		{"0 0 * * *", "Asia/Kolkata", "2026-05-01 00:00:00Z", []string{"2026-05-01 18:30:00Z"}},
		{"@weekly", "UTC", "2026-05-01 00:00:00Z", []string{"2026-05-03 00:00:00Z", "2026-05-10 00:00:00Z"}}, // Sundays
		{"@monthly", "UTC", "2026-01-31 12:00:00Z", []string{"2026-02-01 00:00:00Z", "2026-03-01 00:00:00Z"}},
		{"@yearly", "UTC", "2026-01-01 00:00:00Z", []string{"2027-01-01 00:00:00Z"}},
		{"0 0 31 * *", "UTC", "2026-01-31 00:00:00Z", []string{"2026-03-31 00:00:00Z", "2026-05-31 00:00:00Z", "2026-07-31 00:00:00Z", "2026-08-31 00:00:00Z"}},
		{"0 0 29 2 *", "UTC", "2026-01-01 00:00:00Z", []string{"2028-02-29 00:00:00Z", "2032-02-29 00:00:00Z"}},
		// cronie's day rule: either field, or both when one begins with '*'.
		{"0 12 1 * 1", "UTC", "2026-06-01 12:00:00Z", []string{"2026-06-08 12:00:00Z", "2026-06-15 12:00:00Z", "2026-06-22 12:00:00Z", "2026-06-29 12:00:00Z", "2026-07-01 12:00:00Z", "2026-07-06 12:00:00Z"}},
		{"0 0 13 * 5", "UTC", "2026-02-10 00:00:00Z", []string{"2026-02-13 00:00:00Z", "2026-02-20 00:00:00Z", "2026-02-27 00:00:00Z", "2026-03-06 00:00:00Z", "2026-03-13 00:00:00Z"}},
		{"0 0 */2 * 1", "UTC", "2026-06-01 00:00:00Z", []string{"2026-06-15 00:00:00Z", "2026-06-29 00:00:00Z", "2026-07-13 00:00:00Z"}},
		{"0 0 1-7 * */1", "UTC", "2026-06-07 00:00:00Z", []string{"2026-07-01 00:00:00Z"}},
		{"0 0 29 2 */7", "UTC", "2026-01-01 00:00:00Z", []string{"2032-02-29 00:00:00Z", "2060-02-29 00:00:00Z"}}, // Feb 29 on a Sunday
		{"0 0 30 2 mon", "UTC", "2026-01-01 00:00:00Z", []string{"2026-02-02 00:00:00Z", "2026-02-09 00:00:00Z"}},

		// Europe/Berlin 2026: 02:00 CET -> 03:00 CEST on Mar 29 (01:00Z),
		// 03:00 CEST -> 02:00 CET on Oct 25 (01:00Z).
		{"30 2 * * *", "Europe/Berlin", "2026-03-28 11:00:00Z", []string{"2026-03-29 01:00:00Z", "2026-03-30 00:30:00Z"}}, // 02:30 does not exist on Mar 29: at 03:00
		{"30 2,3 * * *", "Europe/Berlin", "2026-03-28 23:00:00Z", []string{"2026-03-29 01:00:00Z", "2026-03-29 01:30:00Z", "2026-03-30 00:30:00Z"}},
		{"0,30 2 * * *", "Europe/Berlin", "2026-03-28 23:00:00Z", []string{"2026-03-29 01:00:00Z", "2026-03-30 00:00:00Z"}}, // once for the whole gap
		{"0 2,3 * * *", "Europe/Berlin", "2026-03-28 23:00:00Z", []string{"2026-03-29 01:00:00Z", "2026-03-30 00:00:00Z"}},  // 02:00 and 03:00 coincide
		{"* 2 * * *", "Europe/Berlin", "2026-03-28 23:00:00Z", []string{"2026-03-30 00:00:00Z"}},                            // wildcard: gap minutes do not fire
		{"* * * * *", "Europe/Berlin", "2026-03-29 00:58:00Z", []string{"2026-03-29 00:59:00Z", "2026-03-29 01:00:00Z", "2026-03-29 01:01:00Z"}},
		{"0 * * * *", "Europe/Berlin", "2026-03-28 23:30:00Z", []string{"2026-03-29 00:00:00Z", "2026-03-29 01:00:00Z", "2026-03-29 02:00:00Z"}},
		{"30 2 * * *", "Europe/Berlin", "2026-10-24 11:00:00Z", []string{"2026-10-25 00:30:00Z", "2026-10-26 01:30:00Z"}},                                                                           // first 02:30 only
		{"*/30 * * * *", "Europe/Berlin", "2026-10-24 23:45:00Z", []string{"2026-10-25 00:00:00Z", "2026-10-25 00:30:00Z", "2026-10-25 01:00:00Z", "2026-10-25 01:30:00Z", "2026-10-25 02:00:00Z"}}, // wildcard: both passes
		{"*/30 2 * * *", "Europe/Berlin", "2026-10-24 23:45:00Z", []string{"2026-10-25 00:00:00Z", "2026-10-25 00:30:00Z", "2026-10-25 01:00:00Z", "2026-10-25 01:30:00Z", "2026-10-26 01:00:00Z"}},
		{"0 3 * * *", "Europe/Berlin", "2026-10-25 00:59:00Z", []string{"2026-10-25 02:00:00Z"}},
		// A schedule started inside the second 02:00-02:59: its first
		// occurrence not before the start is the second one.
		{"*/30 * * * *", "Europe/Berlin", "2026-10-25 01:10:00Z", []string{"2026-10-25 01:30:00Z", "2026-10-25 02:00:00Z"}},
		{"15 2 * * *", "Europe/Berlin", "2026-10-25 01:10:00Z", []string{"2026-10-25 01:15:00Z", "2026-10-26 01:15:00Z"}},
		{"5 2 * * *", "Europe/Berlin", "2026-10-25 01:10:00Z", []string{"2026-10-26 01:05:00Z"}},

		// America/New_York 2026: 02:00 EST -> 03:00 EDT on Mar 8 (07:00Z),
		// 02:00 EDT -> 01:00 EST on Nov 1 (06:00Z).
		{"30 2 * * *", "America/New_York", "2026-03-07 12:00:00Z", []string{"2026-03-08 07:00:00Z", "2026-03-09 06:30:00Z"}},
		{"*/20 2-3 * * *", "America/New_York", "2026-03-08 06:00:00Z", []string{"2026-03-08 07:00:00Z", "2026-03-08 07:20:00Z", "2026-03-08 07:40:00Z", "2026-03-09 06:00:00Z"}},
		{"30 1 * * *", "America/New_York", "2026-10-31 12:00:00Z", []string{"2026-11-01 05:30:00Z", "2026-11-02 06:30:00Z"}},
		{"0 * * * *", "America/New_York", "2026-11-01 04:30:00Z", []string{"2026-11-01 05:00:00Z", "2026-11-01 06:00:00Z", "2026-11-01 07:00:00Z", "2026-11-01 08:00:00Z"}},
		{"0 1 * * *", "America/New_York", "2026-11-01 04:30:00Z", []string{"2026-11-01 05:00:00Z", "2026-11-02 06:00:00Z"}},

		// Australia/Lord_Howe 2026: 02:00 +11 -> 01:30 +1030 on Apr 5
		// (Apr 4 15:00Z); 02:00 +1030 -> 02:30 +11 on Oct 4 (Oct 3 15:30Z).
		{"15 2 * * *", "Australia/Lord_Howe", "2026-10-03 01:00:00Z", []string{"2026-10-03 15:30:00Z", "2026-10-04 15:15:00Z"}}, // 02:15 Oct 4 does not exist: at 02:30
		{"45 2 * * *", "Australia/Lord_Howe", "2026-10-03 01:00:00Z", []string{"2026-10-03 15:45:00Z", "2026-10-04 15:45:00Z"}},
		{"*/15 1-2 * * *", "Australia/Lord_Howe", "2026-10-03 15:00:00Z", []string{"2026-10-03 15:15:00Z", "2026-10-03 15:30:00Z", "2026-10-03 15:45:00Z", "2026-10-04 14:00:00Z"}},
		{"45 1 * * *", "Australia/Lord_Howe", "2026-04-04 01:00:00Z", []string{"2026-04-04 14:45:00Z", "2026-04-05 15:15:00Z"}},
		{"*/15 * * * *", "Australia/Lord_Howe", "2026-04-04 14:40:00Z", []string{"2026-04-04 14:45:00Z", "2026-04-04 15:00:00Z", "2026-04-04 15:15:00Z", "2026-04-04 15:30:00Z"}},

		// Antarctica/Troll 2026: 01:00 +00 -> 03:00 +02 on Mar 29 (01:00Z),
		// 03:00 +02 -> 01:00 +00 on Oct 25 (01:00Z).
		{"30 1,2 * * *", "Antarctica/Troll", "2026-03-28 12:00:00Z", []string{"2026-03-29 01:00:00Z", "2026-03-29 23:30:00Z", "2026-03-30 00:30:00Z"}},
		{"30 1,2 * * *", "Antarctica/Troll", "2026-03-29 00:00:00Z", []string{"2026-03-29 01:00:00Z", "2026-03-29 23:30:00Z"}},
		{"0 1-3 * * *", "Antarctica/Troll", "2026-03-29 00:00:00Z", []string{"2026-03-29 01:00:00Z", "2026-03-29 23:00:00Z"}},
		{"0 2-5 * * *", "Antarctica/Troll", "2026-03-28 05:00:00Z", []string{"2026-03-29 01:00:00Z", "2026-03-29 02:00:00Z", "2026-03-29 03:00:00Z", "2026-03-30 00:00:00Z"}},
		// Europe/Dublin 2026: 01:00 GMT -> 02:00 IST on Mar 29 (01:00Z).
		{"0 1-5 * * *", "Europe/Dublin", "2026-03-28 05:00:00Z", []string{"2026-03-29 01:00:00Z", "2026-03-29 02:00:00Z", "2026-03-29 03:00:00Z", "2026-03-29 04:00:00Z", "2026-03-30 00:00:00Z"}},
		// Pacific/Chatham 2026: 02:45 +1245 -> 03:45 +1345 on Sep 27 (Sep 26 14:00Z).
		{"45 * * * *", "Pacific/Chatham", "2026-09-26 13:00:00Z", []string{"2026-09-26 14:00:00Z", "2026-09-26 15:00:00Z", "2026-09-26 16:00:00Z"}},
		{"0 2 * * *", "Antarctica/Troll", "2026-10-24 12:00:00Z", []string{"2026-10-25 00:00:00Z", "2026-10-26 02:00:00Z"}},
		{"* * * * *", "Antarctica/Troll", "2026-10-25 00:58:00Z", []string{"2026-10-25 00:59:00Z", "2026-10-25 01:00:00Z", "2026-10-25 01:01:00Z"}},
		{"0 2 * * *", "Antarctica/Troll", "2026-10-25 00:58:00Z", []string{"2026-10-26 02:00:00Z"}}, // 02:00 +02 was at 00:00Z
		{"0 2 * * *", "Antarctica/Troll", "2026-10-25 01:30:00Z", []string{"2026-10-25 02:00:00Z", "2026-10-26 02:00:00Z"}},
	} {
		s, err := ParseSchedule(c.expr)
		if err != nil {
			t.Fatalf("%q: %v", c.expr, err)
		}
		loc := mustLoc(t, c.zone)
		at := utc(c.after)
		for i, w := range c.want {
			got := s.Next(at, loc)
			if want := utc(w); !got.Equal(want) {
				t.Errorf("%q in %s, fire #%d after %s: got %s, want %s (%s)", c.expr, c.zone, i+1,
					at.In(loc).Format(time.RFC3339), got.In(loc).Format(time.RFC3339), want.In(loc).Format(time.RFC3339), w)
				break
			}
			if got.Location() != loc {
				t.Errorf("%q: result in %v, want %v", c.expr, got.Location(), loc)
			}
			at = got
		}
	}
}

func TestScheduleNextSubSecond(t *testing.T) {
	s, _ := ParseSchedule("* * * * *")
	base := time.Date(2026, 5, 1, 10, 0, 0, 0, time.UTC)
	for _, c := range []struct {
		after time.Time
		want  time.Time
	}{
		{base.Add(-time.Nanosecond), base},
		{base, base.Add(time.Minute)},
		{base.Add(time.Nanosecond), base.Add(time.Minute)},
		{base.Add(59*time.Second + 999999999), base.Add(time.Minute)},
	} {
		if got := s.Next(c.after, nil); !got.Equal(c.want) {
			t.Errorf("Next(%s) = %s, want %s", c.after.Format(time.RFC3339Nano), got, c.want)
		}
	}
}

// refNext is the reference evaluator, a scan of every minute after `after`
// implementing cron's DST rules literally. A wildcard entry fires at the
// first instant whose wall clock matches. A fixed-time entry fires at the
// first instant whose wall clock matches and is later than the wall clock of
// `after` (so a repeated wall-clock time fires once), or at the first instant
// after a gap that swallowed a matching wall-clock time later than that of
// `after`. It gives up after limit minutes and returns the zero Time.
func refNext(s *Schedule, after time.Time, loc *time.Location, limit int) time.Time {
	aw := wallKey(after.In(loc))
	t := after.Truncate(time.Minute)
	for i := 0; i < limit; i++ {
		t = t.Add(time.Minute)
		if !t.After(after) {
			continue
		}
		w := t.In(loc)
		if w.Second() != 0 {
			continue
		}
		if s.Wildcard() {
			if refMatches(s, w) {
				return w
			}
			continue
		}
		if wallKey(w) > aw && refMatches(s, w) {
			return w
		}
		// Wall-clock minutes the clocks jumped over just before t.
		pw := t.Add(-time.Minute).In(loc)
		from := time.Date(pw.Year(), pw.Month(), pw.Day(), pw.Hour(), pw.Minute(), 0, 0, time.UTC)
		to := time.Date(w.Year(), w.Month(), w.Day(), w.Hour(), w.Minute(), 0, 0, time.UTC)
		for x := from.Add(time.Minute); x.Before(to); x = x.Add(time.Minute) {
			if wallKey(x) > aw && refMatches(s, x) {
				return w
			}
		}
	}
	return time.Time{}
}

// wallKey orders wall-clock readings.
func wallKey(t time.Time) int64 {
	y, m, d := t.Date()
	return ((int64(y)*100+int64(m))*100+int64(d))*100000 + int64(t.Hour()*3600+t.Minute()*60+t.Second())
}

func refMatches(s *Schedule, w time.Time) bool {
	f, _ := s.Fields()
	if f.Minute&(1<<w.Minute()) == 0 || f.Hour&(1<<w.Hour()) == 0 || f.Month&(1<<int(w.Month())) == 0 {
		return false
	}
	dom := f.Dom&(1<<w.Day()) != 0
	dow := f.Dow&(1<<int(w.Weekday())) != 0
	if f.DomStar || f.DowStar {
		return dom && dow
	}
	return dom || dow
}

var refExprs = []string{
	"* * * * *", "*/5 * * * *", "*/7 * * * *", "0 * * * *", "30 2 * * *", "15,45 1,2 * * *", "*/10 1-3 * * *",
	"0 1-3 * * *", "59 1 * * *", "0,30 2 * * sun", "45 2 * * *", "*/20 0-4 * * *", "0 0 * * *", "0 12 1 * 1",
	"0 0 13 * 5", "0 0 */2 * 1", "0 0 28-31 * *", "0 */7 * * *", "5 4 * * sun", "0 22 * * 1-5", "@hourly",
	"@daily", "@weekly", "30 1 * * *", "0 3 * * *", "* 2 * * *", "* 1 * * *", "0 0 1 * *", "*/25 * * * *",
}

// TestScheduleNextMatchesReference compares Next with the minute scan in
// DST zones, from random base times and from around every 2026 change.
func TestScheduleNextMatchesReference(t *testing.T) {
	zones := []string{"UTC", "Europe/Berlin", "America/New_York", "Australia/Lord_Howe", "Antarctica/Troll",
		"Asia/Kolkata", "Asia/Kathmandu", "Pacific/Chatham", "America/Havana", "Pacific/Apia", "America/Santiago"}
	rng := rand.New(rand.NewSource(1))
	const window = 3 * 24 * 60
	for _, zone := range zones {
		loc := mustLoc(t, zone)
		var bases []time.Time
		for at := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC); ; {
			_, end := at.In(loc).ZoneBounds()
			if end.IsZero() || end.Year() > 2026 {
				break
			}
			for _, d := range []time.Duration{-3 * time.Hour, -70 * time.Minute, -10 * time.Minute, 5 * time.Minute, 40 * time.Minute} {
				bases = append(bases, end.Add(d))
			}
			at = end
		}
		for i := 0; i < 8; i++ {
			bases = append(bases, time.Unix(1767225600+rng.Int63n(3*365*86400), rng.Int63n(2e9)))
		}
		for _, e := range refExprs {
			s, err := ParseSchedule(e)
			if err != nil {
				t.Fatal(err)
			}
			for _, base := range bases {
				at := base
				for i := 0; i < 5; i++ {
					got := s.Next(at, loc)
					want := refNext(s, at, loc, window)
					if want.IsZero() {
						if got.Sub(at) <= window*time.Minute {
							t.Errorf("%q in %s after %s: Next = %s, reference finds none within %d minutes", e, zone, at.In(loc), got, window)
						}
						break
					}
					if !got.Equal(want) {
						t.Errorf("%q in %s after %s: Next = %s, reference = %s", e, zone, at.In(loc), got.In(loc), want)
						break
					}
					at = got
				}
			}
		}
	}
}

func TestScheduleNextFarAndNil(t *testing.T) {
	s, _ := ParseSchedule("0 0 29 2 */7") // Feb 29 on a Sunday
	got := s.Next(time.Date(2200, 1, 1, 0, 0, 0, 0, time.UTC), nil)
	if want := time.Date(2224, 2, 29, 0, 0, 0, 0, time.UTC); !got.Equal(want) {
		t.Errorf("Next = %s, want %s", got, want)
	}
	var zero Schedule
	if got := zero.Next(time.Now(), time.UTC); !got.IsZero() {
		t.Errorf("zero Schedule: Next = %v, want zero", got)
	}
}

// BenchmarkNextYear walks a year of a busy schedule in Europe/Berlin (both
// DST changes included): one op is one year, about 105,000 Next calls.
func BenchmarkNextYear(b *testing.B) {
	s, err := ParseSchedule("*/5 * * * *")
	if err != nil {
		b.Fatal(err)
	}
	loc, err := time.LoadLocation("Europe/Berlin")
	if err != nil {
		b.Fatal(err)
	}
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, loc)
	end := start.AddDate(1, 0, 0)
	b.ReportAllocs()
	calls := 0
	for b.Loop() {
		calls = 0
		for t := start; t.Before(end); t = s.Next(t, loc) {
			calls++
		}
	}
	b.ReportMetric(float64(calls), "calls/op")
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(calls), "ns/call")
}

// BenchmarkNextRare measures a schedule that fires once in years.
func BenchmarkNextRare(b *testing.B) {
	s, _ := ParseSchedule("0 0 29 2 */7")
	loc, _ := time.LoadLocation("America/New_York")
	at := time.Date(2033, 1, 1, 0, 0, 0, 0, loc)
	b.ReportAllocs()
	for b.Loop() {
		s.Next(at, loc)
	}
}

// TestScheduleOversizedStep: cronie accepts a step larger than the range it
// steps through, meaning the range's first value; Notes says so.
func TestScheduleOversizedStep(t *testing.T) {
	for _, c := range []struct {
		expr, note string
		minute     uint64
		hour       uint32
	}{
		{"*/60 * * * *", `step 60 in the minute field "*/60" is larger than its range 0-59: only 0 matches`, 1, AllHours},
		{"0 */24 * * *", `step 24 in the hour field "*/24" is larger than its range 0-23: only 0 matches`, 1, 1},
		{"10-20/30 5 * * *", `step 30 in the minute field "10-20/30" is larger than its range 10-20: only 10 matches`, 1 << 10, 1 << 5},
		{"*/59 * * * *", "", 1 | 1<<59, AllHours},
		{"5 * * * *", "", 1 << 5, AllHours},
	} {
		s, err := ParseSchedule(c.expr)
		if err != nil {
			t.Fatalf("%q: %v", c.expr, err)
		}
		f, _ := s.Fields()
		if f.Minute != c.minute || f.Hour != c.hour {
			t.Errorf("%q: minutes %b hours %b, want %b %b", c.expr, f.Minute, f.Hour, c.minute, c.hour)
		}
		notes := s.Notes()
		switch {
		case c.note == "" && len(notes) != 0:
			t.Errorf("%q: unexpected notes %q", c.expr, notes)
		case c.note != "" && (len(notes) != 1 || notes[0] != c.note):
			t.Errorf("%q: notes %q, want %q", c.expr, notes, c.note)
		}
	}
	if s, _ := ParseSchedule("0 */24 * * *"); !s.Next(time.Date(2026, 5, 1, 0, 0, 0, 0, time.UTC), nil).Equal(time.Date(2026, 5, 2, 0, 0, 0, 0, time.UTC)) {
		t.Error("0 */24 * * * does not fire daily at 00:00")
	}
}

// TestScheduleWildcard pins which entries follow the wall clock in real time.
func TestScheduleWildcard(t *testing.T) {
	for expr, want := range map[string]bool{
		"* * * * *": true, "*/5 * * * *": true, "0 * * * *": true, "* 2 * * *": true, "@hourly": true,
		"0 0 * * *": false, "30 2 * * *": false, "0-59 0-23 * * *": false, "@daily": false, "@weekly": false,
	} {
		s, err := ParseSchedule(expr)
		if err != nil {
			t.Fatal(err)
		}
		f, _ := s.Fields()
		if s.Wildcard() != want || f.Wildcard != want {
			t.Errorf("%q: Wildcard() = %v, Fields().Wildcard = %v, want %v", expr, s.Wildcard(), f.Wildcard, want)
		}
	}
}
