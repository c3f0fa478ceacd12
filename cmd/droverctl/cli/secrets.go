package cli

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"regexp"
	"strings"
	"unicode/utf8"

	"github.com/spf13/cobra"

	"github.com/drover/drover/api"
	"github.com/drover/drover/internal/command"
)

// maxSecretBytes is the server's cap on one value.
const maxSecretBytes = 64 << 10

var secretNameRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,127}$`)

func (a *app) newSecretsCmd() *cobra.Command {
	var fromFile, value string
	var fromStdin bool
	set := &cobra.Command{
		Use:   "set NAME (--from-file F | --from-stdin | --value V)",
		Short: "Set a secret's value (write-only: it can never be read back)",
		Long: `Set a secret. The value is read from a file (exact bytes), from stdin (one
trailing newline removed), or, discouraged, from --value, which leaves it in
the shell history and the process list. It is never taken as an argument.`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) != 1 {
				return command.Usagef("%s wants exactly one NAME; the value comes from --from-file, --from-stdin or --value, never from an argument", cmd.CommandPath())
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			name := args[0]
			if !secretNameRE.MatchString(name) || strings.HasPrefix(name, "DROVER_") {
				return command.Usagef("secret name %q: use letters, digits and '_', not starting with a digit or DROVER_", name)
			}
			n := 0
			for _, given := range []bool{fromFile != "", fromStdin, cmd.Flags().Changed("value")} {
				if given {
					n++
				}
			}
			if n != 1 {
				return command.Usagef("give the value with exactly one of --from-file, --from-stdin or --value")
			}
			var v []byte
			var err error
			switch {
			case fromFile != "":
				v, err = readCapped(fromFile, nil)
			case fromStdin:
				v, err = readCapped("", a.env.Stdin)
				if err == nil {
					s := strings.TrimSuffix(string(v), "\n")
					v = []byte(strings.TrimSuffix(s, "\r"))
				}
			default:
				a.warnf("--value leaves the secret in your shell history and the process list; prefer --from-stdin or --from-file")
				v = []byte(value)
			}
			if err != nil {
				return err
			}
			if len(v) > maxSecretBytes {
				return fmt.Errorf("secret %s: the value is %d bytes, at most %d", name, len(v), maxSecretBytes)
			}
			if !utf8.Valid(v) {
				return fmt.Errorf("secret %s: the value is not valid UTF-8 (encode binary values, e.g. base64)", name)
			}
			c, err := a.apiClient()
			if err != nil {
				return err
			}
			val := string(v)
			if _, err := c.call(cmd.Context(), http.MethodPut, "/api/v1/secrets/"+pathEscape(name), api.SecretRequest{Value: &val}, nil); err != nil {
				return fmt.Errorf("secret %s: %w", name, err)
			}
			if a.format() != "table" {
				b, _ := json.Marshal(map[string]any{"name": name, "set": true})
				return a.printData(b)
			}
			fmt.Fprintf(a.stdout(), "secret %s set\n", name)
			return nil
		},
	}
	set.Flags().StringVar(&fromFile, "from-file", "", "read the value from this file (exact bytes)")
	set.Flags().BoolVar(&fromStdin, "from-stdin", false, "read the value from stdin (one trailing newline removed)")
	set.Flags().StringVar(&value, "value", "", "the value itself (lands in shell history: avoid)")

	rm := a.deleteCmd("rm NAME", []string{"delete"}, "Delete a secret", "a secret name", "/api/v1/secrets/", "secret", "deleted")
	list := a.listCmd("List secret names", "secrets")
	return groupCmd("secrets", "Set, list and delete secrets (values are write-only)", set, list, rm)
}

// readCapped reads a file (or r) up to one byte over the secret cap.
func readCapped(file string, r io.Reader) ([]byte, error) {
	if file != "" {
		f, err := os.Open(file)
		if err != nil {
			return nil, fmt.Errorf("--from-file: %s", describeFSError(err))
		}
		defer f.Close()
		r = f
	}
	b, err := io.ReadAll(io.LimitReader(r, maxSecretBytes+1))
	if err != nil {
		return nil, fmt.Errorf("read the value: %w", err)
	}
	return b, nil
}
