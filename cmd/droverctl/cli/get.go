package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/drover/drover/api"
	"github.com/drover/drover/internal/command"
	"github.com/drover/drover/manifest"
)

func itoa(i int) string { return strconv.Itoa(i) }

// resource names accepted by get, with their aliases.
var resourceAliases = map[string]string{
	"pipes": "pipes", "pipe": "pipes",
	"channels": "channels", "channel": "channels", "rules": "rules", "rule": "rules", // notify.go
	"agents": "agents", "agent": "agents",
	"runs": "runs", "run": "runs",
	"tokens": "tokens", "token": "tokens", "enrollment-tokens": "tokens",
	"secrets": "secrets", "secret": "secrets",
	"api-tokens": "api-tokens", "api-token": "api-tokens",
	"fires": "fires", "fire": "fires", "events": "events", "event": "events",
}

// listOpts are the filters of get (and audit).
type listOpts struct {
	tags   []string
	agent  string
	pipe   string
	status string
	since  string
	until  string
	limit  int
	// reason, scheduledSince and scheduledUntil select runs by why they
	// ended and by the fire time they serve.
	reason         string
	scheduledSince string
	scheduledUntil string
	kind           string // events (monitor.go)
	// selectors are -l k=v[,k2=v2]: more tags, with the meaning of --tag.
	selectors []string
}

func (a *app) newGetCmd() *cobra.Command {
	var o listOpts
	var w watchOpts
	cmd := &cobra.Command{
		Use:   "get pipes|agents|runs|fires|events|tokens|secrets|api-tokens [NAME...]",
		Short: "List pipes, agents, runs, enrollment tokens, secrets or API tokens",
		Long: `List objects as a table, or as the API's JSON or YAML with -o.

  get pipes [NAME...] [--tag k=v | -l k=v,...] [--agent ID]
                                                 pipes (targeting the tags or agent)
  get agents [ID...] [--tag k=v | -l k=v,...] [--status S]
                                                 agents (carrying the tags; online, offline, revoked)
  get runs [ID...] [--pipe P] [--agent ID] [--status S] [--reason R] [--since T] [--until T]
           [--scheduled-since T] [--scheduled-until T] [--limit N]
  get fires PIPE [--since T] [--until T] [--limit N]
                                                 per fire time: agents expected, runs per status
  get events [--kind K] [--pipe P] [--agent ID] [--since T] [--limit N]
                                                 runs failed, missed, recovered; agents offline...
  get tokens                                     enrollment tokens (never their secrets)
  get secrets                                    secret names (values are write-only)
  get api-tokens                                 operator API tokens and their roles

--since, --until, --scheduled-since and --scheduled-until take an RFC 3339 time or a
duration before now (2h). -o wide adds columns: runs get REASON, SCHEDULED, ATTEMPTS and
WRITTEN BY; agents get MACHINE, REPORTED HOSTNAME, MANIFEST (expired) and CONFLICTS; pipes
get CATCHUP, JITTER, TIMEOUT, GRACE and RUN AS.
-o name prints kind/name per object (pipe/backup-db, agent/ID, run/ID).

-w (--watch) on pipes, agents, runs, fires and events prints the list, then
each object that appears or changes, polling every --watch-interval (the
server answers an unchanged list with 304 Not Modified), until Ctrl-C. With
-o json each object is one JSON line.`,
		Args: cobra.ArbitraryArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 {
				return command.Usagef("get wants a resource: pipes, agents, runs, fires, events, tokens, secrets or api-tokens")
			}
			kind, ok := resourceAliases[args[0]]
			if !ok {
				return command.Usagef("unknown resource %q: use pipes, agents, runs, fires, events, tokens, secrets or api-tokens", args[0])
			}
			o.tags = withSelectors(o.tags, o.selectors)
			if err := o.check(cmd, kind); err != nil {
				return err
			}
			if w.on {
				return a.watch(cmd.Context(), kind, args[1:], o, w)
			}
			return a.get(cmd.Context(), kind, args[1:], o)
		},
	}
	f := cmd.Flags()
	f.StringArrayVar(&o.tags, "tag", nil, "k=v: pipes targeting the tag, agents carrying it (repeatable)")
	f.StringVar(&o.agent, "agent", "", "pipes reaching, or runs on, this agent id")
	f.StringVar(&o.pipe, "pipe", "", "runs of this pipe")
	f.StringVar(&o.status, "status", "", "runs with this status ("+strings.Join(api.RunStatuses, ", ")+"); agents: online, offline or revoked")
	f.StringVar(&o.reason, "reason", "", "runs that ended for this reason, exactly (e.g. lost, oom-kill, \"systemd: 203/EXEC\")")
	f.StringVar(&o.scheduledSince, "scheduled-since", "", "runs serving a fire time at or after this time")
	f.StringVar(&o.scheduledUntil, "scheduled-until", "", "runs serving a fire time before this time")
	f.StringVar(&o.since, "since", "", "runs recorded at or after this time (RFC 3339, or a duration before now)")
	f.StringVar(&o.until, "until", "", "runs recorded before this time (RFC 3339, or a duration before now)")
	f.IntVar(&o.limit, "limit", 100, "at most this many runs, fire times or events (1-1000)")
	f.StringVar(&o.kind, "kind", "", "events of this kind (run.failed, run.missed, agent.offline, ...)")
	f.StringArrayVarP(&o.selectors, "selector", "l", nil, "k=v[,k2=v2]: as --tag (both may be given; every tag must match)")
	w.flags(f)
	cmd.ValidArgsFunction = a.completeGet
	return cmd
}

// check refuses filters that do not apply to kind.
func (o *listOpts) check(cmd *cobra.Command, kind string) error {
	allowed := map[string][]string{
		"pipes":  {"tag", "agent"},
		"agents": {"tag", "status"},
		"runs":   {"agent", "pipe", "status", "since", "until", "limit", "reason", "scheduled-since", "scheduled-until"},
		"fires":  {"since", "until", "limit"},
		"events": {"kind", "pipe", "agent", "since", "limit"},
	}[kind]
	var bad error
	cmd.Flags().Visit(func(f *pflag.Flag) {
		switch f.Name {
		case "tag", "selector", "agent", "pipe", "status", "since", "until", "limit", "reason", "scheduled-since", "scheduled-until", "kind":
			name := f.Name
			if name == "selector" {
				name = "tag"
			}
			for _, ok := range allowed {
				if ok == name {
					return
				}
			}
			if bad == nil {
				bad = command.Usagef("--%s does not apply to get %s", f.Name, kind)
			}
		}
	})
	if bad != nil {
		return bad
	}
	if kind == "agents" {
		switch o.status {
		case "", "online", "offline", "revoked":
		default:
			return command.Usagef("--status %q: agents are online, offline or revoked", o.status)
		}
	}
	if kind == "runs" || kind == "fires" || kind == "events" {
		if o.limit < 1 || o.limit > 1000 {
			return command.Usagef("--limit %d out of range 1-1000", o.limit)
		}
		if o.status != "" && !api.KnownStatus(o.status) {
			return command.Usagef("--status %q is not a run status (%s)", o.status, strings.Join(api.RunStatuses, ", "))
		}
	}
	_, err := parseTags(o.tags)
	return err
}

// parseTags reads k=v arguments.
func parseTags(args []string) (map[string]string, error) {
	tags := map[string]string{}
	for _, t := range args {
		k, v, ok := strings.Cut(t, "=")
		if !ok || !manifest.ValidTagKey(k) || !manifest.ValidTagValue(v) {
			return nil, command.Usagef("tag %q: use key=value (key: letters, digits, '.', '_', '/', '-'; value: at most 63 letters, digits, '.', '_', '-')", t)
		}
		if _, dup := tags[k]; dup {
			return nil, command.Usagef("tag %q given twice", k)
		}
		tags[k] = v
	}
	return tags, nil
}

// parseWhen reads an RFC 3339 time or a duration before now.
func (a *app) parseWhen(flag, s string) (time.Time, error) {
	if s == "" {
		return time.Time{}, nil
	}
	if t, err := time.Parse(time.RFC3339, s); err == nil {
		return t, nil
	}
	if d, err := time.ParseDuration(s); err == nil && d >= 0 {
		return a.env.Now().Add(-d), nil
	}
	return time.Time{}, command.Usagef("--%s %q: use an RFC 3339 time (2026-12-01T00:00:00Z) or a duration before now (2h)", flag, s)
}

func (a *app) get(ctx context.Context, kind string, names []string, o listOpts) error {
	c, err := a.apiClient()
	if err != nil {
		return err
	}
	switch kind {
	case "pipes":
		return a.getPipes(ctx, c, names, o)
	case "agents":
		return a.getAgents(ctx, c, names, o)
	case "runs":
		return a.getRuns(ctx, c, names, o)
	case "fires":
		return a.getFires(ctx, c, names, o)
	case "events":
		return a.getEvents(ctx, c, names, o)
	case "tokens":
		return a.getList(ctx, c, names, "/api/v1/enrollment-tokens", "tokens", a.tokensTable)
	case "secrets":
		return a.getList(ctx, c, names, "/api/v1/secrets", "secrets", a.secretsTable)
	case "api-tokens":
		return a.getList(ctx, c, names, "/api/v1/api-tokens", "tokens", a.apiTokensTable)
	case "channels", "rules":
		return a.getNotify(ctx, c, kind, names)
	}
	return command.Usagef("unknown resource %q", kind)
}

// printList prints items as {"<key>": [...]} or as a table.
func (a *app) printList(key string, items []json.RawMessage, table func([]json.RawMessage) error) error {
	if a.output == "name" {
		return a.printNameLines(key, items)
	}
	if a.format() != "table" {
		if items == nil {
			items = []json.RawMessage{}
		}
		return a.printData(map[string][]json.RawMessage{key: items})
	}
	return table(items)
}

// printOne prints one object of the list key, or a one-row table.
func (a *app) printOne(key string, raw json.RawMessage, table func([]json.RawMessage) error) error {
	if a.output == "name" {
		return a.printNameLines(key, []json.RawMessage{raw})
	}
	if a.format() != "table" {
		return a.printData(raw)
	}
	return table([]json.RawMessage{raw})
}

func (a *app) getList(ctx context.Context, c *client, names []string, path, key string, table func([]json.RawMessage) error) error {
	if len(names) > 0 {
		return command.Usagef("get %s takes no names", strings.TrimPrefix(path, "/api/v1/"))
	}
	items, err := c.list(ctx, path, key, nil)
	if err != nil {
		return err
	}
	return a.printList(key, items, table)
}

// fetchNamed gets the object base+name of each name; what names the kind
// in errors ("pipe").
func fetchNamed(ctx context.Context, c *client, base, what string, names []string) ([]json.RawMessage, error) {
	items := make([]json.RawMessage, 0, len(names))
	for _, n := range names {
		raw, err := c.get(ctx, base+pathEscape(n), nil)
		if err != nil {
			return nil, fmt.Errorf("%s %s: %w", what, n, err)
		}
		items = append(items, raw)
	}
	return items, nil
}

// fetchOrList gets the named objects of kind ("pipes"), or when there are
// no names lists them all with query q; what names one in errors ("pipe").
func fetchOrList(ctx context.Context, c *client, kind, what string, names []string, q url.Values) ([]json.RawMessage, error) {
	if len(names) > 0 {
		return fetchNamed(ctx, c, "/api/v1/"+kind+"/", what, names)
	}
	return c.list(ctx, "/api/v1/"+kind, kind, q)
}

// keepIf returns the items that ok accepts once decoded as T; what names the
// kind in errors ("pipe"). The filters run here too, so that an older
// server that ignores the query still gives the right answer.
func keepIf[T any](items []json.RawMessage, what string, ok func(*T) bool) ([]json.RawMessage, error) {
	var kept []json.RawMessage
	for _, it := range items {
		var v T
		if err := json.Unmarshal(it, &v); err != nil {
			return nil, fmt.Errorf("unexpected %s from the server: %w", what, err)
		}
		if ok(&v) {
			kept = append(kept, it)
		}
	}
	return kept, nil
}

// tagQuery is the query of a list filtered by k=v tags.
func tagQuery(tags []string) url.Values {
	q := url.Values{}
	for _, t := range tags {
		q.Add("tag", t)
	}
	return q
}

func decodeAll[T any](items []json.RawMessage) ([]T, error) {
	return decodeList[T](items, "unexpected object from the server")
}

// decodeList decodes every item as T; a malformed one is an error that
// starts with what.
func decodeList[T any](items []json.RawMessage, what string) ([]T, error) {
	out := make([]T, 0, len(items))
	for _, it := range items {
		var v T
		if err := json.Unmarshal(it, &v); err != nil {
			return nil, fmt.Errorf("%s: %w", what, err)
		}
		out = append(out, v)
	}
	return out, nil
}

// ---- pipes

func (a *app) getPipes(ctx context.Context, c *client, names []string, o listOpts) error {
	tags, _ := parseTags(o.tags)
	q := tagQuery(o.tags)
	if o.agent != "" {
		q.Set("agent", o.agent)
	}
	items, err := fetchOrList(ctx, c, "pipes", "pipe", names, q)
	if err != nil {
		return err
	}
	if len(names) == 1 && len(tags) == 0 && o.agent == "" {
		return a.printOne("pipes", items[0], a.pipesTable)
	}
	if len(tags) > 0 || o.agent != "" {
		var ag *api.Agent
		if o.agent != "" {
			ag = &api.Agent{}
			if _, err := c.get(ctx, "/api/v1/agents/"+pathEscape(o.agent), ag); err != nil {
				return fmt.Errorf("agent %s: %w", o.agent, err)
			}
		}
		items, err = keepIf(items, "pipe", func(p *api.Pipe) bool {
			if len(tags) > 0 && (p.Spec.Targets == nil || !subset(tags, p.Spec.Targets.Tags)) {
				return false
			}
			return ag == nil || targets(p.Spec.Targets, ag)
		})
		if err != nil {
			return err
		}
	}
	return a.printList("pipes", items, a.pipesTable)
}

// subset reports whether every k=v of want is in have.
func subset(want, have map[string]string) bool {
	for k, v := range want {
		if got, ok := have[k]; !ok || got != v {
			return false
		}
	}
	return true
}

func fmtTargets(t *manifest.Targets) string {
	if t == nil {
		return ""
	}
	s := fmtTags(t.Tags)
	if n := len(t.Agents); n > 0 {
		ids := strings.Join(t.Agents, ",")
		if n > 2 {
			ids = fmt.Sprintf("%d agents", n)
		}
		if s != "" {
			s += " "
		}
		s += "agents:" + ids
	}
	return s
}

func (a *app) pipesTable(items []json.RawMessage) error {
	cols := []string{"NAME", "VERSION", "SCHEDULE", "TIMEZONE", "TARGETS", "ENABLED", "PAYLOAD", "UPDATED"}
	if a.wide() {
		cols = append(cols, "CATCHUP", "JITTER", "TIMEOUT", "GRACE", "RUN AS")
	}
	return tableOf(a.stdout(), items, cols, func(p *api.Pipe) []string {
		tz := p.Spec.Timezone
		if tz == "" {
			tz = manifest.DefaultTimezone
		}
		row := []string{p.Name, itoa(int(p.Version)), p.Spec.Schedule, tz, fmtTargets(p.Spec.Targets),
			strconv.FormatBool(p.Spec.IsEnabled()), shortDigest(p.Payload.Digest), fmtTimeV(p.UpdatedAt)}
		if a.wide() {
			row = append(row, p.Spec.Catchup, fmtSpecDuration(p.Spec.Jitter), fmtSpecDuration(p.Spec.Timeout),
				fmtSpecDuration(p.Spec.Grace), p.Spec.RunAs)
		}
		return row
	})
}

// fmtSpecDuration shows a spec's duration; "" for none.
func fmtSpecDuration(d manifest.Duration) string {
	if d == 0 {
		return ""
	}
	return d.String()
}

// ---- agents

func (a *app) getAgents(ctx context.Context, c *client, ids []string, o listOpts) error {
	tags, _ := parseTags(o.tags)
	q := tagQuery(o.tags)
	if o.status != "" {
		q.Set("status", o.status)
	}
	items, err := fetchOrList(ctx, c, "agents", "agent", ids, q)
	if err != nil {
		return err
	}
	if len(ids) == 1 && len(tags) == 0 && o.status == "" {
		return a.printOne("agents", items[0], a.agentsTable)
	}
	if len(tags) > 0 || o.status != "" {
		items, err = keepIf(items, "agent", func(ag *api.Agent) bool {
			return subset(tags, ag.Tags) && (o.status == "" || ag.State() == o.status)
		})
		if err != nil {
			return err
		}
	}
	return a.printList("agents", items, a.agentsTable)
}

func (a *app) agentsTable(items []json.RawMessage) error {
	agents, err := decodeAll[api.Agent](items)
	if err != nil {
		return err
	}
	cols := []string{"ID", "NAME", "HOSTNAME", "STATUS", "LAST SEEN", "SERIAL", "TAGS", "BACKEND", "VERSION", "ERRORS"}
	if a.wide() {
		cols = append(cols, "MACHINE", "REPORTED HOSTNAME", "MANIFEST", "CONFLICTS")
	}
	t := newTable(a.stdout(), cols...)
	for _, ag := range agents {
		serial := ""
		if ag.AppliedSerial > 0 || ag.AcceptedSerial > 0 {
			serial = itoa(int(ag.AppliedSerial))
		}
		backend := ag.Backend
		if backend != "" && ag.Scope != "" {
			backend += "/" + ag.Scope
		}
		row := []string{ag.ID, ag.Name, ag.Hostname, ag.State(), fmtTime(ag.LastSeenAt), serial, fmtTags(ag.Tags), backend, ag.AgentVersion, itoa(agentErrors(&ag))}
		if a.wide() {
			manifest := "ok"
			if ag.ManifestExpired {
				manifest = "expired"
			}
			row = append(row, ag.MachineID, ag.ReportedHostname, manifest, itoa(int(ag.IdentityConflicts)))
		}
		t.row(row...)
	}
	return t.flush()
}

// ---- runs

func (a *app) getRuns(ctx context.Context, c *client, ids []string, o listOpts) error {
	if len(ids) > 0 {
		items, err := fetchNamed(ctx, c, "/api/v1/runs/", "run", ids)
		if err != nil {
			return err
		}
		if len(ids) == 1 {
			return a.printOne("runs", items[0], a.runsTable)
		}
		return a.printList("runs", items, a.runsTable)
	}
	since, err := a.parseWhen("since", o.since)
	if err != nil {
		return err
	}
	until, err := a.parseWhen("until", o.until)
	if err != nil {
		return err
	}
	q := url.Values{}
	for k, v := range map[string]string{"pipe": o.pipe, "agent": o.agent, "status": o.status, "reason": o.reason} {
		if v != "" {
			q.Set(k, v)
		}
	}
	for name, v := range map[string]string{"scheduled-since": o.scheduledSince, "scheduled-until": o.scheduledUntil} {
		at, err := a.parseWhen(name, v)
		if err != nil {
			return err
		}
		if !at.IsZero() {
			q.Set(strings.ReplaceAll(name, "-", "_"), at.UTC().Format(time.RFC3339))
		}
	}
	if !since.IsZero() {
		q.Set("since", since.UTC().Format(time.RFC3339))
	}
	if !until.IsZero() {
		q.Set("until", until.UTC().Format(time.RFC3339))
	}
	q.Set("limit", itoa(o.limit))
	items, err := c.list(ctx, "/api/v1/runs", "runs", q, o.limit)
	if err != nil {
		return err
	}
	if !since.IsZero() || !until.IsZero() {
		items, err = keepIf(items, "run", func(r *api.Run) bool {
			return (since.IsZero() || !r.CreatedAt.Before(since)) && (until.IsZero() || r.CreatedAt.Before(until))
		})
		if err != nil {
			return err
		}
	}
	return a.printList("runs", items, a.runsTable)
}

func (a *app) runsTable(items []json.RawMessage) error {
	runs, err := decodeAll[api.Run](items)
	if err != nil {
		return err
	}
	cols := []string{"ID", "PIPE", "VERSION", "AGENT", "STATUS", "TRIGGER", "STARTED", "DURATION", "EXIT"}
	if a.wide() {
		cols = append(cols, "REASON", "SCHEDULED", "ATTEMPTS", "WRITTEN BY")
	}
	t := newTable(a.stdout(), cols...)
	for _, r := range runs {
		dur := ""
		if r.FinishedAt != nil || r.DurationMS > 0 {
			dur = fmtDuration(r.DurationMS)
		}
		row := []string{r.ID, r.Pipe, itoa(int(r.PipeVersion)), r.AgentID, r.Status, r.Trigger, fmtTime(r.StartedAt), dur, runExit(&r)}
		if a.wide() {
			attempts := ""
			if r.Attempts > 0 {
				attempts = itoa(int(r.Attempts))
			}
			row = append(row, r.Reason, fmtTime(r.ScheduledAt), attempts, r.WrittenBy)
		}
		t.row(row...)
	}
	return t.flush()
}

// ---- tokens, secrets, API tokens

func (a *app) tokensTable(items []json.RawMessage) error {
	return tableOf(a.stdout(), items, []string{"ID", "NAME", "TAGS", "STATE", "CREATED", "EXPIRES", "USED", "AGENT"}, func(k *api.EnrollmentToken) []string {
		return []string{k.ID, k.Name, fmtTags(k.Tags), k.State, fmtTimeV(k.CreatedAt), fmtTimeV(k.ExpiresAt), fmtTime(k.UsedAt), k.AgentID}
	})
}

func (a *app) secretsTable(items []json.RawMessage) error {
	return tableOf(a.stdout(), items, []string{"NAME", "CREATED", "UPDATED"}, func(s *api.Secret) []string {
		return []string{s.Name, fmtTimeV(s.CreatedAt), fmtTimeV(s.UpdatedAt)}
	})
}

func (a *app) apiTokensTable(items []json.RawMessage) error {
	return tableOf(a.stdout(), items, []string{"ID", "NAME", "ROLE", "CREATED", "EXPIRES", "LAST USED", "REVOKED"}, func(k *api.APIToken) []string {
		return []string{k.ID, k.Name, k.Role, fmtTimeV(k.CreatedAt), fmtTime(k.ExpiresAt), fmtTime(k.LastUsedAt), fmtTime(k.RevokedAt)}
	})
}
