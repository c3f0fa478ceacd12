package cli

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/drover/drover/internal/command"
	"github.com/drover/drover/manifest"
	"github.com/drover/drover/units"
)

const maxExplainCount = 1000

// explanation is the JSON form of `schedule explain` (scripts read its field names: keep them).
type explanation struct {
	OnCalendar []string `json:"oncalendar"`
	Next       []string `json:"next"`
	// Notes: remarks on the expression (an oversized step) and the fire
	// times a DST change moved, each "<fire time>: <what happened>".
	Notes []string `json:"notes,omitempty"`
}

func newScheduleCmd(a *app) *cobra.Command {
	env := a.env
	cmd := &cobra.Command{Use: "schedule", Short: "Work with schedule expressions", Args: noArgs}
	var (
		expr, tz, after string
		count           int
	)
	explain := &cobra.Command{
		Use:   "explain --cron EXPR [--tz ZONE] [--after RFC3339] [--count N] [-o json|yaml]",
		Short: "Show the OnCalendar lines for a cron expression and its next fire times in UTC",
		Long: `Explain a pipe schedule the way the agent will run it: the systemd OnCalendar=
lines it renders at --after (two when both day fields restrict, then the
absolute UTC instants that correct systemd around the DST changes of the next
400 days) and the next fire times, evaluated in the pipe's time zone with
cron's DST rules and printed in UTC. Fire times a DST change moved or
doubled are marked. An "@every" schedule has no calendar form; its fire times
count from --after as the timer's activation.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if expr == "" {
				return command.Usagef("--cron is required")
			}
			if count < 1 || count > maxExplainCount {
				return command.Usagef("--count %d out of range 1-%d", count, maxExplainCount)
			}
			base := env.Now().UTC().Truncate(time.Second)
			if after != "" {
				t, err := time.Parse(time.RFC3339, after)
				if err != nil {
					return command.Usagef("--after %q is not an RFC 3339 time (e.g. 2026-12-01T00:00:00Z)", after)
				}
				base = t
			}
			if tz == "" {
				tz = manifest.DefaultTimezone
			}
			loc, err := manifest.LoadLocation(tz)
			if err != nil {
				return fmt.Errorf("timezone: %w", err)
			}
			sched, err := manifest.ParseSchedule(expr)
			if err != nil {
				return fmt.Errorf("schedule: %w", err)
			}
			ex := explanation{OnCalendar: []string{}, Next: make([]string, 0, count)}
			if _, isEvery := sched.Every(); !isEvery {
				if ex.OnCalendar, err = units.TimerCalendar(sched, tz, base); err != nil {
					return fmt.Errorf("schedule: %w", err)
				}
			}
			ex.Notes = append(ex.Notes, sched.Notes()...)
			var fires []time.Time
			marks := map[int]string{}
			prev := base
			for t, i := base, 0; i < count; i++ {
				t = sched.Next(t, loc)
				if t.IsZero() {
					break
				}
				if m := dstMark(sched, loc, prev, t); m != "" {
					marks[len(fires)] = m
					ex.Notes = append(ex.Notes, t.UTC().Format(time.RFC3339)+": "+m)
				}
				fires = append(fires, t)
				prev = t
				ex.Next = append(ex.Next, t.UTC().Format(time.RFC3339))
			}
			if a.format() != "table" {
				return a.printData(ex)
			}
			return printExplanation(cmd.OutOrStdout(), sched, tz, loc, base, &ex, fires, marks)
		},
	}
	explain.Flags().StringVar(&expr, "cron", "", "schedule expression: five cron fields or a descriptor such as @daily or \"@every 10m\"")
	explain.Flags().StringVar(&tz, "tz", "", "IANA time zone the schedule is evaluated in (default UTC)")
	explain.Flags().StringVar(&after, "after", "", "start from this RFC 3339 time (default now)")
	explain.Flags().IntVar(&count, "count", 10, "how many fire times to print")
	cmd.AddCommand(explain)
	return cmd
}

// dstMark says how a DST change shaped the fire time t (the one after prev),
// or "" if it did not: a fixed time that fell in a gap and runs when the
// gap ends, or a local time that occurs twice.
func dstMark(s *manifest.Schedule, loc *time.Location, prev, t time.Time) string {
	if _, every := s.Every(); every || loc == time.UTC {
		return ""
	}
	f, _ := s.Fields()
	w := t.In(loc)
	// Clocks jumped forward at t: which matching local times were skipped?
	if start, _ := w.ZoneBounds(); start.Equal(t) {
		_, before := t.Add(-time.Second).In(loc).Zone()
		if _, after := w.Zone(); after > before {
			from := t.Add(-time.Second).In(loc)
			lo := time.Date(from.Year(), from.Month(), from.Day(), from.Hour(), from.Minute(), 0, 0, time.UTC).Add(time.Minute)
			hi := time.Date(w.Year(), w.Month(), w.Day(), w.Hour(), w.Minute(), 0, 0, time.UTC)
			pw := prev.In(loc)
			pk := time.Date(pw.Year(), pw.Month(), pw.Day(), pw.Hour(), pw.Minute(), pw.Second(), 0, time.UTC)
			var gone []string
			for x := lo; x.Before(hi) && len(gone) < 4; x = x.Add(time.Minute) {
				if x.After(pk) && fieldsMatch(f, x) {
					gone = append(gone, x.Format("15:04"))
				}
			}
			if len(gone) > 0 && !s.Wildcard() {
				verb := "does not exist"
				if len(gone) > 1 {
					verb = "do not exist"
				}
				return fmt.Sprintf("%s %s on %s: runs at %s", strings.Join(gone, ", "), verb, hi.Format("2006-01-02"), w.Format("15:04"))
			}
		}
	}
	// The same local time at another instant within a day: it occurs twice.
	for _, d := range []time.Duration{-1, 1} {
		for _, shift := range []time.Duration{30 * time.Minute, time.Hour, 2 * time.Hour} {
			o := t.Add(d * shift).In(loc)
			if o.Hour() == w.Hour() && o.Minute() == w.Minute() && o.Day() == w.Day() {
				which := "first"
				if d < 0 {
					which = "second"
				}
				switch {
				case s.Wildcard():
					return fmt.Sprintf("%s occurs twice on %s (clocks go back): runs at both; this is the %s", w.Format("15:04"), w.Format("2006-01-02"), which)
				case which == "first":
					return fmt.Sprintf("%s occurs twice on %s (clocks go back): runs at the first only", w.Format("15:04"), w.Format("2006-01-02"))
				default:
					return fmt.Sprintf("%s occurs twice on %s (clocks go back): runs at the second, as the schedule started after the first", w.Format("15:04"), w.Format("2006-01-02"))
				}
			}
		}
	}
	return ""
}

// fieldsMatch reports whether the wall-clock time x (as UTC) matches f.
func fieldsMatch(f manifest.Fields, x time.Time) bool {
	if f.Minute&(1<<x.Minute()) == 0 || f.Hour&(1<<x.Hour()) == 0 || f.Month&(1<<int(x.Month())) == 0 {
		return false
	}
	dom := f.Dom&(1<<x.Day()) != 0
	dow := f.Dow&(1<<int(x.Weekday())) != 0
	if f.DaysAnd() {
		return dom && dow
	}
	return dom || dow
}

// printExplanation prints schedule explain as text: the schedule, its timer
// lines and notes, then the fire times in UTC and local time, with the DST
// marks.
func printExplanation(out io.Writer, sched *manifest.Schedule, tz string, loc *time.Location, base time.Time, ex *explanation, fires []time.Time, marks map[int]string) error {
	fmt.Fprintf(out, "Schedule:    %s\nTime zone:   %s\n", sched.String(), tz)
	if every, isEvery := sched.Every(); isEvery {
		fmt.Fprintf(out, "Timer:       OnActiveSec=%s OnUnitActiveSec=%s (counted from activation, here %s)\n",
			manifest.Duration(every), manifest.Duration(every), base.UTC().Format(time.RFC3339))
	}
	for _, l := range ex.OnCalendar {
		fmt.Fprintf(out, "OnCalendar:  %s\n", l)
	}
	for _, n := range sched.Notes() {
		fmt.Fprintf(out, "Note:        %s\n", n)
	}
	fmt.Fprintf(out, "\nNext %d fire times:\n", len(fires))
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "UTC\tLOCAL (%s)\tNOTE\n", tz)
	for i, f := range fires {
		fmt.Fprintf(tw, "%s\t%s\t%s\n", f.UTC().Format(time.RFC3339), strings.TrimSpace(f.In(loc).Format("Mon 2006-01-02 15:04 MST")), marks[i])
	}
	return tw.Flush()
}
