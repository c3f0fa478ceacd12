package manifest

import (
	"errors"
	"fmt"
	"math/bits"
	"strconv"
	"strings"
	"time"
)

// Schedule is a parsed schedule expression (docs/design.md, "Schedule semantics").
//
// A five-field cron expression is held as one bitset per field, so that Next
// can jump from one matching value to the next instead of scanning minutes.
// A Schedule is immutable and safe for concurrent use.
type Schedule struct {
	expr  string
	every time.Duration // > 0 for "@every <duration>"

	minute uint64 // bit n: minute n (0-59)
	hour   uint32 // bit n: hour n (0-23)
	dom    uint32 // bit n: day of month n (1-31)
	month  uint16 // bit n: month n (1-12)
	dow    uint8  // bit n: weekday n (0 = Sunday … 6 = Saturday)

	domStar, dowStar bool // the field began with '*' (cronie's day rule)

	// wild: the minute or hour field began with '*' (cron's DST rule: the
	// entry follows the wall clock in real time).
	wild  bool
	notes []string // remarks for `schedule explain`, e.g. an oversized step
}

// Fields is the expanded form of a five-field schedule, as units.OnCalendar
// and other translators need it.
type Fields struct {
	Minute uint64 // bit n set: minute n (0-59)
	Hour   uint32 // bit n set: hour n (0-23)
	Dom    uint32 // bit n set: day of month n (1-31)
	Month  uint16 // bit n set: month n (1-12)
	Dow    uint8  // bit n set: weekday n, 0 = Sunday … 6 = Saturday (7 is folded into 0)

	// DomStar and DowStar report whether the day-of-month and day-of-week
	// fields began with '*'. cronie's day rule: if either is set, a day must
	// match both day fields; otherwise it matches if it matches either.
	DomStar, DowStar bool

	// Wildcard reports whether the minute or hour field began with '*'
	// (cron's DST rule; see Schedule.Next).
	Wildcard bool
}

// Full sets, for comparisons by translators.
const (
	AllMinutes uint64 = 1<<60 - 1
	AllHours   uint32 = 1<<24 - 1
	AllDoms    uint32 = (1<<31 - 1) << 1
	AllMonths  uint16 = (1<<12 - 1) << 1
	AllDows    uint8  = 1<<7 - 1
)

// DaysAnd reports whether a day must match both day fields (cronie: either
// field began with '*'); otherwise matching either one is enough.
func (f Fields) DaysAnd() bool { return f.DomStar || f.DowStar }

// MinEvery is the shortest interval "@every" accepts.
const MinEvery = time.Minute

const supported = "use five fields (minute hour day-of-month month day-of-week), " +
	"@hourly, @daily, @midnight, @weekly, @monthly, @yearly, @annually or @every <duration>"

type fieldDef struct {
	name     string
	min, max int
	names    []string // names[i] is the value min+i… see nameValue
}

var (
	monthNames = []string{"jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"}
	dayNames   = []string{"sun", "mon", "tue", "wed", "thu", "fri", "sat"}

	fieldDefs = [5]fieldDef{
		{name: "minute", min: 0, max: 59},
		{name: "hour", min: 0, max: 23},
		{name: "day-of-month", min: 1, max: 31},
		{name: "month", min: 1, max: 12, names: monthNames},
		{name: "day-of-week", min: 0, max: 7, names: dayNames},
	}
)

// nameValue returns the value of a month (1-12) or weekday (0-6) name.
func (d *fieldDef) nameValue(s string) (int, bool) {
	for i, n := range d.names {
		if strings.EqualFold(s, n) {
			if d.min == 1 {
				return i + 1, true
			}
			return i, true
		}
	}
	return 0, false
}

// ParseSchedule parses a five-field cron expression or a descriptor. Errors
// are plain messages without a field path; they say what is supported.
func ParseSchedule(expr string) (*Schedule, error) {
	s := strings.TrimSpace(expr)
	if s == "" {
		return nil, errors.New("empty schedule: " + supported)
	}
	for _, r := range s {
		if r != ' ' && r != '\t' && (r < 0x21 || r > 0x7e) {
			return nil, fmt.Errorf("unexpected character %q: a schedule is printable ASCII on one line", r)
		}
	}
	if s[0] == '@' {
		return parseDescriptor(s)
	}
	fields := strings.Fields(s)
	switch n := len(fields); {
	case n == 6:
		return nil, errors.New("6 fields: a seconds (or year) field is not supported; " +
			"use five fields: minute hour day-of-month month day-of-week")
	case n == 7:
		return nil, errors.New("7 fields (Quartz seconds and year) are not supported; " +
			"use five fields: minute hour day-of-month month day-of-week")
	case n == 1:
		return nil, fmt.Errorf("1 field: %s", supported)
	case n != 5:
		return nil, fmt.Errorf("%d fields: %s", n, supported)
	}
	sch := &Schedule{expr: s}
	var sets [5]uint64
	for i, f := range fields {
		v, err := parseField(&fieldDefs[i], f, &sch.notes)
		if err != nil {
			return nil, err
		}
		sets[i] = v
	}
	sch.wild = fields[0][0] == '*' || fields[1][0] == '*'
	sch.minute = sets[0]
	sch.hour = uint32(sets[1])
	sch.dom = uint32(sets[2])
	sch.month = uint16(sets[3])
	dow := sets[4]
	if dow&(1<<7) != 0 { // 7 is Sunday too
		dow = dow&^(1<<7) | 1
	}
	sch.dow = uint8(dow)
	sch.domStar = fields[2][0] == '*'
	sch.dowStar = fields[4][0] == '*'
	if err := sch.checkPossible(fields[2], fields[3]); err != nil {
		return nil, err
	}
	return sch, nil
}

var descriptors = map[string]string{
	"@yearly":   "0 0 1 1 *",
	"@annually": "0 0 1 1 *",
	"@monthly":  "0 0 1 * *",
	"@weekly":   "0 0 * * 0",
	"@daily":    "0 0 * * *",
	"@midnight": "0 0 * * *",
	"@hourly":   "0 * * * *",
}

func parseDescriptor(s string) (*Schedule, error) {
	word, rest, _ := strings.Cut(strings.ReplaceAll(s, "\t", " "), " ")
	rest = strings.TrimSpace(rest)
	word = strings.ToLower(word)
	if word == "@every" {
		return parseEvery(s, rest)
	}
	if word == "@reboot" {
		return nil, errors.New("@reboot is not supported: schedules are time based; " + supported)
	}
	fields, ok := descriptors[word]
	if !ok {
		return nil, fmt.Errorf("unknown descriptor %q: %s", truncate(word), supported)
	}
	if rest != "" {
		return nil, fmt.Errorf("%s takes no arguments, got %q", word, truncate(rest))
	}
	sch, err := ParseSchedule(fields)
	if err != nil {
		panic("manifest: bad descriptor table: " + err.Error())
	}
	sch.expr = s
	return sch, nil
}

func parseEvery(s, arg string) (*Schedule, error) {
	if arg == "" {
		return nil, errors.New("@every needs a duration, e.g. @every 15m or @every 1h30m")
	}
	if strings.ContainsAny(arg, " \t") {
		return nil, fmt.Errorf("@every takes one duration, got %q", truncate(arg))
	}
	d, err := time.ParseDuration(arg)
	if err != nil {
		return nil, fmt.Errorf("@every: %q is not a duration (use e.g. 90s, 15m, 1h30m)", truncate(arg))
	}
	if d < MinEvery {
		return nil, fmt.Errorf("@every %s is too short: the minimum interval is 1m", arg)
	}
	if d%time.Second != 0 {
		return nil, fmt.Errorf("@every %s has a fraction of a second: use whole seconds", arg)
	}
	return &Schedule{expr: s, every: d}, nil
}

// parseField parses one comma-separated cron field into a bitset of values
// (bit v for value v, in the field's own numbering: day-of-week 7 stays 7).
func parseField(d *fieldDef, text string, notes *[]string) (uint64, error) {
	if strings.ContainsAny(text, "?#") || quartzElem(text) {
		return 0, fmt.Errorf("%q in the %s field is a Quartz extension: L, W, # and ? are not supported "+
			"(use numbers, names, ranges a-b, lists a,b and steps */n or a-b/n)", truncate(text), d.name)
	}
	var set uint64
	for _, elem := range strings.Split(text, ",") {
		if elem == "" {
			return 0, fmt.Errorf("empty element in the %s field %q", d.name, truncate(text))
		}
		v, err := parseElem(d, elem, notes)
		if err != nil {
			return 0, err
		}
		set |= v
	}
	return set, nil
}

// quartzElem reports Quartz-only forms: L, LW, L-3, 15W, 5L.
func quartzElem(text string) bool {
	for _, e := range strings.Split(text, ",") {
		u := strings.ToUpper(e)
		if u == "L" || u == "LW" || strings.HasPrefix(u, "L-") {
			return true
		}
		if n := len(u); n >= 2 && (u[n-1] == 'L' || u[n-1] == 'W') && isDigits(u[:n-1]) {
			return true
		}
	}
	return false
}

func parseElem(d *fieldDef, elem string, notes *[]string) (uint64, error) {
	rangePart, stepPart, hasStep := strings.Cut(elem, "/")
	var lo, hi int
	step := 1
	if hasStep {
		if !isDigits(stepPart) {
			return 0, fmt.Errorf("invalid step in %q in the %s field: a step is a whole number, as in */5", truncate(elem), d.name)
		}
		n, ok := atoiSmall(stepPart)
		switch {
		case ok && n == 0:
			return 0, fmt.Errorf("step 0 in the %s field: a step must be at least 1", d.name)
		case !ok:
			return 0, fmt.Errorf("step %s in the %s field is too large: at most 9999", truncate(stepPart), d.name)
		}
		step = n
	}
	defer func() {
		// cronie accepts a step larger than the range it steps through: only
		// the range's first value matches. Say so, as it is rarely meant.
		if hasStep && lo+step > hi && lo < hi && notes != nil {
			*notes = append(*notes, fmt.Sprintf("step %d in the %s field %q is larger than its range %d-%d: only %d matches",
				step, d.name, truncate(elem), lo, hi, lo))
		}
	}()
	switch {
	case rangePart == "":
		return 0, fmt.Errorf("invalid element %q in the %s field: a step follows '*' or a range, as in */5 or 0-30/5", truncate(elem), d.name)
	case rangePart == "*":
		lo, hi = d.min, d.max
	case strings.HasPrefix(rangePart, "*"):
		return 0, fmt.Errorf("invalid element %q in the %s field: '*' may only be followed by a step, as in */5", truncate(elem), d.name)
	default:
		a, b, isRange := strings.Cut(rangePart, "-")
		var err error
		if lo, err = parseValue(d, a, elem); err != nil {
			return 0, err
		}
		switch {
		case isRange:
			if hi, err = parseValue(d, b, elem); err != nil {
				return 0, err
			}
			if hi < lo {
				hint := ""
				if d.names != nil && d.min == 0 && hi == 0 {
					hint = " (Sunday at the end of a range is 7, as in 1-7)"
				}
				return 0, fmt.Errorf("reversed range %s in the %s field: write the smaller value first%s", truncate(rangePart), d.name, hint)
			}
		case hasStep:
			hi = d.max // "a/n" means a-max/n, as in cronie
		default:
			hi = lo
		}
	}
	var set uint64
	for v := lo; v <= hi; v += step {
		set |= 1 << v
	}
	return set, nil
}

func parseValue(d *fieldDef, s, elem string) (int, error) {
	if s == "" {
		return 0, fmt.Errorf("invalid element %q in the %s field: a range is written a-b", truncate(elem), d.name)
	}
	if isDigits(s) {
		n, ok := atoiSmall(s)
		if !ok || n < d.min || n > d.max {
			return 0, fmt.Errorf("%s %s out of range %d-%d", d.name, truncate(s), d.min, d.max)
		}
		return n, nil
	}
	if d.names != nil {
		if n, ok := d.nameValue(s); ok {
			return n, nil
		}
		return 0, fmt.Errorf("invalid %s %q: use %d-%d or the names %s-%s", d.name, truncate(s), d.min, d.max, d.names[0], d.names[len(d.names)-1])
	}
	return 0, fmt.Errorf("invalid %s %q: use numbers %d-%d", d.name, truncate(s), d.min, d.max)
}

func isDigits(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

// atoiSmall parses a decimal number of at most 4 digits after leading zeros.
func atoiSmall(s string) (int, bool) {
	t := strings.TrimLeft(s, "0")
	if len(t) > 4 {
		return 0, false
	}
	if t == "" {
		return 0, true
	}
	n, err := strconv.Atoi(t)
	return n, err == nil
}

func truncate(s string) string {
	if len(s) > 40 {
		return s[:40] + "…"
	}
	return s
}

// maxDays is the most days each month can have (February: 29).
var maxDays = [13]int{0, 31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31}

// checkPossible rejects schedules that can never fire: when a day has to match
// the day-of-month field (always, unless cronie's "either" rule applies) and no
// selected month has any of the selected days.
func (s *Schedule) checkPossible(domText, monthText string) error {
	if !s.daysAnd() && s.dow != 0 {
		return nil // some weekday of every month matches
	}
	for m := 1; m <= 12; m++ {
		if s.month&(1<<m) != 0 && s.dom&((1<<(maxDays[m]+1))-2) != 0 {
			return nil
		}
	}
	return fmt.Errorf("day-of-month %s never occurs in month %s, so the schedule would never fire", truncate(domText), truncate(monthText))
}

func (s *Schedule) daysAnd() bool { return s.domStar || s.dowStar }

// String returns the expression as given, trimmed.
func (s *Schedule) String() string { return s.expr }

// Every returns the interval of an "@every" schedule.
func (s *Schedule) Every() (time.Duration, bool) { return s.every, s.every > 0 }

// Fields returns the expanded fields of a calendar schedule (descriptors
// expanded as cron does); ok is false for "@every".
func (s *Schedule) Fields() (f Fields, ok bool) {
	if s.every > 0 {
		return Fields{}, false
	}
	return Fields{
		Minute: s.minute, Hour: s.hour, Dom: s.dom, Month: s.month, Dow: s.dow,
		DomStar: s.domStar, DowStar: s.dowStar, Wildcard: s.wild,
	}, true
}

// maxSearchYears bounds Next's search. Every schedule ParseSchedule accepts
// fires at least once in any 400-year span of the Gregorian calendar.
const maxSearchYears = 401

// Notes returns remarks about the expression worth showing to its author
// (for example a step larger than its field's range); nil if none.
func (s *Schedule) Notes() []string { return append([]string(nil), s.notes...) }

// Wildcard reports whether the minute or hour field began with '*': cron's
// DST rule then lets the entry follow the wall clock in real time.
func (s *Schedule) Wildcard() bool { return s.wild }

// Next returns the first fire time strictly after `after`, evaluated in loc
// (nil means UTC); for "@every" it is after + the interval. The result is in
// loc. It returns the zero Time only if nothing fires within 400 years, which
// cannot happen for a schedule ParseSchedule accepted.
//
// Daylight saving time follows cron's own rules (Vixie cron, cronie):
//   - A wildcard entry (the minute or hour field begins with '*') follows the
//     wall clock in real time: it fires at every instant, at second :00, whose
//     local time matches. Local times in a spring-forward gap never occur and
//     do not fire; local times that occur twice when the clocks go back fire
//     twice.
//   - A fixed-time entry (neither field begins with '*') fires once per
//     matching local time. A local time that occurs twice fires at its first
//     occurrence after `after`: the search moves forward through wall-clock
//     times from the local time of `after`, so once the first occurrence has
//     fired the repeated time is behind it; only a schedule started inside
//     the second pass fires the rest of that pass. A local time inside a
//     spring-forward gap fires at the first instant after the gap (the
//     instant the clocks jumped), once, however many matching times the gap
//     holds.
func (s *Schedule) Next(after time.Time, loc *time.Location) time.Time {
	if s.every > 0 {
		return after.Add(s.every)
	}
	if loc == nil {
		loc = time.UTC
	}
	if s.wild && loc != time.UTC {
		return s.nextReal(after, loc)
	}
	return s.nextWall(after, loc)
}

// nextReal is Next for wildcard entries: within each period of one UTC
// offset, the wall clock is a fixed shift of real time, so it searches that
// period's wall clock as UTC and shifts the result back, and moves on to the
// next period if nothing matched before the period ended.
func (s *Schedule) nextReal(after time.Time, loc *time.Location) time.Time {
	cur := after
	for i := 0; i < 4*maxSearchYears+8; i++ {
		probe := cur.Add(time.Second).In(loc)
		_, off := probe.Zone()
		_, end := ZoneBounds(probe)
		// The period's wall clock as UTC: search there, shift back.
		shift := time.Duration(off) * time.Second
		t := s.nextWall(cur.Add(shift).UTC(), time.UTC)
		if t.IsZero() {
			return t
		}
		t = t.Add(-shift)
		if end.IsZero() || t.Before(end) {
			return t.In(loc)
		}
		cur = end.Add(-time.Second)
	}
	return time.Time{}
}

// nextWall searches wall-clock times forward from the local time of `after`
// (see Next: the fixed-time rule; in a fixed zone, also the wildcard rule).
func (s *Schedule) nextWall(after time.Time, loc *time.Location) time.Time {
	wall := after.In(loc)
	year, mon, d := wall.Date()
	h, mi, _ := wall.Clock()
	m := int(mon)
	mi++ // fires at :00, so the first candidate is the next minute
	limit := year + maxSearchYears
	and := s.daysAnd()
	allDays := s.allDays()
	for year <= limit {
		// Carry overflowing units.
		if mi > 59 {
			mi = 0
			h++
		}
		if h > 23 {
			h = 0
			d++
		}
		if d > daysIn(year, m) {
			d = 1
			m++
		}
		if m > 12 {
			m = 1
			year++
		}
		if s.month&(1<<m) == 0 {
			nm := nextBit(uint64(s.month), m)
			if nm < 0 {
				year++
				nm = nextBit(uint64(s.month), 1)
				if nm < 0 {
					return time.Time{}
				}
			}
			m, d, h, mi = nm, 1, 0, 0
			continue
		}
		if !allDays {
			if and && s.dom != AllDoms {
				nd := nextBit(uint64(s.dom), d)
				if nd < 0 || nd > daysIn(year, m) {
					d, h, mi = 32, 0, 0 // next month
					continue
				}
				if nd != d {
					d, h, mi = nd, 0, 0
				}
			}
			if !s.dayMatches(year, m, d, and) {
				d, h, mi = d+1, 0, 0
				continue
			}
		}
		if s.hour&(1<<h) == 0 {
			nh := nextBit(uint64(s.hour), h)
			if nh < 0 {
				d, h, mi = d+1, 0, 0
				continue
			}
			h, mi = nh, 0
		}
		nmi := nextBit(s.minute, mi)
		if nmi < 0 {
			h, mi = h+1, 0
			continue
		}
		mi = nmi
		if t, ok := resolve(year, m, d, h, mi, loc, after); ok {
			return t
		}
		mi++
	}
	return time.Time{}
}

// allDays reports whether every day matches the day fields.
func (s *Schedule) allDays() bool {
	domAll, dowAll := s.dom == AllDoms, s.dow == AllDows
	if s.daysAnd() {
		return domAll && dowAll
	}
	return domAll || dowAll
}

func (s *Schedule) dayMatches(y, m, d int, and bool) bool {
	domOK := s.dom&(1<<d) != 0
	if and && !domOK {
		return false
	}
	if !and && domOK {
		return true
	}
	return s.dow&(1<<weekday(y, m, d)) != 0
}

// nextBit returns the lowest set bit of set that is >= from, or -1.
func nextBit(set uint64, from int) int {
	if from > 63 {
		return -1
	}
	rest := set >> uint(from) << uint(from)
	if rest == 0 {
		return -1
	}
	return bits.TrailingZeros64(rest)
}

func isLeap(y int) bool { return y%4 == 0 && (y%100 != 0 || y%400 == 0) }

func daysIn(y, m int) int {
	if m == 2 && !isLeap(y) {
		return 28
	}
	return maxDays[m]
}

// civilDays returns the days since 1970-01-01 of a proleptic Gregorian date
// (Howard Hinnant's days_from_civil).
func civilDays(y, m, d int) int64 {
	if m <= 2 {
		y--
	}
	era := y / 400
	if y < 0 && y%400 != 0 {
		era--
	}
	yoe := y - era*400
	mp := (m + 9) % 12
	doy := (153*mp+2)/5 + d - 1
	doe := yoe*365 + yoe/4 - yoe/100 + doy
	return int64(era)*146097 + int64(doe) - 719468
}

// weekday returns 0 (Sunday) … 6 (Saturday).
func weekday(y, m, d int) int {
	w := (civilDays(y, m, d) + 4) % 7 // 1970-01-01 was a Thursday
	if w < 0 {
		w += 7
	}
	return int(w)
}

// maxShift bounds how far apart two offsets of one zone around a transition
// can be; it limits the search for a second occurrence of a wall-clock time.
const maxShift = 26 * 3600

// resolve converts the wall-clock time y-m-d h:mi:00 in loc to the earliest
// instant with that wall-clock time that is after `after`; a wall-clock time
// inside a gap (clocks moved forward) resolves to the first instant after the
// gap. ok is false if that instant is not after `after`.
func resolve(y, m, d, h, mi int, loc *time.Location, after time.Time) (time.Time, bool) {
	t := time.Date(y, time.Month(m), d, h, mi, 0, 0, loc)
	a := after.Unix() // whole-second instants: t > after ⇔ t.Unix() > after.Unix()
	if loc == time.UTC {
		return t, t.Unix() > a
	}
	w := civilDays(y, m, d)*86400 + int64(h)*3600 + int64(mi)*60
	_, off := t.Zone()
	u := t.Unix()
	if u+int64(off) != w {
		// time.Date normalised a time that does not exist in this zone period;
		// check the offsets around it before concluding it is in a gap.
		return resolveSlow(w, loc, a)
	}
	start, end := ZoneBounds(t)
	// An earlier occurrence lies in the previous zone period, if the clock
	// was turned back at its end.
	if !start.IsZero() && u-start.Unix() < maxShift {
		_, poff := start.Add(-time.Second).Zone()
		if p := w - int64(poff); p < start.Unix() && p > a {
			return time.Unix(p, 0).In(loc), true
		}
	}
	if u > a {
		return t, true
	}
	// A later occurrence lies in the next zone period.
	if !end.IsZero() && end.Unix()-u < maxShift {
		_, noff := end.Zone()
		if n := w - int64(noff); n >= end.Unix() && n > a {
			return time.Unix(n, 0).In(loc), true
		}
	}
	return time.Time{}, false
}

// resolveSlow finds the earliest instant after a whose wall clock in loc is
// w (seconds since the epoch as if UTC), trying every offset in effect within
// maxShift of it; if w falls in a gap, the end of the gap.
func resolveSlow(w int64, loc *time.Location, a int64) (time.Time, bool) {
	best := int64(0)
	found := false
	for _, probe := range [...]int64{w - maxShift, w, w + maxShift} {
		_, off := time.Unix(probe, 0).In(loc).Zone()
		u := w - int64(off)
		if _, o2 := time.Unix(u, 0).In(loc).Zone(); o2 != off || u <= a {
			continue
		}
		if !found || u < best {
			best, found = u, true
		}
	}
	if !found {
		if g, gap := gapEnd(w, loc); gap && g > a {
			return time.Unix(g, 0).In(loc), true
		}
		return time.Time{}, false
	}
	return time.Unix(best, 0).In(loc), true
}

// gapEnd returns the instant at which the clocks of loc jumped over the
// wall-clock time w (seconds since the epoch as if UTC), if w lies in such a
// gap: the first instant after it.
func gapEnd(w int64, loc *time.Location) (int64, bool) {
	at := time.Unix(w-maxShift, 0).In(loc)
	for i := 0; i < 4; i++ {
		_, off := at.Zone()
		_, end := ZoneBounds(at)
		if end.IsZero() || end.Unix() > w+maxShift {
			return 0, false
		}
		_, noff := end.Zone()
		e := end.Unix()
		if e+int64(off) <= w && w < e+int64(noff) {
			return e, true
		}
		at = end
	}
	return 0, false
}
