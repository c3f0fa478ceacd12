package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/drover/drover/api"
	"github.com/drover/drover/internal/command"
	"github.com/drover/drover/manifest"
)

// get fires PIPE and get events: the fleet-monitoring views.

// fireStatusOrder is the order counts are printed in; other statuses follow.
var fireStatusOrder = []string{api.StatusSucceeded, api.StatusFailed, api.StatusTimedOut, api.StatusMissed, api.StatusRunning, api.StatusPending, api.StatusCanceled, api.StatusSkipped}

func (a *app) getFires(ctx context.Context, c *client, names []string, o listOpts) error {
	if len(names) != 1 {
		return command.Usagef("get fires takes one pipe name")
	}
	if !manifest.ValidName(names[0]) {
		return command.Usagef("%q is not a pipe name", names[0])
	}
	q := url.Values{}
	for flag, v := range map[string]string{"since": o.since, "until": o.until} {
		at, err := a.parseWhen(flag, v)
		if err != nil {
			return err
		}
		if !at.IsZero() {
			q.Set(flag, at.UTC().Format(time.RFC3339))
		}
	}
	q.Set("limit", itoa(o.limit))
	var fl api.FireList
	raw, err := c.get(ctx, "/api/v1/pipes/"+pathEscape(names[0])+"/fires?"+q.Encode(), &fl)
	if err != nil {
		return err
	}
	if a.format() != "table" {
		return a.printData(raw)
	}
	w := a.stdout()
	loc, err := manifest.LoadLocation(fl.Timezone)
	if err != nil {
		loc = time.UTC
	}
	layout := "15:04"
	if len(fl.Fires) > 0 {
		first, last := fl.Fires[0].At.In(loc), fl.Fires[len(fl.Fires)-1].At.In(loc)
		if first.YearDay() != last.YearDay() || first.Year() != last.Year() {
			layout = "2006-01-02 15:04"
		}
	}
	if fl.Truncated {
		fmt.Fprintf(w, "(older fire times left out: narrow --since/--until or raise --limit)\n")
	}
	if len(fl.Fires) == 0 {
		fmt.Fprintf(w, "no fire times of %s in the window\n", sanitizeLine(fl.Pipe))
	}
	for _, f := range fl.Fires {
		parts := []string{f.At.In(loc).Format(layout), fmt.Sprintf("%d expected", f.Expected)}
		statuses := make([]string, 0, len(f.Counts))
		for st := range f.Counts {
			if !slices.Contains(fireStatusOrder, st) {
				statuses = append(statuses, st)
			}
		}
		slices.Sort(statuses)
		for _, st := range append(slices.Clone(fireStatusOrder), statuses...) {
			if n := f.Counts[st]; n > 0 {
				parts = append(parts, fmt.Sprintf("%d %s", n, sanitizeLine(st)))
			}
		}
		if f.Unreported > 0 {
			parts = append(parts, fmt.Sprintf("%d not reported yet", f.Unreported))
		}
		fmt.Fprintln(w, strings.Join(parts, "  "))
	}
	return nil
}

// eventKinds are the kinds get events --kind accepts.
var eventKinds = []string{"run.failed", "run.missed", "run.long", "run.recovered", "agent.offline", "agent.online",
	"manifest.rejected", "manifest.expired", "identity.conflict", "pipe.moved"}

func (a *app) getEvents(ctx context.Context, c *client, names []string, o listOpts) error {
	if len(names) > 0 {
		return command.Usagef("get events takes no names")
	}
	if o.kind != "" && !slices.Contains(eventKinds, o.kind) {
		return command.Usagef("--kind %q is not an event kind (%s)", o.kind, strings.Join(eventKinds, ", "))
	}
	q := url.Values{}
	for k, v := range map[string]string{"kind": o.kind, "pipe": o.pipe, "agent": o.agent} {
		if v != "" {
			q.Set(k, v)
		}
	}
	since, err := a.parseWhen("since", o.since)
	if err != nil {
		return err
	}
	if !since.IsZero() {
		q.Set("since", since.UTC().Format(time.RFC3339))
	}
	q.Set("limit", itoa(o.limit))
	items, err := c.list(ctx, "/api/v1/events", "events", q, o.limit)
	if err != nil {
		return err
	}
	return a.printList("events", items, a.eventsTable)
}

func (a *app) eventsTable(items []json.RawMessage) error {
	return tableOf(a.stdout(), items, []string{"AT", "KIND", "PIPE", "AGENT", "RUN", "MESSAGE"}, func(e *api.Event) []string {
		return []string{fmtTimeV(e.At), e.Kind, e.Pipe, e.Agent, e.RunID, e.Message}
	})
}
