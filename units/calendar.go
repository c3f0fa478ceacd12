package units

import (
	"errors"
	"fmt"
	"math/bits"
	"strconv"
	"strings"

	"github.com/drover/drover/manifest"
)

// OnCalendar translates a cron schedule into systemd OnCalendar= values, each
// "[Weekdays ]*-MM-DD HH:MM:00 <tz>" in systemd.time(7) syntax with the time
// zone appended (tz "" means UTC; "UTC" is appended too).
//
// It returns one value, or two when both day fields restrict and cronie's
// "either" rule applies (neither day field begins with '*'): one value with
// the day-of-month restriction and every weekday, one with the weekday
// restriction and every day of the month; systemd fires at the earlier of
// the two, once when both match. A day-of-month value that can never elapse
// in the selected months (e.g. "30 2 mon") is left out: the weekday value
// alone has the same fire times.
//
// Outside the days of DST changes, systemd's evaluation of these values
// gives exactly manifest.Schedule.Next's instants; on those days it misses
// some (cron's DST rules are not wall-clock rules, and systemd has bugs
// there), which the correction lines (Corrections, TimerCalendar) make up
// for. The oracle tests in this package check both against systemd-analyze.
//
// "@every" schedules have no calendar form and return an error.
//
// tz must be "UTC" or a Region/City name (see calendarZone for why "GMT",
// "CET" and the like are refused).
func OnCalendar(s *manifest.Schedule, tz string) ([]string, error) {
	if s == nil {
		return nil, errors.New("no schedule")
	}
	f, ok := s.Fields()
	if !ok {
		return nil, fmt.Errorf("%q is an interval and has no OnCalendar= form (use OnUnitActiveSec=)", s.String())
	}
	if tz == "" {
		tz = "UTC"
	}
	if tz != "UTC" {
		if _, err := manifest.LoadLocation(tz); err != nil {
			return nil, err
		}
		if err := calendarZone(tz); err != nil {
			return nil, err
		}
	}
	clock := fmt.Sprintf("%s:%s:00 %s",
		compact(uint64(f.Hour), 0, 23), compact(f.Minute, 0, 59), tz)
	month := compact(uint64(f.Month), 1, 12)
	line := func(dow uint8, dom uint32) string {
		var b strings.Builder
		if dow != manifest.AllDows {
			b.WriteString(weekdays(dow))
			b.WriteByte(' ')
		}
		b.WriteString("*-")
		b.WriteString(month)
		b.WriteByte('-')
		b.WriteString(compact(uint64(dom), 1, 31))
		b.WriteByte(' ')
		b.WriteString(clock)
		return b.String()
	}
	domAll, dowAll := f.Dom == manifest.AllDoms, f.Dow == manifest.AllDows
	switch {
	case f.DaysAnd():
		// A day must match both: systemd ANDs a weekday and a date too.
		return []string{line(f.Dow, f.Dom)}, nil
	case domAll || dowAll:
		// Either rule with one field matching every day: every day matches.
		return []string{line(manifest.AllDows, manifest.AllDoms)}, nil
	}
	var out []string
	if domPossible(f.Dom, f.Month) {
		out = append(out, line(manifest.AllDows, f.Dom))
	}
	return append(out, line(f.Dow, manifest.AllDoms)), nil
}

// calendarZone rejects time zone names systemd would not evaluate as the
// IANA zone of that name.
//
// systemd 252 checks the last word of a calendar value against the host's own
// zone abbreviations (tzname[0], tzname[1]) before it looks for a zone file,
// and takes a match as "local time, DST off/on". On a host in Europe/London,
// "*-*-* 12:00:00 GMT" is then London time with DST forced off, and
// systemd-analyze reports "Next elapse: never" in summer; "EST" on a host in
// America/New_York and "CET" in Europe/Berlin behave the same. Abbreviations
// never contain '/', so Region/City names (and Etc/GMT, Etc/UTC) are safe;
// "UTC" is safe too, as systemd recognises it first.
//
// Zones under right/ count leap seconds, which Go's time package does not:
// fire times would differ by the leap seconds so far.
func calendarZone(tz string) error {
	switch {
	case !strings.Contains(tz, "/"):
		return fmt.Errorf("time zone %q cannot be used in OnCalendar=: systemd reads a name that is also "+
			"the host's zone abbreviation as that abbreviation; use UTC or a Region/City name such as Europe/Berlin (or Etc/GMT)", tz)
	case strings.HasPrefix(tz, "right/"):
		return fmt.Errorf("time zone %q counts leap seconds, which is not supported; use the zone without right/", tz)
	}
	return nil
}

// domPossible reports whether some selected month has a selected day.
func domPossible(dom uint32, month uint16) bool {
	maxDays := [13]int{0, 31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31}
	for m := 1; m <= 12; m++ {
		if month&(1<<m) != 0 && dom&(1<<(maxDays[m]+1)-2) != 0 {
			return true
		}
	}
	return false
}

// weekdays formats a cron weekday set (bit 0 = Sunday) in systemd's names,
// Monday first, runs of three or more as "Mon..Fri".
func weekdays(dow uint8) string {
	names := [7]string{"Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"}
	// Rotate to Monday-first: bit 0 = Monday … bit 6 = Sunday.
	mf := dow>>1 | (dow&1)<<6
	var parts []string
	for i := 0; i < 7; {
		if mf&(1<<i) == 0 {
			i++
			continue
		}
		j := i
		for j+1 < 7 && mf&(1<<(j+1)) != 0 {
			j++
		}
		switch {
		case j-i >= 2:
			parts = append(parts, names[i]+".."+names[j])
		case j == i+1:
			parts = append(parts, names[i], names[j])
		default:
			parts = append(parts, names[i])
		}
		i = j + 1
	}
	return strings.Join(parts, ",")
}

// compact formats a set of values lo..hi (bit v = value v) as a systemd
// calendar component: "*" for all of them, "a..b" for a run, "a..b/n" for
// one arithmetic progression, else a list of values and runs ("a..b" for
// three or more consecutive values). Values are two digits.
//
// A repetition is never written open-ended ("a/n", as systemd's own
// shorthand would have it). systemd 252 computes the next value of an open
// repetition as a+k·n even when that passes the end of the field and lets
// mktime normalise the overflow: "*:00/7" at 23:56 becomes hour 24, minute 3,
// i.e. 00:03 the next day, and as the normalisation only resets the unit
// directly below the one that changed, it then fires at 00:07 instead of
// 00:00; likewise "*-*-02/7" goes from Dec 30 to Jan 9, skipping Jan 2, and
// "00/10:00" from 20:00 on the last day of a month to 10:00, skipping 00:00.
// With an explicit end ("00..56/7") systemd finds no further value in the
// field and carries correctly.
func compact(set uint64, lo, hi int) string {
	full := (uint64(1)<<(hi+1) - 1) &^ (uint64(1)<<lo - 1)
	set &= full
	if set == full {
		return "*"
	}
	vals := make([]int, 0, bits.OnesCount64(set))
	for s := set; s != 0; s &= s - 1 {
		vals = append(vals, bits.TrailingZeros64(s))
	}
	if len(vals) >= 3 {
		step := vals[1] - vals[0]
		ap := true
		for i := 2; i < len(vals); i++ {
			if vals[i]-vals[i-1] != step {
				ap = false
				break
			}
		}
		if ap {
			first, last := vals[0], vals[len(vals)-1]
			if step == 1 {
				return two(first) + ".." + two(last)
			}
			// Always with its end: systemd 252 mis-evaluates an open
			// repetition "a/n" whose next value overflows the field (see
			// the comment on compact).
			return two(first) + ".." + two(last) + "/" + strconv.Itoa(step)
		}
	}
	var parts []string
	for i := 0; i < len(vals); {
		j := i
		for j+1 < len(vals) && vals[j+1] == vals[j]+1 {
			j++
		}
		if j-i >= 2 {
			parts = append(parts, two(vals[i])+".."+two(vals[j]))
		} else {
			for k := i; k <= j; k++ {
				parts = append(parts, two(vals[k]))
			}
		}
		i = j + 1
	}
	return strings.Join(parts, ",")
}

func two(v int) string {
	if v < 10 {
		return "0" + strconv.Itoa(v)
	}
	return strconv.Itoa(v)
}
