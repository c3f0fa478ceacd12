package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/drover/drover/api"
	"github.com/drover/drover/internal/command"
	"github.com/drover/drover/manifest"
)

func (a *app) newDescribeCmd() *cobra.Command {
	var version string
	cmd := &cobra.Command{
		Use:               "describe pipe|agent|run NAME [--version N]",
		ValidArgsFunction: a.completeDescribe,
		Short:             "Show one pipe, agent or run in detail",
		Long: `Show one pipe, agent or run in detail, or with -o json or -o yaml the API's
object.

  describe pipe NAME               the current version, its agents, versions, recent runs and spec
  describe pipe NAME --version N   version N of the pipe and its spec (also of a deleted pipe)
  describe agent ID
  describe run ID`,
		Args: exactArgs(2, "a kind (pipe, agent or run) and a name or id"),
		RunE: func(cmd *cobra.Command, args []string) error {
			kind := resourceAliases[args[0]]
			switch kind {
			case "pipes", "agents", "runs":
			default:
				return command.Usagef("describe %q: use pipe, agent or run", args[0])
			}
			var n uint64
			if cmd.Flags().Changed("version") {
				if kind != "pipes" {
					return command.Usagef("--version applies to describe pipe only")
				}
				var err error
				if n, err = parseVersion("--version", version); err != nil {
					return err
				}
			}
			c, err := a.apiClient()
			if err != nil {
				return err
			}
			switch kind {
			case "pipes":
				if n > 0 {
					return a.describePipeVersion(cmd.Context(), c, args[1], n)
				}
				return a.describePipe(cmd.Context(), c, args[1])
			case "agents":
				return a.describeAgent(cmd.Context(), c, args[1])
			}
			return a.describeRun(cmd.Context(), c, args[1])
		},
	}
	cmd.Flags().StringVar(&version, "version", "", "describe pipe: show this version (droverctl history PIPE lists them)")
	return cmd
}

// describePipeVersion shows one stored version of a pipe.
func (a *app) describePipeVersion(ctx context.Context, c *client, name string, version uint64) error {
	var v api.PipeVersion
	shown, err := a.getShown(ctx, c, versionsPath(name, version), &v, fmt.Sprintf("pipe %s version %d", name, version))
	if missingEndpoint(err) {
		return fmt.Errorf("pipe %s: this server keeps no pipe history (it lacks GET /api/v1/pipes/{name}/versions/{version})", name)
	}
	if shown || err != nil {
		return err
	}
	s := v.Spec
	s.Normalize()
	kv := newKV(a.stdout())
	pipeHeadKV(kv, v.Name, v.Version, &s)
	kv.add("Current", strconv.FormatBool(v.Current))
	specKV(kv, &s, v.Payload)
	kv.add("Created", fmtTimeV(v.CreatedAt))
	if err := kv.flush(); err != nil {
		return err
	}
	return a.printSpec(&s)
}

// getShown gets the object at path into out. With -o json or -o yaml it
// prints the object as the server sent it and reports shown; the table is
// the caller's otherwise. what names the object in errors ("pipe x").
func (a *app) getShown(ctx context.Context, c *client, path string, out any, what string) (shown bool, err error) {
	raw, err := c.get(ctx, path, out)
	if err != nil {
		return false, fmt.Errorf("%s: %w", what, err)
	}
	if a.format() != "table" {
		return true, a.printData(raw)
	}
	return false, nil
}

// pipeHeadKV and specKV add the rows describe shows for a pipe (or one of
// its versions) with normalized spec s.
func pipeHeadKV(kv *kvWriter, name string, version uint64, s *manifest.Spec) {
	kv.add("Name", name)
	kv.add("Description", s.Description)
	kv.add("Version", itoa(int(version)))
}

func specKV(kv *kvWriter, s *manifest.Spec, payload manifest.Payload) {
	kv.add("Schedule", s.Schedule)
	kv.add("Time zone", s.Timezone)
	kv.add("Enabled", strconv.FormatBool(s.IsEnabled()))
	kv.add("Targets", fmtTargets(s.Targets))
	kv.add("Payload", fmt.Sprintf("%s (%d bytes)", payload.Digest, payload.Size))
}

// printSpec writes a pipe spec as indented YAML under "Spec:".
func (a *app) printSpec(s *manifest.Spec) error {
	out := a.stdout()
	fmt.Fprintln(out, "\nSpec:")
	b, err := json.Marshal(s)
	if err != nil {
		return fmt.Errorf("encode spec: %w", err)
	}
	y, err := jsonToYAML(b)
	if err != nil {
		return err
	}
	for _, l := range strings.Split(strings.TrimRight(string(y), "\n"), "\n") {
		fmt.Fprintf(out, "  %s\n", sanitizeLine(l))
	}
	return nil
}

func (a *app) describePipe(ctx context.Context, c *client, name string) error {
	var p api.Pipe
	if shown, err := a.getShown(ctx, c, "/api/v1/pipes/"+pathEscape(name), &p, "pipe "+name); shown || err != nil {
		return err
	}
	out := a.stdout()
	s := p.Spec
	s.Normalize()
	kv := newKV(out)
	pipeHeadKV(kv, p.Name, p.Version, &s)
	specKV(kv, &s, p.Payload)
	placementKV(kv, p.Placement, a.env.Now())
	kv.add("Created", fmtTimeV(p.CreatedAt))
	kv.add("Updated", fmtTimeV(p.UpdatedAt))
	if err := kv.flush(); err != nil {
		return err
	}
	if sched, err := manifest.ParseSchedule(s.Schedule); err == nil {
		if loc, err := manifest.LoadLocation(s.Timezone); err == nil {
			if _, every := sched.Every(); !every {
				fmt.Fprintln(out, "\nNext fire times (UTC):")
				t := a.env.Now().UTC().Truncate(time.Second)
				for i := 0; i < 3; i++ {
					if t = sched.Next(t, loc); t.IsZero() {
						break
					}
					fmt.Fprintf(out, "  %s\n", t.UTC().Format(time.RFC3339))
				}
			}
		}
	}
	agents, err := c.list(ctx, "/api/v1/agents", "agents", nil)
	if err != nil {
		return err
	}
	all, err := decodeAll[api.Agent](agents)
	if err != nil {
		return err
	}
	fmt.Fprintln(out, "\nAgents:")
	t := newTable(indent(out), "ID", "HOSTNAME", "STATUS", "VERSION RUNNING", "APPLY ERROR")
	n := 0
	for _, ag := range all {
		if !targets(s.Targets, &ag) {
			continue
		}
		n++
		running, applyErr := "", ""
		for _, ps := range ag.Pipes {
			if ps.Name == p.Name {
				running, applyErr = itoa(int(ps.Version)), ps.ApplyError
			}
		}
		if p.Placement != nil && p.Placement.Holder == ag.ID {
			running = strings.TrimSpace(running + " (holder)")
		}
		t.row(ag.ID, ag.Hostname, ag.State(), running, applyErr)
	}
	if n == 0 {
		fmt.Fprintln(out, "  (none: no agent matches the targets)")
	} else if err := t.flush(); err != nil {
		return err
	}
	if len(p.Versions) > 0 {
		fmt.Fprintln(out, "\nVersions:")
		t := newTable(indent(out), "VERSION", "PAYLOAD", "CREATED")
		for _, v := range p.Versions {
			t.row(itoa(int(v.Version)), shortDigest(v.Digest), fmtTimeV(v.CreatedAt))
		}
		if err := t.flush(); err != nil {
			return err
		}
	}
	if err := a.recentRuns(ctx, c, url.Values{"pipe": {p.Name}}); err != nil {
		return err
	}
	return a.printSpec(&s)
}

// recentRuns prints the last five runs matching q.
func (a *app) recentRuns(ctx context.Context, c *client, q url.Values) error {
	q.Set("limit", "5")
	items, err := c.list(ctx, "/api/v1/runs", "runs", q, 5)
	if err != nil {
		return err
	}
	runs, err := decodeAll[api.Run](items)
	if err != nil {
		return err
	}
	out := a.stdout()
	fmt.Fprintln(out, "\nRecent runs:")
	if len(runs) == 0 {
		fmt.Fprintln(out, "  (none)")
		return nil
	}
	t := newTable(indent(out), "ID", "PIPE", "AGENT", "STATUS", "TRIGGER", "STARTED", "EXIT")
	for _, r := range runs {
		t.row(r.ID, r.Pipe, r.AgentID, r.Status, r.Trigger, fmtTime(r.StartedAt), runExit(&r))
	}
	return t.flush()
}

func (a *app) describeAgent(ctx context.Context, c *client, id string) error {
	var ag api.Agent
	if shown, err := a.getShown(ctx, c, "/api/v1/agents/"+pathEscape(id), &ag, "agent "+id); shown || err != nil {
		return err
	}
	out := a.stdout()
	kv := newKV(out)
	kv.add("ID", ag.ID)
	kv.add("Name", ag.Name)
	kv.add("Hostname", ag.Hostname)
	if ag.ReportedHostname != "" && ag.ReportedHostname != ag.Hostname {
		kv.add("Reported hostname", ag.ReportedHostname)
	}
	machine := ag.MachineID
	if machine == "" {
		machine = "(not bound yet: bound at the first stream that reports one)"
	}
	kv.add("Machine", machine)
	if ag.IdentityConflicts > 0 {
		kv.add("Identity conflicts", fmt.Sprintf("%d refused streams from another machine; last %s from machine %s",
			ag.IdentityConflicts, fmtTime(ag.IdentityConflictAt), ag.IdentityConflictMachine))
	}
	kv.add("Status", ag.State())
	kv.add("Last seen", fmtTime(ag.LastSeenAt))
	kv.add("Tags", fmtTags(ag.Tags))
	kv.add("Platform", strings.Trim(ag.OS+"/"+ag.Arch, "/"))
	kv.add("Agent version", ag.AgentVersion)
	backend := ag.Backend
	if ag.Scope != "" {
		backend += " (" + ag.Scope + " scope)"
	}
	if ag.SystemdVersion != "" {
		backend += ", systemd " + ag.SystemdVersion
	}
	kv.add("Backend", backend)
	kv.add("Enrolled", fmtTimeV(ag.CreatedAt))
	kv.add("Certificate expires", fmtTimeV(ag.CertExpiresAt))
	if ag.Revoked {
		kv.add("Revoked", fmtTime(ag.RevokedAt))
	}
	if m := ag.Manifest; m != nil {
		kv.add("Manifest", fmt.Sprintf("serial %d, %s, issued %s, expires %s, key list v%d",
			m.Serial, shortDigest(m.Digest), fmtTimeV(m.IssuedAt), fmtTimeV(m.ExpiresAt), m.KeyListVersion))
	}
	kv.add("Accepted serial", itoa(int(ag.AcceptedSerial)))
	kv.add("Applied serial", itoa(int(ag.AppliedSerial)))
	kv.add("Manifest state", ag.ManifestState)
	if ag.ManifestExpired {
		kv.add("Manifest expired", "the manifest in force on the host expired "+fmtTime(ag.ManifestExpiresAt)+"; its pipes keep running")
	}
	if ag.ManifestError != "" {
		kv.add("Manifest error", ag.ManifestError)
	}
	if err := kv.flush(); err != nil {
		return err
	}
	if err := printAgentPipes(out, ag.Pipes); err != nil {
		return err
	}
	return a.recentRuns(ctx, c, url.Values{"agent": {ag.ID}})
}

// printAgentPipes prints the pipes an agent reported, with their next fire
// time and problems.
func printAgentPipes(out io.Writer, pipes []api.PipeStatus) error {
	fmt.Fprintln(out, "\nPipes:")
	if len(pipes) == 0 {
		fmt.Fprintln(out, "  (none reported)")
		return nil
	}
	t := newTable(indent(out), "NAME", "VERSION", "NEXT FIRE", "PROBLEM")
	for _, p := range pipes {
		next := ""
		if len(p.NextFireTimes) > 0 {
			next = fmtTimeV(p.NextFireTimes[0])
		}
		problem := p.ApplyError
		if p.ElapseMismatch != "" {
			problem = strings.TrimSpace(problem + " scheduler disagrees: " + p.ElapseMismatch)
		}
		if len(p.DropInsRemoved) > 0 {
			problem = strings.TrimSpace(problem + " drop-ins removed: " + strings.Join(p.DropInsRemoved, ", "))
		}
		switch { // placement: one
		case p.LeaseEnded:
			next = "lease ended, stopped"
		case !p.LeaseUntil.IsZero():
			next = strings.TrimSpace(next + " (lease until " + fmtTimeV(p.LeaseUntil) + ")")
		}
		t.row(p.Name, itoa(int(p.Version)), next, problem)
	}
	return t.flush()
}

func (a *app) describeRun(ctx context.Context, c *client, id string) error {
	var r api.Run
	if shown, err := a.getShown(ctx, c, "/api/v1/runs/"+pathEscape(id), &r, "run "+id); shown || err != nil {
		return err
	}
	kv := newKV(a.stdout())
	kv.add("ID", r.ID)
	kv.add("Pipe", fmt.Sprintf("%s (version %d)", r.Pipe, r.PipeVersion))
	kv.add("Agent", r.AgentID)
	kv.add("Status", r.Status)
	kv.add("Trigger", r.Trigger)
	kv.add("Request", r.RequestID)
	kv.add("Scheduled", fmtTime(r.ScheduledAt))
	kv.add("Started", fmtTime(r.StartedAt))
	kv.add("Finished", fmtTime(r.FinishedAt))
	if r.FinishedAt != nil {
		kv.add("Duration", fmtDuration(r.DurationMS))
	}
	kv.add("Exit", runExit(&r))
	kv.add("Reason", r.Reason)
	if r.Attempts > 0 {
		kv.add("Attempts", itoa(int(r.Attempts)))
	}
	kv.add("Written by", r.WrittenBy)
	if r.Error != "" {
		kv.add("Error", r.Error)
	}
	logs := fmt.Sprintf("%d chunks, %d bytes", r.LogChunks, r.LogBytes)
	if r.LogTruncated {
		logs += " (truncated)"
	}
	kv.add("Log", logs+"; droverctl logs "+r.ID)
	if err := kv.flush(); err != nil {
		return err
	}
	return writeRunTelemetry(a.stdout(), &r)
}

// indent prefixes every line written through it with two spaces.
func indent(w io.Writer) *indentWriter {
	return &indentWriter{w: w, bol: true}
}

type indentWriter struct {
	w   io.Writer
	bol bool
}

func (iw *indentWriter) Write(p []byte) (int, error) {
	var buf []byte
	for _, b := range p {
		if iw.bol {
			buf = append(buf, ' ', ' ')
		}
		buf = append(buf, b)
		iw.bol = b == '\n'
	}
	if _, err := iw.w.Write(buf); err != nil {
		return 0, err
	}
	return len(p), nil
}
