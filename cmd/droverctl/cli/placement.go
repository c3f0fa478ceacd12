package cli

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/spf13/cobra"

	"github.com/drover/drover/api"
	"github.com/drover/drover/internal/command"
)

// newPipesCmd is "droverctl pipes": operations on pipes beyond apply and
// get (moving a placement: one pipe).
func (a *app) newPipesCmd() *cobra.Command {
	return groupCmd("pipes", "Operate on pipes: move a placement: one pipe to another agent", a.newPipesMoveCmd())
}

func (a *app) newPipesMoveCmd() *cobra.Command {
	var to string
	cmd := &cobra.Command{
		Use:               "move PIPE --to AGENT",
		ValidArgsFunction: a.completeKind("pipes", 1),
		Short:             "Hand a placement: one pipe over to another agent it targets",
		Long: `Hand a placement: one pipe over to another agent it targets, by the lease
rules: the holder loses the pipe now; AGENT gains it once the holder's lease
has ended plus the skew margin (placement.lease, placement.skew_margin), or at
once when the holder confirms it applied a manifest without the pipe. Its
catch-up covers the fire times nobody served in between.

It prints the placement after the request (describe pipe shows it too).`,
		Args: exactArgs(1, "a pipe name"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if to == "" {
				return command.Usagef("pipes move wants --to AGENT")
			}
			c, err := a.apiClient()
			if err != nil {
				return err
			}
			return a.movePipe(cmd.Context(), c, args[0], to)
		},
	}
	cmd.Flags().StringVar(&to, "to", "", "the agent to hand the pipe over to")
	return cmd
}

func (a *app) movePipe(ctx context.Context, c *client, pipe, to string) error {
	var pl api.Placement
	raw, err := c.call(ctx, http.MethodPost, "/api/v1/pipes/"+pathEscape(pipe)+"/move", api.MovePipeRequest{To: to}, &pl)
	if err != nil {
		return fmt.Errorf("move %s: %w", pipe, err)
	}
	if a.format() != "table" {
		return a.printData(raw)
	}
	out := a.stdout()
	switch {
	case pl.Holder == to:
		fmt.Fprintf(out, "pipe %s moved to %s (lease until %s)\n", pipe, to, fmtTimeV(pl.LeaseUntil))
	case pl.Holder == "" && !pl.NextAfter.IsZero():
		fmt.Fprintf(out, "pipe %s: %s lost it; %s gains it after %s (the lease of %s plus the skew margin), sooner if %s confirms\n",
			pipe, pl.Previous, to, fmtTimeV(pl.NextAfter), pl.Previous, pl.Previous)
	default:
		fmt.Fprintf(out, "pipe %s: move to %s requested\n", pipe, to)
	}
	return nil
}

// placementKV adds describe pipe's placement rows.
func placementKV(kv *kvWriter, pl *api.Placement, now time.Time) {
	if pl == nil {
		kv.add("Placement", "all (every targeted agent)")
		return
	}
	kv.add("Placement", "one (a single holder under a lease)")
	switch {
	case pl.Holder != "":
		kv.add("Holder", pl.Holder+" since "+fmtTimeV(pl.Since))
		lease := fmtTimeV(pl.LeaseUntil)
		if !pl.LeaseUntil.After(now) {
			lease += " (ended)"
		}
		kv.add("Lease until", lease)
		if r := pl.Reported; r != nil {
			switch {
			case r.LeaseEnded:
				kv.add("Holder reports", "lease ended, timer stopped (at "+fmtTimeV(r.At)+")")
			case !r.LeaseUntil.IsZero():
				kv.add("Holder reports", "lease until "+fmtTimeV(r.LeaseUntil)+" (at "+fmtTimeV(r.At)+")")
			}
		} else {
			kv.add("Holder reports", "nothing yet")
		}
	case pl.Previous != "":
		kv.add("Holder", "none: handing over from "+pl.Previous+" (lease until "+fmtTimeV(pl.PreviousLeaseUntil)+"), next holder after "+fmtTimeV(pl.NextAfter))
	default:
		kv.add("Holder", "none (no healthy targeted agent)")
	}
	if !pl.LastFireServed.IsZero() {
		kv.add("Last fire served", fmtTimeV(pl.LastFireServed))
	}
	if pl.MoveTo != "" {
		kv.add("Move requested", "to "+pl.MoveTo)
	}
}
