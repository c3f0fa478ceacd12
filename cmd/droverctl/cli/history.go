package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"

	"github.com/spf13/cobra"

	"github.com/drover/drover/api"
	"github.com/drover/drover/internal/command"
)

// versionsPath is the path of a pipe's versions, or of one with version > 0.
func versionsPath(pipe string, version uint64) string {
	p := "/api/v1/pipes/" + pathEscape(pipe) + "/versions"
	if version > 0 {
		p += "/" + strconv.FormatUint(version, 10)
	}
	return p
}

// parseVersion reads a pipe version argument or flag value: 1, 2, ...
func parseVersion(what, s string) (uint64, error) {
	n, err := strconv.ParseUint(s, 10, 64)
	if err != nil || n == 0 {
		return 0, command.Usagef("%s %q: want a version number, a positive integer (1, 2, ...)", what, s)
	}
	return n, nil
}

func (a *app) newHistoryCmd() *cobra.Command {
	return &cobra.Command{
		Use:               "history PIPE",
		ValidArgsFunction: a.completeKind("pipes", 1),
		Short:             "List a pipe's versions, newest first (also of a deleted pipe)",
		Long: `List every version of a pipe, newest first: when it was stored, its schedule,
its payload digest, and which one is current (none when the pipe is deleted).
With -o json or -o yaml the API's version objects, spec included.

Show one version's spec with "droverctl describe pipe PIPE --version N";
make it current again with "droverctl restore PIPE N".`,
		Args: exactArgs(1, "a pipe name"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.apiClient()
			if err != nil {
				return err
			}
			return a.history(cmd.Context(), c, args[0])
		},
	}
}

// historyList is the JSON form of history: the API's PipeVersionList with
// every page's versions (so without next_cursor).
type historyList struct {
	Name     json.RawMessage   `json:"name,omitempty"`
	Deleted  json.RawMessage   `json:"deleted,omitempty"`
	Versions []json.RawMessage `json:"versions"`
}

func (a *app) history(ctx context.Context, c *client, pipe string) error {
	items, head, err := c.listHead(ctx, versionsPath(pipe, 0), "versions", nil)
	if missingEndpoint(err) {
		return fmt.Errorf("pipe %s: this server keeps no pipe history (it lacks GET /api/v1/pipes/{name}/versions)", pipe)
	}
	if err != nil {
		return fmt.Errorf("pipe %s: %w", pipe, err)
	}
	if a.format() != "table" {
		if items == nil {
			items = []json.RawMessage{}
		}
		return a.printData(historyList{Name: head["name"], Deleted: head["deleted"], Versions: items})
	}
	vs, err := decodeAll[api.PipeVersion](items)
	if err != nil {
		return err
	}
	t := newTable(a.stdout(), "VERSION", "CURRENT", "CREATED", "SCHEDULE", "PAYLOAD")
	for _, v := range vs {
		cur := ""
		if v.Current {
			cur = "*"
		}
		t.row(itoa(int(v.Version)), cur, fmtTimeV(v.CreatedAt), v.Spec.Schedule, shortDigest(v.Payload.Digest))
	}
	if err := t.flush(); err != nil {
		return err
	}
	var deleted bool
	if raw, ok := head["deleted"]; ok {
		_ = json.Unmarshal(raw, &deleted)
	}
	if deleted {
		fmt.Fprintf(a.stderr(), "note: pipe %s is deleted; droverctl restore %s VERSION brings it back\n", sanitizeLine(pipe), sanitizeLine(pipe))
	}
	return nil
}

func (a *app) newRestoreCmd() *cobra.Command {
	return &cobra.Command{
		Use:               "restore PIPE VERSION",
		ValidArgsFunction: a.completeKind("pipes", 1),
		Short:             "Make an old version of a pipe current again, as a new version",
		Long: `Store the spec and payload of an old version of a pipe as its newest version
(a deleted pipe comes back); the agents get it with their next manifest.
Prints the version now in force; with -o json or -o yaml the API's answer.
Nothing changes when that version's spec and payload are the current ones.

"droverctl history PIPE" lists the versions.`,
		Args: exactArgs(2, "a pipe name and a VERSION"),
		RunE: func(cmd *cobra.Command, args []string) error {
			pipe := args[0]
			version, err := parseVersion("VERSION", args[1])
			if err != nil {
				return err
			}
			c, err := a.apiClient()
			if err != nil {
				return err
			}
			var resp api.PutPipeResponse
			raw, err := c.call(cmd.Context(), http.MethodPost, versionsPath(pipe, version)+"/restore", map[string]any{}, &resp)
			if missingEndpoint(err) {
				return fmt.Errorf("restore %s version %d: this server cannot restore versions (it lacks POST /api/v1/pipes/{name}/versions/{version}/restore)", pipe, version)
			}
			if err != nil {
				return fmt.Errorf("restore %s version %d: %w", pipe, version, err)
			}
			if a.format() != "table" {
				return a.printData(raw)
			}
			if !resp.Created {
				fmt.Fprintf(a.stdout(), "pipe/%s unchanged (version %d): version %d matches the current spec\n", sanitizeLine(resp.Name), resp.Version, version)
				return nil
			}
			fmt.Fprintf(a.stdout(), "pipe/%s restored from version %d (version %d, payload %s)\n",
				sanitizeLine(resp.Name), version, resp.Version, shortDigest(sanitizeLine(resp.Digest)))
			return nil
		},
	}
}
