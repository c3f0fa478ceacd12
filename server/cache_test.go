package server

import (
	"context"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/drover/drover/server/store"
	"github.com/drover/drover/server/store/sqlite"
)

// countingStore counts the reads the cache lets through to a real SQLite
// store.
type countingStore struct {
	*sqlite.DB
	certReads, manifestReads atomic.Int64
}

func (c *countingStore) AgentCert(ctx context.Context, id string) (*store.AgentCert, error) {
	c.certReads.Add(1)
	return c.DB.AgentCert(ctx, id)
}

func (c *countingStore) GetManifest(ctx context.Context, id string) (*store.StoredManifest, error) {
	c.manifestReads.Add(1)
	return c.DB.GetManifest(ctx, id)
}

// A manifest save leaves the agents' certificate entries alone and caches
// the saved manifests, so the fetches a change sets off read neither from
// the database; a certificate write evicts only the certificate entry.
func TestCacheKeepsKindsApartAndFillsFromSaves(t *testing.T) {
	ctx := context.Background()
	db, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "server.db"), "normal")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	seedAgents(t, db, 2)
	st := &countingStore{DB: db}
	c := newCachedStore(st)
	const id = "agt-bench-00000"
	now := time.Now().UTC().Truncate(time.Second)
	save := func(serial uint64) {
		t.Helper()
		m := &store.StoredManifest{AgentID: id, Serial: serial, ContentHash: "h", Digest: "sha256:d", Envelope: []byte("env"),
			IssuedAt: now, ExpiresAt: now.Add(time.Hour), KeyListVersion: 1, PrevSerial: serial - 1}
		if stale, err := c.SaveManifests(ctx, []*store.StoredManifest{m}); err != nil || len(stale) != 0 {
			t.Fatal(stale, err)
		}
	}
	save(1)
	if _, err := c.AgentCert(ctx, id); err != nil {
		t.Fatal(err)
	}
	save(2)
	m, err := c.GetManifest(ctx, id)
	if err != nil || m.Serial != 2 {
		t.Fatalf("manifest after the save: %+v %v", m, err)
	}
	if _, err := c.AgentCert(ctx, id); err != nil {
		t.Fatal(err)
	}
	if n, k := st.certReads.Load(), st.manifestReads.Load(); n != 1 || k != 0 {
		t.Fatalf("%d certificate and %d manifest reads from the database, want 1 and 0", n, k)
	}
	// The database holds what the cache returned.
	if dm, err := db.GetManifest(ctx, id); err != nil || dm.Serial != 2 || string(dm.Envelope) != "env" {
		t.Fatalf("stored: %+v %v", dm, err)
	}
	// A certificate write evicts the certificate, not the manifest.
	if err := c.SetNextCert(ctx, id, "next", now.Add(24*time.Hour)); err != nil {
		t.Fatal(err)
	}
	if ac, err := c.AgentCert(ctx, id); err != nil || ac.NextSerial != "next" {
		t.Fatalf("certificate after the renewal: %+v %v", ac, err)
	}
	if _, err := c.GetManifest(ctx, id); err != nil {
		t.Fatal(err)
	}
	if n, k := st.certReads.Load(), st.manifestReads.Load(); n != 2 || k != 0 {
		t.Fatalf("%d certificate and %d manifest reads, want 2 and 0", n, k)
	}
	// A save refused because another replica saved over the serial it was
	// compiled on is not cached: the next read goes to the database.
	lost := &store.StoredManifest{AgentID: id, Serial: 3, ContentHash: "h3", Digest: "sha256:d3", Envelope: []byte("env3"),
		IssuedAt: now, ExpiresAt: now.Add(time.Hour), KeyListVersion: 1, PrevSerial: 1}
	if stale, err := c.SaveManifests(ctx, []*store.StoredManifest{lost}); err != nil || len(stale) != 1 {
		t.Fatalf("a save over a serial no longer stored: stale %v, %v", stale, err)
	}
	if m, err := c.GetManifest(ctx, id); err != nil || m.Serial != 2 || st.manifestReads.Load() != 1 {
		t.Fatalf("after a refused save: %+v %v (%d reads)", m, err, st.manifestReads.Load())
	}
}

// raceStore runs during after each enrollment's commit, before the cache
// sees its result: a write that races with the enrollment.
type raceStore struct {
	*countingStore
	during func()
}

func (r *raceStore) EnrollAgents(ctx context.Context, es []store.Enrollment) ([]error, error) {
	failed, err := r.countingStore.EnrollAgents(ctx, es)
	if r.during != nil {
		r.during()
	}
	return failed, err
}

// An enrollment caches the certificate state of each agent it enrolled,
// so the new agent's first stream and poll read nothing back; a refused
// enrollment caches nothing, and a write that raced with the enrollment
// (here a revocation) is not covered up by the fill.
func TestCacheFillsFromEnrollment(t *testing.T) {
	ctx := context.Background()
	db, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "server.db"), "normal")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	rs := &raceStore{countingStore: &countingStore{DB: db}}
	c := newCachedStore(rs)
	now := time.Now().UTC()
	ok, twice := testEnrollment(t, db, "t1", now), testEnrollment(t, db, "t1", now.Add(time.Second))
	failed, err := c.EnrollAgents(ctx, []store.Enrollment{ok, twice})
	if err != nil || failed[0] != nil || failed[1] == nil {
		t.Fatalf("enrollments: %v, %v", failed, err)
	}
	ac, err := c.AgentCert(ctx, ok.Agent.ID)
	if err != nil || rs.certReads.Load() != 0 {
		t.Fatalf("the enrolled agent's certificate: %+v %v (%d reads from the database, want 0)", ac, err, rs.certReads.Load())
	}
	if dc, err := db.AgentCert(ctx, ok.Agent.ID); err != nil || *dc != *ac {
		t.Fatalf("cached %+v, the database holds %+v (%v)", ac, dc, err)
	}
	if _, err := c.AgentCert(ctx, twice.Agent.ID); err == nil || rs.certReads.Load() != 1 {
		t.Fatalf("the refused enrollment's agent: %v (%d reads, want 1)", err, rs.certReads.Load())
	}

	raced := testEnrollment(t, db, "t2", now)
	rs.during = func() {
		if err := c.RevokeAgent(ctx, raced.Agent.ID, now); err != nil {
			t.Error(err)
		}
	}
	if failed, err := c.EnrollAgents(ctx, []store.Enrollment{raced}); err != nil || failed[0] != nil {
		t.Fatalf("enrollment: %v, %v", failed, err)
	}
	if ac, err := c.AgentCert(ctx, raced.Agent.ID); err != nil || !ac.Revoked {
		t.Fatalf("an agent revoked while its enrollment committed: %+v %v, want revoked", ac, err)
	}
}
