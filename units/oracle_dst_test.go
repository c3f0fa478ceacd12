package units

import (
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/drover/drover/manifest"
)

// oracleDSTZones are zones whose changes systemd has got wrong or that
// change in unusual ways: Chatham (+12:45/+13:45, changes at 02:45), Casablanca
// (clocks go back for Ramadan), Dublin (its "winter time" is the negative
// DST), Troll (a two-hour shift), Lord_Howe (30 minutes), Havana (changes at
// midnight), Santiago (changes at 24:00), New York.
var oracleDSTZones = []string{
	"Pacific/Chatham", "Africa/Casablanca", "Europe/Dublin", "Antarctica/Troll",
	"Australia/Lord_Howe", "America/Havana", "America/Santiago", "America/New_York",
}

// oracleDSTExprs holds wildcard entries (minute or hour field beginning with
// '*') and fixed-time entries that touch the hours around the changes of
// oracleDSTZones.
var oracleDSTExprs = []string{
	// wildcard
	"* * * * *", "*/5 * * * *", "*/7 * * * *", "0 * * * *", "45 * * * *", "15,45 * * * *", "* 2 * * *",
	"*/10 0-3 * * *", "30 */2 * * *", "*/15 1,2 * * *", "* 23,0 * * *",
	// fixed time
	"30 2 * * *", "0 1-5 * * *", "0 2-5 * * *", "45 2 * * *", "0 0 * * *", "30 0 * * *", "0,30 1,2 * * *",
	"59 1 * * *", "0 3 * * *", "15 23 * * *", "0 0 * * sun", "0 2 1-7 * sun", "0 1,2,3 * * sat,sun",
}

// TestOracleDSTDays simulates the timers of oracleDSTExprs in
// oracleDSTZones from before, at and inside every change of 2026-2027, asking
// systemd for every line at every step where no chain answers it (bulk mode;
// TestOracleZoneSuffix runs full mode).
func TestOracleDSTDays(t *testing.T) {
	sa := oracleAnalyze(t)
	const iterations = 12
	for _, zone := range oracleDSTZones {
		loc, err := time.LoadLocation(zone)
		if err != nil {
			t.Fatal(err)
		}
		trs := Transitions(loc, time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC), time.Date(2028, 1, 1, 0, 0, 0, 0, time.UTC))
		if len(trs) < 2 {
			t.Fatalf("%s: %d offset changes in 2026-2027", zone, len(trs))
		}
		var bases []time.Time
		for _, tr := range trs {
			_, before := tr.Add(-time.Second).In(loc).Zone()
			_, after := tr.In(loc).Zone()
			shift := time.Duration(after-before) * time.Second
			if shift < 0 {
				shift = -shift
			}
			// The evening before; just before the change; inside the
			// repeated range or just after the gap.
			bases = append(bases, tr.Add(-6*time.Hour-7*time.Minute), tr.Add(-shift-10*time.Minute), tr.Add(5*time.Minute))
		}
		t.Run(strings.ReplaceAll(zone, "/", "_"), func(t *testing.T) {
			t.Parallel()
			var cs []simCase
			for _, e := range oracleDSTExprs {
				s := calParse(t, e)
				for _, base := range bases {
					cs = append(cs, newSimCase(t, s, zone, base, iterations, false))
				}
			}
			sim := simulateAndReport(t, sa, zone, cs)
			t.Logf("%s: %d timers, %d systemd-analyze runs", zone, len(cs), sim.runs)
		})
	}
}

// TestTranslationAloneMisses documents why the corrections exist: without
// them, systemd 252 misses fire times on DST days (the examples below).
// It checks that systemd never fires at an instant the evaluator does not:
// every elapse of the translated line alone is one of the evaluator's.
func TestTranslationAloneMisses(t *testing.T) {
	sa := oracleAnalyze(t)
	for _, c := range []struct {
		expr, zone, after string
		lost              int // evaluator instants systemd's first elapse skips
	}{
		{"0 1-5 * * *", "Europe/Dublin", "2026-03-28T05:00:00Z", 4},
		{"0 2-5 * * *", "Antarctica/Troll", "2026-03-28T05:00:00Z", 1},
		{"*/30 * * * *", "America/New_York", "2026-11-01T05:40:00Z", 2}, // the repeated hour's second pass
		{"30 2 * * *", "Europe/Berlin", "2026-03-28T12:00:00Z", 1},      // the gap time
	} {
		s := calParse(t, c.expr)
		loc, _ := manifest.LoadLocation(c.zone)
		after, _ := time.Parse(time.RFC3339, c.after)
		lines, err := OnCalendar(s, c.zone)
		if err != nil {
			t.Fatal(err)
		}
		blocks := oracleRun(t, sa, ":"+c.zone, after, 1, []string{strings.TrimSuffix(lines[0], " "+c.zone)})
		if len(blocks[0].times) != 1 {
			t.Fatalf("%q: no elapse", c.expr)
		}
		got := blocks[0].times[0]
		lost := 0
		at := after
		for {
			at = s.Next(at, loc)
			if !at.Before(got) {
				break
			}
			lost++
		}
		if !at.Equal(got) || lost != c.lost {
			t.Errorf("%q in %s after %s: systemd's first elapse %s; evaluator instant there %s, %d skipped, want %d",
				c.expr, c.zone, c.after, got.Format(time.RFC3339), at.Format(time.RFC3339), lost, c.lost)
		}
	}
}

// TestChathamTranslationFails documents the worst of systemd 252's DST
// errors: on Pacific/Chatham's spring-forward day it cannot compute a next
// elapse at all for minute 45, so a timer with that line alone would have
// nothing scheduled; the rendered timer has correction lines for that day.
func TestChathamTranslationFails(t *testing.T) {
	sa := oracleAnalyze(t)
	base := time.Date(2026, 9, 26, 13, 30, 0, 0, time.UTC)
	cmd := exec.Command(sa, "calendar", "--base-time=@"+strconv.FormatInt(base.Unix(), 10), "*-*-* *:45:00")
	cmd.Env = append(os.Environ(), "TZ=:Pacific/Chatham", "LC_ALL=C", "SYSTEMD_COLORS=0")
	out, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "Failed to determine next elapse") {
		t.Logf("systemd-analyze computed it (a fixed systemd?): %s", out)
	}
	s := calParse(t, "45 * * * *")
	corr, err := Corrections(s, "Pacific/Chatham", base)
	if err != nil {
		t.Fatal(err)
	}
	loc, _ := time.LoadLocation("Pacific/Chatham")
	next := s.Next(base, loc)
	var first time.Time
	for _, b := range oracleRun(t, sa, "UTC", base, 1, corr) {
		if len(b.times) > 0 && (first.IsZero() || b.times[0].Before(first)) {
			first = b.times[0]
		}
	}
	if next.UTC().Format(time.RFC3339) != "2026-09-26T14:00:00Z" || !first.Equal(next) {
		t.Errorf("next %s; the correction lines' first elapse %s", next.UTC().Format(time.RFC3339), first)
	}
}
