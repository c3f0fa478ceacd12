package server

import (
	"context"
	"errors"
	"fmt"
	"github.com/drover/drover/internal/command"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/drover/drover/server/pki"
	"github.com/drover/drover/server/store/postgres"
	"github.com/drover/drover/server/store/sqlite"
	"github.com/spf13/cobra"
)

// newMigrateCmd is `drover-server migrate --to DSN`: copy the data dir's
// SQLite database and its keys (sealed with the KEK) into an empty
// PostgreSQL database (docs/postgres.md).
func newMigrateCmd(cf *cliFlags, env []string) *cobra.Command {
	var to string
	c := &cobra.Command{Use: "migrate --to postgres://USER:PASSWORD@HOST/DB",
		Short: "Copy the data dir's SQLite database and keys (sealed with kek_file) into an empty PostgreSQL database", Args: noArgs,
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
// dsn, and the data dir's keys sealed with the KEK of cfg.KEKFile, while
// holding the data dir's lock, so that no server writes to either
// meanwhile. The agents keep their certificates (same CA) and their
// manifests verify (same keyring).
func migrateToPostgres(ctx context.Context, cfg Config, dsn string, out io.Writer) error {
	path := filepath.Join(cfg.DataDir, "server.db")
	if _, err := os.Stat(path); err != nil {
		return fmt.Errorf("migrate: no SQLite database to copy: %w", err)
	}
	kek, err := pki.LoadKEK(cfg.KEKFile)
	if err != nil {
		return fmt.Errorf("migrate: the keys are sealed with the KEK the PostgreSQL servers will read: %w", err)
	}
	lock, err := lockDataDir(cfg.DataDir)
	if err != nil {
		return fmt.Errorf("migrate: %w (stop drover-server first)", err)
	}
	defer lock.release()
	plain, err := pki.FileKeys(cfg.DataDir)
	if err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	keys, err := pki.SealKeys(kek, plain, time.Now())
	if err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
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
	if err := dst.ImportSQLite(ctx, src.Reader(), keys, func(table string, rows int64) {
		fmt.Fprintf(out, "%-20s %d rows\n", table, rows)
	}); err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	fmt.Fprintf(out, "%-20s %d keys sealed with the KEK %s (%s)\n", "server_keys", len(keys), kek.ID(), cfg.KEKFile)
	fmt.Fprintf(out, "copied %s into PostgreSQL; now set store.driver: postgres and store.dsn in the configuration\n", path)
	return nil
}

// newKEKCmd is `drover-server kek generate`: write a new key-encryption
// key (docs/postgres.md, "Keys and the KEK").
func newKEKCmd(cf *cliFlags, env []string) *cobra.Command {
	var out string
	gen := &cobra.Command{Use: "generate [--out PATH]", Short: "Write a new key-encryption key (mode 0600; default: kek_file)", Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return cf.run(cmd, env, func(_ context.Context, cfg Config, stdout, _ io.Writer) error {
				path := cfg.KEKFile
				if out != "" {
					path = out
				}
				kek, err := pki.GenerateKEK(path)
				if err != nil {
					return err
				}
				fmt.Fprintf(stdout, "wrote a new key-encryption key to %s (id %s)\ncopy it to every replica's kek_file (mode 0600, owned by the server's user) and keep a backup apart from the database's\n", path, kek.ID())
				return nil
			})
		}}
	gen.Flags().StringVar(&out, "out", "", "file to write (default: kek_file, "+DefaultKEKFile+")")
	var newFile string
	rewrap := &cobra.Command{Use: "rewrap --new PATH", Short: "Seal the keys in PostgreSQL with another KEK (every replica stopped)", Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if newFile == "" {
				return command.Usage(errors.New("kek rewrap: --new is required (the new KEK file, from drover-server kek generate --out)"))
			}
			return cf.run(cmd, env, func(ctx context.Context, cfg Config, stdout, _ io.Writer) error {
				return rewrapKEK(ctx, cfg, newFile, stdout)
			})
		}}
	rewrap.Flags().StringVar(&newFile, "new", "", "the new KEK file")
	return group("kek", "Manage the key-encryption key that seals the keys in PostgreSQL", gen, rewrap)
}

// rewrapKEK seals every server key in the database with the KEK in
// newFile instead of kek_file's, in one transaction, while no replica
// runs (a running one would go on sealing with the old KEK).
func rewrapKEK(ctx context.Context, cfg Config, newFile string, out io.Writer) error {
	if !keysInStore(&cfg) {
		return errors.New("kek rewrap: the keys are sealed with a KEK only with store.driver postgres")
	}
	old, err := pki.LoadKEK(cfg.KEKFile)
	if err != nil {
		return fmt.Errorf("kek rewrap: the current KEK: %w", err)
	}
	next, err := pki.LoadKEK(newFile)
	if err != nil {
		return fmt.Errorf("kek rewrap: the new KEK: %w", err)
	}
	st, err := postgres.Open(ctx, cfg.Store.DSN, postgres.Pool{MaxConns: 2})
	if err != nil {
		return fmt.Errorf("kek rewrap: %w", err)
	}
	defer st.Close()
	if n, err := st.LockSessions(ctx); err != nil {
		return fmt.Errorf("kek rewrap: %w", err)
	} else if n > 0 {
		return fmt.Errorf("kek rewrap: %d drover-server replicas are running on this database; stop every one first", n)
	}
	rows, err := st.ServerKeys(ctx)
	if err != nil {
		return fmt.Errorf("kek rewrap: %w", err)
	}
	kl := rows["keylist.dsse"]
	if kl == nil {
		return errors.New("kek rewrap: the database holds no server keys")
	}
	keys, err := pki.RewrapKeys(rows, old, next, time.Now())
	if errors.Is(err, pki.ErrWrongKEK) {
		return fmt.Errorf("kek rewrap: kek_file %s does not open the stored keys: %w", cfg.KEKFile, err)
	}
	if err != nil {
		return fmt.Errorf("kek rewrap: %w", err)
	}
	if err := st.UpdateServerKeys(ctx, "keylist.dsse", kl.Version, keys, nil); err != nil {
		return fmt.Errorf("kek rewrap: %w", err)
	}
	fmt.Fprintf(out, "%d server keys sealed with KEK %s (was %s); install %s as kek_file on every replica, then start them\n", len(keys), next.ID(), old.ID(), newFile)
	return nil
}
