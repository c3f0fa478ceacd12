package cli

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/drover/drover/api"
	"github.com/drover/drover/internal/command"
)

// ---- audit

func (a *app) newAuditCmd() *cobra.Command {
	var actor, action, target, since, until string
	var limit int
	cmd := &cobra.Command{
		Use:   "audit [--actor A] [--action X] [--target T] [--since T] [--until T] [--limit N]",
		Short: "List the audit log: who changed what, when, with digests before and after",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if limit < 1 || limit > 10000 {
				return command.Usagef("--limit %d out of range 1-10000", limit)
			}
			from, err := a.parseWhen("since", since)
			if err != nil {
				return err
			}
			to, err := a.parseWhen("until", until)
			if err != nil {
				return err
			}
			c, err := a.apiClient()
			if err != nil {
				return err
			}
			q := url.Values{}
			for k, v := range map[string]string{"actor": actor, "action": action, "target": target} {
				if v != "" {
					q.Set(k, v)
				}
			}
			if !from.IsZero() {
				q.Set("since", from.UTC().Format(time.RFC3339))
			}
			if !to.IsZero() {
				q.Set("until", to.UTC().Format(time.RFC3339))
			}
			q.Set("limit", itoa(min(limit, 1000)))
			items, err := c.list(cmd.Context(), "/api/v1/audit", "entries", q, limit)
			if missingEndpoint(err) {
				return fmt.Errorf("audit: this server has no audit log yet (it lacks GET /api/v1/audit)")
			}
			if err != nil {
				return fmt.Errorf("audit: %w", err)
			}
			return a.printList("entries", items, a.auditTable)
		},
	}
	f := cmd.Flags()
	f.StringVar(&actor, "actor", "", "entries by this token name or id")
	f.StringVar(&action, "action", "", "entries of this action, e.g. pipes.write")
	f.StringVar(&target, "target", "", "entries about this object, e.g. pipe/backup-db")
	f.StringVar(&since, "since", "", "entries at or after this time (RFC 3339, or a duration before now)")
	f.StringVar(&until, "until", "", "entries before this time (RFC 3339, or a duration before now)")
	f.IntVar(&limit, "limit", 100, "at most this many entries")
	return cmd
}

func (a *app) auditTable(items []json.RawMessage) error {
	cols := []string{"TIME", "ACTOR", "ROLE", "ACTION", "TARGET", "BEFORE", "AFTER"}
	return tableOf(a.stdout(), items, cols, func(e *api.AuditEntry) []string {
		actor := e.Actor
		if e.ActorID != "" && e.ActorID != e.Actor {
			actor += " (" + e.ActorID + ")"
		}
		return []string{fmtTimeV(e.At), actor, e.Role, e.Action, e.Target, shortDigest(e.BeforeDigest), shortDigest(e.AfterDigest)}
	})
}

// ---- completion

func (a *app) newCompletionCmd(root *cobra.Command) *cobra.Command {
	a.registerCompletions(root)
	return &cobra.Command{
		Use:   "completion bash|zsh|fish",
		Short: "Print a shell completion script",
		Long: `Print a completion script for bash, zsh or fish. For example:

  droverctl completion bash > /etc/bash_completion.d/droverctl
  droverctl completion zsh > "${fpath[1]}/_droverctl"
  droverctl completion fish > ~/.config/fish/completions/droverctl.fish`,
		ValidArgs: []string{"bash", "zsh", "fish"},
		Args:      exactArgs(1, "a shell: bash, zsh or fish"),
		RunE: func(_ *cobra.Command, args []string) error {
			out := a.stdout()
			switch args[0] {
			case "bash":
				return root.GenBashCompletionV2(out, true)
			case "zsh":
				return root.GenZshCompletion(out)
			case "fish":
				return root.GenFishCompletion(out, true)
			}
			return command.Usagef("completion %q: use bash, zsh or fish", args[0])
		},
	}
}

// ---- login

func (a *app) newLoginCmd() *cobra.Command {
	var tokenFile string
	var tokenStdin, noVerify bool
	cmd := &cobra.Command{
		Use:   "login --server URL [--ca FILE] [--token-file F | --token-stdin]",
		Short: "Save the server, CA and token to the config file (mode 0600)",
		Long: `Check a server, CA and token, then save them to the config file
($XDG_CONFIG_HOME/drover/config.yaml, by default ~/.config/drover/config.yaml;
or --config), written with mode 0600. The token comes from --token-file,
--token-stdin, --token or DROVER_TOKEN; on the server host the admin token is
in the data dir (/var/lib/drover-server/admin.token) and the CA next to it
(ca.crt).`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if tokenFile != "" && tokenStdin {
				return command.Usagef("use --token-file or --token-stdin, not both")
			}
			path := a.configPath()
			if path == "" {
				return fmt.Errorf("no config file location: set HOME or XDG_CONFIG_HOME, or pass --config")
			}
			prev, _, err := a.readConfig()
			if err != nil {
				prev = &fileConfig{}
			}
			cn, err := a.loginConn(prev, tokenFile, tokenStdin)
			if err != nil {
				return err
			}
			if !noVerify {
				if err := a.verifyLogin(cmd.Context(), cn); err != nil {
					return err
				}
			}
			if err := writeConfig(path, &fileConfig{Server: cn.server, Token: cn.token, CA: cn.ca}); err != nil {
				return err
			}
			fmt.Fprintf(a.stdout(), "logged in to %s; wrote %s\n", cn.server, path)
			return nil
		},
	}
	cmd.Flags().StringVar(&tokenFile, "token-file", "", "read the token from this file")
	cmd.Flags().BoolVar(&tokenStdin, "token-stdin", false, "read the token from the first line of stdin")
	cmd.Flags().BoolVar(&noVerify, "no-verify", false, "save without checking the server")
	return cmd
}

// loginConn is the server, token and CA login saves: from the flags, else
// the environment, else the config file (prev); the token may come from
// tokenFile or stdin instead.
func (a *app) loginConn(prev *fileConfig, tokenFile string, tokenStdin bool) (*conn, error) {
	token := ""
	switch {
	case tokenFile != "":
		b, err := os.ReadFile(tokenFile)
		if err != nil {
			return nil, fmt.Errorf("--token-file: %s", describeFSError(err))
		}
		token = strings.TrimSpace(string(b))
	case tokenStdin:
		line, err := bufio.NewReader(a.env.Stdin).ReadString('\n')
		if err != nil && line == "" {
			return nil, fmt.Errorf("--token-stdin: no token on stdin")
		}
		token = strings.TrimSpace(line)
	case a.token != "":
		token = a.token
	case a.env.Getenv("DROVER_TOKEN") != "":
		token = a.env.Getenv("DROVER_TOKEN")
	default:
		token = prev.Token
	}
	if token == "" {
		return nil, command.Usagef("no token: use --token-file, --token-stdin, --token or DROVER_TOKEN")
	}
	server := a.server
	if server == "" {
		server = a.env.Getenv("DROVER_SERVER")
	}
	if server == "" {
		server = prev.Server
	}
	if server == "" {
		return nil, command.Usagef("--server is required")
	}
	server, err := normalizeServer(server)
	if err != nil {
		return nil, err
	}
	ca := a.ca
	if ca == "" {
		ca = a.env.Getenv("DROVER_CA")
	}
	if ca == "" {
		ca = prev.CA
	}
	if ca != "" {
		if ca, err = filepath.Abs(ca); err != nil {
			return nil, err
		}
	}
	return &conn{server: server, token: token, ca: ca}, nil
}

// verifyLogin checks that the server answers the token: whoami, or on an
// older server a list of runs.
func (a *app) verifyLogin(ctx context.Context, cn *conn) error {
	c, err := newClient(cn)
	if err != nil {
		return err
	}
	defer c.close()
	var who api.WhoAmI
	_, err = c.get(ctx, "/api/v1/whoami", &who)
	if missingEndpoint(err) {
		_, err = c.get(ctx, "/api/v1/runs?limit=1", nil)
	}
	if err != nil {
		return fmt.Errorf("login to %s failed: %w", cn.server, err)
	}
	if who.Role != "" {
		fmt.Fprintf(a.stderr(), "token %s (%s), role %s\n", sanitizeLine(who.ID), sanitizeLine(who.Name), sanitizeLine(who.Role))
	}
	return nil
}
