package storetest

import (
	"bytes"
	"crypto/sha256"
	"fmt"
	"maps"
	"testing"
	"time"

	"github.com/drover/drover/server/errs"
	"github.com/drover/drover/server/store"
)

// Stream presence: a claim is taken over by the replica that puts it last,
// dropped only by its holder, refreshed by touching and expired by age.
func testStreamPresence(t *testing.T, st store.Store) {
	ctx := t.Context()
	got := func(ids []string, since time.Time) map[string]string {
		t.Helper()
		m, err := st.StreamReplicas(ctx, ids, since)
		must(t, err)
		return m
	}
	if m := got(nil, time.Time{}); len(m) != 0 {
		t.Fatalf("empty store: %v", m)
	}
	must(t, st.PutStreams(ctx, "r-a", []string{"agt-1", "agt-2"}, t0))
	must(t, st.PutStreams(ctx, "r-b", []string{"agt-3"}, t0))
	must(t, st.PutStreams(ctx, "r-a", nil, t0))
	if m := got(nil, t0); !maps.Equal(m, map[string]string{"agt-1": "r-a", "agt-2": "r-a", "agt-3": "r-b"}) {
		t.Fatalf("claims: %v", m)
	}
	// The agent moved to r-b; r-a's late drop of its old stream does not
	// remove r-b's claim.
	must(t, st.PutStreams(ctx, "r-b", []string{"agt-2"}, t0.Add(time.Second)))
	must(t, st.DropStream(ctx, "agt-2", "r-a"))
	if m := got([]string{"agt-2", "agt-9"}, t0); !maps.Equal(m, map[string]string{"agt-2": "r-b"}) {
		t.Fatalf("after the move: %v", m)
	}
	must(t, st.DropStream(ctx, "agt-3", "r-b"))
	if m := got([]string{"agt-3"}, time.Time{}); len(m) != 0 {
		t.Fatalf("dropped claim still there: %v", m)
	}
	// r-a refreshes its claims; r-b's unrefreshed one goes stale, then is
	// deleted once older than the expiry.
	n, err := st.TouchStreams(ctx, "r-a", t0.Add(time.Minute), t0.Add(-time.Hour))
	must(t, err)
	if n != 1 {
		t.Fatalf("r-a touched %d claims, want 1", n)
	}
	if m := got(nil, t0.Add(30*time.Second)); !maps.Equal(m, map[string]string{"agt-1": "r-a"}) {
		t.Fatalf("fresh claims: %v", m)
	}
	if _, err := st.TouchStreams(ctx, "r-a", t0.Add(time.Minute), t0.Add(30*time.Second)); err != nil {
		t.Fatal(err)
	}
	if m := got(nil, time.Time{}); !maps.Equal(m, map[string]string{"agt-1": "r-a"}) {
		t.Fatalf("after expiry: %v", m)
	}
	// Many ids in one call.
	var ids []string
	for i := range 1200 {
		ids = append(ids, fmt.Sprintf("agt-m%04d", i))
	}
	must(t, st.PutStreams(ctx, "r-c", ids, t0.Add(time.Minute)))
	if m := got(ids, t0); len(m) != len(ids) || m["agt-m1199"] != "r-c" {
		t.Fatalf("%d of %d claims", len(m), len(ids))
	}
}

// Console sessions: stored by hash, expired by idle time and age, bounded
// in number, deleted one by one or per token.
func testConsoleSessions(t *testing.T, st store.Store) {
	ctx := t.Context()
	h := func(s string) []byte { b := sha256.Sum256([]byte(s)); return b[:] }
	lim := func(now time.Time, max int) store.SessionLimits {
		return store.SessionLimits{IdleBefore: now.Add(-30 * time.Minute), CreatedBefore: now.Add(-12 * time.Hour), Max: max}
	}
	_, err := st.GetSession(ctx, h("none"), lim(t0, 0))
	wantKind(t, "unknown session", err, errs.ErrNotFound)
	must(t, st.CreateSession(ctx, &store.ConsoleSession{IDHash: h("a"), TokenID: "tok1", CreatedAt: t0, LastSeenAt: t0}, lim(t0, 0)))
	s, err := st.GetSession(ctx, h("a"), lim(t0.Add(time.Minute), 0))
	must(t, err)
	if !bytes.Equal(s.IDHash, h("a")) || s.TokenID != "tok1" || !s.CreatedAt.Equal(t0) || !s.LastSeenAt.Equal(t0) {
		t.Fatalf("session %+v", s)
	}
	// Used at +20m, it is still live at +45m (idle 25m), not at +51m.
	must(t, st.TouchSession(ctx, h("a"), t0.Add(20*time.Minute)))
	must(t, st.TouchSession(ctx, h("a"), t0.Add(10*time.Minute))) // an older use does not move it back
	s, err = st.GetSession(ctx, h("a"), lim(t0.Add(45*time.Minute), 0))
	must(t, err)
	if !s.LastSeenAt.Equal(t0.Add(20 * time.Minute)) {
		t.Fatalf("last seen %v", s.LastSeenAt)
	}
	_, err = st.GetSession(ctx, h("a"), lim(t0.Add(51*time.Minute), 0))
	wantKind(t, "idle session", err, errs.ErrNotFound)
	_, err = st.GetSession(ctx, h("a"), lim(t0, 0))
	wantKind(t, "an expired session is deleted", err, errs.ErrNotFound)

	// Absolute expiry, whatever the use.
	must(t, st.CreateSession(ctx, &store.ConsoleSession{IDHash: h("b"), TokenID: "tok1", CreatedAt: t0, LastSeenAt: t0}, lim(t0, 0)))
	must(t, st.TouchSession(ctx, h("b"), t0.Add(12*time.Hour)))
	_, err = st.GetSession(ctx, h("b"), lim(t0.Add(12*time.Hour+time.Second), 0))
	wantKind(t, "session past its absolute expiry", err, errs.ErrNotFound)

	// Bounded: the oldest go past Max.
	for i := range 5 {
		at := t0.Add(time.Duration(i) * time.Second)
		must(t, st.CreateSession(ctx, &store.ConsoleSession{IDHash: h(fmt.Sprint("c", i)), TokenID: "tok2", CreatedAt: at, LastSeenAt: at}, lim(at, 3)))
	}
	for i := range 5 {
		_, err := st.GetSession(ctx, h(fmt.Sprint("c", i)), lim(t0.Add(5*time.Second), 0))
		if (i >= 2) != (err == nil) {
			t.Errorf("session c%d after the bound of 3: %v", i, err)
		}
	}
	must(t, st.DeleteSession(ctx, h("c4")))
	must(t, st.DeleteSession(ctx, h("c4")))
	_, err = st.GetSession(ctx, h("c4"), lim(t0, 0))
	wantKind(t, "deleted session", err, errs.ErrNotFound)
	must(t, st.DeleteTokenSessions(ctx, "tok2"))
	_, err = st.GetSession(ctx, h("c3"), lim(t0, 0))
	wantKind(t, "session of a token whose sessions were ended", err, errs.ErrNotFound)
}
