package cli

import (
	"context"
	"fmt"
	"maps"
	"net/http"
	"strings"

	"github.com/spf13/cobra"

	"github.com/drover/drover/api"
	"github.com/drover/drover/internal/command"
	"github.com/drover/drover/manifest"
)

func (a *app) newAgentsCmd() *cobra.Command {
	var replace bool
	tag := &cobra.Command{
		Use:   "tag ID k=v ... [k-] [--replace]",
		Short: "Set (k=v) or remove (k-) tags of an agent; its manifest is recompiled",
		Long: `Change an agent's tags. k=v sets a tag, k- removes one; other tags are kept
unless --replace is given, which makes the listed tags the whole set.`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) < 2 && !(replace && len(args) == 1) {
				return command.Usagef("%s wants an agent id and at least one k=v or k-", cmd.CommandPath())
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			set, remove, err := parseTagEdits(args[1:])
			if err != nil {
				return err
			}
			if replace && len(remove) > 0 {
				return command.Usagef("k- has no meaning with --replace")
			}
			return a.tagAgent(cmd.Context(), args[0], set, remove, replace)
		},
	}
	tag.Flags().BoolVar(&replace, "replace", false, "make the given tags the agent's only tags")

	revoke := &cobra.Command{
		Use:   "revoke ID",
		Short: "Revoke an agent: its certificate is refused everywhere and its stream closes",
		Args:  exactArgs(1, "an agent id"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.apiClient()
			if err != nil {
				return err
			}
			var ag api.Agent
			raw, err := c.call(cmd.Context(), http.MethodPost, "/api/v1/agents/"+pathEscape(args[0])+"/revoke", map[string]any{}, &ag)
			if err != nil {
				return fmt.Errorf("agent %s: %w", args[0], err)
			}
			if a.format() != "table" {
				return a.printData(raw)
			}
			fmt.Fprintf(a.stdout(), "agent %s revoked\n", sanitizeLine(ag.ID))
			return nil
		},
	}
	rm := a.deleteCmd("rm ID", []string{"delete"}, "Delete an agent's record (revoke it first)", "an agent id", "/api/v1/agents/", "agent", "deleted")
	for _, c := range []*cobra.Command{tag, revoke, rm} {
		c.ValidArgsFunction = a.completeKind("agents", 1)
	}
	list := a.listCmd("List agents (as get agents)", "agents")
	return groupCmd("agents", "Tag, revoke and delete agents", list, tag, revoke, rm)
}

// parseTagEdits reads the arguments of agents tag: k=v sets a tag, k-
// removes one.
func parseTagEdits(args []string) (set map[string]string, remove []string, err error) {
	set = map[string]string{}
	for _, t := range args {
		if k, ok := strings.CutSuffix(t, "-"); ok && !strings.Contains(t, "=") {
			if !manifest.ValidTagKey(k) {
				return nil, nil, command.Usagef("tag %q: not a valid key", k)
			}
			remove = append(remove, k)
			continue
		}
		m, err := parseTags([]string{t})
		if err != nil {
			return nil, nil, err
		}
		maps.Copy(set, m)
	}
	return set, remove, nil
}

// tagAgent sets the agent's tags: its current ones (none with replace)
// without remove, with set.
func (a *app) tagAgent(ctx context.Context, id string, set map[string]string, remove []string, replace bool) error {
	c, err := a.apiClient()
	if err != nil {
		return err
	}
	tags := map[string]string{}
	if !replace {
		var ag api.Agent
		if _, err := c.get(ctx, "/api/v1/agents/"+pathEscape(id), &ag); err != nil {
			return fmt.Errorf("agent %s: %w", id, err)
		}
		maps.Copy(tags, ag.Tags)
	}
	for _, k := range remove {
		delete(tags, k)
	}
	maps.Copy(tags, set)
	var ag api.Agent
	raw, err := c.call(ctx, http.MethodPut, "/api/v1/agents/"+pathEscape(id)+"/tags", api.TagsRequest{Tags: tags}, &ag)
	if err != nil {
		return fmt.Errorf("agent %s: %w", id, err)
	}
	if a.format() != "table" {
		return a.printData(raw)
	}
	fmt.Fprintf(a.stdout(), "agent %s tagged: %s\n", sanitizeLine(ag.ID), orNone(fmtTags(ag.Tags)))
	return nil
}

func orNone(s string) string {
	if s == "" {
		return "(none)"
	}
	return s
}
