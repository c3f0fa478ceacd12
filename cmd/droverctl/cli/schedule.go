package cli

import (
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/drover/drover/manifest"
	"github.com/drover/drover/units"
)

const maxExplainCount = 1000

// explanation is the JSON form of `schedule explain` (pinned by the issue).
type explanation struct {
	OnCalendar []string `json:"oncalendar"`
	Next       []string `json:"next"`
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
lines it renders (two when both day fields restrict) and the next fire times,
evaluated in the pipe's time zone and printed in UTC. An "@every" schedule has
no calendar form; its fire times count from --after as the timer's activation.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if expr == "" {
				return usagef("--cron is required")
			}
			if count < 1 || count > maxExplainCount {
				return usagef("--count %d out of range 1-%d", count, maxExplainCount)
			}
			base := env.Now().UTC().Truncate(time.Second)
			if after != "" {
				t, err := time.Parse(time.RFC3339, after)
				if err != nil {
					return usagef("--after %q is not an RFC 3339 time (e.g. 2026-12-01T00:00:00Z)", after)
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
			every, isEvery := sched.Every()
			if !isEvery {
				if ex.OnCalendar, err = units.OnCalendar(sched, tz); err != nil {
					return fmt.Errorf("schedule: %w", err)
				}
			}
			var fires []time.Time
			for t, i := base, 0; i < count; i++ {
				t = sched.Next(t, loc)
				if t.IsZero() {
					break
				}
				fires = append(fires, t)
				ex.Next = append(ex.Next, t.UTC().Format(time.RFC3339))
			}
			out := cmd.OutOrStdout()
			if a.format() != "table" {
				return a.printData(ex)
			}
			fmt.Fprintf(out, "Schedule:    %s\nTime zone:   %s\n", sched.String(), tz)
			if isEvery {
				fmt.Fprintf(out, "Timer:       OnActiveSec=%s OnUnitActiveSec=%s (counted from activation, here %s)\n",
					manifest.Duration(every), manifest.Duration(every), base.UTC().Format(time.RFC3339))
			}
			for _, l := range ex.OnCalendar {
				fmt.Fprintf(out, "OnCalendar:  %s\n", l)
			}
			fmt.Fprintf(out, "\nNext %d fire times:\n", len(fires))
			tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
			fmt.Fprintf(tw, "UTC\tLOCAL (%s)\n", tz)
			for _, f := range fires {
				fmt.Fprintf(tw, "%s\t%s\n", f.UTC().Format(time.RFC3339), strings.TrimSpace(f.In(loc).Format("Mon 2006-01-02 15:04 MST")))
			}
			return tw.Flush()
		},
	}
	explain.Flags().StringVar(&expr, "cron", "", "schedule expression: five cron fields or a descriptor such as @daily or \"@every 10m\"")
	explain.Flags().StringVar(&tz, "tz", "", "IANA time zone the schedule is evaluated in (default UTC)")
	explain.Flags().StringVar(&after, "after", "", "start from this RFC 3339 time (default now)")
	explain.Flags().IntVar(&count, "count", 10, "how many fire times to print")
	cmd.AddCommand(explain)
	return cmd
}
