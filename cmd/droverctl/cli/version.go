package cli

import (
	"fmt"

	"github.com/drover/drover/internal/command"
	"github.com/spf13/cobra"

	"github.com/drover/drover/api"
)

// versionInfo is the JSON of droverctl version.
type versionInfo struct {
	Client string `json:"client"`
	Server string `json:"server,omitempty"`
}

func (a *app) newVersionCmd() *cobra.Command {
	var clientOnly bool
	cmd := &cobra.Command{
		Use:   "version [--client]",
		Short: "Print droverctl's version and the server's",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			v := versionInfo{Client: Version}
			var serverErr error
			if !clientOnly {
				serverErr = a.serverVersion(cmd, &v)
			}
			if a.output == "name" {
				return command.Usagef("-o name: version prints no objects; use -o json")
			}
			if a.format() != "table" {
				if err := a.printData(v); err != nil {
					return err
				}
				return serverErr
			}
			fmt.Fprintf(a.stdout(), "Client Version: %s\n", sanitizeLine(v.Client))
			if v.Server != "" {
				fmt.Fprintf(a.stdout(), "Server Version: %s\n", sanitizeLine(v.Server))
			}
			return serverErr
		},
	}
	cmd.Flags().BoolVar(&clientOnly, "client", false, "print only droverctl's version; do not ask the server")
	return cmd
}

// serverVersion asks the server its version; an older server without
// GET /api/v1/version is "unknown".
func (a *app) serverVersion(cmd *cobra.Command, v *versionInfo) error {
	c, err := a.apiClient()
	if err != nil {
		return err
	}
	var sv api.Version
	_, err = c.get(cmd.Context(), "/api/v1/version", &sv)
	switch {
	case missingEndpoint(err):
		v.Server = "unknown (the server has no /api/v1/version)"
	case err != nil:
		return fmt.Errorf("server version: %w", err)
	default:
		v.Server = sv.Server
	}
	return nil
}
