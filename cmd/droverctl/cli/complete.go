package cli

import (
	"context"
	"encoding/json"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"
)

// Shell completion of names from the server: pipe names, agent ids and run
// ids. One page, a short timeout, and nothing (never an error) when the
// server cannot be asked.

// completionTimeout bounds a completion's call to the server.
const completionTimeout = 3 * time.Second

// completionPage is how many names a completion asks for.
const completionPage = 100

// outputFormats are the values of -o.
var outputFormats = []string{"table", "wide", "json", "yaml", "name"}

// getResources are the resources get completes, in the order of its help.
var getResources = []string{"pipes", "agents", "runs", "fires", "events", "tokens", "secrets", "api-tokens", "channels", "rules"}

// registerCompletions completes root's -o values.
func (a *app) registerCompletions(root *cobra.Command) {
	_ = root.RegisterFlagCompletionFunc("output", cobra.FixedCompletions(outputFormats, cobra.ShellCompDirectiveNoFileComp))
}

// completeGet completes get's resource, then its names.
func (a *app) completeGet(cmd *cobra.Command, args []string, toComplete string) ([]string, cobra.ShellCompDirective) {
	if len(args) == 0 {
		return withPrefix(getResources, toComplete), cobra.ShellCompDirectiveNoFileComp
	}
	kind := resourceAliases[args[0]]
	if kind == "fires" {
		if len(args) > 1 {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		kind = "pipes"
	}
	return a.serverNames(cmd.Context(), kind, toComplete, args[1:]), cobra.ShellCompDirectiveNoFileComp
}

// completeDescribe completes describe's kind, then one name of it.
func (a *app) completeDescribe(cmd *cobra.Command, args []string, toComplete string) ([]string, cobra.ShellCompDirective) {
	switch len(args) {
	case 0:
		return withPrefix([]string{"pipe", "agent", "run"}, toComplete), cobra.ShellCompDirectiveNoFileComp
	case 1:
		return a.serverNames(cmd.Context(), resourceAliases[args[0]], toComplete, nil), cobra.ShellCompDirectiveNoFileComp
	}
	return nil, cobra.ShellCompDirectiveNoFileComp
}

// completeKind completes the names of kind ("pipes", "agents" or "runs");
// at most max arguments (0: any number).
func (a *app) completeKind(kind string, max int) cobra.CompletionFunc {
	return func(cmd *cobra.Command, args []string, toComplete string) ([]string, cobra.ShellCompDirective) {
		if max > 0 && len(args) >= max {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		return a.serverNames(cmd.Context(), kind, toComplete, args), cobra.ShellCompDirectiveNoFileComp
	}
}

// serverNames lists the names of kind that start with prefix and are not
// in given: pipe names, agent ids (described by hostname) or run ids
// (described by pipe and status), from the first page of the list.
func (a *app) serverNames(ctx context.Context, kind, prefix string, given []string) []string {
	field, describe := "", func(map[string]json.RawMessage) string { return "" }
	switch kind {
	case "pipes":
		field = "name"
	case "agents":
		field = "id"
		describe = func(f map[string]json.RawMessage) string { return unquoteID(f["hostname"]) }
	case "runs":
		field = "id"
		describe = func(f map[string]json.RawMessage) string {
			return strings.TrimSpace(unquoteID(f["pipe"]) + " " + unquoteID(f["status"]))
		}
	default:
		return nil
	}
	if ctx == nil {
		ctx = context.Background()
	}
	ctx, cancel := context.WithTimeout(ctx, completionTimeout)
	defer cancel()
	c, err := a.apiClient()
	if err != nil {
		return nil
	}
	q := url.Values{"limit": {itoa(completionPage)}}
	items, err := c.list(ctx, "/api/v1/"+kind, kind, q, completionPage)
	if err != nil {
		return nil
	}
	var out []string
	for _, it := range items {
		var f map[string]json.RawMessage
		if json.Unmarshal(it, &f) != nil {
			continue
		}
		name := unquoteID(f[field])
		if name == "" || !strings.HasPrefix(name, prefix) || slices.Contains(given, name) {
			continue
		}
		if d := sanitizeLine(describe(f)); d != "" {
			name += "\t" + d
		}
		out = append(out, name)
	}
	return out
}

func withPrefix(words []string, prefix string) []string {
	var out []string
	for _, w := range words {
		if strings.HasPrefix(w, prefix) {
			out = append(out, w)
		}
	}
	return out
}
