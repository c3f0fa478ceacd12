package units

import (
	"fmt"
	"math/rand"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"github.com/drover/drover/manifest"
)

func TestOnCalendarLines(t *testing.T) {
	for _, c := range []struct {
		expr, tz string
		want     []string
	}{
		{"* * * * *", "UTC", []string{"*-*-* *:*:00 UTC"}},
		{"30 2 * * *", "", []string{"*-*-* 02:30:00 UTC"}},
		{"30 2 * * *", "Europe/Berlin", []string{"*-*-* 02:30:00 Europe/Berlin"}},
		{"*/5 * * * *", "UTC", []string{"*-*-* *:00..55/5:00 UTC"}},
		{"*/7 * * * *", "UTC", []string{"*-*-* *:00..56/7:00 UTC"}},
		{"5/15 1/4 * * *", "UTC", []string{"*-*-* 01..21/4:05..50/15:00 UTC"}},
		{"0,30 8-18 * * *", "UTC", []string{"*-*-* 08..18:00,30:00 UTC"}},
		{"0,1,2,5,7,8,9 0,1 * * *", "UTC", []string{"*-*-* 00,01:00..02,05,07..09:00 UTC"}},
		{"0 22 * * 1-5", "America/New_York", []string{"Mon..Fri *-*-* 22:00:00 America/New_York"}},
		{"0 0 * * 0,6", "UTC", []string{"Sat,Sun *-*-* 00:00:00 UTC"}},
		{"0 0 * * 5-7", "UTC", []string{"Fri..Sun *-*-* 00:00:00 UTC"}},
		{"0 0 * * 0,1,3,4,5", "UTC", []string{"Mon,Wed..Fri,Sun *-*-* 00:00:00 UTC"}},
		{"0 0 * * 0-7", "UTC", []string{"*-*-* 00:00:00 UTC"}},
		{"0 0 1 jan,jul *", "UTC", []string{"*-01,07-01 00:00:00 UTC"}},
		{"0 0 * */3 *", "UTC", []string{"*-01..10/3-* 00:00:00 UTC"}},
		{"0 0 29 2 *", "UTC", []string{"*-02-29 00:00:00 UTC"}},
		{"0 0 2-30/7 * *", "UTC", []string{"*-*-02..30/7 00:00:00 UTC"}},
		{"@yearly", "Asia/Kolkata", []string{"*-01-01 00:00:00 Asia/Kolkata"}},
		{"@daily", "Etc/GMT", []string{"*-*-* 00:00:00 Etc/GMT"}},
		{"@daily", "America/Argentina/Buenos_Aires", []string{"*-*-* 00:00:00 America/Argentina/Buenos_Aires"}},
		{"@monthly", "UTC", []string{"*-*-01 00:00:00 UTC"}},
		{"@weekly", "UTC", []string{"Sun *-*-* 00:00:00 UTC"}},
		{"@daily", "UTC", []string{"*-*-* 00:00:00 UTC"}},
		{"@hourly", "UTC", []string{"*-*-* *:00:00 UTC"}},
		// cronie's day rule.
		{"0 12 1 * 1", "Europe/Berlin", []string{"*-*-01 12:00:00 Europe/Berlin", "Mon *-*-* 12:00:00 Europe/Berlin"}},
		{"0 0 13 * fri", "UTC", []string{"*-*-13 00:00:00 UTC", "Fri *-*-* 00:00:00 UTC"}},
		{"0 0 1,15 jan-mar mon-fri", "UTC", []string{"*-01..03-01,15 00:00:00 UTC", "Mon..Fri *-01..03-* 00:00:00 UTC"}},
		{"0 0 */2 * 1", "UTC", []string{"Mon *-*-01..31/2 00:00:00 UTC"}}, // dom begins with '*': both
		{"0 0 1-7 * */2", "UTC", []string{"Tue,Thu,Sat,Sun *-*-01..07 00:00:00 UTC"}},
		{"0 0 1-7 * *", "UTC", []string{"*-*-01..07 00:00:00 UTC"}},
		{"0 0 1-31 * 1", "UTC", []string{"*-*-* 00:00:00 UTC"}}, // either rule, all days
		{"0 0 1 * 0-6", "UTC", []string{"*-*-* 00:00:00 UTC"}},
		{"0 0 30 2 mon", "UTC", []string{"Mon *-02-* 00:00:00 UTC"}}, // Feb 30 never elapses: left out
	} {
		s, err := manifest.ParseSchedule(c.expr)
		if err != nil {
			t.Fatalf("%q: %v", c.expr, err)
		}
		got, err := OnCalendar(s, c.tz)
		if err != nil || !reflect.DeepEqual(got, c.want) {
			t.Errorf("OnCalendar(%q, %q) = %q, %v\nwant %q", c.expr, c.tz, got, err, c.want)
		}
	}
}

func TestOnCalendarErrors(t *testing.T) {
	every, _ := manifest.ParseSchedule("@every 5m")
	daily, _ := manifest.ParseSchedule("@daily")
	for _, c := range []struct {
		s   *manifest.Schedule
		tz  string
		msg string
	}{
		{nil, "UTC", "no schedule"},
		{every, "UTC", `"@every 5m" is an interval and has no OnCalendar= form (use OnUnitActiveSec=)`},
		{daily, "Mars/Olympus_Mons", `unknown time zone "Mars/Olympus_Mons" (use an IANA name such as Europe/Berlin)`},
		{daily, "Europe/Berlin %n", `"Europe/Berlin %n" is not an IANA time zone name (e.g. Europe/Berlin)`},
		{daily, "Local", `"Local" is not an IANA time zone name (e.g. Europe/Berlin)`},
		{daily, "../../etc/passwd", `"../../etc/passwd" is not an IANA time zone name (e.g. Europe/Berlin)`},
		{daily, "GMT", `"GMT": use UTC or a Region/City IANA name such as Europe/Berlin (abbreviations like CET or EST are ambiguous to systemd)`},
		{daily, "CET", `"CET": use UTC or a Region/City IANA name such as Europe/Berlin (abbreviations like CET or EST are ambiguous to systemd)`},
		{daily, "right/Europe/Berlin", `"right/Europe/Berlin": use UTC or a Region/City IANA name such as Europe/Berlin (abbreviations like CET or EST are ambiguous to systemd)`},
	} {
		got, err := OnCalendar(c.s, c.tz)
		if err == nil || err.Error() != c.msg {
			t.Errorf("OnCalendar(%v, %q) = %q, %v; want error %q", c.s, c.tz, got, err, c.msg)
		}
	}
}

// calLine is an OnCalendar= value parsed back, independently of the
// manifest package: bitsets in cron's numbering (weekday bit 0 = Sunday).
type calLine struct {
	dow    uint8
	month  uint16
	dom    uint32
	hour   uint32
	minute uint64
	second uint64
	tz     string
}

var sdDays = map[string]int{"Mon": 1, "Tue": 2, "Wed": 3, "Thu": 4, "Fri": 5, "Sat": 6, "Sun": 7}

// parseCalLine reads "[Weekdays ]*-MM-DD HH:MM:SS TZ" as systemd.time(7)
// defines it, for the subset OnCalendar writes (plus "a/n").
func parseCalLine(line string) (calLine, error) {
	var c calLine
	words := strings.Split(line, " ")
	if len(words) == 4 {
		for _, part := range strings.Split(words[0], ",") {
			a, b, isRange := strings.Cut(part, "..")
			lo, ok1 := sdDays[a]
			hi := lo
			ok2 := true
			if isRange {
				hi, ok2 = sdDays[b]
			}
			if !ok1 || !ok2 || hi < lo {
				return c, fmt.Errorf("bad weekdays %q", words[0])
			}
			for d := lo; d <= hi; d++ {
				c.dow |= 1 << (d % 7)
			}
		}
		words = words[1:]
	} else {
		c.dow = 0x7f
	}
	if len(words) != 3 {
		return c, fmt.Errorf("%d words", len(words))
	}
	c.tz = words[2]
	date := strings.SplitN(words[0], "-", 3)
	clock := strings.Split(words[1], ":")
	if len(date) != 3 || date[0] != "*" || len(clock) != 3 {
		return c, fmt.Errorf("bad date or time in %q", line)
	}
	var err error
	var v uint64
	if v, err = parseComp(date[1], 1, 12); err != nil {
		return c, err
	}
	c.month = uint16(v)
	if v, err = parseComp(date[2], 1, 31); err != nil {
		return c, err
	}
	c.dom = uint32(v)
	if v, err = parseComp(clock[0], 0, 23); err != nil {
		return c, err
	}
	c.hour = uint32(v)
	if c.minute, err = parseComp(clock[1], 0, 59); err != nil {
		return c, err
	}
	if c.second, err = parseComp(clock[2], 0, 59); err != nil {
		return c, err
	}
	return c, nil
}

func parseComp(s string, lo, hi int) (uint64, error) {
	if s == "*" {
		return (1<<(hi+1) - 1) &^ (1<<lo - 1), nil
	}
	var set uint64
	for _, part := range strings.Split(s, ",") {
		rng, stepText, hasStep := strings.Cut(part, "/")
		a, b, isRange := strings.Cut(rng, "..")
		start, err1 := strconv.Atoi(a)
		stop, err2 := start, error(nil)
		if isRange {
			stop, err2 = strconv.Atoi(b)
		} else if hasStep {
			stop = hi
		}
		step, err3 := 1, error(nil)
		if hasStep {
			step, err3 = strconv.Atoi(stepText)
		}
		if err1 != nil || err2 != nil || err3 != nil || len(a) != 2 || isRange && len(b) != 2 ||
			start < lo || stop > hi || stop < start || step < 1 {
			return 0, fmt.Errorf("bad component %q", s)
		}
		for v := start; v <= stop; v += step {
			set |= 1 << v
		}
	}
	return set, nil
}

// checkTranslation checks that the lines fire on exactly the minutes the
// schedule does: same times of day, and for every month, day of the month
// and weekday, some line matches if and only if cron's day rule does.
func checkTranslation(s *manifest.Schedule, tz string, lines []string) error {
	f, ok := s.Fields()
	if !ok {
		return fmt.Errorf("no fields")
	}
	var parsed []calLine
	for _, l := range lines {
		c, err := parseCalLine(l)
		if err != nil {
			return fmt.Errorf("%q: %v", l, err)
		}
		if c.tz != tz || c.second != 1 || c.minute != f.Minute || c.hour != f.Hour {
			return fmt.Errorf("%q: time of day or zone differs from %+v", l, f)
		}
		parsed = append(parsed, c)
	}
	maxDays := [13]int{0, 31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31}
	for m := 1; m <= 12; m++ {
		for d := 1; d <= maxDays[m]; d++ {
			for wd := 0; wd < 7; wd++ {
				domOK, dowOK := f.Dom&(1<<d) != 0, f.Dow&(1<<wd) != 0
				want := f.Month&(1<<m) != 0
				if f.DaysAnd() {
					want = want && domOK && dowOK
				} else {
					want = want && (domOK || dowOK)
				}
				got := false
				for _, c := range parsed {
					got = got || c.month&(1<<m) != 0 && c.dom&(1<<d) != 0 && c.dow&(1<<wd) != 0
				}
				if got != want {
					return fmt.Errorf("%q: month %d day %d weekday %d: lines match %v, cron %v", lines, m, d, wd, got, want)
				}
			}
		}
	}
	return nil
}

func TestOnCalendarTranslationExact(t *testing.T) {
	corpus := oracleCorpus(t)
	rng := rand.New(rand.NewSource(7))
	for i := 0; i < 3000; i++ {
		if s, err := manifest.ParseSchedule(randomCron(rng)); err == nil {
			corpus = append(corpus, s)
		}
	}
	for _, s := range corpus {
		if _, ok := s.Every(); ok {
			continue
		}
		lines, err := OnCalendar(s, "Europe/Berlin")
		if err != nil {
			t.Fatalf("%q: %v", s, err)
		}
		if err := checkTranslation(s, "Europe/Berlin", lines); err != nil {
			t.Errorf("%q: %v", s, err)
		}
	}
}

// randomCron builds a five-field expression from random elements; some are
// invalid on purpose.
func randomCron(rng *rand.Rand) string {
	elem := func(lo, hi int) string {
		a := lo + rng.Intn(hi-lo+1)
		b := a + rng.Intn(hi-a+1)
		switch rng.Intn(7) {
		case 0:
			return "*"
		case 1:
			return "*/" + strconv.Itoa(1+rng.Intn(hi))
		case 2:
			return strconv.Itoa(a)
		case 3:
			return fmt.Sprintf("%d-%d", a, b)
		case 4:
			return fmt.Sprintf("%d-%d/%d", a, b, 1+rng.Intn(hi))
		case 5:
			return fmt.Sprintf("%d/%d", a, 1+rng.Intn(hi))
		}
		return fmt.Sprintf("%d,%d", a, b)
	}
	field := func(lo, hi int) string {
		parts := []string{elem(lo, hi)}
		for rng.Intn(3) == 0 {
			parts = append(parts, elem(lo, hi))
		}
		return strings.Join(parts, ",")
	}
	return strings.Join([]string{field(0, 59), field(0, 23), field(1, 31), field(1, 12), field(0, 7)}, " ")
}

// FuzzOnCalendar: whatever ParseSchedule accepts translates into lines that
// parse under parseCalLine and fire on exactly the schedule's minutes.
func FuzzOnCalendar(f *testing.F) {
	for _, e := range []string{"*/5 * * * *", "0 12 1 * 1", "0 0 */2 * 1", "0 0 30 2 mon", "1-59/2 0/5 */3 2-11/3 5-7", "@weekly"} {
		f.Add(e)
	}
	f.Fuzz(func(t *testing.T, expr string) {
		s, err := manifest.ParseSchedule(expr)
		if err != nil {
			return
		}
		lines, err := OnCalendar(s, "America/New_York")
		if _, every := s.Every(); every {
			if err == nil {
				t.Fatalf("%q: lines for an interval", expr)
			}
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		if err := checkTranslation(s, "America/New_York", lines); err != nil {
			t.Fatal(err)
		}
	})
}
