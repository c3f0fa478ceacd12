package units

import (
	"bufio"
	"bytes"
	"fmt"
	"math/rand"
	"os"
	"os/exec"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/drover/drover/internal/testkit"
	"github.com/drover/drover/manifest"
)

// The systemd oracle: for every expression of testdata/cron-corpus.txt, in
// every zone of oracleZones, from every base time of oracleBases, the next
// oracleIterations fire times of manifest.Schedule.Next (up to the
// correction horizon) must equal the elapses of the timer rendered at that
// base time, simulated over all its OnCalendar= lines (the translation and
// the DST corrections) with `systemd-analyze calendar` computing each line's
// next elapse (see oracle_sim_test.go).
//
// systemd 252 evaluates a value with a time zone suffix in a forked child that
// sets TZ=:<zone> and then runs the ordinary local-time evaluation; each fork
// costs about 5 ms here, which makes 300 expressions × 20 iterations × ~70
// base times far too slow. So the bulk comparison runs systemd-analyze with
// TZ=:<zone> in its environment and the lines without the suffix, which is
// exactly what the forked child computes (for "UTC" the suffix stays: it
// selects systemd's separate UTC code path; the correction lines are in UTC
// and keep it too). TestOracleZoneSuffix checks
// with the emitted lines verbatim, suffix included, on the DST corners, and
// TestOnCalendarNormalizes checks every emitted line with its suffix parses
// and is already in systemd's normalized form.

const oracleIterations = 20

var oracleZones = []string{
	"UTC", "Europe/Berlin", "America/New_York", "Australia/Lord_Howe", "Asia/Kolkata", "Antarctica/Troll",
}

// oracleAnalyze returns the path of systemd-analyze, skipping the test if it
// is missing (failing it when CI=true).
func oracleAnalyze(t testing.TB) string {
	t.Helper()
	return testkit.RequireCommand(t, "systemd-analyze", "")
}

// oracleCorpus returns the expressions of testdata/cron-corpus.txt, parsed.
func oracleCorpus(t testing.TB) []*manifest.Schedule {
	t.Helper()
	b, err := os.ReadFile("testdata/cron-corpus.txt")
	if err != nil {
		t.Fatal(err)
	}
	var out []*manifest.Schedule
	seen := map[string]bool{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if seen[line] {
			t.Fatalf("cron-corpus.txt:%d: duplicate %q", n, line)
		}
		seen[line] = true
		s, err := manifest.ParseSchedule(line)
		if err != nil {
			t.Fatalf("cron-corpus.txt:%d: %q: %v", n, line, err)
		}
		out = append(out, s)
	}
	if len(out) < 300 {
		t.Fatalf("cron-corpus.txt has %d expressions, want at least 300", len(out))
	}
	return out
}

// oracleBases returns the base times for one zone: around every offset
// change of 2026 and 2027 (before the affected wall-clock range, just before
// the change, and just after it, which is inside the repeated range when
// clocks go back), plus ordinary days.
func oracleBases(t testing.TB, loc *time.Location) []time.Time {
	t.Helper()
	var out []time.Time
	stop := time.Date(2028, 1, 1, 0, 0, 0, 0, time.UTC)
	for at := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC); ; {
		_, end := at.In(loc).ZoneBounds()
		if end.IsZero() || !end.Before(stop) {
			break
		}
		_, before := end.Add(-time.Second).Zone()
		_, after := end.Zone()
		shift := time.Duration(after-before) * time.Second
		if shift < 0 {
			shift = -shift
		}
		if shift > 0 {
			out = append(out, end.Add(-shift-10*time.Minute), end.Add(-10*time.Minute), end.Add(5*time.Minute))
		}
		at = end
	}
	if n := len(out); loc.String() != "UTC" && loc.String() != "Asia/Kolkata" && n != 12 {
		t.Fatalf("%s: found %d base times around DST changes in 2026-2027, want 12", loc, n)
	}
	out = append(out,
		time.Date(2026, 6, 15, 9, 41, 27, 0, loc),   // an ordinary day, base not on a minute
		time.Date(2027, 12, 31, 23, 30, 0, 0, loc),  // year end
		time.Date(2028, 2, 27, 20, 0, 0, 0, loc),    // before a leap day
		time.Date(2026, 10, 31, 23, 59, 59, 0, loc), // month end
	)
	if len(out) == 4 { // no DST: Europe's change dates are ordinary days here
		out = append(out, time.Date(2026, 3, 29, 0, 50, 0, 0, loc), time.Date(2026, 10, 25, 1, 50, 0, 0, loc))
	}
	return out
}

// oracleBlock is one expression's output of systemd-analyze calendar.
type oracleBlock struct {
	normalized string
	original   string
	times      []time.Time // in UTC
}

// oracleRun runs systemd-analyze calendar on exprs with TZ=tzEnv and
// returns one block per expression.
func oracleRun(t testing.TB, sa, tzEnv string, base time.Time, iterations int, exprs []string) []oracleBlock {
	t.Helper()
	args := []string{"calendar", "--iterations=" + strconv.Itoa(iterations)}
	if !base.IsZero() {
		args = append(args, "--base-time=@"+strconv.FormatInt(base.Unix(), 10))
	}
	cmd := exec.Command(sa, append(args, exprs...)...)
	cmd.Env = append(os.Environ(), "TZ="+tzEnv, "LC_ALL=C", "SYSTEMD_COLORS=0", "SYSTEMD_PAGER=cat")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil || stderr.Len() > 0 {
		t.Fatalf("systemd-analyze (TZ=%s) failed: %v\n%s", tzEnv, err, stderr.String())
	}
	blocks, err := oracleParseOutput(stdout.String())
	if err != nil {
		t.Fatalf("systemd-analyze (TZ=%s): %v\n%s", tzEnv, err, stdout.String())
	}
	if len(blocks) != len(exprs) {
		t.Fatalf("systemd-analyze (TZ=%s): %d blocks for %d expressions", tzEnv, len(blocks), len(exprs))
	}
	return blocks
}

// oracleParseOutput reads the output of systemd-analyze calendar: per
// expression an optional "Original form:", "Normalized form:", then
// "Next elapse:" and "Iter. #N:" lines, each followed by "(in UTC):" when the
// process's time zone is not UTC, and "From now:" lines, which are ignored.
func oracleParseOutput(out string) ([]oracleBlock, error) {
	var blocks []oracleBlock
	var cur *oracleBlock
	var vals []string // elapse values of cur, "(in UTC)" replacing the local one
	var original string
	finish := func() error {
		if cur == nil {
			return nil
		}
		for _, v := range vals {
			s, ok := strings.CutSuffix(v, " UTC")
			if !ok {
				return fmt.Errorf("%q: elapse %q is not in UTC", cur.normalized, v)
			}
			tm, err := time.Parse("Mon 2006-01-02 15:04:05", s)
			if err != nil {
				return fmt.Errorf("%q: elapse %q: %v", cur.normalized, v, err)
			}
			cur.times = append(cur.times, tm)
		}
		blocks = append(blocks, *cur)
		cur, vals = nil, nil
		return nil
	}
	for _, line := range strings.Split(out, "\n") {
		key, val, ok := strings.Cut(strings.TrimSpace(line), ": ")
		if !ok {
			continue
		}
		val = strings.TrimSpace(val)
		switch {
		case key == "Original form":
			if err := finish(); err != nil {
				return nil, err
			}
			original = val
		case key == "Normalized form":
			if err := finish(); err != nil {
				return nil, err
			}
			cur = &oracleBlock{normalized: val, original: original}
			original = ""
		case cur == nil:
			return nil, fmt.Errorf("unexpected line %q", line)
		case key == "Next elapse" || strings.HasPrefix(key, "Iter. #"):
			if val != "never" {
				vals = append(vals, val)
			}
		case key == "(in UTC)":
			if len(vals) == 0 {
				return nil, fmt.Errorf("%q: (in UTC) without an elapse", cur.normalized)
			}
			vals[len(vals)-1] = val
		case key == "From now":
		default:
			return nil, fmt.Errorf("unexpected line %q", line)
		}
	}
	if err := finish(); err != nil {
		return nil, err
	}
	return blocks, nil
}

// oracleCase is one expression in one zone.
type oracleCase struct {
	sched *manifest.Schedule
	lines []string // as OnCalendar emits them
	first int      // index of lines[0] in the batch
}

func oracleBuild(t testing.TB, corpus []*manifest.Schedule, zone string) ([]oracleCase, []string) {
	t.Helper()
	var cases []oracleCase
	var batch []string
	for _, s := range corpus {
		lines, err := OnCalendar(s, zone)
		if _, every := s.Every(); every {
			if err == nil {
				t.Fatalf("%q: OnCalendar accepted an @every schedule", s)
			}
			continue
		}
		if err != nil {
			t.Fatalf("%q in %s: %v", s, zone, err)
		}
		if len(lines) < 1 || len(lines) > 2 {
			t.Fatalf("%q: %d lines", s, len(lines))
		}
		for _, l := range lines {
			if !strings.HasSuffix(l, " "+zone) {
				t.Fatalf("%q: line %q does not end in %q", s, l, " "+zone)
			}
		}
		cases = append(cases, oracleCase{sched: s, lines: lines, first: len(batch)})
		batch = append(batch, lines...)
	}
	return cases, batch
}

// oracleMerge merges the series of an expression's lines: sorted, without
// duplicates, at most n. It also returns whether the series was complete
// (every line gave n times; otherwise systemd stopped at its year limit).
func oracleMerge(blocks []oracleBlock, n int) ([]time.Time, bool) {
	var all []time.Time
	complete := true
	for _, b := range blocks {
		all = append(all, b.times...)
		if len(b.times) < n {
			complete = false
		}
	}
	sort.Slice(all, func(i, j int) bool { return all[i].Before(all[j]) })
	var out []time.Time
	for i, tm := range all {
		if i > 0 && tm.Equal(all[i-1]) {
			continue
		}
		out = append(out, tm)
	}
	if len(out) >= n {
		return out[:n], true
	}
	return out, complete
}

// oracleCheck compares systemd's series from base with Next's and returns a
// description of the first difference, or "".
func oracleCheck(s *manifest.Schedule, loc *time.Location, base time.Time, want []time.Time, complete bool) string {
	at := base
	for i, w := range want {
		got := s.Next(at, loc)
		if !got.Equal(w) {
			return fmt.Sprintf("fire #%d after %s: Next = %s, systemd = %s (series so far ok: %d)",
				i+1, at.In(loc).Format(time.RFC3339), oracleFmt(got, loc), oracleFmt(w, loc), i)
		}
		at = got
	}
	if !complete {
		// systemd gives up after the year 2199 (MAX_YEAR in calendarspec.c).
		got := s.Next(at, loc)
		if !got.IsZero() && got.In(loc).Year() <= 2199 {
			return fmt.Sprintf("systemd ends after %d fire times, Next continues with %s", len(want), oracleFmt(got, loc))
		}
	}
	return ""
}

func oracleFmt(t time.Time, loc *time.Location) string {
	if t.IsZero() {
		return "zero"
	}
	return t.In(loc).Format("2006-01-02 15:04:05 MST") + " (" + t.UTC().Format("15:04Z") + ")"
}

func TestOracleSystemd(t *testing.T) {
	sa := oracleAnalyze(t)
	corpus := oracleCorpus(t)
	start := time.Now()
	var mu sync.Mutex
	var total, cases, runs int
	t.Cleanup(func() {
		t.Logf("oracle: %d expressions × %d zones, %d timers simulated (%d (zone, base time) pairs), %d fire times, %d systemd-analyze runs, in %s",
			len(corpus), len(oracleZones), cases, total, cases*oracleIterations, runs, time.Since(start).Round(time.Millisecond))
	})
	if n := len(corpus) * len(oracleZones); n < 1800 {
		t.Fatalf("the corpus has %d (expression, zone) cases, want at least 1,800", n)
	}
	for _, zone := range oracleZones {
		loc, err := time.LoadLocation(zone)
		if err != nil {
			t.Fatal(err)
		}
		bases := oracleBases(t, loc)
		t.Run(strings.ReplaceAll(zone, "/", "_"), func(t *testing.T) {
			t.Parallel()
			var cs []simCase
			for _, base := range bases {
				for _, s := range corpus {
					if _, every := s.Every(); every {
						if _, err := OnCalendar(s, zone); err == nil {
							t.Fatalf("%q: OnCalendar accepted an @every schedule", s)
						}
						continue
					}
					cs = append(cs, newSimCase(t, s, zone, base, oracleIterations, false))
				}
			}
			sim := simulateAndReport(t, sa, zone, cs)
			mu.Lock()
			total += len(bases)
			cases += len(cs)
			runs += sim.runs
			mu.Unlock()
		})
	}
}

// TestOracleZoneSuffix runs the emitted lines verbatim, time zone suffix
// included (systemd's forked per-zone evaluation), on expressions that touch
// the DST hours, from base times around the 2026 changes.
func TestOracleZoneSuffix(t *testing.T) {
	sa := oracleAnalyze(t)
	exprs := []string{
		"* * * * *", "*/5 * * * *", "0 * * * *", "30 2 * * *", "*/10 1-3 * * *", "15,45 1,2 * * *",
		"59 1 * * *", "0,30 2 * * sun", "*/20 0-4 * * *", "45 2 * * *",
	}
	const iterations = 5
	for _, zone := range []string{"Europe/Berlin", "America/New_York", "Australia/Lord_Howe", "Antarctica/Troll"} {
		loc, err := time.LoadLocation(zone)
		if err != nil {
			t.Fatal(err)
		}
		// The 2026 changes: just before the clocks go forward; before and
		// inside the repeated range when they go back.
		var bases []time.Time
		for _, tr := range Transitions(loc, time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC), time.Date(2027, 1, 1, 0, 0, 0, 0, time.UTC)) {
			_, before := tr.Add(-time.Second).In(loc).Zone()
			_, after := tr.In(loc).Zone()
			if shift := time.Duration(after-before) * time.Second; shift > 0 {
				bases = append(bases, tr.Add(-10*time.Minute))
			} else {
				bases = append(bases, tr.Add(shift-10*time.Minute), tr.Add(5*time.Minute))
			}
		}
		if len(bases) != 3 {
			t.Fatalf("%s: %d base times for 2026, want 3", zone, len(bases))
		}
		t.Run(strings.ReplaceAll(zone, "/", "_"), func(t *testing.T) {
			t.Parallel()
			var cs []simCase
			for _, base := range bases {
				for _, e := range exprs {
					cs = append(cs, newSimCase(t, calParse(t, e), zone, base, iterations, true))
				}
			}
			for _, d := range newOracleSim(sa).simulate(t, cs, true) {
				t.Error(d)
			}
		})
	}
}

// TestOnCalendarNormalizes checks that every line emitted for the corpus, in
// every zone, parses under systemd-analyze and is already in its normalized
// form.
func TestOnCalendarNormalizes(t *testing.T) {
	sa := oracleAnalyze(t)
	corpus := oracleCorpus(t)
	// Plus random expressions (see randomCron), in one zone.
	var extra []*manifest.Schedule
	rng := rand.New(rand.NewSource(11))
	for len(extra) < 2000 {
		if s, err := manifest.ParseSchedule(randomCron(rng)); err == nil {
			extra = append(extra, s)
		}
	}
	for _, zone := range append(oracleZones, "random") {
		cs := corpus
		if zone == "random" {
			cs, zone = extra, "Europe/Berlin"
		}
		_, batch := oracleBuild(t, cs, zone)
		blocks := oracleRun(t, sa, "UTC", time.Time{}, 0, batch)
		for i, b := range blocks {
			if b.original != "" || b.normalized != batch[i] {
				t.Errorf("%q: systemd normalizes it to %q", batch[i], b.normalized)
			}
		}
	}
}

func calParse(t testing.TB, expr string) *manifest.Schedule {
	t.Helper()
	s, err := manifest.ParseSchedule(expr)
	if err != nil {
		t.Fatalf("%q: %v", expr, err)
	}
	return s
}

// TestOracleHostZone runs emitted lines under host time zones whose
// abbreviations (GMT, EST, CET) coincide with IANA zone names: the values
// OnCalendar writes must not depend on the host's zone. (The bare names are
// refused by OnCalendar; see calendarZone.)
func TestOracleHostZone(t *testing.T) {
	sa := oracleAnalyze(t)
	s := calParse(t, "0 12 * * *")
	base := time.Date(2026, 7, 1, 0, 0, 0, 0, time.UTC)
	for _, host := range []string{":Europe/London", ":America/New_York", ":Europe/Berlin"} {
		for _, zone := range []string{"UTC", "Etc/GMT", "Europe/London", "America/New_York", "Europe/Berlin"} {
			loc, err := time.LoadLocation(zone)
			if err != nil {
				t.Fatal(err)
			}
			cases, batch := oracleBuild(t, []*manifest.Schedule{s}, zone)
			blocks := oracleRun(t, sa, host, base, 2, batch)
			want, complete := oracleMerge(blocks[cases[0].first:cases[0].first+len(cases[0].lines)], 2)
			if len(want) == 0 {
				t.Errorf("host TZ=%s: %q never elapses", host, batch)
				continue
			}
			if diff := oracleCheck(s, loc, base, want, complete); diff != "" {
				t.Errorf("host TZ=%s, %q: %s", host, batch, diff)
			}
		}
	}
}
