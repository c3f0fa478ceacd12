package units

import (
	"fmt"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/drover/drover/manifest"
)

// CorrectionHorizon is how far past the day of the render the correction
// lines reach. The agent re-renders (and the content changes) whenever a
// transition enters the window, long before the last correction passes.
const CorrectionHorizon = 400 * 24 * time.Hour

// TimerCalendar returns every OnCalendar= value of a timer for s in tz,
// rendered at now: the translation (OnCalendar), then the correction lines
// (Corrections).
func TimerCalendar(s *manifest.Schedule, tz string, now time.Time) ([]string, error) {
	lines, err := OnCalendar(s, tz)
	if err != nil {
		return nil, err
	}
	corr, err := Corrections(s, tz, now)
	if err != nil {
		return nil, err
	}
	return append(lines, corr...), nil
}

// Corrections returns the absolute OnCalendar= instants, in UTC, that make
// systemd fire exactly at the evaluator's instants around DST changes.
//
// systemd's calendar evaluation is wall-clock based and has been wrong around
// DST changes in several ways (in systemd 252: it skips the repeated hour of
// a wildcard entry, never fires a fixed time that falls in a gap, skips the
// rest of the day in Europe/Dublin and Africa/Casablanca when the day's first
// candidate is in the gap, drops times just after Antarctica/Troll's two-hour
// gap, and cannot compute a next elapse at all for some Pacific/Chatham
// spring-forward days). Outside those days it agrees with the evaluator.
// So for the two local days starting with the day of each offset change of
// tz whose change lies within CorrectionHorizon of now's UTC day, every fire
// time of the evaluator on those days is listed explicitly; a timer fires at
// the earliest next elapse of any of its lines, so whatever systemd makes of
// the translated line on those days, these instants fire (a line systemd
// cannot compute is skipped, these remain). The translated line is never
// earlier than the evaluator on those days (the oracle tests check that it
// only ever misses), so the union is exactly the evaluator's series.
//
// The instants are grouped per UTC date, hours with the same minutes in one
// value ("2027-03-28 01,02:00,30:00 UTC"), so a */5 pipe gets a few lines
// per change, not hundreds. Only instants after the start of now's UTC day
// are listed, and now only matters through that day: the content changes
// when a change enters or leaves the window, not on every render.
//
// UTC and zones without changes in the window get none; "@every" schedules
// have no calendar and get none.
func Corrections(s *manifest.Schedule, tz string, now time.Time) ([]string, error) {
	if s == nil {
		return nil, fmt.Errorf("no schedule")
	}
	if _, every := s.Every(); every || tz == "" || tz == "UTC" {
		return nil, nil
	}
	loc, err := manifest.LoadLocation(tz)
	if err != nil {
		return nil, err
	}
	day := now.UTC().Truncate(24 * time.Hour)
	key := corrKey{expr: s.String(), tz: tz, day: day.Unix()}
	if v, ok := corrCache.Load(key); ok {
		return append([]string(nil), v.([]string)...), nil
	}
	lines := corrections(s, loc, day)
	if corrCacheSize.Add(1) > maxCorrCache {
		corrCache.Clear()
		corrCacheSize.Store(0)
	}
	corrCache.Store(key, lines)
	return append([]string(nil), lines...), nil
}

type corrKey struct {
	expr, tz string
	day      int64
}

// corrCache holds computed corrections: a manifest's pipes share few
// schedule and zone pairs, and an agent renders them on every apply.
var (
	corrCache     sync.Map // corrKey -> []string
	corrCacheSize atomic.Int64
)

const maxCorrCache = 4096

// Transitions returns the instants within [from, to) at which loc's UTC
// offset changes (zone abbreviation changes alone are not transitions).
func Transitions(loc *time.Location, from, to time.Time) []time.Time {
	var out []time.Time
	at := from
	for i := 0; i < 64; i++ {
		_, end := manifest.ZoneBounds(at.In(loc))
		if end.IsZero() || !end.Before(to) {
			break
		}
		_, before := end.Add(-time.Second).In(loc).Zone()
		_, after := end.In(loc).Zone()
		if before != after {
			out = append(out, end)
		}
		at = end
	}
	return out
}

// CorrectionWindows returns the [start, end) spans of real time the
// correction lines cover for the changes of loc around the horizon of day:
// the two local days starting with the local day of each change.
func CorrectionWindows(loc *time.Location, day time.Time) [][2]time.Time {
	day = day.UTC().Truncate(24 * time.Hour)
	var out [][2]time.Time
	// Changes up to 3 days past the horizon too: their windows may begin
	// before it, and every instant before the horizon must be covered.
	for _, tr := range Transitions(loc, day.Add(-3*24*time.Hour), day.Add(CorrectionHorizon+3*24*time.Hour)) {
		before := tr.Add(-time.Second).In(loc)
		y, m, d := before.Date()
		start := localMidnight(y, m, d, loc)
		end := localMidnight(y, m, d+2, loc)
		if start.After(tr) {
			start = tr.Add(-24 * time.Hour)
		}
		if !end.After(day) {
			continue
		}
		if n := len(out); n > 0 && !start.After(out[n-1][1]) {
			out[n-1][1] = end // overlapping windows (two changes close together)
			continue
		}
		out = append(out, [2]time.Time{start, end})
	}
	return out
}

// localMidnight returns the first instant of the local date y-m-d (a midnight
// that falls in a gap is the end of the gap).
func localMidnight(y int, m time.Month, d int, loc *time.Location) time.Time {
	t := time.Date(y, m, d, 0, 0, 0, 0, loc)
	if wy, wm, wd := t.Date(); wy != y || wm != m || wd != d {
		// time.Date moved a non-existent midnight to the previous day: the day
		// starts when the clocks jump.
		t = time.Date(y, m, d, 1, 0, 0, 0, loc).Truncate(time.Hour)
	}
	return t
}

func corrections(s *manifest.Schedule, loc *time.Location, day time.Time) []string {
	// instants per UTC date: hour -> minute set.
	type dayset struct {
		date  time.Time
		hours [24]uint64
	}
	var days []*dayset
	for _, w := range CorrectionWindows(loc, day) {
		from := w[0].Add(-time.Second)
		if from.Before(day) {
			from = day
		}
		for t := s.Next(from, loc); !t.IsZero() && t.Before(w[1]); t = s.Next(t, loc) {
			u := t.UTC()
			date := u.Truncate(24 * time.Hour)
			if n := len(days); n == 0 || !days[n-1].date.Equal(date) {
				days = append(days, &dayset{date: date})
			}
			ds := days[len(days)-1]
			ds.hours[u.Hour()] |= 1 << u.Minute()
		}
	}
	var out []string
	for _, ds := range days {
		// Hours with the same minutes share a value.
		groups := map[uint64]uint64{} // minutes -> hours
		var order []uint64
		for h, mins := range ds.hours {
			if mins == 0 {
				continue
			}
			if _, ok := groups[mins]; !ok {
				order = append(order, mins)
			}
			groups[mins] |= 1 << h
		}
		sort.Slice(order, func(i, j int) bool { return lowBit(groups[order[i]]) < lowBit(groups[order[j]]) })
		for _, mins := range order {
			var b strings.Builder
			b.WriteString(ds.date.Format("2006-01-02"))
			b.WriteByte(' ')
			b.WriteString(compact(groups[mins], 0, 23))
			b.WriteByte(':')
			b.WriteString(compact(mins, 0, 59))
			b.WriteString(":00 UTC")
			out = append(out, b.String())
		}
	}
	return out
}

func lowBit(v uint64) int {
	for i := 0; i < 64; i++ {
		if v&(1<<i) != 0 {
			return i
		}
	}
	return 64
}
