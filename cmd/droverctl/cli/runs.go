package cli

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/drover/drover/api"
	"github.com/drover/drover/internal/command"
)

// pollInterval is how often logs -f polls a server without live logs.
var pollInterval = time.Second

// logEndGrace is how long logs -f waits for the last chunks of an ended run.
const logEndGrace = 5 * time.Second

func (a *app) newLogsCmd() *cobra.Command {
	var follow bool
	cmd := &cobra.Command{
		Use:               "logs RUN [-f]",
		ValidArgsFunction: a.completeKind("runs", 1),
		Short:             "Print a run's output; -f follows it until the run ends",
		Long: `Print the output of a run, as the agent shipped it.

With -f the output is followed live (Server-Sent Events when the server
offers them, else by polling) until the run ends; the final status goes to
stderr. With -o json the log is the API's JSON (chunks with base64 data);
with -f -o json each chunk is printed as one JSON line. Control characters
other than newline and tab (terminal escape sequences) are shown escaped,
e.g. \x1b; --raw prints the bytes as they are.`,
		Args: exactArgs(1, "a run id"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.apiClient()
			if err != nil {
				return err
			}
			if follow {
				return a.followLogs(cmd.Context(), c, args[0])
			}
			return a.printLogs(cmd.Context(), c, args[0])
		},
	}
	cmd.Flags().BoolVarP(&follow, "follow", "f", false, "follow the output until the run ends")
	cmd.Flags().BoolVar(&a.rawLogs, "raw", false, "print control characters and escape sequences as they are")
	return cmd
}

func (a *app) printLogs(ctx context.Context, c *client, id string) error {
	path := "/api/v1/runs/" + pathEscape(id) + "/logs"
	if a.format() != "table" {
		raw, err := c.get(ctx, path, nil)
		if err != nil {
			return fmt.Errorf("run %s: %w", id, err)
		}
		return a.printData(raw)
	}
	resp, err := c.do(ctx, c.stream, request{method: http.MethodGet, path: path, accept: "text/plain"})
	if err != nil {
		return fmt.Errorf("run %s: %w", id, err)
	}
	defer resp.Body.Close()
	if _, err := io.Copy(a.logOut(), resp.Body); err != nil {
		return fmt.Errorf("run %s: reading the log: %w", id, err)
	}
	if err := a.flushLog(); err != nil {
		return err
	}
	if resp.Header.Get("X-Drover-Log-Truncated") == "true" {
		fmt.Fprintln(a.stderr(), "note: the log was truncated by the server's per-run cap")
	}
	return nil
}

// chunkPrinter prints each chunk once, in order of arrival.
type chunkPrinter struct {
	a    *app
	seen map[uint64]bool
}

func (p *chunkPrinter) print(ch api.LogChunk, raw json.RawMessage) error {
	if p.seen[ch.Seq] {
		return nil
	}
	p.seen[ch.Seq] = true
	switch p.a.format() {
	case "json":
		if raw == nil {
			raw, _ = json.Marshal(ch)
		}
		_, err := p.a.stdout().Write(append(compactJSON(raw), '\n'))
		return err
	case "yaml":
		if raw == nil {
			raw, _ = json.Marshal(ch)
		}
		io.WriteString(p.a.stdout(), "---\n")
		return writeFormatted(p.a.stdout(), "yaml", raw)
	}
	_, err := p.a.logOut().Write(ch.Data)
	return err
}

func compactJSON(raw []byte) []byte {
	var buf bytes.Buffer
	if err := json.Compact(&buf, raw); err != nil {
		return raw
	}
	return buf.Bytes()
}

// followLogs follows a run's output until it ends.
func (a *app) followLogs(ctx context.Context, c *client, id string) error {
	p := &chunkPrinter{a: a, seen: map[uint64]bool{}}
	run, err := a.followSSE(ctx, c, id, p)
	if errors.Is(err, errNoSSE) {
		run, err = a.pollLogs(ctx, c, id, p)
	}
	if ctx.Err() != nil {
		return nil // interrupted: stopping is what the operator asked for
	}
	if err != nil {
		return err
	}
	if run != nil {
		msg := fmt.Sprintf("run %s %s", run.ID, run.Status)
		if e := runExit(run); e != "" {
			msg += " (exit " + e + ")"
		}
		fmt.Fprintln(a.stderr(), sanitizeLine(msg))
	}
	return nil
}

var errNoSSE = errors.New("the server has no live log stream")

// followSSE reads GET /api/v1/runs/{id}/logs/stream (text/event-stream):
// "chunk" events carry a chunk as JSON with the seq as event id; an "end"
// event carries the finished run. It reconnects with Last-Event-ID.
func (a *app) followSSE(ctx context.Context, c *client, id string, p *chunkPrinter) (*api.Run, error) {
	path := "/api/v1/runs/" + pathEscape(id) + "/logs/stream"
	lastID, prevID := "", ""
	for attempt := 0; ; attempt++ {
		if lastID != prevID {
			attempt, prevID = 0, lastID // progress: breaks are counted anew
		}
		resp, err := c.doSSE(ctx, path, lastID)
		if missingEndpoint(err) {
			return nil, errNoSSE
		}
		if err != nil {
			var ae *api.Error
			if attempt < 5 && !errors.As(err, &ae) && ctx.Err() == nil {
				time.Sleep(time.Second)
				continue
			}
			return nil, fmt.Errorf("run %s: %w", id, err)
		}
		if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/event-stream") {
			resp.Body.Close()
			return nil, errNoSSE
		}
		run, err := readSSE(resp.Body, p, &lastID)
		resp.Body.Close()
		if run != nil || err != nil && !isStreamBreak(err) {
			return run, err
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		// The stream broke without an end event: reconnect and resume.
		if attempt >= 5 {
			return nil, fmt.Errorf("run %s: the live log stream keeps breaking: %v", id, err)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

func isStreamBreak(err error) bool {
	return err == nil || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || strings.Contains(err.Error(), "connection reset")
}

func (c *client) doSSE(ctx context.Context, path, lastID string) (*http.Response, error) {
	req, err := c.newRequest(ctx, http.MethodGet, path, nil, "text/event-stream")
	if err != nil {
		return nil, err
	}
	req.Header.Set("Cache-Control", "no-cache")
	if lastID != "" {
		req.Header.Set("Last-Event-ID", lastID)
	}
	resp, err := c.stream.Do(req)
	if err != nil {
		return nil, connError(c.base, err)
	}
	if resp.StatusCode/100 != 2 {
		return nil, readAPIError(resp, http.MethodGet, path)
	}
	return resp, nil
}

// readSSE parses events until an "end" event (returning the run) or the
// end of the stream (returning nil and the read error).
func readSSE(r io.Reader, p *chunkPrinter, lastID *string) (*api.Run, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 8<<20)
	var event, id string
	var data strings.Builder
	for sc.Scan() {
		line := sc.Text()
		if line == "" {
			if data.Len() > 0 || event != "" {
				raw := json.RawMessage(strings.TrimSuffix(data.String(), "\n"))
				switch event {
				case "", "chunk":
					var ch api.LogChunk
					if err := json.Unmarshal(raw, &ch); err != nil {
						return nil, fmt.Errorf("malformed log event: %w", err)
					}
					if err := p.print(ch, raw); err != nil {
						return nil, err
					}
				case "end":
					var run api.Run
					if err := json.Unmarshal(raw, &run); err != nil {
						return nil, fmt.Errorf("malformed end event: %w", err)
					}
					return &run, nil
				case "error":
					var body struct {
						Error *api.ErrorInfo `json:"error"`
					}
					if json.Unmarshal(raw, &body) == nil && body.Error != nil {
						return nil, &apiError{err: &api.Error{ErrorInfo: *body.Error}, method: http.MethodGet}
					}
					return nil, fmt.Errorf("the server ended the stream: %s", raw)
				}
				if id != "" {
					*lastID = id
				}
			}
			event, id = "", ""
			data.Reset()
			continue
		}
		if strings.HasPrefix(line, ":") {
			continue // comment / keep-alive
		}
		field, value, _ := strings.Cut(line, ":")
		value = strings.TrimPrefix(value, " ")
		switch field {
		case "event":
			event = value
		case "data":
			data.WriteString(value)
			data.WriteByte('\n')
		case "id":
			id = value
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	return nil, io.EOF
}

// pollLogs follows a run by polling its JSON log and status.
func (a *app) pollLogs(ctx context.Context, c *client, id string, p *chunkPrinter) (*api.Run, error) {
	base := "/api/v1/runs/" + pathEscape(id)
	fetch := func() error {
		var body struct {
			Chunks []json.RawMessage `json:"chunks"`
		}
		if _, err := c.get(ctx, base+"/logs", &body); err != nil {
			return fmt.Errorf("run %s: %w", id, err)
		}
		type item struct {
			ch  api.LogChunk
			raw json.RawMessage
		}
		items := make([]item, 0, len(body.Chunks))
		for _, raw := range body.Chunks {
			var ch api.LogChunk
			if err := json.Unmarshal(raw, &ch); err != nil {
				return fmt.Errorf("run %s: malformed log chunk: %w", id, err)
			}
			items = append(items, item{ch, raw})
		}
		sort.SliceStable(items, func(i, j int) bool { return items[i].ch.Seq < items[j].ch.Seq })
		for _, it := range items {
			if err := p.print(it.ch, it.raw); err != nil {
				return err
			}
		}
		return nil
	}
	var endedAt time.Time
	for {
		var run api.Run
		if _, err := c.get(ctx, base, &run); err != nil {
			return nil, fmt.Errorf("run %s: %w", id, err)
		}
		if err := fetch(); err != nil {
			return nil, err
		}
		if api.Terminal(run.Status) {
			// Chunks may still be on their way from the agent: wait for
			// as many as it reported, for a few seconds at most.
			if endedAt.IsZero() {
				endedAt = time.Now()
			}
			if uint64(len(p.seen)) >= run.LogChunks || run.LogTruncated || time.Since(endedAt) > logEndGrace {
				return &run, nil
			}
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(pollInterval):
		}
	}
}

// ---- run, cancel

// runPipeResp is the answer of POST /api/v1/pipes/{name}/run. RequestIDs
// is set by runByTags (one request per agent, on an older server); the
// server's own answer has RequestID only.
type runPipeResp struct {
	api.RunPipeResponse
	RequestIDs []string `json:"request_ids,omitempty"`
}

// requestIDs are the ids whose runs answer this request.
func (r *runPipeResp) requestIDs() []string {
	if len(r.RequestIDs) > 0 {
		return r.RequestIDs
	}
	if r.RequestID == "" {
		return nil
	}
	return []string{r.RequestID}
}

// runWaitInterval is how often run --wait polls the request's runs.
var runWaitInterval = 500 * time.Millisecond

// runWaitPageSize is the page size run --wait asks for; 0 is the server's
// default (tests make it small to cross pages).
var runWaitPageSize = 0

func (a *app) newRunCmd() *cobra.Command {
	var agent string
	var tagArgs []string
	var wait bool
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:               "run PIPE [--agent ID | --tag k=v ...] [--wait [--timeout DURATION]]",
		ValidArgsFunction: a.completeKind("pipes", 1),
		Short:             "Run a pipe now on every agent it targets, one agent, or the agents with tags",
		Long: `Ask agents to run a pipe now: every agent the pipe targets, one of them
(--agent), or those carrying tags (--tag k=v, repeatable). A targeted agent
that is offline is listed as such and does not run the pipe: the request is
not kept for it.

Without --wait the command ends once the server has sent the request.

With --wait it then follows the runs the request started (polling the server
every half second) until every agent that got the request has finished its
run, and prints one row per agent: AGENT RUN STATUS EXIT DURATION ERROR. With
-o json or -o yaml it prints one object: request_id, sent, offline and runs
(the API's run objects). --timeout bounds the wait (e.g. 30s, 5m; default:
until interrupted); the rows then show where each run stands.

Exit status with --wait: 0 only if the run of every agent that got the request
succeeded; 1 if a run failed, timed out, was canceled or was skipped (a run of
the pipe was in progress on that agent), if --timeout passed or the wait was
interrupted first (stderr names the agents still waited for), or if a targeted
agent was offline (it did not run the pipe).`,
		Args: exactArgs(1, "a pipe name"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if agent != "" && len(tagArgs) > 0 {
				return command.Usagef("use --agent or --tag, not both")
			}
			if cmd.Flags().Changed("timeout") && !wait {
				return command.Usagef("--timeout applies to --wait only")
			}
			if timeout < 0 {
				return command.Usagef("--timeout %s: must not be negative (0 waits until interrupted)", timeout)
			}
			tags, err := parseTags(tagArgs)
			if err != nil {
				return err
			}
			c, err := a.apiClient()
			if err != nil {
				return err
			}
			if !wait {
				return a.runPipe(cmd.Context(), c, args[0], agent, tags)
			}
			return a.runPipeWait(cmd.Context(), c, args[0], agent, tags, timeout)
		},
	}
	cmd.Flags().StringVar(&agent, "agent", "", "run on this agent only")
	cmd.Flags().StringArrayVar(&tagArgs, "tag", nil, "run on the targeted agents carrying k=v (repeatable)")
	cmd.Flags().BoolVar(&wait, "wait", false, "wait for the runs to end; exit 0 only if all succeeded (an offline agent counts as not)")
	cmd.Flags().DurationVar(&timeout, "timeout", 0, "with --wait: give up waiting after this long, e.g. 30s or 5m (default 0: until interrupted)")
	return cmd
}

func (a *app) runPipe(ctx context.Context, c *client, pipe, agent string, tags map[string]string) error {
	resp, raw, err := a.requestRun(ctx, c, pipe, agent, tags)
	if err != nil {
		return err
	}
	if a.format() != "table" {
		if err := a.printData(raw); err != nil {
			return err
		}
	} else {
		a.printRunRequested(pipe, resp)
	}
	return noAgentSent(pipe, resp)
}

// requestRun asks the server for a run of pipe.
func (a *app) requestRun(ctx context.Context, c *client, pipe, agent string, tags map[string]string) (*runPipeResp, json.RawMessage, error) {
	path := "/api/v1/pipes/" + pathEscape(pipe) + "/run"
	var resp runPipeResp
	// At most one of agent and tags is set; neither: every targeted agent.
	raw, err := c.call(ctx, http.MethodPost, path, api.RunPipeRequest{Agent: agent, Tags: tags}, &resp)
	if len(tags) > 0 && unknownField(err, "tags") {
		// An older server: pick the agents here and ask each.
		raw, err = a.runByTags(ctx, c, pipe, tags, &resp)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("run %s: %w", pipe, err)
	}
	return &resp, raw, nil
}

func (a *app) printRunRequested(pipe string, resp *runPipeResp) {
	fmt.Fprintf(a.stdout(), "run of %s requested (request %s)\n", pipe, resp.RequestID)
	if len(resp.Sent) > 0 {
		fmt.Fprintf(a.stdout(), "  sent to: %s\n", strings.Join(resp.Sent, ", "))
	}
	if len(resp.Offline) > 0 {
		fmt.Fprintf(a.stdout(), "  offline (not run): %s\n", strings.Join(resp.Offline, ", "))
	}
}

// noAgentSent is the error of a request no agent got.
func noAgentSent(pipe string, resp *runPipeResp) error {
	if len(resp.Sent) > 0 {
		return nil
	}
	if len(resp.Offline) == 0 {
		return fmt.Errorf("pipe %s targets no agent that matches", pipe)
	}
	return fmt.Errorf("no agent that runs pipe %s is online", pipe)
}

// runWaitResult is what run --wait prints with -o json|yaml.
type runWaitResult struct {
	RequestID  string            `json:"request_id"`
	RequestIDs []string          `json:"request_ids,omitempty"`
	Sent       []string          `json:"sent"`
	Offline    []string          `json:"offline"`
	Runs       []json.RawMessage `json:"runs"`
}

// agentRun is the run an agent reported for a request.
type agentRun struct {
	run api.Run
	raw json.RawMessage
}

// runPipeWait is run --wait: the request, then its runs until each agent
// that got it has finished one, timeout passes or ctx ends.
func (a *app) runPipeWait(ctx context.Context, c *client, pipe, agent string, tags map[string]string, timeout time.Duration) error {
	resp, _, err := a.requestRun(ctx, c, pipe, agent, tags)
	if err != nil {
		return err
	}
	if a.format() == "table" {
		a.printRunRequested(pipe, resp)
	}
	var runs map[string]*agentRun
	var waitErr error
	if len(resp.Sent) > 0 {
		runs, waitErr = a.waitRuns(ctx, c, resp, timeout)
		if runs == nil {
			return fmt.Errorf("run %s: waiting for the runs: %w", pipe, waitErr)
		}
	}
	if err := a.printRunsWaited(resp, runs); err != nil {
		return err
	}
	if err := noAgentSent(pipe, resp); err != nil {
		return err
	}
	return waitProblems(resp, runs, waitErr, timeout)
}

// printRunsWaited prints the runs run --wait saw: one row per agent that
// got the request, or with -o json|yaml a runWaitResult.
func (a *app) printRunsWaited(resp *runPipeResp, runs map[string]*agentRun) error {
	if a.format() != "table" {
		out := runWaitResult{RequestID: resp.RequestID, RequestIDs: resp.RequestIDs, Sent: resp.Sent, Offline: resp.Offline, Runs: []json.RawMessage{}}
		if out.Sent == nil {
			out.Sent = []string{}
		}
		if out.Offline == nil {
			out.Offline = []string{}
		}
		for _, id := range resp.Sent {
			if ar := runs[id]; ar != nil {
				out.Runs = append(out.Runs, ar.raw)
			}
		}
		return a.printData(out)
	}
	if len(resp.Sent) == 0 {
		return nil
	}
	t := newTable(a.stdout(), "AGENT", "RUN", "STATUS", "EXIT", "DURATION", "ERROR")
	for _, id := range resp.Sent {
		ar := runs[id]
		if ar == nil {
			t.row(id, "", "no run yet", "", "", "")
			continue
		}
		r := &ar.run
		exit, dur := runExit(r), ""
		if r.FinishedAt != nil || r.DurationMS > 0 {
			dur = fmtDuration(r.DurationMS)
		}
		if r.Status == api.StatusSkipped {
			exit, dur = "", "" // nothing ran
		}
		t.row(id, r.ID, r.Status, exit, dur, r.Error)
	}
	return t.flush()
}

// waitProblems says why run --wait's exit status is not 0, most pressing
// first; nil when every agent that got the request succeeded.
func waitProblems(resp *runPipeResp, runs map[string]*agentRun, waitErr error, timeout time.Duration) error {
	var problems, waiting []string
	for _, id := range resp.Sent {
		ar := runs[id]
		switch {
		case ar == nil || !api.Terminal(ar.run.Status):
			waiting = append(waiting, id)
		case ar.run.Status != api.StatusSucceeded:
			problems = append(problems, runProblem(id, &ar.run))
		}
	}
	if len(waiting) > 0 {
		what := "timed out after " + fmtWait(timeout)
		if !errors.Is(waitErr, errWaitTimeout) {
			what = "interrupted"
		}
		problems = append([]string{fmt.Sprintf("%s waiting for %s %s", what, plural(len(waiting), "agent", "agents"), strings.Join(waiting, ", "))}, problems...)
	}
	if n := len(resp.Offline); n > 0 {
		problems = append(problems, fmt.Sprintf("%s %s %s offline and did not run the pipe",
			plural(n, "agent", "agents"), strings.Join(resp.Offline, ", "), plural(n, "was", "were")))
	}
	if len(problems) > 0 {
		return errors.New(strings.Join(problems, "; "))
	}
	return nil
}

// runProblem says why an agent's finished run is not a success.
func runProblem(agent string, r *api.Run) string {
	p := "the run on agent " + agent
	switch r.Status {
	case api.StatusSkipped:
		p += " was skipped"
		if r.Error == "" {
			p += " (a run of the pipe was in progress)"
		}
	case api.StatusCanceled:
		p += " was canceled"
	default:
		p += " " + strings.ReplaceAll(r.Status, "_", " ")
	}
	switch e := runExit(r); {
	case r.Error != "":
		p += ": " + r.Error
	case e != "" && r.Status != api.StatusSkipped:
		p += " (exit " + e + ")"
	}
	return p
}

// fmtWait shows a --timeout as given: 5m rather than 5m0s.
func fmtWait(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}

// errWaitTimeout is waitRuns' error when --timeout passed.
var errWaitTimeout = errors.New("the --timeout passed")

// waitRuns polls the runs of resp's request until every agent in
// resp.Sent has a finished run (nil error), timeout passes
// (errWaitTimeout) or ctx ends (its error). It returns the runs
// last seen, by agent; the map is nil only when the API refused.
func (a *app) waitRuns(ctx context.Context, c *client, resp *runPipeResp, timeout time.Duration) (map[string]*agentRun, error) {
	wctx, cancel := ctx, context.CancelFunc(func() {})
	if timeout > 0 {
		wctx, cancel = context.WithTimeout(ctx, timeout)
	}
	defer cancel()
	sent := map[string]bool{}
	for _, id := range resp.Sent {
		sent[id] = true
	}
	done := func(runs map[string]*agentRun) bool {
		for id := range sent {
			if ar := runs[id]; ar == nil || !api.Terminal(ar.run.Status) {
				return false
			}
		}
		return true
	}
	runs := map[string]*agentRun{}
	const maxFailures = 10 // consecutive unreachable polls (a server restart)
	failures := 0
	for {
		got, err := fetchRequestRuns(wctx, c, resp.requestIDs(), sent)
		switch {
		case err == nil:
			runs, failures = got, 0
			if done(runs) {
				return runs, nil
			}
		case wctx.Err() != nil:
			// Ended mid-request: handled below.
		default:
			var ae *api.Error
			if failures++; errors.As(err, &ae) || failures >= maxFailures {
				return nil, err
			}
		}
		select {
		case <-wctx.Done():
		case <-time.After(runWaitInterval):
			continue
		}
		if ctx.Err() != nil {
			return runs, ctx.Err()
		}
		// The timeout passed: one last look, so that the rows show where
		// each run stands now.
		lctx, lcancel := context.WithTimeout(ctx, 5*time.Second)
		got, err = fetchRequestRuns(lctx, c, resp.requestIDs(), sent)
		lcancel()
		if err == nil {
			runs = got
			if done(runs) {
				return runs, nil
			}
		}
		return runs, errWaitTimeout
	}
}

// fetchRequestRuns lists the runs of requests (every page) and picks one
// per agent of sent: its newest finished run, else its newest run.
func fetchRequestRuns(ctx context.Context, c *client, requests []string, sent map[string]bool) (map[string]*agentRun, error) {
	runs := map[string]*agentRun{}
	for _, req := range requests {
		q := url.Values{"request_id": {req}}
		if runWaitPageSize > 0 {
			q.Set("limit", strconv.Itoa(runWaitPageSize))
		}
		items, err := c.list(ctx, "/api/v1/runs", "runs", q)
		if err != nil {
			return nil, err
		}
		for _, raw := range items {
			var r api.Run
			if err := json.Unmarshal(raw, &r); err != nil {
				return nil, fmt.Errorf("GET /api/v1/runs: malformed run: %w", err)
			}
			if r.RequestID != req || !sent[r.AgentID] {
				continue // a server that ignores the filter
			}
			// Newest first: keep the first, unless a finished one follows
			// a pending or running one.
			if cur := runs[r.AgentID]; cur == nil || !api.Terminal(cur.run.Status) && api.Terminal(r.Status) {
				runs[r.AgentID] = &agentRun{run: r, raw: raw}
			}
		}
	}
	return runs, nil
}

// unknownField reports a 400 naming field as unknown.
func unknownField(err error, field string) bool {
	var ae *api.Error
	if !errors.As(err, &ae) || ae.Status != http.StatusBadRequest {
		return false
	}
	for _, d := range ae.Details {
		if d.Field == field {
			return true
		}
	}
	return false
}

// runByTags asks for a run on each targeted agent carrying tags.
func (a *app) runByTags(ctx context.Context, c *client, pipe string, tags map[string]string, resp *runPipeResp) (json.RawMessage, error) {
	var p api.Pipe
	if _, err := c.get(ctx, "/api/v1/pipes/"+pathEscape(pipe), &p); err != nil {
		return nil, err
	}
	items, err := c.list(ctx, "/api/v1/agents", "agents", nil)
	if err != nil {
		return nil, err
	}
	agents, err := decodeAll[api.Agent](items)
	if err != nil {
		return nil, err
	}
	resp.Sent, resp.Offline = []string{}, []string{}
	var ids []string
	for _, ag := range agents {
		if targets(p.Spec.Targets, &ag) && subset(tags, ag.Tags) {
			var r api.RunPipeResponse
			if _, err := c.call(ctx, http.MethodPost, "/api/v1/pipes/"+pathEscape(pipe)+"/run", api.RunPipeRequest{Agent: ag.ID}, &r); err != nil {
				return nil, fmt.Errorf("agent %s: %w", ag.ID, err)
			}
			resp.Sent = append(resp.Sent, r.Sent...)
			resp.Offline = append(resp.Offline, r.Offline...)
			ids = append(ids, r.RequestID)
		}
	}
	resp.RequestID, resp.RequestIDs = strings.Join(ids, ","), ids
	raw, err := json.Marshal(map[string]any{"request_id": resp.RequestID, "request_ids": ids, "sent": resp.Sent, "offline": resp.Offline})
	return raw, err
}

func (a *app) newCancelCmd() *cobra.Command {
	return &cobra.Command{
		Use:               "cancel RUN",
		ValidArgsFunction: a.completeKind("runs", 1),
		Short:             "Cancel a running run (the agent kills its whole process tree)",
		Args:              exactArgs(1, "a run id"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.apiClient()
			if err != nil {
				return err
			}
			id := args[0]
			raw, err := c.call(cmd.Context(), http.MethodPost, "/api/v1/runs/"+pathEscape(id)+"/cancel", map[string]any{}, nil)
			if missingEndpoint(err) {
				return fmt.Errorf("cancel run %s: this server cannot cancel runs (it lacks POST /api/v1/runs/{id}/cancel)", id)
			}
			if err != nil {
				return fmt.Errorf("cancel run %s: %w", id, err)
			}
			if a.format() != "table" {
				if raw == nil {
					raw, _ = json.Marshal(map[string]any{"run_id": id, "cancel_requested": true})
				}
				return a.printData(raw)
			}
			fmt.Fprintf(a.stdout(), "cancel requested for run %s\n", sanitizeLine(id))
			return nil
		},
	}
}
