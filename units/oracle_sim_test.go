package units

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/drover/drover/manifest"
)

// The timer simulation: systemd fires a timer at the earliest next elapse of
// any of its OnCalendar= lines, computed from the previous elapse; a line it
// cannot compute is skipped for that step. simulate runs exactly that, with
// `systemd-analyze calendar` computing every line's next elapse, along the
// evaluator's series: step k starts from the evaluator's k-th instant, so
// the first step at which systemd's earliest elapse differs is the first
// difference of the two series.
//
// Batching: a chain that systemd-analyze prints for one line from a base
// (--iterations=N) is a list of exact facts, next(base) = c0 and
// next(c_i) = c_(i+1), because systemd-analyze computes each iteration from
// the previous elapse. Most steps of a timer are answered by such a chain of
// the line that fired; only the other lines at a step that a chain does not
// answer are asked again, and those questions are batched per base time (one
// systemd-analyze run for every line asked from that base).
//
// In bulk mode, two more kinds of step are answered from the line's chain
// from the case's base instead of asking systemd again: a correction line
// (an absolute UTC value) by the earliest of its instants after the step's
// base, and a translated line whose step lies between two elements of its
// chain with no offset change between them by the later element.
// Full mode (TestOracleDSTDays, TestOracleZoneSuffix) asks systemd at every
// step instead, so both shortcuts are checked there.

// simNext is one line's next elapse from a base, as systemd computed it.
type simNext struct {
	at    time.Time // zero: never
	fails bool      // systemd could not compute it
}

type simGroup struct {
	tzEnv string
	base  int64
}

type simKey struct {
	tzEnv, expr string
	base        int64
}

// oracleSim holds what systemd said, for one time zone environment.
type oracleSim struct {
	sa    string
	facts map[simKey]simNext
	// chains: the complete series of correction lines from a base.
	chains map[simKey][]time.Time
	runs   int
}

func newOracleSim(sa string) *oracleSim {
	return &oracleSim{sa: sa, facts: map[simKey]simNext{}, chains: map[simKey][]time.Time{}}
}

// simCase is one timer: its lines as systemd-analyze gets them (with tzEnv
// in its environment), which of them are corrections, and the evaluator's
// series from base.
type simCase struct {
	label string
	sched *manifest.Schedule
	loc   *time.Location
	tzEnv string
	lines []string
	corr  []bool
	base  time.Time
	want  []time.Time
}

// newSimCase renders s in zone at base (corrections as of base's day) and
// computes the evaluator's n instants. verbatim keeps the zone suffix of the
// translated lines (systemd's forked per-zone evaluation); otherwise they
// are stripped and the zone goes into TZ.
func newSimCase(t testing.TB, s *manifest.Schedule, zone string, base time.Time, n int, verbatim bool) simCase {
	t.Helper()
	loc, err := manifest.LoadLocation(zone)
	if err != nil {
		t.Fatal(err)
	}
	normal, err := OnCalendar(s, zone)
	if err != nil {
		t.Fatalf("%q in %s: %v", s, zone, err)
	}
	corr, err := Corrections(s, zone, base)
	if err != nil {
		t.Fatalf("%q in %s: corrections: %v", s, zone, err)
	}
	c := simCase{label: fmt.Sprintf("%q in %s from %s", s, zone, oracleFmt(base, loc)), sched: s, loc: loc, base: base}
	c.tzEnv = ":" + zone
	if zone == "UTC" || verbatim {
		c.tzEnv = "UTC"
	}
	for _, l := range normal {
		if c.tzEnv != "UTC" {
			l = strings.TrimSuffix(l, " "+zone)
		}
		c.lines = append(c.lines, l)
		c.corr = append(c.corr, false)
	}
	for _, l := range corr {
		c.lines = append(c.lines, l)
		c.corr = append(c.corr, true)
	}
	// Compared up to the horizon: the agent renders again before it.
	horizon := base.UTC().Truncate(24 * time.Hour).Add(CorrectionHorizon)
	for at, i := base, 0; i < n; i++ {
		at = s.Next(at, loc)
		if at.IsZero() || !at.Before(horizon) {
			break
		}
		c.want = append(c.want, at)
	}
	return c
}

// run asks systemd-analyze for exprs from base and records the facts its
// chains give. Lines it cannot compute are recorded as failing there.
func (o *oracleSim) run(t testing.TB, tzEnv string, base time.Time, iterations int, exprs []string, corrChains bool) {
	t.Helper()
	if len(exprs) == 0 {
		return
	}
	o.runs++
	args := []string{"calendar", "--iterations=" + strconv.Itoa(iterations), "--base-time=@" + strconv.FormatInt(base.Unix(), 10)}
	cmd := exec.Command(o.sa, append(args, exprs...)...)
	cmd.Env = append(os.Environ(), "TZ="+tzEnv, "LC_ALL=C", "SYSTEMD_COLORS=0", "SYSTEMD_PAGER=cat")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	runErr := cmd.Run()
	failed := map[string]bool{}
	for _, line := range strings.Split(strings.TrimSpace(stderr.String()), "\n") {
		switch {
		case line == "":
		case strings.HasPrefix(line, "Failed to determine next elapse for '"):
			rest := strings.TrimPrefix(line, "Failed to determine next elapse for '")
			expr, _, ok := strings.Cut(rest, "': ")
			if !ok {
				t.Fatalf("systemd-analyze: unexpected %q", line)
			}
			failed[expr] = true
		case strings.HasPrefix(line, "Infinite loop in calendar calculation: "):
			// Logged before the failure above.
		default:
			t.Fatalf("systemd-analyze (TZ=%s): %v\n%s", tzEnv, runErr, stderr.String())
		}
	}
	if runErr != nil && len(failed) == 0 {
		t.Fatalf("systemd-analyze (TZ=%s): %v\n%s", tzEnv, runErr, stderr.String())
	}
	blocks, err := oracleParseOutput(stdout.String())
	if err != nil {
		t.Fatalf("systemd-analyze (TZ=%s): %v\n%s", tzEnv, err, stdout.String())
	}
	byExpr := map[string][]time.Time{}
	for _, b := range blocks {
		byExpr[b.normalized] = b.times
	}
	if iterations > 1 && len(failed) > 0 {
		// systemd-analyze prints nothing for an expression when any of its
		// iterations fails: ask those again for the first elapse alone.
		var again []string
		for _, e := range exprs {
			if failed[e] {
				again = append(again, e)
			}
		}
		o.run(t, tzEnv, base, 1, again, false)
		kept := exprs[:0:0]
		for _, e := range exprs {
			if !failed[e] {
				kept = append(kept, e)
			}
		}
		exprs = kept
	}
	for _, e := range exprs {
		times, printed := byExpr[e]
		if !printed && !failed[e] {
			t.Fatalf("systemd-analyze printed nothing for %q (not in its normalized form?)", e)
		}
		prev := base
		for _, tm := range times {
			o.facts[simKey{tzEnv, e, prev.Unix()}] = simNext{at: tm}
			prev = tm
		}
		switch {
		case failed[e]:
			o.facts[simKey{tzEnv, e, prev.Unix()}] = simNext{fails: true}
		case len(times) < iterations:
			o.facts[simKey{tzEnv, e, prev.Unix()}] = simNext{} // never
		}
		o.chains[simKey{tzEnv, e, base.Unix()}] = times
	}
}

// lookup returns a line's next elapse from base, if known (or, in bulk mode,
// derivable for a correction line from its chain from the case's base).
func (o *oracleSim) lookup(c *simCase, i int, base time.Time, full bool) (simNext, bool) {
	n := len(c.want) + 1 // the chain length simulate asked for (at least)
	if f, ok := o.facts[simKey{c.tzEnv, c.lines[i], base.Unix()}]; ok {
		return f, true
	}
	if full {
		return simNext{}, false
	}
	chain, ok := o.chains[simKey{c.tzEnv, c.lines[i], c.base.Unix()}]
	if !ok {
		return simNext{}, false
	}
	j := sort.Search(len(chain), func(j int) bool { return chain[j].After(base) })
	if c.corr[i] {
		switch {
		case j < len(chain):
			return simNext{at: chain[j]}, true
		case len(chain) < n:
			return simNext{}, true // the line has no more instants
		}
		return simNext{}, false
	}
	// A translated line between two elements of its chain with no offset
	// change between them (3 hours of margin cover the largest shift):
	// systemd searched that stretch of wall-clock time, in one offset, from
	// the earlier element and found the later one first, so a search from
	// any point of it finds the same. (With a change in between, systemd may
	// have skipped times a later search finds: Europe/Dublin.)
	if j == len(chain) {
		return simNext{}, false
	}
	prev := c.base
	if j > 0 {
		prev = chain[j-1]
	}
	if len(Transitions(c.loc, prev.Add(-3*time.Hour), chain[j].Add(3*time.Hour))) == 0 {
		return simNext{at: chain[j]}, true
	}
	return simNext{}, false
}

// simulate runs every case and returns one message per case whose simulated
// timer differs from the evaluator (its first difference). full: ask systemd
// for correction lines at every step too.
func (o *oracleSim) simulate(t testing.TB, cases []simCase, full bool) []string {
	t.Helper()
	// Chains from each case's base: translated lines for as many steps as
	// the series, correction lines complete.
	type group = simGroup
	chainN := map[group]map[string]bool{}
	chainC := map[group]map[string]bool{}
	add := func(m map[group]map[string]bool, g group, e string) {
		if m[g] == nil {
			m[g] = map[string]bool{}
		}
		m[g][e] = true
	}
	n := 0
	for i := range cases {
		c := &cases[i]
		n = max(n, len(c.want))
		g := group{c.tzEnv, c.base.Unix()}
		for j, l := range c.lines {
			if c.corr[j] {
				add(chainC, g, l)
			} else {
				add(chainN, g, l)
			}
		}
	}
	// A correction line's instants are evaluator instants, so its first n+1
	// from the base reach past the series: enough for every step.
	o.runGroups(t, chainN, n+1, false)
	o.runGroups(t, chainC, n+1, true)

	// Steps no chain answers, batched per base, in rounds: per case only
	// the first unanswered step, asked with a chain as long as the series,
	// which usually answers the steps after it too.
	for round := 0; ; round++ {
		ask := map[group]map[string]bool{}
		for i := range cases {
			c := &cases[i]
		steps:
			for k := 0; k < len(c.want); k++ {
				b := c.base
				if k > 0 {
					b = c.want[k-1]
				}
				missing := false
				for j := range c.lines {
					if _, ok := o.lookup(c, j, b, full); !ok {
						add(ask, group{c.tzEnv, b.Unix()}, c.lines[j])
						missing = true
					}
				}
				if missing {
					continue steps // all at once: fewer, larger batches
				}
			}
		}
		if len(ask) == 0 {
			break
		}
		if round > n+1 {
			t.Fatalf("simulation does not converge after %d rounds", round)
		}
		if os.Getenv("ORACLE_DEBUG") != "" {
			ne := 0
			for _, v := range ask {
				ne += len(v)
			}
			t.Logf("round %d: %d bases, %d questions", round, len(ask), ne)
			if round == 0 {
				byExpr := map[string]int{}
				for _, v := range ask {
					for e := range v {
						byExpr[e]++
					}
				}
				type kv struct {
					e string
					n int
				}
				var top []kv
				for e, n := range byExpr {
					top = append(top, kv{e, n})
				}
				sort.Slice(top, func(i, j int) bool { return top[i].n > top[j].n })
				for _, x := range top[:min(len(top), 15)] {
					t.Logf("  %4d %q", x.n, x.e)
				}
			}
		}
		o.runGroups(t, ask, n+1, false)
	}

	var diffs []string
	for i := range cases {
		c := &cases[i]
		for k := 0; k < len(c.want); k++ {
			b := c.base
			if k > 0 {
				b = c.want[k-1]
			}
			var got time.Time
			var failing []string
			for j := range c.lines {
				f, ok := o.lookup(c, j, b, full)
				if !ok {
					t.Fatalf("%s: no answer for %q from %s", c.label, c.lines[j], b)
				}
				if f.fails {
					failing = append(failing, c.lines[j])
					continue
				}
				if !f.at.IsZero() && (got.IsZero() || f.at.Before(got)) {
					got = f.at
				}
			}
			if !got.Equal(c.want[k]) {
				note := ""
				if len(failing) > 0 {
					note = fmt.Sprintf(" (systemd cannot compute %q there)", failing)
				}
				diffs = append(diffs, fmt.Sprintf("%s, lines %q:\n\tfire #%d after %s: evaluator %s, timer %s%s",
					c.label, c.lines, k+1, oracleFmt(b, c.loc), oracleFmt(c.want[k], c.loc), oracleFmt(got, c.loc), note))
				break
			}
		}
	}
	return diffs
}

// runGroups runs one systemd-analyze per group, two at a time.
func (o *oracleSim) runGroups(t testing.TB, groups map[simGroup]map[string]bool, iterations int, corrChains bool) {
	t.Helper()
	type job struct {
		tzEnv string
		base  time.Time
		exprs []string
	}
	var jobs []job
	for g, set := range groups {
		j := job{tzEnv: g.tzEnv, base: time.Unix(g.base, 0)}
		for e := range set {
			j.exprs = append(j.exprs, e)
		}
		sort.Strings(j.exprs)
		jobs = append(jobs, j)
	}
	// Each job writes into its own simulator, merged afterwards.
	subs := make([]*oracleSim, len(jobs))
	var wg sync.WaitGroup
	sem := make(chan struct{}, 2)
	errs := make([]string, len(jobs))
	for i, j := range jobs {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			sub := newOracleSim(o.sa)
			ft := &fatalCatcher{TB: t}
			func() {
				defer func() {
					if r := recover(); r != nil && r != errFatal {
						panic(r)
					}
				}()
				sub.run(ft, j.tzEnv, j.base, iterations, j.exprs, corrChains)
			}()
			errs[i] = ft.msg
			subs[i] = sub
		}()
	}
	wg.Wait()
	for i, sub := range subs {
		if errs[i] != "" {
			t.Fatal(errs[i])
		}
		o.runs += sub.runs
		for k, v := range sub.facts {
			if old, ok := o.facts[k]; ok && old != v {
				t.Fatalf("systemd-analyze gave two answers for %q from %d: %v and %v", k.expr, k.base, old, v)
			}
			o.facts[k] = v
		}
		for k, v := range sub.chains {
			o.chains[k] = v
		}
	}
}

var errFatal = fmt.Errorf("fatal")

// fatalCatcher lets run report a fatal error from a goroutine: Fatalf
// records the message and unwinds with a panic the goroutine recovers.
type fatalCatcher struct {
	testing.TB
	msg string
}

func (f *fatalCatcher) Helper() {}

func (f *fatalCatcher) Fatalf(format string, args ...any) {
	f.msg = fmt.Sprintf(format, args...)
	panic(errFatal)
}

func (f *fatalCatcher) Fatal(args ...any) {
	f.msg = fmt.Sprint(args...)
	panic(errFatal)
}

// simulateAndReport runs the cases of zone against systemd-analyze at sa
// and fails t with the first 15 differences (and their count).
// DROVER_ORACLE_FULL=1: ask systemd at every step (minutes).
func simulateAndReport(t *testing.T, sa, zone string, cs []simCase) *oracleSim {
	t.Helper()
	sim := newOracleSim(sa)
	diffs := sim.simulate(t, cs, os.Getenv("DROVER_ORACLE_FULL") == "1")
	for i, d := range diffs {
		if i == 15 {
			t.Errorf("%s: %d failures in all", zone, len(diffs))
			break
		}
		t.Error(d)
	}
	return sim
}
