package cli

import (
	"encoding/json"
	"fmt"
	"net/http"
	"path"
	"regexp"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/drover/drover/api"
	"github.com/drover/drover/internal/command"
)

// tokenShapeRE is the pinned shape of an enrollment token; only tokens of
// this shape are ever put into a shell line.
var tokenShapeRE = regexp.MustCompile(`^drv1\.[a-z2-7]{1,64}\.[A-Za-z0-9_-]{1,128}\.[0-9a-f]{64}$`)

// safePathRE limits the drop-in path to characters that need no quoting.
var safePathRE = regexp.MustCompile(`^/[A-Za-z0-9._/-]+$`)

const defaultDropinPath = "/etc/drover/enroll.token"

func (a *app) newTokensCmd() *cobra.Command {
	var ttl, name, dropinPath string
	var tagArgs []string
	var dropin bool
	create := &cobra.Command{
		Use:   "create [--ttl D] [--tag k=v ...] [--name N] [--print-dropin]",
		Short: "Create a one-time enrollment token and print it (it is shown only once)",
		Long: `Create an enrollment token. The token is printed on stdout, alone, so it can be
captured; its id and expiry go to stderr. With -o json the API's answer is
printed: {"id", "token", "expires_at"}.

--print-dropin prints instead one shell line that writes the token to
/etc/drover/enroll.token (mode 0600, atomically, creating /etc/drover) on the
host to enroll: paste it there or hand it to config management.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if ttl != "" {
				if _, err := time.ParseDuration(ttl); err != nil {
					return command.Usagef("--ttl %q is not a duration (e.g. 30m, 24h)", ttl)
				}
			}
			tags, err := parseTags(tagArgs)
			if err != nil {
				return err
			}
			if dropinPath != defaultDropinPath && !dropin {
				return command.Usagef("--dropin-path is used only with --print-dropin")
			}
			if !safePathRE.MatchString(dropinPath) || path.Clean(dropinPath) != dropinPath || path.Dir(dropinPath) == "/" {
				return command.Usagef("--dropin-path %q: use a clean absolute path of letters, digits, '.', '_', '-' and '/' below a directory", dropinPath)
			}
			c, err := a.apiClient()
			if err != nil {
				return err
			}
			var resp api.EnrollmentTokenCreated
			raw, err := c.call(cmd.Context(), http.MethodPost, "/api/v1/enrollment-tokens", api.EnrollmentTokenRequest{TTL: ttl, Name: name, Tags: tags}, &resp)
			if err != nil {
				return fmt.Errorf("create token: %w", err)
			}
			line := ""
			if dropin {
				if line, err = dropinLine(resp.Token, dropinPath); err != nil {
					return err
				}
			}
			if a.format() != "table" {
				if dropin {
					var m map[string]json.RawMessage
					if err := json.Unmarshal(raw, &m); err != nil {
						return err
					}
					m["dropin"], _ = json.Marshal(line)
					ordered, _ := json.Marshal(m)
					raw = ordered
				}
				return a.printData(raw)
			}
			if dropin {
				fmt.Fprintln(a.stdout(), line)
			} else {
				fmt.Fprintln(a.stdout(), resp.Token)
			}
			fmt.Fprintf(a.stderr(), "token %s expires %s; it is shown only once and works for one enrollment\n",
				sanitizeLine(resp.ID), fmtTimeV(resp.ExpiresAt))
			return nil
		},
	}
	f := create.Flags()
	f.StringVar(&ttl, "ttl", "", "how long the token stays valid, e.g. 30m or 24h (server default when unset)")
	f.StringArrayVar(&tagArgs, "tag", nil, "k=v tag the enrolled agent gets (repeatable)")
	f.StringVar(&name, "name", "", "name the enrolled agent gets")
	f.BoolVar(&dropin, "print-dropin", false, "print a shell line that writes the token to "+defaultDropinPath+" with mode 0600")
	f.StringVar(&dropinPath, "dropin-path", defaultDropinPath, "where the --print-dropin line writes the token")

	list := a.listCmd("List enrollment tokens (never their secrets)", "tokens")
	rm := a.deleteCmd("rm ID", []string{"delete", "revoke"}, "Delete an enrollment token so it can no longer enroll", "a token id",
		"/api/v1/enrollment-tokens/", "token", "deleted")
	return groupCmd("tokens", "Create, list and delete enrollment tokens", create, list, rm)
}

// dropinLine is a POSIX shell line that writes token to p with mode 0600,
// atomically (a temporary file in the same directory, then rename).
func dropinLine(token, p string) (string, error) {
	if !tokenShapeRE.MatchString(token) {
		return "", fmt.Errorf("the server returned a token of an unexpected shape; refusing to put it in a shell line")
	}
	dir := path.Dir(p)
	return fmt.Sprintf(`install -d -m 0755 %s && (umask 077 && t=$(mktemp %s/.enroll.token.XXXXXX) && printf '%%s\n' '%s' > "$t" && mv -f "$t" %s)`,
		dir, dir, token, p), nil
}

// deleteObj sends DELETE base+id and reports it.
func (a *app) deleteObj(cmd *cobra.Command, base, what, id, verb string) error {
	c, err := a.apiClient()
	if err != nil {
		return err
	}
	raw, err := c.call(cmd.Context(), http.MethodDelete, base+pathEscape(id), nil, nil)
	if missingEndpoint(err) {
		return fmt.Errorf("%s %s: this server cannot do that (it lacks DELETE %s{id})", what, id, base)
	}
	if err != nil {
		return fmt.Errorf("%s %s: %w", what, id, err)
	}
	if a.format() != "table" {
		if raw == nil {
			key := "id"
			if what == "secret" || what == "pipe" {
				key = "name"
			}
			raw, _ = json.Marshal(map[string]any{key: id, verb: true})
		}
		return a.printData(raw)
	}
	fmt.Fprintf(a.stdout(), "%s %s %s\n", what, sanitizeLine(id), verb)
	return nil
}

// ---- operator API tokens

var roles = []string{"viewer", "operator", "admin"}

func (a *app) newAPITokensCmd() *cobra.Command {
	var name, role, ttl string
	create := &cobra.Command{
		Use:   "create --name N --role viewer|operator|admin",
		Short: "Create an API token for an operator or a CI job (shown only once)",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if name == "" {
				return command.Usagef("--name is required")
			}
			ok := false
			for _, r := range roles {
				ok = ok || r == role
			}
			if !ok {
				return command.Usagef("--role %q: use %s", role, strings.Join(roles, ", "))
			}
			if ttl != "" {
				if _, err := time.ParseDuration(ttl); err != nil {
					return command.Usagef("--ttl %q is not a duration (e.g. 720h)", ttl)
				}
			}
			c, err := a.apiClient()
			if err != nil {
				return err
			}
			var resp api.APITokenCreated
			raw, err := c.call(cmd.Context(), http.MethodPost, "/api/v1/api-tokens", api.APITokenRequest{Name: name, Role: role, TTL: ttl}, &resp)
			if missingEndpoint(err) {
				return fmt.Errorf("create API token: this server has no API tokens yet (it lacks POST /api/v1/api-tokens)")
			}
			if err != nil {
				return fmt.Errorf("create API token: %w", err)
			}
			if a.format() != "table" {
				return a.printData(raw)
			}
			fmt.Fprintln(a.stdout(), resp.Token)
			fmt.Fprintf(a.stderr(), "API token %s (%s, role %s); it is shown only once\n", sanitizeLine(resp.ID), sanitizeLine(name), role)
			return nil
		},
	}
	create.Flags().StringVar(&name, "name", "", "who or what uses the token")
	create.Flags().StringVar(&role, "role", "viewer", "viewer (reads), operator (also runs, applies, sets secrets) or admin")
	create.Flags().StringVar(&ttl, "ttl", "", "how long the token works, e.g. 720h (default: until revoked)")
	list := a.listCmd("List API tokens (never their secrets)", "api-tokens")
	revoke := a.deleteCmd("revoke ID", []string{"rm", "delete"}, "Revoke an API token", "a token id",
		"/api/v1/api-tokens/", "API token", "revoked")
	return groupCmd("api-tokens", "Create, list and revoke operator API tokens (roles viewer, operator, admin)", create, list, revoke)
}
