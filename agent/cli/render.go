package cli

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"

	"github.com/drover/drover/internal/atomicfile"
	"github.com/drover/drover/internal/command"
	"github.com/drover/drover/internal/paths"
	"github.com/drover/drover/manifest"
	"github.com/drover/drover/units"
)

func newRenderCmd(env *Env) *cobra.Command {
	var (
		pipeFile, outDir, scope, agentPath, dataDir, now string
	)
	cmd := &cobra.Command{
		Use:   "render --pipe FILE [--out DIR]",
		Short: "Validate one pipe spec and write its systemd units, without touching systemd",
		Long: `Render validates the pipe spec in FILE (one YAML document) and produces the
drover-pipe-<name>.service and .timer units exactly as the agent would install
them. With --out the files are written into DIR; otherwise they are printed.
Nothing is loaded into systemd. The timer's DST correction lines are those of
a render at --now (RFC 3339, default the current time): the DST changes of
the pipe's zone within 400 days of that day.`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) > 0 {
				return command.Usagef("unexpected argument %q", args[0])
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, _ []string) error {
			if pipeFile == "" {
				return command.Usagef("--pipe is required")
			}
			opts := units.Options{AgentPath: agentPath, Scope: units.Scope(scope), DataDir: dataDir}
			if now != "" {
				t, err := time.Parse(time.RFC3339, now)
				if err != nil {
					return command.Usagef("--now %q is not an RFC 3339 time (e.g. 2027-03-01T00:00:00Z)", now)
				}
				opts.Now = t
			}
			if opts.Scope != units.ScopeSystem && opts.Scope != units.ScopeUser {
				return command.Usagef("--scope %q: use system or user", scope)
			}
			data, err := os.ReadFile(pipeFile)
			if err != nil {
				return fmt.Errorf("read pipe: %w", err)
			}
			specs, err := manifest.DecodeSpecs(data)
			if err != nil {
				var ve *manifest.ValidationError
				if errors.As(err, &ve) {
					for _, p := range ve.Problems {
						fmt.Fprintf(env.Stderr, "%s:%s\n", pipeFile, lineOrField(p))
					}
					return fmt.Errorf("%s: %d problem(s); nothing rendered", pipeFile, len(ve.Problems))
				}
				return err
			}
			if len(specs) != 1 {
				return fmt.Errorf("%s holds %d pipes; render takes exactly one", pipeFile, len(specs))
			}
			spec := specs[0]
			spec.Normalize()
			files, err := units.Render(&spec, opts)
			if err != nil {
				return fmt.Errorf("render %s: %w", spec.Name, err)
			}
			if outDir == "" {
				for i, f := range files {
					if i > 0 {
						fmt.Fprintln(env.Stdout)
					}
					fmt.Fprintf(env.Stdout, "# --- %s ---\n", f.Name)
					env.Stdout.Write(f.Content)
				}
				return nil
			}
			if err := os.MkdirAll(outDir, 0o755); err != nil {
				return err
			}
			for _, f := range files {
				if err := atomicfile.Write(filepath.Join(outDir, f.Name), f.Content, 0o644); err != nil {
					return err
				}
				fmt.Fprintln(env.Stdout, filepath.Join(outDir, f.Name))
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&pipeFile, "pipe", "", "pipe spec YAML file (one document)")
	cmd.Flags().StringVar(&outDir, "out", "", "write the unit files into this directory instead of printing them")
	cmd.Flags().StringVar(&scope, "scope", string(units.ScopeSystem), "systemd scope the units are for: system or user")
	cmd.Flags().StringVar(&agentPath, "agent-path", paths.AgentBinary, "agent binary the service runs")
	cmd.Flags().StringVar(&dataDir, "data-dir", paths.AgentDataDir, "agent data directory")
	cmd.Flags().StringVar(&now, "now", "", "render as the agent would at this RFC 3339 time (DST correction lines; default now)")
	return cmd
}

func lineOrField(p manifest.FieldError) string {
	if p.Line > 0 {
		p2 := p
		p2.Line = 0
		return fmt.Sprintf("%d: %s", p.Line, p2.Error())
	}
	return " " + p.Error()
}
