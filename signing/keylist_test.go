package signing

import (
	"bytes"
	"encoding/json"
	"testing"
	"time"

	"github.com/drover/drover/manifest"
)

func TestSignKeyListValidates(t *testing.T) {
	root, k := mustKey(t, Ed25519), mustKey(t, ECDSAP256)
	exp := t0.AddDate(1, 0, 0)
	bad := k.Public()
	bad.ID = root.KeyID()
	cases := map[string]KeyList{
		"version 0":      {Version: 0, ExpiresAt: exp, Keys: []PublicKey{k.Public()}},
		"no expiry":      {Version: 1, Keys: []PublicKey{k.Public()}},
		"no keys":        {Version: 1, ExpiresAt: exp},
		"duplicate keys": {Version: 1, ExpiresAt: exp, Keys: []PublicKey{k.Public(), k.Public()}},
		"key id lies":    {Version: 1, ExpiresAt: exp, Keys: []PublicKey{bad}},
		"too many keys":  {Version: 1, ExpiresAt: exp, Keys: make([]PublicKey, MaxKeys+1)},
	}
	for name, kl := range cases {
		t.Run(name, func(t *testing.T) {
			_, err := SignKeyList(root, kl)
			wantOnly(t, err, ErrInvalidKeyList, ErrInvalidKey)
		})
	}
	// A root that signs an invalid list by hand does not get it accepted.
	env := mustSign(t, root, KeyListPayloadType, []byte(`{"version":1,"expires_at":"2031-01-01T00:00:00Z","keys":[]}`))
	tr := &TrustRoot{RootKeys: []PublicKey{root.Public()}}
	wantOnly(t, tr.UpdateKeyList(env, t0), ErrInvalidKeyList)
	env = mustSign(t, root, KeyListPayloadType, []byte(`{"version":1,"expires_at":"2031-01-01T00:00:00Z","keys":[],"extra":true}`))
	wantOnly(t, tr.UpdateKeyList(env, t0), ErrInvalidKeyList)
	if tr.KeyList != nil {
		t.Fatal("refused key list was stored")
	}
}

func TestKeyListUpdateRules(t *testing.T) {
	for _, alg := range algs {
		t.Run(string(alg), func(t *testing.T) {
			root, k1, k2 := mustKey(t, alg), mustKey(t, Ed25519), mustKey(t, ECDSAP256)
			exp := t0.AddDate(1, 0, 0)
			v1 := mustKeyList(t, root, 1, exp, k1)
			v2 := mustKeyList(t, root, 2, exp, k1, k2)
			tr := mustTrustRoot(t, root, v2)
			held := append([]byte(nil), tr.KeyList...)
			unchanged := func() {
				t.Helper()
				if !bytes.Equal(tr.KeyList, held) {
					t.Fatal("trust root changed by a refused update")
				}
			}

			wantOnly(t, tr.UpdateKeyList(v1, t0), ErrKeyListRollback) // lower version
			unchanged()
			if err := tr.UpdateKeyList(v2, t0); err != nil { // same bytes: no-op
				t.Fatalf("identical key list: %v", err)
			}
			unchanged()
			v2b := mustKeyList(t, root, 2, exp.Add(time.Hour), k1, k2) // same version, other bytes
			wantOnly(t, tr.UpdateKeyList(v2b, t0), ErrKeyListRollback)
			unchanged()

			// Signed by a key that is not a root key (even one in the key list).
			v3bad := mustKeyList(t, k1, 3, exp, k1, k2)
			wantOnly(t, tr.UpdateKeyList(v3bad, t0), ErrUnknownKey)
			unchanged()
			// Root-signed, but as the wrong payload type.
			kl := KeyList{Version: 3, ExpiresAt: exp, Keys: []PublicKey{k1.Public()}}
			b, _ := kl.Encode()
			wantOnly(t, tr.UpdateKeyList(mustSign(t, root, manifest.PayloadType, b), t0), ErrPayloadType)
			unchanged()
			// Expired.
			v3exp := mustKeyList(t, root, 3, t0, k1)
			wantOnly(t, tr.UpdateKeyList(v3exp, t0), ErrKeyListExpired)
			unchanged()
			// Garbage.
			wantOnly(t, tr.UpdateKeyList([]byte("{}"), t0), ErrMalformedEnvelope)
			unchanged()

			// A higher version is taken, and a copy of it is kept.
			v5 := mustKeyList(t, root, 5, exp, k2)
			if err := tr.UpdateKeyList(v5, t0); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(tr.KeyList, v5) {
				t.Fatal("new key list not stored")
			}
			v5[0] = 'x'
			if got, err := tr.CurrentKeyList(t0); err != nil || got.Version != 5 {
				t.Fatalf("CurrentKeyList = %+v, %v (aliasing the caller's buffer?)", got, err)
			}
		})
	}
}

func TestCurrentKeyList(t *testing.T) {
	root, k1 := mustKey(t, Ed25519), mustKey(t, Ed25519)
	exp := t0.Add(time.Hour)
	tr := mustTrustRoot(t, root, mustKeyList(t, root, 1, exp, k1))
	kl, err := tr.CurrentKeyList(exp.Add(-time.Nanosecond))
	if err != nil || kl.Version != 1 || len(kl.Keys) != 1 || kl.Keys[0] != k1.Public() || !kl.ExpiresAt.Equal(exp) {
		t.Fatalf("CurrentKeyList = %+v, %v", kl, err)
	}
	_, err = tr.CurrentKeyList(exp)
	wantOnly(t, err, ErrKeyListExpired)

	// The held list may be expired; a newer one replaces it.
	if err := tr.UpdateKeyList(mustKeyList(t, root, 2, exp.Add(time.Hour), k1), exp); err != nil {
		t.Fatal(err)
	}
	if _, err := tr.CurrentKeyList(exp); err != nil {
		t.Fatal(err)
	}

	// A key list signed by a non-root key is never current.
	bad := &TrustRoot{RootKeys: []PublicKey{root.Public()}, KeyList: mustKeyList(t, k1, 9, exp, k1)}
	_, err = bad.CurrentKeyList(t0)
	wantOnly(t, err, ErrUnknownKey)
	_, err = NewTrustRoot([]PublicKey{root.Public()}, mustKeyList(t, k1, 9, exp, k1), t0)
	wantOnly(t, err, ErrUnknownKey)
	// No key list / no root keys.
	_, err = (&TrustRoot{RootKeys: []PublicKey{root.Public()}}).CurrentKeyList(t0)
	wantOnly(t, err, ErrMalformedEnvelope)
	if _, err := (&TrustRoot{KeyList: tr.KeyList}).CurrentKeyList(t0); err == nil {
		t.Fatal("trust root without root keys accepted a key list")
	}
	// An empty trust root takes its first root-signed list, also after a
	// JSON round trip turned its nil key list into null.
	fresh := &TrustRoot{RootKeys: []PublicKey{root.Public()}}
	b, err := json.Marshal(fresh)
	if err != nil {
		t.Fatal(err)
	}
	var back TrustRoot
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	_, err = back.CurrentKeyList(t0)
	wantOnly(t, err, ErrMalformedEnvelope)
	for _, r := range []*TrustRoot{fresh, &back} {
		if err := r.UpdateKeyList(tr.KeyList, t0); err != nil {
			t.Fatal(err)
		}
		if _, err := r.CurrentKeyList(t0); err != nil {
			t.Fatal(err)
		}
	}
}

func TestTrustRootJSONKeepsExactBytes(t *testing.T) {
	root, k1 := mustKey(t, ECDSAP256), mustKey(t, Ed25519)
	tr := mustTrustRoot(t, root, mustKeyList(t, root, 1, t0.AddDate(1, 0, 0), k1))
	b, err := json.Marshal(tr)
	if err != nil {
		t.Fatal(err)
	}
	var back TrustRoot
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(back.KeyList, tr.KeyList) {
		t.Fatalf("key list bytes changed through JSON:\n%s\n%s", tr.KeyList, back.KeyList)
	}
	if err := back.UpdateKeyList(tr.KeyList, t0); err != nil {
		t.Fatalf("same list after a round trip: %v", err)
	}
}

// TestRotation rotates manifest keys without re-enrolling: the agent's
// trust root keeps its root keys and only takes newer root-signed key lists.
func TestRotation(t *testing.T) {
	for _, alg := range algs {
		t.Run("root "+string(alg), func(t *testing.T) {
			root := mustKey(t, alg)
			k1, k2 := mustKey(t, Ed25519), mustKey(t, ECDSAP256)
			exp := t0.AddDate(0, 3, 0)
			tr := mustTrustRoot(t, root, mustKeyList(t, root, 1, exp, k1))
			st := State{AgentID: "agent-7"}
			accept := func(s *Signer, serial, klv uint64) error {
				t.Helper()
				acc, err := AcceptManifest(signManifest(t, s, newManifest("agent-7", serial, klv, 2)), tr, st, t0, 0)
				if err == nil {
					if acc.KeyID != s.KeyID() {
						t.Fatalf("accepted with key %s, signed by %s", acc.KeyID, s.KeyID())
					}
					st.Serial, st.Digest = acc.Manifest.Serial, acc.Digest
				}
				return err
			}

			// v1 {K1}: K1 accepted, K2 not yet.
			if err := accept(k1, 1, 1); err != nil {
				t.Fatal(err)
			}
			wantOnly(t, accept(k2, 2, 1), ErrUnknownKey)
			// The server moved to v2 before the agent refreshed: a manifest by a
			// key the held list knows says so (ErrKeyListStale); one by the new
			// key cannot be trusted to say anything (ErrUnknownKey). The agent
			// refreshes its key list on either.
			wantOnly(t, accept(k1, 2, 2), ErrKeyListStale)

			// v2 {K1, K2}: both accepted.
			if err := tr.UpdateKeyList(mustKeyList(t, root, 2, exp, k1, k2), t0); err != nil {
				t.Fatal(err)
			}
			if err := accept(k2, 2, 2); err != nil {
				t.Fatal(err)
			}
			if err := accept(k1, 3, 2); err != nil {
				t.Fatal(err)
			}

			// v3 {K2}: K1 is refused from now on.
			if err := tr.UpdateKeyList(mustKeyList(t, root, 3, exp, k2), t0); err != nil {
				t.Fatal(err)
			}
			wantOnly(t, accept(k1, 4, 3), ErrUnknownKey)
			if err := accept(k2, 4, 3); err != nil {
				t.Fatal(err)
			}
			// Nor can v2 (which still had K1) be replayed.
			wantOnly(t, tr.UpdateKeyList(mustKeyList(t, root, 2, exp, k1, k2), t0), ErrKeyListRollback)
			wantOnly(t, accept(k1, 5, 3), ErrUnknownKey)
			if st.Serial != 4 {
				t.Fatalf("final serial %d", st.Serial)
			}
		})
	}
}
