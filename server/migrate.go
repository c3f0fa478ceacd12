package server

import (
	"context"
	"errors"
	"fmt"
	"github.com/drover/drover/internal/command"
	"io"
	"os"
	"path/filepath"

	"github.com/drover/drover/server/store/postgres"
	"github.com/drover/drover/server/store/sqlite"
	"github.com/spf13/cobra"
)

// newMigrateCmd is `drover-server migrate --to DSN`: copy the data dir's
// SQLite database into an empty PostgreSQL database (docs/postgres.md).
func newMigrateCmd(cf *cliFlags, env []string) *cobra.Command {
	var to string
	c := &cobra.Command{Use: "migrate --to postgres://USER:PASSWORD@HOST/DB",
		Short: "Copy the data dir's SQLite database into an empty PostgreSQL database", Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if to == "" {
				return command.Usage(errors.New("migrate: --to is required (the PostgreSQL connection string)"))
			}
			return cf.run(cmd, env, func(ctx context.Context, cfg Config, stdout, _ io.Writer) error {
				return migrateToPostgres(ctx, cfg, to, stdout)
			})
		}}
	c.Flags().StringVar(&to, "to", "", "PostgreSQL connection string of an empty database")
	return c
}

// migrateToPostgres copies cfg.DataDir's server.db into the database at
// dsn while holding the data dir's lock, so that no server writes to it
// meanwhile.
func migrateToPostgres(ctx context.Context, cfg Config, dsn string, out io.Writer) error {
	path := filepath.Join(cfg.DataDir, "server.db")
	if _, err := os.Stat(path); err != nil {
		return fmt.Errorf("migrate: no SQLite database to copy: %w", err)
	}
	lock, err := lockDataDir(cfg.DataDir)
	if err != nil {
		return fmt.Errorf("migrate: %w (stop drover-server first)", err)
	}
	defer lock.release()
	src, err := sqlite.Open(ctx, path, cfg.Store.Synchronous)
	if err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	defer src.Close()
	dst, err := postgres.Open(ctx, dsn, postgres.Pool{MaxConns: 2})
	if err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	defer dst.Close()
	if err := dst.ImportSQLite(ctx, src.Reader(), func(table string, rows int64) {
		fmt.Fprintf(out, "%-20s %d rows\n", table, rows)
	}); err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	fmt.Fprintf(out, "copied %s into PostgreSQL; now set store.driver: postgres and store.dsn in the configuration\n", path)
	return nil
}
