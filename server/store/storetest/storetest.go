// Package storetest is the conformance suite that every store.Store must
// pass: Run(t, open) runs it against fresh stores made by open. It holds
// the store contracts that callers rely on (sentinel errors, idempotent
// ingestion, ordering, cursors). Only tests import it.
package storetest

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/drover/drover/api"
	"github.com/drover/drover/manifest"
	"github.com/drover/drover/server/errs"
	"github.com/drover/drover/server/store"
)

// Run runs every conformance test, each on a fresh empty store from open.
// The store is closed when the test ends.
func Run(t *testing.T, open func(t *testing.T) store.Store) {
	tests := []struct {
		name string
		fn   func(t *testing.T, st store.Store)
	}{
		{"Enrollment", testEnrollment},
		{"EnrollmentBatch", testEnrollmentBatch},
		{"EnrollmentConcurrent", testEnrollmentConcurrent},
		{"Agents", testAgents},
		{"AgentsTagged", testAgentsTagged},
		{"Pipes", testPipes},
		{"Secrets", testSecrets},
		{"Manifests", testManifests},
		{"APITokensAndAudit", testAPITokensAndAudit},
		{"Ingestion", testIngestion},
		{"RunTelemetry", testRunTelemetry},
		{"Events", testEvents},
		{"NotifyConfig", testNotifyConfig},
		{"NotifyQueue", testNotifyQueue},
		{"StreamPresence", testStreamPresence},
		{"ConsoleSessions", testConsoleSessions},
		{"ServerKeys", testServerKeys},
		{"Holders", testHolders},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			st := open(t)
			t.Cleanup(func() { st.Close() })
			tc.fn(t, st)
		})
	}
}

var t0 = time.Date(2026, 6, 1, 12, 0, 0, 0, time.UTC)

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func wantKind(t *testing.T, what string, err, kind error) {
	t.Helper()
	if !errors.Is(err, kind) {
		t.Fatalf("%s: %v, want %v", what, err, kind)
	}
}

// enroll makes an agent through an enrollment token, the only way in.
func enroll(t *testing.T, st store.Store, id string, tags map[string]string) {
	t.Helper()
	ctx := t.Context()
	tok := &store.EnrollmentToken{ID: "tok-" + id, SecretHash: []byte("h"), Name: id, Tags: tags, CreatedAt: t0, ExpiresAt: t0.Add(time.Hour)}
	must(t, st.CreateToken(ctx, tok))
	must(t, st.EnrollAgent(ctx, tok.ID, t0, &store.Agent{ID: id, Name: id, Hostname: id + ".example", Tags: tags, CreatedAt: t0, CertSerial: "s-" + id, CertExpiresAt: t0.Add(24 * time.Hour)}))
}

// enrollTwo enrolls agt-a (role=web) and agt-b (no tags).
func enrollTwo(t *testing.T, st store.Store) {
	t.Helper()
	enroll(t, st, "agt-a", map[string]string{"role": "web"})
	enroll(t, st, "agt-b", nil)
}

func testEnrollment(t *testing.T, st store.Store) {
	ctx := t.Context()
	tok := &store.EnrollmentToken{ID: "tok-1", SecretHash: []byte("hash"), Name: "web", Tags: map[string]string{"role": "web"}, CreatedAt: t0, ExpiresAt: t0.Add(time.Hour)}
	must(t, st.CreateToken(ctx, tok))
	got, err := st.GetToken(ctx, "tok-1")
	if err != nil || !bytes.Equal(got.SecretHash, tok.SecretHash) || got.Tags["role"] != "web" || !got.ExpiresAt.Equal(tok.ExpiresAt) || !got.UsedAt.IsZero() {
		t.Fatalf("GetToken: %+v %v", got, err)
	}
	_, err = st.GetToken(ctx, "nope")
	wantKind(t, "GetToken(unknown)", err, errs.ErrNotFound)

	a := &store.Agent{ID: "agt-1", Name: "web", Hostname: "h1", Tags: tok.Tags, CreatedAt: t0, CertSerial: "s1"}
	must(t, st.EnrollAgent(ctx, "tok-1", t0.Add(time.Minute), a))
	wantKind(t, "EnrollAgent(used)", st.EnrollAgent(ctx, "tok-1", t0.Add(time.Minute), &store.Agent{ID: "agt-2", CreatedAt: t0}), errs.ErrTokenUsed)
	if got, err := st.GetToken(ctx, "tok-1"); err != nil || got.AgentID != "agt-1" || got.UsedAt.IsZero() {
		t.Fatalf("used token: %+v %v", got, err)
	}

	must(t, st.CreateToken(ctx, &store.EnrollmentToken{ID: "tok-2", SecretHash: []byte("h2"), CreatedAt: t0.Add(time.Second), ExpiresAt: t0.Add(time.Hour)}))
	wantKind(t, "EnrollAgent(expired)", st.EnrollAgent(ctx, "tok-2", t0.Add(2*time.Hour), &store.Agent{ID: "agt-3", CreatedAt: t0}), errs.ErrTokenExpired)
	if _, err := st.GetAgent(ctx, "agt-3"); !errors.Is(err, errs.ErrNotFound) {
		t.Fatalf("an agent was made by an expired token: %v", err)
	}

	toks, err := st.ListTokens(ctx)
	if err != nil || len(toks) != 2 || toks[0].ID != "tok-2" {
		t.Fatalf("ListTokens (newest first): %v %v", toks, err)
	}
	must(t, st.DeleteToken(ctx, "tok-2"))
	wantKind(t, "DeleteToken(deleted)", st.DeleteToken(ctx, "tok-2"), errs.ErrNotFound)
}

// testEnrollmentBatch: one EnrollAgents call commits the enrollments that
// can be applied and rolls back the others alone, each one whole (token,
// agent and audit entry, or none of them).
func testEnrollmentBatch(t *testing.T, st store.Store) {
	ctx := t.Context()
	for _, id := range []string{"b1", "b2", "b3", "b4"} {
		must(t, st.CreateToken(ctx, &store.EnrollmentToken{ID: id, SecretHash: []byte(id), CreatedAt: t0, ExpiresAt: t0.Add(time.Hour)}))
	}
	now := t0.Add(time.Minute)
	enr := func(tok, agent string, at time.Time) store.Enrollment {
		return store.Enrollment{TokenID: tok, Now: at, Agent: &store.Agent{ID: agent, Name: agent, Hostname: agent, CreatedAt: at, CertSerial: "s-" + agent},
			Audit: &store.AuditEntry{At: at, ActorID: "enrollment-token/" + tok, Action: "agents.enroll", Target: "agent/" + agent}}
	}
	es := []store.Enrollment{
		enr("b1", "agt-b1", now),
		enr("b1", "agt-b1-again", now),           // the same token twice in one batch
		enr("nope", "agt-unknown", now),          // no such token
		enr("b2", "agt-b1", now),                 // the agent's insert fails (its id is taken): b2 stays unused
		enr("b3", "agt-b3", t0.Add(2*time.Hour)), // expired
		enr("b4", "agt-b4", now),
	}
	failed, err := st.EnrollAgents(ctx, es)
	must(t, err)
	if len(failed) != len(es) {
		t.Fatalf("EnrollAgents: %d results for %d enrollments", len(failed), len(es))
	}
	must(t, failed[0])
	wantKind(t, "the same token again", failed[1], errs.ErrTokenUsed)
	wantKind(t, "an unknown token", failed[2], errs.ErrInvalidToken)
	if failed[3] == nil {
		t.Fatal("an enrollment whose agent id is taken succeeded")
	}
	wantKind(t, "an expired token", failed[4], errs.ErrTokenExpired)
	must(t, failed[5])
	for _, id := range []string{"agt-b1", "agt-b4"} {
		if _, err := st.GetAgent(ctx, id); err != nil {
			t.Fatalf("enrolled agent %s: %v", id, err)
		}
	}
	for _, id := range []string{"agt-b1-again", "agt-unknown", "agt-b3"} {
		if _, err := st.GetAgent(ctx, id); !errors.Is(err, errs.ErrNotFound) {
			t.Fatalf("a refused enrollment made agent %s: %v", id, err)
		}
	}
	if got, err := st.GetToken(ctx, "b1"); err != nil || got.AgentID != "agt-b1" {
		t.Fatalf("token b1: %+v %v", got, err)
	}
	for _, id := range []string{"b2", "b3"} {
		if got, err := st.GetToken(ctx, id); err != nil || !got.UsedAt.IsZero() || got.AgentID != "" {
			t.Fatalf("token %s of a refused enrollment was used: %+v %v", id, got, err)
		}
	}
	audit, err := st.ListAudit(ctx, store.AuditFilter{Action: "agents.enroll", Limit: 100})
	must(t, err)
	var targets []string
	for _, e := range audit {
		targets = append(targets, e.Target)
	}
	if len(targets) != 2 || targets[0] != "agent/agt-b4" || targets[1] != "agent/agt-b1" {
		t.Fatalf("audit entries of the batch: %v (want those of the two applied enrollments)", targets)
	}
	if es[0].Audit.ID == 0 || es[5].Audit.ID == 0 {
		t.Fatal("the audit entries' ids were not set")
	}
	// b2 is still usable, in a batch of its own.
	failed, err = st.EnrollAgents(ctx, []store.Enrollment{enr("b2", "agt-b2", now)})
	must(t, err)
	must(t, failed[0])

	// A batch above the bound is refused whole.
	big := make([]store.Enrollment, 1001)
	for i := range big {
		big[i] = enr("b4", fmt.Sprintf("agt-big-%d", i), now)
	}
	if _, err := st.EnrollAgents(ctx, big); err == nil {
		t.Fatal("a batch of 1001 enrollments was accepted")
	}
}

// testEnrollmentConcurrent: batches racing for the same tokens use each
// token exactly once.
func testEnrollmentConcurrent(t *testing.T, st store.Store) {
	ctx := t.Context()
	const tokens, racers = 8, 6
	for i := range tokens {
		must(t, st.CreateToken(ctx, &store.EnrollmentToken{ID: fmt.Sprintf("c%d", i), SecretHash: []byte("h"), CreatedAt: t0, ExpiresAt: t0.Add(time.Hour)}))
	}
	now := t0.Add(time.Minute)
	var wg sync.WaitGroup
	results := make([][]error, racers)
	errsOf := make([]error, racers)
	for r := range racers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			es := make([]store.Enrollment, tokens)
			for i := range es {
				id := fmt.Sprintf("agt-c%d-r%d", i, r)
				es[i] = store.Enrollment{TokenID: fmt.Sprintf("c%d", (i+r)%tokens), Now: now, Agent: &store.Agent{ID: id, Name: id, CreatedAt: now, CertSerial: id}}
			}
			results[r], errsOf[r] = st.EnrollAgents(ctx, es)
		}()
	}
	wg.Wait()
	ok := 0
	for r := range racers {
		must(t, errsOf[r])
		for _, err := range results[r] {
			switch {
			case err == nil:
				ok++
			case !errors.Is(err, errs.ErrTokenUsed):
				t.Fatalf("racer %d: %v (want nil or ErrTokenUsed)", r, err)
			}
		}
	}
	if ok != tokens {
		t.Fatalf("%d enrollments succeeded with %d tokens", ok, tokens)
	}
	agents, err := st.ListAgents(ctx)
	must(t, err)
	if len(agents) != tokens {
		t.Fatalf("%d agents for %d tokens", len(agents), tokens)
	}
}

// AgentsTagged finds exactly the agents that have the key, whatever its
// value, and not those whose other keys or values contain it, nor those
// that LIKE's wildcards in the key would match.
func testAgentsTagged(t *testing.T, st store.Store) {
	ctx := t.Context()
	enroll(t, st, "agt-a", map[string]string{"drover.internal": "true"})
	enroll(t, st, "agt-b", map[string]string{"role": "drover.internal"})
	enroll(t, st, "agt-c", map[string]string{"drover.internal.x": "1", "x.drover.internal": "2"})
	enroll(t, st, "agt-d", map[string]string{"droverXinternal": "true", "DROVER.INTERNAL": "true"})
	enroll(t, st, "agt-e", map[string]string{"a": "1", "drover.internal": ""})
	enroll(t, st, "agt-f", nil)
	enroll(t, st, "agt-g", map[string]string{"k_%\\\"<": "v"})
	must(t, st.RevokeAgent(ctx, "agt-e", t0.Add(time.Minute)))
	ids := func(key string) []string {
		as, err := st.AgentsTagged(ctx, key)
		must(t, err)
		var out []string
		for _, a := range as {
			out = append(out, a.ID)
		}
		return out
	}
	if got := ids("drover.internal"); !slices.Equal(got, []string{"agt-a", "agt-e"}) {
		t.Fatalf("AgentsTagged(drover.internal): %v, want [agt-a agt-e]", got)
	}
	if got := ids("k_%\\\"<"); !slices.Equal(got, []string{"agt-g"}) {
		t.Fatalf("AgentsTagged(a key with LIKE's wildcards, a backslash, a quote): %v, want [agt-g]", got)
	}
	if got := ids("k__\\\"<"); len(got) != 0 {
		t.Fatalf("AgentsTagged(k__...): %v, want none (_ is not a wildcard)", got)
	}
	if got := ids("nope"); len(got) != 0 {
		t.Fatalf("AgentsTagged(nope): %v", got)
	}
}

func testAgents(t *testing.T, st store.Store) {
	ctx := t.Context()
	enrollTwo(t, st)
	a, err := st.GetAgent(ctx, "agt-a")
	if err != nil || a.Hostname != "agt-a.example" || a.Tags["role"] != "web" || a.CertSerial != "s-agt-a" {
		t.Fatalf("GetAgent: %+v %v", a, err)
	}
	_, err = st.GetAgent(ctx, "nope")
	wantKind(t, "GetAgent(unknown)", err, errs.ErrNotFound)
	if as, err := st.ListAgents(ctx); err != nil || len(as) != 2 {
		t.Fatalf("ListAgents: %v %v", as, err)
	}

	must(t, st.SetAgentTags(ctx, "agt-a", map[string]string{"role": "db"}, t0.Add(time.Minute)))
	if a, _ := st.GetAgent(ctx, "agt-a"); a.Tags["role"] != "db" {
		t.Fatalf("tags after SetAgentTags: %v", a.Tags)
	}

	must(t, st.SetNextCert(ctx, "agt-a", "s2", t0.Add(48*time.Hour)))
	if c, err := st.AgentCert(ctx, "agt-a"); err != nil || c.Serial != "s-agt-a" || c.NextSerial != "s2" || c.Revoked {
		t.Fatalf("AgentCert after SetNextCert: %+v %v", c, err)
	}
	must(t, st.PromoteCert(ctx, "agt-a", "s2"))
	if c, _ := st.AgentCert(ctx, "agt-a"); c.Serial != "s2" || c.NextSerial != "" {
		t.Fatalf("AgentCert after PromoteCert: %+v", c)
	}

	const m1, m2 = "0123456789abcdef0123456789abcdef", "fedcba9876543210fedcba9876543210"
	if got, err := st.BindMachine(ctx, "agt-a", m1, t0); err != nil || got != m1 {
		t.Fatalf("BindMachine: %q %v", got, err)
	}
	if got, err := st.BindMachine(ctx, "agt-a", m2, t0); err != nil || got != m1 {
		t.Fatalf("BindMachine over a bound machine: %q %v, want the first", got, err)
	}
	must(t, st.NoteIdentityConflict(ctx, "agt-a", m2, t0.Add(time.Second)))
	if a, _ := st.GetAgent(ctx, "agt-a"); a.MachineID != m1 || a.IdentityConflicts != 1 || a.IdentityConflictMachine != m2 {
		t.Fatalf("identity after a conflict: %+v", a)
	}

	must(t, st.RevokeAgent(ctx, "agt-b", t0.Add(time.Hour)))
	if c, _ := st.AgentCert(ctx, "agt-b"); !c.Revoked {
		t.Fatal("revoked agent's cert is not revoked")
	}
	must(t, st.DeleteAgent(ctx, "agt-b"))
	_, err = st.GetAgent(ctx, "agt-b")
	wantKind(t, "GetAgent(deleted)", err, errs.ErrNotFound)
}

// putPipe stores a version of pipe name with the given command and payload.
func putPipe(t *testing.T, st store.Store, name, cmd string, payload []byte, tags map[string]string, at time.Time) (uint64, bool) {
	t.Helper()
	spec := manifest.Spec{Name: name, Command: []string{"sh", "-c", cmd}, Targets: &manifest.Targets{Tags: tags}}
	sj, err := store.SpecJSON(&spec)
	must(t, err)
	v, created, err := st.PutPipe(t.Context(), &store.PipeVersion{Name: name, Spec: spec, SpecJSON: sj, PayloadDigest: fmt.Sprintf("sha256:%x", payload), PayloadSize: int64(len(payload))}, payload, at)
	must(t, err)
	return v, created
}

func testPipes(t *testing.T, st store.Store) {
	ctx := t.Context()
	if v, created := putPipe(t, st, "job", "echo 1", []byte("p1"), nil, t0); v != 1 || !created {
		t.Fatalf("first PutPipe: %d %v", v, created)
	}
	if v, created := putPipe(t, st, "job", "echo 1", []byte("p1"), nil, t0.Add(time.Second)); v != 1 || created {
		t.Fatalf("same PutPipe again: %d %v, want 1 false", v, created)
	}
	if v, created := putPipe(t, st, "job", "echo 2", []byte("p1"), nil, t0.Add(2*time.Second)); v != 2 || !created {
		t.Fatalf("changed PutPipe: %d %v", v, created)
	}
	putPipe(t, st, "other", "echo o", []byte("p2"), nil, t0)
	p, err := st.GetPipe(ctx, "job")
	if err != nil || p.Version != 2 || p.Spec.Command[2] != "echo 2" || !p.CreatedAt.Equal(t0) {
		t.Fatalf("GetPipe: %+v %v", p, err)
	}
	if ps, err := st.ListPipes(ctx); err != nil || len(ps) != 2 || ps[0].Name != "job" {
		t.Fatalf("ListPipes (by name): %v %v", ps, err)
	}
	if vs, err := st.ListPipeVersions(ctx, "job"); err != nil || len(vs) != 2 {
		t.Fatalf("ListPipeVersions: %v %v", vs, err)
	}
	digest := p.PayloadDigest
	if b, err := st.GetPayload(ctx, digest); err != nil || string(b) != "p1" {
		t.Fatalf("GetPayload: %q %v", b, err)
	}
	if n, err := st.PayloadSize(ctx, digest); err != nil || n != 2 {
		t.Fatalf("PayloadSize: %d %v", n, err)
	}
	buf := make([]byte, 8)
	if n, err := st.ReadPayload(ctx, digest, 1, buf); err != nil || string(buf[:n]) != "1" {
		t.Fatalf("ReadPayload at 1: %q %v", buf[:n], err)
	}
	_, err = st.GetPayload(ctx, "sha256:none")
	wantKind(t, "GetPayload(unknown)", err, errs.ErrNotFound)

	must(t, st.DeletePipe(ctx, "job", t0.Add(time.Minute)))
	_, err = st.GetPipe(ctx, "job")
	wantKind(t, "GetPipe(deleted)", err, errs.ErrNotFound)
	if cur, deleted, err := st.PipeState(ctx, "job"); err != nil || cur != 2 || !deleted {
		t.Fatalf("PipeState(deleted): %d %v %v", cur, deleted, err)
	}
	if v, err := st.GetPipeVersion(ctx, "job", 1); err != nil || v.Spec.Command[2] != "echo 1" {
		t.Fatalf("GetPipeVersion of a deleted pipe: %+v %v", v, err)
	}
	_, _, err = st.PipeState(ctx, "never")
	wantKind(t, "PipeState(never)", err, errs.ErrNotFound)
	if v, created := putPipe(t, st, "job", "echo 2", []byte("p1"), nil, t0.Add(time.Hour)); v != 3 || !created {
		t.Fatalf("PutPipe after delete: %d %v, want a new version", v, created)
	}
}

func testSecrets(t *testing.T, st store.Store) {
	ctx := t.Context()
	must(t, st.PutSecret(ctx, "db", []byte("sealed-1"), t0))
	must(t, st.PutSecret(ctx, "api", []byte("sealed-2"), t0))
	must(t, st.PutSecret(ctx, "db", []byte("sealed-3"), t0.Add(time.Minute)))
	ls, err := st.ListSecrets(ctx, "", 0)
	if err != nil || len(ls) != 2 || ls[0].Name != "api" || ls[1].Name != "db" || !ls[1].UpdatedAt.Equal(t0.Add(time.Minute)) {
		t.Fatalf("ListSecrets: %+v %v", ls, err)
	}
	if page, err := st.ListSecrets(ctx, "", 1); err != nil || len(page) != 1 || page[0].Name != "api" {
		t.Fatalf("ListSecrets(limit 1): %+v %v", page, err)
	}
	if page, err := st.ListSecrets(ctx, "api", 10); err != nil || len(page) != 1 || page[0].Name != "db" {
		t.Fatalf("ListSecrets(after api): %+v %v", page, err)
	}
	got, err := st.GetSecrets(ctx, []string{"db", "missing"})
	if err != nil || len(got) != 1 || string(got["db"]) != "sealed-3" {
		t.Fatalf("GetSecrets: %q %v", got, err)
	}
	must(t, st.DeleteSecret(ctx, "db"))
	wantKind(t, "DeleteSecret(deleted)", st.DeleteSecret(ctx, "db"), errs.ErrNotFound)
}

func testManifests(t *testing.T, st store.Store) {
	ctx := t.Context()
	enrollTwo(t, st)
	putPipe(t, st, "job", "echo", []byte("p"), map[string]string{"role": "web"}, t0)
	pipes, agents, err := st.CompileInputs(ctx, nil)
	if err != nil || len(pipes) != 1 || len(agents) != 2 || agents[0].Prev != nil {
		t.Fatalf("CompileInputs: %v %v %v", pipes, agents, err)
	}
	m := &store.StoredManifest{AgentID: "agt-a", Serial: 2, ContentHash: "c", Digest: "sha256:d", Envelope: []byte(`{"m":1}`),
		IssuedAt: t0, ExpiresAt: t0.Add(time.Hour), KeyListVersion: 1, Payloads: []string{"sha256:p"}, Secrets: []string{"db"}}
	if stale, err := st.SaveManifests(ctx, []*store.StoredManifest{m}); err != nil || len(stale) != 0 {
		t.Fatalf("SaveManifests(first): stale %v, %v", stale, err)
	}
	old := *m
	old.Serial, old.Envelope = 1, []byte(`{"old":1}`)
	// Compiled over no manifest, or over serial 1, while serial 2 was
	// saved: stale, nothing changes.
	same := *m
	same.Envelope = []byte(`{"same serial":1}`)
	racing := *m
	racing.PrevSerial, racing.Serial, racing.Envelope = 1, 3, []byte(`{"racing":1}`)
	stale, err := st.SaveManifests(ctx, []*store.StoredManifest{&old, &same, &racing})
	if err != nil || len(stale) != 3 {
		t.Fatalf("SaveManifests(stale): stale %v, %v", stale, err)
	}
	got, err := st.GetManifest(ctx, "agt-a")
	if err != nil || got.Serial != 2 || !bytes.Equal(got.Envelope, m.Envelope) || got.Digest != m.Digest {
		t.Fatalf("GetManifest (an older serial or a stale compile must not replace the stored one): %+v %v", got, err)
	}
	next := *m
	next.PrevSerial, next.Serial, next.Envelope = 2, 3, []byte(`{"next":1}`)
	if stale, err := st.SaveManifests(ctx, []*store.StoredManifest{&next}); err != nil || len(stale) != 0 {
		t.Fatalf("SaveManifests(next): stale %v, %v", stale, err)
	}
	if got, err := st.GetManifest(ctx, "agt-a"); err != nil || got.Serial != 3 || !bytes.Equal(got.Envelope, next.Envelope) {
		t.Fatalf("GetManifest after the next serial: %+v %v", got, err)
	}
	if stale, err := st.SaveManifests(ctx, []*store.StoredManifest{m}); err != nil || len(stale) != 1 {
		t.Fatalf("SaveManifests(back to 2): stale %v, %v", stale, err)
	}
	_, err = st.GetManifest(ctx, "agt-b")
	wantKind(t, "GetManifest(none)", err, errs.ErrNotFound)
	if _, agents, err := st.CompileInputs(ctx, []string{"agt-a"}); err != nil || len(agents) != 1 || agents[0].Prev == nil || agents[0].Prev.Serial != 3 {
		t.Fatalf("CompileInputs(agt-a): %v %v", agents, err)
	}
	if due, err := st.ManifestsDue(ctx, t0.Add(time.Second)); err != nil || len(due) != 1 || due[0] != "agt-a" {
		t.Fatalf("ManifestsDue: %v %v", due, err)
	}
	if due, err := st.ManifestsDue(ctx, t0); err != nil || len(due) != 0 {
		t.Fatalf("ManifestsDue(before issue): %v %v", due, err)
	}
	if ids, err := st.AgentsUsingSecret(ctx, "db"); err != nil || len(ids) != 1 || ids[0] != "agt-a" {
		t.Fatalf("AgentsUsingSecret: %v %v", ids, err)
	}
}

func testAPITokensAndAudit(t *testing.T, st store.Store) {
	ctx := t.Context()
	must(t, st.CreateAPIToken(ctx, &store.APIToken{ID: "at-1", Name: "ci", Role: "operator", SecretHash: []byte("h1"), CreatedAt: t0, CreatedBy: "admin"}))
	must(t, st.EnsureAPIToken(ctx, &store.APIToken{ID: "at-1", Name: "ci", Role: "operator", SecretHash: []byte("h2"), CreatedAt: t0}))
	if tok, err := st.GetAPIToken(ctx, "at-1"); err != nil || string(tok.SecretHash) != "h2" {
		t.Fatalf("EnsureAPIToken on a live token takes its hash: %+v %v", tok, err)
	}
	must(t, st.EnsureAPIToken(ctx, &store.APIToken{ID: "at-2", Name: "boot", Role: "admin", SecretHash: []byte("h"), CreatedAt: t0.Add(time.Second)}))
	if ls, err := st.ListAPITokens(ctx); err != nil || len(ls) != 2 || ls[0].ID != "at-1" {
		t.Fatalf("ListAPITokens (oldest first): %v %v", ls, err)
	}
	must(t, st.TouchAPIToken(ctx, "at-1", t0.Add(time.Minute)))
	must(t, st.RevokeAPIToken(ctx, "at-1", t0.Add(time.Hour)))
	must(t, st.RevokeAPIToken(ctx, "at-1", t0.Add(2*time.Hour)))
	tok, err := st.GetAPIToken(ctx, "at-1")
	if err != nil || !tok.RevokedAt.Equal(t0.Add(time.Hour)) || !tok.LastUsedAt.Equal(t0.Add(time.Minute)) {
		t.Fatalf("revoked twice keeps the first time: %+v %v", tok, err)
	}
	wantKind(t, "RevokeAPIToken(unknown)", st.RevokeAPIToken(ctx, "nope", t0), errs.ErrNotFound)
	_, err = st.GetAPIToken(ctx, "nope")
	wantKind(t, "GetAPIToken(unknown)", err, errs.ErrNotFound)

	for i, action := range []string{"pipe.put", "pipe.delete", "pipe.put"} {
		must(t, st.AddAudit(ctx, &store.AuditEntry{At: t0.Add(time.Duration(i) * time.Second), ActorID: "at-1", ActorName: "ci", Role: "operator", Action: action, Target: "job"}))
	}
	es, err := st.ListAudit(ctx, store.AuditFilter{Action: "pipe.put", Limit: 10})
	if err != nil || len(es) != 2 || !es[0].At.After(es[1].At) {
		t.Fatalf("ListAudit (newest first): %v %v", es, err)
	}
	if es2, err := st.ListAudit(ctx, store.AuditFilter{BeforeID: es[0].ID, Limit: 10, Actor: "ci"}); err != nil || len(es2) != 2 {
		t.Fatalf("ListAudit after a cursor: %v %v", es2, err)
	}
}

func testIngestion(t *testing.T, st store.Store) {
	ctx := t.Context()
	enroll(t, st, "agt-a", nil)
	enroll(t, st, "agt-b", nil)
	lim := store.IngestLimits{MaxLogBytes: 10, Marker: []byte("[truncated]")}
	recv := t0.Add(time.Minute)
	recs := []*store.Record{
		{AgentID: "agt-a", Received: recv, Seq: 1, Hello: &store.HelloRecord{AgentVersion: "1.2.3", Hostname: "reported", ManifestSerial: 4}},
		{AgentID: "agt-a", Received: recv, Seq: 2, RunStarted: &store.Run{ID: "r1", Pipe: "job", PipeVersion: 1, Trigger: api.TriggerSchedule, StartedAt: t0}},
		{AgentID: "agt-a", Received: recv, Seq: 3, Chunk: &store.LogChunk{RunID: "r1", Seq: 0, Stream: "stdout", Data: []byte("12345678")}},
		{AgentID: "agt-a", Received: recv, Seq: 4, Chunk: &store.LogChunk{RunID: "r1", Seq: 1, Stream: "stdout", Data: []byte("over")}},
		{AgentID: "agt-a", Received: recv, Seq: 5, Chunk: &store.LogChunk{RunID: "r1", Seq: 2, Stream: "stdout", Data: []byte("dropped")}},
		{AgentID: "agt-a", Received: recv, Seq: 6, RunFinished: &store.Run{ID: "r1", Pipe: "job", Status: api.StatusSucceeded, StartedAt: t0, FinishedAt: t0.Add(time.Second), LogChunks: 3}},
		// another agent's record about r1 is ignored
		{AgentID: "agt-b", Received: recv, Seq: 1, RunFinished: &store.Run{ID: "r1", Pipe: "job", Status: api.StatusFailed}},
	}
	must(t, st.ApplyRecords(ctx, recs, lim))
	must(t, st.ApplyRecords(ctx, recs, lim)) // a replay changes nothing

	a, _ := st.GetAgent(ctx, "agt-a")
	if a.AgentVersion != "1.2.3" || a.ReportedHostname != "reported" || a.Hostname != "agt-a.example" || a.AcceptedSerial != 4 || !a.LastSeenAt.Equal(recv) {
		t.Fatalf("agent after Hello: %+v", a)
	}
	r, err := st.GetRun(ctx, "r1")
	if err != nil || r.AgentID != "agt-a" || r.Status != api.StatusSucceeded || r.LogBytes != 8 || !r.LogTruncated {
		t.Fatalf("GetRun: %+v %v", r, err)
	}
	logs, err := st.GetLogs(ctx, "r1")
	if err != nil || len(logs) != 2 || string(logs[0].Data) != "12345678" || string(logs[1].Data) != "[truncated]" || logs[1].Stream != "system" {
		t.Fatalf("GetLogs (the chunk over the cap is the marker, later ones dropped): %+v %v", logs, err)
	}
	if after, err := st.GetLogsAfter(ctx, "r1", 0, 10); err != nil || len(after) != 1 || after[0].Seq != 1 {
		t.Fatalf("GetLogsAfter(0): %+v %v", after, err)
	}
	if n, err := st.CountLogChunks(ctx, "r1"); err != nil || n != 2 {
		t.Fatalf("CountLogChunks: %d %v", n, err)
	}

	must(t, st.ApplyRecords(ctx, []*store.Record{
		{AgentID: "agt-a", Received: recv.Add(time.Second), RunStarted: &store.Run{ID: "r2", Pipe: "job", StartedAt: t0.Add(time.Second)}},
		{AgentID: "agt-b", Received: recv.Add(2 * time.Second), RunStarted: &store.Run{ID: "r3", Pipe: "other", StartedAt: t0.Add(time.Second)}},
	}, lim))
	if c, err := st.RunCounts(ctx); err != nil || c[api.StatusSucceeded] != 1 || c[api.StatusRunning] != 2 {
		t.Fatalf("RunCounts: %v %v", c, err)
	}
	runs, err := st.ListRuns(ctx, store.RunFilter{Limit: 10})
	if err != nil || len(runs) != 3 || runs[0].ID != "r3" {
		t.Fatalf("ListRuns (newest first): %v %v", runs, err)
	}
	page, err := st.ListRuns(ctx, store.RunFilter{Limit: 10, BeforeAt: runs[0].CreatedAt, BeforeID: runs[0].ID})
	if err != nil || len(page) != 2 || page[0].ID != runs[1].ID {
		t.Fatalf("ListRuns after a cursor: %v %v", page, err)
	}
	if byPipe, err := st.ListRuns(ctx, store.RunFilter{Pipe: "other", Limit: 10}); err != nil || len(byPipe) != 1 || byPipe[0].ID != "r3" {
		t.Fatalf("ListRuns(pipe other): %v %v", byPipe, err)
	}

	// A drained agent that no longer lists r2 twice settles it lost.
	for i := range 2 {
		settle := &store.SettleRecord{Running: map[string]bool{}, SentAt: recv.Add(time.Duration(10+i) * time.Second)}
		must(t, st.ApplyRecords(ctx, []*store.Record{{AgentID: "agt-a", Received: recv.Add(time.Duration(10+i) * time.Second), Settle: settle}}, lim))
		if i == 1 && (len(settle.Settled) != 1 || settle.Settled[0] != "r2") {
			t.Fatalf("settled: %v", settle.Settled)
		}
	}
	if r, _ := st.GetRun(ctx, "r2"); r.Status != api.StatusFailed || r.Reason != store.ReasonLost || r.WrittenBy != "server" {
		t.Fatalf("settled run: %+v", r)
	}
	if n, err := st.PruneRuns(ctx, t0.Add(time.Hour), 0); err != nil || n != 3 {
		t.Fatalf("PruneRuns: %d %v", n, err)
	}
}

func testEvents(t *testing.T, st store.Store) {
	ctx := t.Context()
	evs := []*store.Event{
		{At: t0, Kind: "run.failed", Pipe: "job", AgentID: "agt-a", RunID: "r1", Message: "failed", Dedupe: "run.failed/r1"},
		{At: t0.Add(time.Second), Kind: "run.missed", Pipe: "job", AgentID: "agt-a", Message: "missed", Dedupe: "run.missed/x"},
	}
	must(t, st.AddEvents(ctx, evs))
	must(t, st.AddEvents(ctx, evs[:1])) // the same occurrence is stored once
	ls, err := st.ListEvents(ctx, store.EventFilter{Limit: 10})
	if err != nil || len(ls) != 2 || ls[0].Kind != "run.missed" {
		t.Fatalf("ListEvents (newest first, deduplicated): %v %v", ls, err)
	}
	if ls, err := st.ListEvents(ctx, store.EventFilter{Kind: "run.failed", Limit: 10}); err != nil || len(ls) != 1 {
		t.Fatalf("ListEvents(kind): %v %v", ls, err)
	}
	if n, err := st.PruneEvents(ctx, t0.Add(time.Millisecond)); err != nil || n != 1 {
		t.Fatalf("PruneEvents: %d %v", n, err)
	}
	must(t, st.SetMonitorState(ctx, map[string]string{"a": "1", "b": "2"}, t0))
	must(t, st.SetMonitorState(ctx, map[string]string{"a": ""}, t0))
	if s, err := st.MonitorState(ctx); err != nil || len(s) != 1 || s["b"] != "2" {
		t.Fatalf("MonitorState: %v %v", s, err)
	}
}

// testServerKeys: the first InitServerKeys stores, later ones find keys
// and change nothing; UpdateServerKeys is a compare-and-swap on one key's
// version.
func testServerKeys(t *testing.T, st store.Store) {
	ctx := t.Context()
	if ks, err := st.ServerKeys(ctx); err != nil || len(ks) != 0 {
		t.Fatalf("ServerKeys(empty): %v %v", ks, err)
	}
	first := []*store.ServerKey{{ID: "ca.key", Sealed: []byte{0, 1, 2}, Version: 1, UpdatedAt: t0}, {ID: "keylist", Sealed: []byte("kl1"), Version: 1, UpdatedAt: t0}}
	if ok, err := st.InitServerKeys(ctx, first); err != nil || !ok {
		t.Fatalf("InitServerKeys(first): %v %v", ok, err)
	}
	if ok, err := st.InitServerKeys(ctx, []*store.ServerKey{{ID: "ca.key", Sealed: []byte("other"), Version: 1}, {ID: "x", Sealed: []byte("x"), Version: 1}}); err != nil || ok {
		t.Fatalf("InitServerKeys(second): %v %v", ok, err)
	}
	ks, err := st.ServerKeys(ctx)
	if err != nil || len(ks) != 2 || !bytes.Equal(ks["ca.key"].Sealed, []byte{0, 1, 2}) || ks["keylist"].Version != 1 || !ks["ca.key"].UpdatedAt.Equal(t0) {
		t.Fatalf("ServerKeys after a second init: %v %v", ks, err)
	}
	put := []*store.ServerKey{{ID: "keylist", Sealed: []byte("kl2"), Version: 2, UpdatedAt: t0.Add(time.Minute)}, {ID: "manifest/k2", Sealed: []byte("k2"), Version: 1, UpdatedAt: t0}}
	wantKind(t, "UpdateServerKeys(wrong version)", st.UpdateServerKeys(ctx, "keylist", 2, put, nil), errs.ErrConflict)
	wantKind(t, "UpdateServerKeys(missing key)", st.UpdateServerKeys(ctx, "nope", 1, put, nil), errs.ErrNotFound)
	must(t, st.UpdateServerKeys(ctx, "keylist", 1, put, []string{"ca.key"}))
	wantKind(t, "UpdateServerKeys(replayed)", st.UpdateServerKeys(ctx, "keylist", 1, put, nil), errs.ErrConflict)
	ks, err = st.ServerKeys(ctx, "keylist", "ca.key")
	if err != nil || len(ks) != 1 || ks["keylist"].Version != 2 || string(ks["keylist"].Sealed) != "kl2" {
		t.Fatalf("ServerKeys(keylist, ca.key) after update: %v %v", ks, err)
	}
	if ks, err := st.ServerKeys(ctx); err != nil || len(ks) != 2 || ks["manifest/k2"] == nil {
		t.Fatalf("ServerKeys after update: %v %v", ks, err)
	}
}
