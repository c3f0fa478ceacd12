package console

import (
	"crypto/sha256"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/drover/drover/server/store/sqlite"
)

// Sessions in a real SQLite store: the cookie value is not stored, the
// CSRF token is the same on every lookup, idle and absolute expiry hold,
// a use is recorded at most once a minute, and Delete ends a session.
func TestStoredSessions(t *testing.T) {
	ctx := t.Context()
	st, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "server.db"), "normal")
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	clk := &fakeClock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	ss := NewStored(st, Expiry{Idle: 10 * time.Minute, Absolute: time.Hour}, clk.now)
	s, err := ss.Create(ctx, "tok")
	if err != nil {
		t.Fatal(err)
	}
	if s.ID == s.CSRF || len(s.ID) < 40 || len(s.CSRF) < 40 || strings.Contains(s.CSRF, s.ID) {
		t.Fatalf("weak session %+v", s)
	}
	var n int
	raw := sha256.Sum256([]byte(s.ID))
	if err := st.Reader().QueryRow(`SELECT COUNT(*) FROM console_sessions WHERE id_hash=? OR id_hash=? OR token_id=?`, []byte(s.ID), raw[:], s.ID).Scan(&n); err != nil || n != 0 {
		t.Fatalf("the cookie value (or its plain hash) is stored: %d rows, %v", n, err)
	}
	clk.t = clk.t.Add(9 * time.Minute)
	g, err := ss.Get(ctx, s.ID)
	if err != nil || g.CSRF != s.CSRF || g.TokenID != "tok" {
		t.Fatalf("get: %+v, %v", g, err)
	}
	clk.t = clk.t.Add(9 * time.Minute) // 9 min after the last use
	if _, err := ss.Get(ctx, s.ID); err != nil {
		t.Fatalf("a session used 9 minutes ago: %v", err)
	}
	// Used at +18m, +18m30s: the second use is not written (under a
	// minute), so the session idles out 10 min after +18m.
	clk.t = clk.t.Add(30 * time.Second)
	if _, err := ss.Get(ctx, s.ID); err != nil {
		t.Fatal(err)
	}
	clk.t = clk.t.Add(9*time.Minute + 40*time.Second)
	if _, err := ss.Get(ctx, s.ID); !errors.Is(err, ErrNoSession) {
		t.Fatalf("idle session: %v", err)
	}

	// Absolute expiry, and Delete.
	s2, _ := ss.Create(ctx, "tok")
	for range 6 { // used every 9 minutes, 54 minutes in all
		clk.t = clk.t.Add(9 * time.Minute)
		if _, err := ss.Get(ctx, s2.ID); err != nil {
			t.Fatal(err)
		}
	}
	clk.t = clk.t.Add(7 * time.Minute)
	if _, err := ss.Get(ctx, s2.ID); !errors.Is(err, ErrNoSession) {
		t.Fatalf("a session past its absolute expiry: %v", err)
	}
	s3, _ := ss.Create(ctx, "tok")
	if err := ss.Delete(ctx, s3.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := ss.Get(ctx, s3.ID); !errors.Is(err, ErrNoSession) {
		t.Fatalf("deleted: %v", err)
	}
	for _, bad := range []string{"", strings.Repeat("a", 200), "nope"} {
		if _, err := ss.Get(ctx, bad); !errors.Is(err, ErrNoSession) {
			t.Fatalf("id %.10q: %v", bad, err)
		}
	}
}
