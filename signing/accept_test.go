package signing

import (
	"bytes"
	"errors"
	"testing"
	"time"

	"github.com/drover/drover/manifest"
)

type acceptFixture struct {
	root, k1, other *Signer
	tr              *TrustRoot
}

func newAcceptFixture(t *testing.T, alg Algorithm) *acceptFixture {
	root, k1, other := mustKey(t, alg), mustKey(t, alg), mustKey(t, alg)
	return &acceptFixture{root: root, k1: k1, other: other,
		tr: mustTrustRoot(t, root, mustKeyList(t, root, 3, t0.AddDate(0, 6, 0), k1))}
}

func TestAcceptManifest(t *testing.T) {
	for _, alg := range algs {
		t.Run(string(alg), func(t *testing.T) {
			f := newAcceptFixture(t, alg)
			m := newManifest("agent-1", 10, 3, 3)
			payload := encode(t, m)
			env := mustSign(t, f.k1, manifest.PayloadType, payload)
			acc, err := AcceptManifest(env, f.tr, State{AgentID: "agent-1", Serial: 9, Digest: "sha256:old"}, t0, 1<<20)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(acc.Payload, payload) || acc.Digest != Digest(payload) || acc.KeyID != f.k1.KeyID() || acc.Unchanged {
				t.Fatalf("accepted %+v", acc)
			}
			if acc.Manifest.Serial != 10 || len(acc.Manifest.Pipes) != 3 || acc.Manifest.Pipes[1].Name != "pipe-0001" {
				t.Fatalf("manifest %+v", acc.Manifest)
			}
			// First manifest ever (Serial 0 in the state) is accepted too.
			if _, err := AcceptManifest(env, f.tr, State{AgentID: "agent-1"}, t0, 0); err != nil {
				t.Fatal(err)
			}
			// Equal serial, same content: Unchanged.
			acc2, err := AcceptManifest(env, f.tr, State{AgentID: "agent-1", Serial: 10, Digest: acc.Digest}, t0, 0)
			if err != nil || !acc2.Unchanged || acc2.Digest != acc.Digest {
				t.Fatalf("unchanged: %+v, %v", acc2, err)
			}
			// Re-signing the same bytes gives a different envelope (ECDSA) but the
			// same payload digest: still Unchanged.
			env2 := mustSign(t, f.k1, manifest.PayloadType, payload)
			if acc3, err := AcceptManifest(env2, f.tr, State{AgentID: "agent-1", Serial: 10, Digest: acc.Digest}, t0, 0); err != nil || !acc3.Unchanged {
				t.Fatalf("re-signed unchanged: %+v, %v", acc3, err)
			}
		})
	}
}

func TestAcceptManifestRejections(t *testing.T) {
	f := newAcceptFixture(t, Ed25519)
	good := newManifest("agent-1", 10, 3, 2)
	goodEnv := signManifest(t, f.k1, good)
	goodDigest := Digest(encode(t, good))
	st := State{AgentID: "agent-1", Serial: 9, Digest: "sha256:prev"}

	with := func(edit func(m *manifest.Manifest)) []byte {
		m := newManifest("agent-1", 10, 3, 2)
		edit(m)
		return signManifest(t, f.k1, m)
	}
	expiredKL := mustTrustRoot(t, f.root, mustKeyList(t, f.root, 3, t0.Add(time.Second), f.k1))
	expiredKL2 := *expiredKL

	cases := []struct {
		name string
		env  []byte
		tr   *TrustRoot
		st   State
		now  time.Time
		max  int
		want error
	}{
		{"oversize", goodEnv, f.tr, st, t0, len(goodEnv) - 1, ErrTooLarge},
		// The size cap comes before anything else: no trust root needed, no parsing.
		{"oversize garbage, no trust root", bytes.Repeat([]byte("{"), 100), nil, st, t0, 99, ErrTooLarge},
		{"swapped payload type", mustSign(t, f.k1, KeyListPayloadType, encode(t, good)), f.tr, st, t0, 0, ErrPayloadType},
		{"another agent", with(func(m *manifest.Manifest) { m.AgentID = "agent-2" }), f.tr, st, t0, 0, ErrWrongAgent},
		{"empty agent in state", goodEnv, f.tr, State{Serial: 9}, t0, 0, ErrWrongAgent},
		{"lower serial", with(func(m *manifest.Manifest) { m.Serial = 8 }), f.tr, st, t0, 0, ErrRollback},
		{"equal serial, other content", with(func(m *manifest.Manifest) { m.Serial = 9 }), f.tr, st, t0, 0, ErrSerialConflict},
		{"expired", goodEnv, f.tr, st, good.ExpiresAt, 0, ErrExpired},
		{"long expired", goodEnv, f.tr, st, good.ExpiresAt.Add(time.Hour), 0, ErrExpired},
		{"unchanged but expired", goodEnv, f.tr, State{AgentID: "agent-1", Serial: 10, Digest: goodDigest}, good.ExpiresAt, 0, ErrExpired},
		{"issued in the future", with(func(m *manifest.Manifest) { m.IssuedAt = t0.Add(MaxClockSkew + time.Second) }), f.tr, st, t0, 0, ErrNotYetValid},
		{"signed by a key not in the key list", signManifest(t, f.other, good), f.tr, st, t0, 0, ErrUnknownKey},
		{"signed by the root key", signManifest(t, f.root, good), f.tr, st, t0, 0, ErrUnknownKey},
		{"expired key list", goodEnv, &expiredKL2, st, t0.Add(time.Second), 0, ErrKeyListExpired},
		{"names a newer key list", with(func(m *manifest.Manifest) { m.KeyListVersion = 4 }), f.tr, st, t0, 0, ErrKeyListStale},
		{"names an older key list", with(func(m *manifest.Manifest) { m.KeyListVersion = 2 }), f.tr, st, t0, 0, ErrKeyListMismatch},
		{"invalid manifest", with(func(m *manifest.Manifest) { m.Pipes[0].Payload.Digest = "md5:x" }), f.tr, st, t0, 0, ErrInvalidManifest},
		{"not a manifest", mustSign(t, f.k1, manifest.PayloadType, []byte(`{"agent_id":"agent-1","extra":1}`)), f.tr, st, t0, 0, ErrInvalidManifest},
		{"garbage envelope", []byte("garbage"), f.tr, st, t0, 0, ErrMalformedEnvelope},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			acc, err := AcceptManifest(c.env, c.tr, c.st, c.now, c.max)
			if acc != nil {
				t.Fatalf("accepted %+v", acc)
			}
			wantOnly(t, err, c.want)
		})
	}

	// Boundaries that are accepted: exactly at the size cap, a second before
	// expiry, issued exactly MaxClockSkew ahead.
	if _, err := AcceptManifest(goodEnv, f.tr, st, t0, len(goodEnv)); err != nil {
		t.Errorf("at the size cap: %v", err)
	}
	if _, err := AcceptManifest(goodEnv, f.tr, st, good.ExpiresAt.Add(-time.Second), 0); err != nil {
		t.Errorf("just before expiry: %v", err)
	}
	if _, err := AcceptManifest(with(func(m *manifest.Manifest) { m.IssuedAt = t0.Add(MaxClockSkew) }), f.tr, st, t0, 0); err != nil {
		t.Errorf("issued MaxClockSkew ahead: %v", err)
	}
	// The manifest package's validation error stays reachable.
	_, err := AcceptManifest(with(func(m *manifest.Manifest) { m.Pipes[0].Payload.Digest = "md5:x" }), f.tr, st, t0, 0)
	var ve *manifest.ValidationError
	if !errors.As(err, &ve) || len(ve.Problems) != 1 || ve.Problems[0].Field != "pipes[0].payload.digest" {
		t.Fatalf("validation error not wrapped: %v", err)
	}
}

func TestSentinelsDistinct(t *testing.T) {
	seen := map[string]bool{}
	for i, a := range sentinels {
		if seen[a.Error()] {
			t.Errorf("duplicate message %q", a.Error())
		}
		seen[a.Error()] = true
		for j, b := range sentinels {
			if i != j && errors.Is(a, b) {
				t.Errorf("%v is %v", a, b)
			}
		}
	}
}
