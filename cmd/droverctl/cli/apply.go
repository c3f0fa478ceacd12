package cli

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strings"

	"github.com/spf13/cobra"

	"github.com/drover/drover/api"
	"github.com/drover/drover/internal/command"
	"github.com/drover/drover/manifest"
)

// change is one entry of an apply plan (also the JSON of apply and diff).
type change struct {
	Name    string            `json:"name"`
	File    string            `json:"file,omitempty"`
	Action  string            `json:"action"`
	Changes []string          `json:"changes,omitempty"`
	Version uint64            `json:"version,omitempty"`
	Digest  string            `json:"digest,omitempty"`
	Agents  []api.AgentChange `json:"agents,omitempty"`

	local  *localPipe
	remote *api.Pipe
}

// applyResult is the JSON form of apply.
type applyResult struct {
	DryRun bool      `json:"dry_run"`
	Pipes  []*change `json:"pipes"`
	// Source says where the per-agent view came from: "server" (its dry-run
	// endpoint) or "client" (computed from the agents' tags).
	AgentsFrom string `json:"agents_from,omitempty"`
}

func (a *app) newApplyCmd() *cobra.Command {
	var files []string
	var prune, dryRun bool
	var maxPayload int64
	cmd := &cobra.Command{
		Use:   "apply -f FILE|DIR [-f ...] [--prune] [--dry-run]",
		Short: "Make the server's pipes match YAML files (declarative)",
		Long: `Apply pipe specs from YAML files: several documents per file, a directory
read recursively in lexical order (*.yaml and *.yml; names starting with '.'
are skipped), "-" for stdin. Paths in files: are relative to the YAML file and
are bundled into the payload.

Every file is read and validated before anything is sent: when any file has
a problem, every problem is printed as FILE:LINE: FIELD: MESSAGE and nothing
changes on the server. --prune also deletes the server's pipes that the files
do not define. --dry-run shows what would change and which agents each change
reaches, and changes nothing.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if len(files) == 0 {
				return command.Usagef("apply needs -f FILE or -f DIR")
			}
			return a.apply(cmd.Context(), files, prune, dryRun, maxPayload)
		},
	}
	cmd.Flags().StringArrayVarP(&files, "filename", "f", nil, "YAML file or directory of pipe specs (repeatable; - for stdin)")
	cmd.Flags().BoolVar(&prune, "prune", false, "delete server pipes that are not in the files")
	cmd.Flags().BoolVar(&dryRun, "dry-run", false, "show what would change, per pipe and per agent; change nothing")
	cmd.Flags().Int64Var(&maxPayload, "max-payload-bytes", defaultMaxPayload, "refuse payloads larger than this (the server's signing.max_payload_bytes)")
	return cmd
}

func (a *app) newDiffCmd() *cobra.Command {
	var files []string
	var prune bool
	var maxPayload int64
	cmd := &cobra.Command{
		Use:   "diff -f FILE|DIR [--prune]",
		Short: "Show how the server's pipes differ from YAML files",
		Long: `Compare pipe specs from YAML files with the server's pipes and print a
unified diff per pipe (server first, files second; both normalized, with the
payload digest as a last line). With --prune, pipes that apply --prune would
delete are shown too. Nothing changes on the server.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if len(files) == 0 {
				return command.Usagef("diff needs -f FILE or -f DIR")
			}
			return a.diff(cmd.Context(), files, prune, maxPayload)
		},
	}
	cmd.Flags().StringArrayVarP(&files, "filename", "f", nil, "YAML file or directory of pipe specs (repeatable; - for stdin)")
	cmd.Flags().BoolVar(&prune, "prune", false, "also show server pipes that are not in the files")
	cmd.Flags().Int64Var(&maxPayload, "max-payload-bytes", defaultMaxPayload, "refuse payloads larger than this (the server's signing.max_payload_bytes)")
	return cmd
}

// loadValid loads the files and prints every problem; it fails when there is one.
func (a *app) loadValid(files []string, maxPayload int64) ([]*localPipe, error) {
	if maxPayload <= 0 {
		return nil, command.Usagef("--max-payload-bytes must be positive")
	}
	pipes, probs := loadPipes(files, a.env.Stdin, a.warnf, maxPayload)
	if len(probs) == 0 {
		return pipes, nil
	}
	sortProblems(probs)
	fileSet := map[string]bool{}
	for _, p := range probs {
		fmt.Fprintln(a.stderr(), p.String())
		fileSet[p.file] = true
	}
	n := "1 problem"
	if len(probs) > 1 {
		n = fmt.Sprintf("%d problems", len(probs))
	}
	f := "1 file"
	if len(fileSet) > 1 {
		f = fmt.Sprintf("%d files", len(fileSet))
	}
	return nil, reportedError{fmt.Sprintf("%s in %s; nothing was sent to the server", n, f)}
}

// loadPlan loads the files (loadValid) and plans their changes against the
// server (plan).
func (a *app) loadPlan(ctx context.Context, files []string, prune bool, maxPayload int64) (*client, []*change, error) {
	pipes, err := a.loadValid(files, maxPayload)
	if err != nil {
		return nil, nil, err
	}
	c, err := a.apiClient()
	if err != nil {
		return nil, nil, err
	}
	plan, err := a.plan(ctx, c, pipes, prune)
	return c, plan, err
}

// plan compares the local pipes with the server's.
func (a *app) plan(ctx context.Context, c *client, pipes []*localPipe, prune bool) ([]*change, error) {
	items, err := c.list(ctx, "/api/v1/pipes", "pipes", nil)
	if err != nil {
		return nil, err
	}
	remote, err := decodeList[api.Pipe](items, "GET /api/v1/pipes: unexpected pipe")
	if err != nil {
		return nil, err
	}
	byName := map[string]*api.Pipe{}
	for i := range remote {
		byName[remote[i].Name] = &remote[i]
	}
	var plan []*change
	local := map[string]bool{}
	for _, lp := range pipes {
		local[lp.spec.Name] = true
		ch := &change{Name: lp.spec.Name, File: lp.src.name, local: lp, Digest: lp.digest}
		r := byName[lp.spec.Name]
		ch.remote = r
		switch {
		case r == nil:
			ch.Action = api.ActionCreate
		default:
			ch.Changes = specChanges(r, lp)
			ch.Version = r.Version
			if len(ch.Changes) == 0 {
				ch.Action = api.ActionUnchanged
			} else {
				ch.Action = api.ActionUpdate
			}
		}
		plan = append(plan, ch)
	}
	if prune {
		if len(pipes) == 0 {
			return nil, errors.New("--prune with no pipe in the files would delete every pipe on the server; refusing")
		}
		for i := range remote {
			if !local[remote[i].Name] {
				plan = append(plan, &change{Name: remote[i].Name, Action: api.ActionDelete, Version: remote[i].Version, Digest: remote[i].Payload.Digest, remote: &remote[i]})
			}
		}
	}
	return plan, nil
}

// specChanges lists the top-level spec fields (and "payload") that differ.
func specChanges(r *api.Pipe, lp *localPipe) []string {
	rs := normalSpec(r)
	rm, lm := fieldMap(&rs), fieldMap(&lp.norm)
	keys := map[string]bool{}
	for k := range rm {
		keys[k] = true
	}
	for k := range lm {
		keys[k] = true
	}
	var out []string
	for k := range keys {
		if !bytes.Equal(rm[k], lm[k]) {
			out = append(out, k)
		}
	}
	sort.Strings(out)
	if r.Payload.Digest != lp.digest {
		out = append(out, "payload")
	}
	return out
}

// normalSpec is a server pipe's spec, normalized as the local ones are.
func normalSpec(p *api.Pipe) manifest.Spec {
	s := *p.Spec.Clone()
	if s.Name == "" {
		s.Name = p.Name
	}
	s.Normalize()
	return s
}

func fieldMap(s *manifest.Spec) map[string]json.RawMessage {
	b, _ := json.Marshal(s)
	var m map[string]json.RawMessage
	_ = json.Unmarshal(b, &m)
	for k, v := range m {
		var buf bytes.Buffer
		if json.Compact(&buf, v) == nil {
			m[k] = buf.Bytes()
		}
	}
	return m
}

// body is the PUT body of a local pipe.
func (lp *localPipe) body() api.PutPipeRequest {
	spec, _ := json.Marshal(&lp.spec)
	b := api.PutPipeRequest{Spec: spec}
	if lp.bundle != nil {
		s := base64.StdEncoding.EncodeToString(lp.bundle)
		b.Bundle = &s
	}
	return b
}

// useServerDryRun is false in tests of the client-side fallback.
var useServerDryRun = true

// serverDryRun asks the server what each change would do. It returns false
// when the server has no dry-run endpoint. Validation errors are returned,
// so a real apply can check everything server-side before changing anything.
func (a *app) serverDryRun(ctx context.Context, c *client, plan []*change) (bool, error) {
	for _, ch := range plan {
		if ch.Action == api.ActionUnchanged {
			continue
		}
		var body api.DryRunRequest
		if ch.Action == api.ActionDelete {
			body.Delete = true
		} else {
			pb := ch.local.body()
			body.Spec, body.Bundle = pb.Spec, pb.Bundle
		}
		var resp api.DryRunResponse
		_, err := c.call(ctx, http.MethodPost, "/api/v1/pipes/"+pathEscape(ch.Name)+"/dry-run", body, &resp)
		if missingEndpoint(err) {
			return false, nil
		}
		if err != nil {
			return true, a.pipeError(ch, err)
		}
		ch.Agents = resp.Agents
		if ch.Agents == nil {
			ch.Agents = []api.AgentChange{}
		}
		// The server has the last word on whether anything changes.
		if resp.Action == api.ActionUnchanged && ch.Action == api.ActionUpdate {
			ch.Action, ch.Changes, ch.Agents = api.ActionUnchanged, nil, nil
		}
	}
	return true, nil
}

// clientAgents fills in which agents each change reaches, from the agents'
// tags and the old and new targets (the server's rule).
func (a *app) clientAgents(ctx context.Context, c *client, plan []*change) error {
	items, err := c.list(ctx, "/api/v1/agents", "agents", nil)
	if err != nil {
		return err
	}
	agents, err := decodeList[api.Agent](items, "GET /api/v1/agents: unexpected agent")
	if err != nil {
		return err
	}
	for _, ch := range plan {
		if ch.Action == api.ActionUnchanged {
			continue
		}
		ch.Agents = []api.AgentChange{}
		var oldT, newT *manifest.Targets
		if ch.remote != nil {
			oldT = ch.remote.Spec.Targets
		}
		if ch.local != nil {
			newT = ch.local.norm.Targets
		}
		for i := range agents {
			ag := &agents[i]
			was, will := targets(oldT, ag), ch.Action != api.ActionDelete && targets(newT, ag)
			act := ""
			switch {
			case was && will:
				act = api.AgentUpdate
			case will:
				act = api.AgentAdd
			case was:
				act = api.AgentRemove
			default:
				continue
			}
			ch.Agents = append(ch.Agents, api.AgentChange{ID: ag.ID, Name: ag.Name, Hostname: ag.Hostname, Action: act})
		}
	}
	return nil
}

func (a *app) apply(ctx context.Context, files []string, prune, dryRun bool, maxPayload int64) error {
	c, plan, err := a.loadPlan(ctx, files, prune, maxPayload)
	if err != nil {
		return err
	}
	res := &applyResult{DryRun: dryRun, Pipes: plan}
	// The server's dry-run checks every change first (when it has one), so a
	// problem only the server can see still changes nothing.
	hasDryRun := false
	if useServerDryRun {
		if hasDryRun, err = a.serverDryRun(ctx, c, plan); err != nil {
			return fmt.Errorf("%w\nnothing was changed", err)
		}
	}
	if dryRun {
		res.AgentsFrom = "server"
		if !hasDryRun {
			res.AgentsFrom = "client"
			if err := a.clientAgents(ctx, c, plan); err != nil {
				return err
			}
		}
		if a.format() != "table" {
			return a.printData(res)
		}
		return a.printPlan(res)
	}
	table := a.format() == "table"
	done := 0
	for _, ch := range plan {
		ch.Agents = nil
		switch ch.Action {
		case api.ActionUnchanged:
			if table {
				fmt.Fprintf(a.stdout(), "pipe/%s unchanged\n", ch.Name)
			}
			continue
		case api.ActionDelete:
			if _, err := c.call(ctx, http.MethodDelete, "/api/v1/pipes/"+pathEscape(ch.Name), nil, nil); err != nil && !isNotFound(err) {
				return a.partial(done, plan, fmt.Errorf("delete pipe %s: %w", ch.Name, err))
			}
			ch.Version = 0
			if table {
				fmt.Fprintf(a.stdout(), "pipe/%s deleted\n", ch.Name)
			}
		default:
			var resp api.PutPipeResponse
			if _, err := c.call(ctx, http.MethodPut, "/api/v1/pipes/"+pathEscape(ch.Name), ch.local.body(), &resp); err != nil {
				return a.partial(done, plan, a.pipeError(ch, err))
			}
			ch.Version, ch.Digest = resp.Version, resp.Digest
			if table {
				verb := "configured"
				if ch.Action == api.ActionCreate {
					verb = "created"
				}
				fmt.Fprintf(a.stdout(), "pipe/%s %s (version %d)\n", ch.Name, verb, resp.Version)
			}
		}
		done++
	}
	if !table {
		return a.printData(res)
	}
	return nil
}

// partial explains an apply that stopped after some changes were made.
func (a *app) partial(done int, plan []*change, err error) error {
	if done == 0 {
		return fmt.Errorf("%w\nnothing was changed", err)
	}
	n := 0
	for _, ch := range plan {
		if ch.Action != api.ActionUnchanged {
			n++
		}
	}
	return fmt.Errorf("%w\napply stopped: %d of %d changes were made (run apply again after fixing the problem)", err, done, n)
}

// pipeError turns an API error about one pipe into FILE:LINE: FIELD: MESSAGE
// lines when the pipe came from a file.
func (a *app) pipeError(ch *change, err error) error {
	var ae *api.Error
	if !errors.As(err, &ae) || ch.local == nil || len(ae.Details) == 0 {
		return fmt.Errorf("pipe %s: %w", ch.Name, err)
	}
	for _, d := range ae.Details {
		field := strings.TrimPrefix(d.Field, "spec.")
		if field == "spec" {
			field = ""
		}
		if field == "bundle" {
			field = "files"
		}
		fmt.Fprintln(a.stderr(), ch.local.problem(field, d.Message).String())
	}
	msg := ae.Message
	if msg == "" {
		msg = ae.Code
	}
	return reportedError{fmt.Sprintf("the server refused pipe %s: %s (%s)", ch.Name, sanitizeLine(msg), ae.Code)}
}

// printPlan prints a dry run: one row per pipe, then one per agent.
func (a *app) printPlan(res *applyResult) error {
	out := a.stdout()
	t := newTable(out, "PIPE", "ACTION", "CHANGES", "VERSION", "AGENTS", "FILE")
	counts := map[string]int{}
	for _, ch := range res.Pipes {
		counts[ch.Action]++
		ver := ""
		if ch.Version > 0 {
			ver = itoa(int(ch.Version))
		}
		agents := ""
		if ch.Action != api.ActionUnchanged {
			agents = itoa(len(ch.Agents))
		}
		t.row(ch.Name, ch.Action, strings.Join(ch.Changes, ","), ver, agents, ch.File)
	}
	if err := t.flush(); err != nil {
		return err
	}
	type agentRow struct {
		id, host string
		changes  []string
		diffs    []string
	}
	rows := map[string]*agentRow{}
	var order []*agentRow
	for _, ch := range res.Pipes {
		for _, ac := range ch.Agents {
			r := rows[ac.ID]
			if r == nil {
				r = &agentRow{id: ac.ID, host: ac.Hostname}
				rows[ac.ID] = r
				order = append(order, r)
			}
			sign := map[string]string{api.AgentAdd: "+", api.AgentUpdate: "~", api.AgentRemove: "-"}[ac.Action]
			if sign == "" {
				sign = ac.Action + ":"
			}
			c := sign + ch.Name
			if !ac.After.IsZero() { // placement: one: gained once the lease before ended
				c += " (after " + fmtTimeV(ac.After) + ")"
			}
			r.changes = append(r.changes, c)
			// Added and removed entries are whole; show what an update changes.
			if ac.Diff != "" && ac.Action == api.AgentUpdate {
				r.diffs = append(r.diffs, fmt.Sprintf("--- agent %s (%s): %s\n%s", ac.ID, sanitizeLine(ac.Hostname), ch.Name,
					sanitizeText(strings.TrimRight(ac.Diff, "\n")+"\n")))
			}
		}
	}
	if len(order) > 0 {
		sort.SliceStable(order, func(i, j int) bool {
			if order[i].host != order[j].host {
				return order[i].host < order[j].host
			}
			return order[i].id < order[j].id
		})
		fmt.Fprintln(out)
		t := newTable(out, "AGENT", "HOSTNAME", "MANIFEST CHANGES")
		for _, r := range order {
			t.row(r.id, r.host, strings.Join(r.changes, " "))
		}
		if err := t.flush(); err != nil {
			return err
		}
		for _, r := range order {
			for _, d := range r.diffs {
				fmt.Fprintf(out, "\n%s", d)
			}
		}
	}
	fmt.Fprintf(out, "\nDry run: %d to create, %d to update, %d to delete, %d unchanged. Nothing was changed.\n",
		counts[api.ActionCreate], counts[api.ActionUpdate], counts[api.ActionDelete], counts[api.ActionUnchanged])
	return nil
}

// diff prints a unified diff of each pipe that would change.
func (a *app) diff(ctx context.Context, files []string, prune bool, maxPayload int64) error {
	_, plan, err := a.loadPlan(ctx, files, prune, maxPayload)
	if err != nil {
		return err
	}
	if a.format() != "table" {
		type diffEntry struct {
			*change
			Diff string `json:"diff,omitempty"`
		}
		out := struct {
			Pipes []diffEntry `json:"pipes"`
		}{Pipes: []diffEntry{}}
		for _, ch := range plan {
			out.Pipes = append(out.Pipes, diffEntry{ch, pipeDiff(ch)})
		}
		return a.printData(out)
	}
	w := a.stdout()
	changed := 0
	for _, ch := range plan {
		if ch.Action == api.ActionUnchanged {
			continue
		}
		changed++
		io.WriteString(w, sanitizeText(pipeDiff(ch)))
	}
	if changed == 0 {
		fmt.Fprintln(w, "No differences.")
	}
	return nil
}

// pipeDiff is the unified diff of one change.
func pipeDiff(ch *change) string {
	if ch.Action == api.ActionUnchanged {
		return ""
	}
	var oldText, newText []string
	oldName, newName := "/dev/null", "/dev/null"
	if ch.remote != nil {
		rs := normalSpec(ch.remote)
		oldText = specLines(&rs, ch.remote.Payload.Digest)
		oldName = fmt.Sprintf("server/pipes/%s (version %d)", ch.Name, ch.remote.Version)
	}
	if ch.local != nil {
		newText = specLines(&ch.local.norm, ch.local.digest)
		newName = ch.local.src.name + " (" + ch.Name + ")"
	}
	return unifiedDiff(oldName, newName, oldText, newText, 3)
}

// specLines renders a normalized spec as YAML lines, plus its payload digest.
func specLines(s *manifest.Spec, digest string) []string {
	b, _ := json.Marshal(s)
	y, err := jsonToYAML(b)
	if err != nil {
		y = b
	}
	lines := strings.Split(strings.TrimRight(string(y), "\n"), "\n")
	return append(lines, "# payload: "+digest)
}
