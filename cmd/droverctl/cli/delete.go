package cli

import (
	"context"
	"fmt"
	"net/http"

	"github.com/drover/drover/internal/command"
	"github.com/spf13/cobra"

	"github.com/drover/drover/api"
	"github.com/drover/drover/manifest"
)

// delete pipe NAME...: remove pipes by name, as apply --prune removes the
// ones the files no longer define. Their versions stay and restore brings
// one back.

func (a *app) newDeleteCmd() *cobra.Command {
	var dryRun bool
	cmd := &cobra.Command{
		Use:   "delete pipe NAME... [--dry-run]",
		Short: "Delete pipes by name (their versions stay: restore brings one back)",
		Long: `Delete pipes: every named pipe is looked up first, and nothing is deleted
when one of them does not exist. The agents the pipes target drop them from
their manifests. --dry-run shows which agents each deletion reaches and
changes nothing. A deleted pipe's versions stay: "droverctl history PIPE"
lists them and "droverctl restore PIPE VERSION" brings one back.`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 {
				return command.Usagef("delete wants a resource: pipe")
			}
			if resourceAliases[args[0]] != "pipes" {
				return command.Usagef("delete %q: only pipes are deleted here (agents rm, tokens rm, api-tokens revoke, secrets rm)", args[0])
			}
			if len(args) < 2 {
				return command.Usagef("delete pipe wants at least one pipe name")
			}
			for _, n := range args[1:] {
				if !manifest.ValidName(n) {
					return command.Usagef("%q is not a pipe name", n)
				}
			}
			return nil
		},
		ValidArgsFunction: func(cmd *cobra.Command, args []string, toComplete string) ([]string, cobra.ShellCompDirective) {
			if len(args) == 0 {
				return withPrefix([]string{"pipe"}, toComplete), cobra.ShellCompDirectiveNoFileComp
			}
			return a.serverNames(cmd.Context(), "pipes", toComplete, args[1:]), cobra.ShellCompDirectiveNoFileComp
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.deletePipes(cmd.Context(), args[1:], dryRun)
		},
	}
	cmd.Flags().BoolVar(&dryRun, "dry-run", false, "show which agents each deletion reaches; change nothing")
	return cmd
}

// deletePipes deletes the named pipes; the answer is apply's (a plan of
// deletions), so -o json and --dry-run read the same as apply's.
func (a *app) deletePipes(ctx context.Context, names []string, dryRun bool) error {
	c, err := a.apiClient()
	if err != nil {
		return err
	}
	items, err := fetchNamed(ctx, c, "/api/v1/pipes/", "pipe", unique(names))
	if err != nil {
		return fmt.Errorf("%w\nnothing was deleted", err)
	}
	pipes, err := decodeList[api.Pipe](items, "unexpected pipe from the server")
	if err != nil {
		return err
	}
	res := &applyResult{DryRun: dryRun}
	for i := range pipes {
		p := &pipes[i]
		res.Pipes = append(res.Pipes, &change{Name: p.Name, Action: api.ActionDelete, Version: p.Version, Digest: p.Payload.Digest, remote: p})
	}
	if dryRun {
		res.AgentsFrom = "server"
		hasDryRun := false
		if useServerDryRun {
			if hasDryRun, err = a.serverDryRun(ctx, c, res.Pipes); err != nil {
				return err
			}
		}
		if !hasDryRun {
			res.AgentsFrom = "client"
			if err := a.clientAgents(ctx, c, res.Pipes); err != nil {
				return err
			}
		}
		if a.format() != "table" {
			return a.printData(res)
		}
		return a.printPlan(res)
	}
	for i, ch := range res.Pipes {
		if _, err := c.call(ctx, http.MethodDelete, "/api/v1/pipes/"+pathEscape(ch.Name), nil, nil); err != nil && !isNotFound(err) {
			return a.partial(i, res.Pipes, fmt.Errorf("delete pipe %s: %w", ch.Name, err))
		}
		if a.format() == "table" {
			fmt.Fprintf(a.stdout(), "pipe/%s deleted\n", ch.Name)
		}
	}
	if a.format() != "table" {
		return a.printData(res)
	}
	return nil
}

// unique is names without repeats, in order.
func unique(names []string) []string {
	seen := map[string]bool{}
	var out []string
	for _, n := range names {
		if !seen[n] {
			seen[n] = true
			out = append(out, n)
		}
	}
	return out
}
