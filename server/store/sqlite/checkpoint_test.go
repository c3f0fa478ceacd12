package sqlite

import (
	"context"
	"crypto/rand"
	"database/sql"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// writeMiB commits n MiB of random blobs in one transaction of the writer.
func writeMiB(t *testing.T, db *DB, n int) {
	t.Helper()
	err := db.InTx(context.Background(), func(tx *sql.Tx) error {
		if _, err := tx.Exec(`CREATE TABLE IF NOT EXISTS bulk(b BLOB)`); err != nil {
			return err
		}
		for range n * 256 {
			if _, err := tx.Exec(`INSERT INTO bulk(b) VALUES(?)`, rand.Text()+string(make([]byte, 4000))); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func fileSize(t *testing.T, path string) int64 {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Size()
}

// A commit that grows the WAL past SQLite's default 1,000 pages does not
// checkpoint on the writer: the pages reach the database file only when a
// checkpoint of the checkpointer's own runs (with SQLite's default, the
// commit itself would have copied them and the file would have grown at
// once).
func TestCommitsDoNotCheckpointOnTheWriter(t *testing.T) {
	path := filepath.Join(t.TempDir(), "server.db")
	db, err := open(context.Background(), path, "full", 0)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.Checkpoint(context.Background()); err != nil { // the migrations' pages
		t.Fatal(err)
	}
	before := fileSize(t, path)
	writeMiB(t, db, 8)
	writeMiB(t, db, 1) // a second commit: the default would checkpoint here at the latest
	if grown := fileSize(t, path) - before; grown > 1<<20 {
		t.Fatalf("the database file grew by %d bytes at commit: the writer checkpointed", grown)
	}
	st, err := db.Checkpoint(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if st.Busy || st.WALFrames < 9*256 || st.Checkpointed != st.WALFrames {
		t.Fatalf("checkpoint: %+v, want every one of the >= %d frames copied", st, 9*256)
	}
	if grown := fileSize(t, path) - before; grown < 9<<20 {
		t.Fatalf("after the checkpoint the database file grew by %d bytes, want >= 9 MiB", grown)
	}
	var n int
	if err := db.Reader().QueryRow(`SELECT COUNT(*) FROM bulk`).Scan(&n); err != nil || n != 9*256 {
		t.Fatalf("rows: %d, %v", n, err)
	}
}

// The background checkpointer copies the WAL without being asked, and the
// next transaction after a complete checkpoint starts the WAL over instead
// of growing it.
func TestCheckpointerRunsInTheBackground(t *testing.T) {
	path := filepath.Join(t.TempDir(), "server.db")
	db, err := open(context.Background(), path, "full", 20*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	before := fileSize(t, path)
	writeMiB(t, db, 6)
	deadline := time.Now().Add(10 * time.Second)
	for fileSize(t, path)-before < 6<<20 {
		if time.Now().After(deadline) {
			t.Fatalf("the database file grew by %d bytes in 10 s: no background checkpoint (last error %v)", fileSize(t, path)-before, db.CheckpointErr())
		}
		time.Sleep(10 * time.Millisecond)
	}
	// caughtUp waits for a background checkpoint that began after the
	// last commit.
	caughtUp := func() {
		t.Helper()
		for r := db.ckptRuns.Load(); db.ckptRuns.Load() < r+2; {
			if time.Now().After(deadline) {
				t.Fatal("no background checkpoint in 10 s")
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	caughtUp()
	wal := fileSize(t, path+"-wal")
	for range 4 {
		writeMiB(t, db, 4)
		caughtUp()
	}
	// Not started over, the WAL would have grown by the 16 MiB written.
	if got := fileSize(t, path+"-wal"); got > wal+1<<20 {
		t.Fatalf("the WAL grew from %d to %d bytes over four checkpointed commits of 4 MiB: it was not started over", wal, got)
	}
	if err := db.CheckpointErr(); err != nil {
		t.Fatal(err)
	}
}

// Closing twice is harmless, as closing the pools is.
func TestCloseTwice(t *testing.T) {
	db, err := Open(context.Background(), filepath.Join(t.TempDir(), "server.db"), "normal")
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
}
