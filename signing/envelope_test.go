package signing

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"testing"

	"github.com/drover/drover/manifest"
)

func TestSignEnvelopeFormat(t *testing.T) {
	for _, alg := range algs {
		t.Run(string(alg), func(t *testing.T) {
			s := mustKey(t, alg)
			payload := []byte("exact \x00 bytes\n")
			env := mustSign(t, s, manifest.PayloadType, payload)
			var fields map[string]json.RawMessage
			if err := json.Unmarshal(env, &fields); err != nil {
				t.Fatal(err)
			}
			var names []string
			for k := range fields {
				names = append(names, k)
			}
			sort.Strings(names)
			if strings.Join(names, ",") != "payload,payloadType,signatures" {
				t.Fatalf("envelope fields %v", names)
			}
			var e rawEnvelope
			if err := json.Unmarshal(env, &e); err != nil {
				t.Fatal(err)
			}
			if e.PayloadType != manifest.PayloadType || e.Payload != base64.StdEncoding.EncodeToString(payload) {
				t.Fatalf("envelope %s", env)
			}
			if len(e.Signatures) != 1 || e.Signatures[0].KeyID != s.KeyID() {
				t.Fatalf("signatures %+v", e.Signatures)
			}
			if err := oracleVerify(env, manifest.PayloadType, payload, s.Public()); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func TestSignRefuses(t *testing.T) {
	s := mustKey(t, Ed25519)
	for _, pt := range []string{"", "has space", "tab\t", "é", strings.Repeat("a", 257)} {
		if _, err := Sign(s, pt, []byte("x")); err == nil {
			t.Errorf("Sign with payload type %q succeeded", pt)
		}
	}
	if _, err := Sign(s, manifest.PayloadType, nil); err == nil {
		t.Error("Sign of an empty payload succeeded")
	}
	if _, err := Sign(nil, manifest.PayloadType, []byte("x")); err == nil {
		t.Error("Sign with a nil signer succeeded")
	}
	if _, err := Sign(&Signer{}, manifest.PayloadType, []byte("x")); err == nil {
		t.Error("Sign with a zero signer succeeded")
	}
}

func TestVerifyRejections(t *testing.T) {
	k1, k2 := mustKey(t, Ed25519), mustKey(t, ECDSAP256)
	payload := []byte(`{"a":1}`)
	env1 := mustSign(t, k1, manifest.PayloadType, payload)
	env2 := mustSign(t, k2, manifest.PayloadType, payload)

	// Relabel env2's signature with k1's id.
	relabeled := bytes.Replace(env2, []byte(k2.KeyID()), []byte(k1.KeyID()), 1)

	cases := []struct {
		name string
		env  []byte
		pt   string
		keys []PublicKey
		want error
		also []error
	}{
		{"swapped payload type", env1, KeyListPayloadType, []PublicKey{k1.Public()}, ErrPayloadType, nil},
		{"key not trusted", env2, manifest.PayloadType, []PublicKey{k1.Public()}, ErrUnknownKey, nil},
		{"no keys", env1, manifest.PayloadType, nil, ErrUnknownKey, nil},
		// The trusted entry claims k1's id but holds k2's key: its id is not
		// the hash of its key, so it is never used, even though k2 signed.
		{"keyid alone not trusted", relabeled, manifest.PayloadType,
			[]PublicKey{{ID: k1.KeyID(), Algorithm: ECDSAP256, PEM: k2.Public().PEM}}, ErrUnknownKey, []error{ErrInvalidKey}},
		// Relabelled to a trusted id, the signature does not verify under that key.
		{"relabelled signature", relabeled, manifest.PayloadType, []PublicKey{k1.Public()}, ErrBadSignature, nil},
		{"algorithm field lies", env1, manifest.PayloadType,
			[]PublicKey{{ID: k1.KeyID(), Algorithm: ECDSAP256, PEM: k1.Public().PEM}}, ErrUnknownKey, []error{ErrInvalidKey}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p, kid, err := Verify(c.env, c.pt, c.keys)
			if p != nil || kid != "" {
				t.Fatalf("rejected Verify returned payload %q key %q", p, kid)
			}
			wantOnly(t, err, c.want, c.also...)
		})
	}
}

func TestVerifySeveralSignatures(t *testing.T) {
	k1, k2, k3 := mustKey(t, Ed25519), mustKey(t, ECDSAP256), mustKey(t, Ed25519)
	payload := []byte("payload")
	var e1, e2, e3 rawEnvelope
	for _, x := range []struct {
		s *Signer
		e *rawEnvelope
	}{{k1, &e1}, {k2, &e2}, {k3, &e3}} {
		if err := json.Unmarshal(mustSign(t, x.s, manifest.PayloadType, payload), x.e); err != nil {
			t.Fatal(err)
		}
	}
	merged := e3
	merged.Signatures = append(merged.Signatures, e2.Signatures...)
	merged.Signatures = append(merged.Signatures, e1.Signatures...)
	env, err := json.Marshal(merged)
	if err != nil {
		t.Fatal(err)
	}
	// k3 is unknown, k2 is trusted: verified by k2.
	_, kid, err := Verify(env, manifest.PayloadType, []PublicKey{k1.Public(), k2.Public()})
	if err != nil || kid != k2.KeyID() {
		t.Fatalf("Verify = %s, %v; want %s", kid, err, k2.KeyID())
	}
	// A forged signature claiming k1 does not block a good one by k1.
	forged := e1
	forged.Signatures = append(append(forged.Signatures[:0:0], e1.Signatures...), e1.Signatures...)
	forged.Signatures[0].Sig = e3.Signatures[0].Sig
	env, _ = json.Marshal(forged)
	if _, kid, err := Verify(env, manifest.PayloadType, []PublicKey{k1.Public()}); err != nil || kid != k1.KeyID() {
		t.Fatalf("Verify = %s, %v", kid, err)
	}
	// Only the forged one: bad signature.
	forged.Signatures = forged.Signatures[:1]
	env, _ = json.Marshal(forged)
	_, _, err = Verify(env, manifest.PayloadType, []PublicKey{k1.Public()})
	wantOnly(t, err, ErrBadSignature)
}

func TestVerifyMalformed(t *testing.T) {
	k := mustKey(t, Ed25519)
	payload := []byte("hello, world!!") // 14 bytes: base64 ends in one "=", with 2 spare bits
	env := mustSign(t, k, manifest.PayloadType, payload)
	var e rawEnvelope
	if err := json.Unmarshal(env, &e); err != nil {
		t.Fatal(err)
	}
	sig, kid, p := e.Signatures[0].Sig, e.Signatures[0].KeyID, e.Payload
	mk := func(format string, args ...any) []byte { return []byte(fmt.Sprintf(format, args...)) }
	pt := manifest.PayloadType
	// Non-canonical payload: same bytes, non-zero trailing bits in the last char.
	last := p[len(p)-2]
	alt := strings.IndexByte("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/", last) + 1
	nonCanon := p[:len(p)-2] + string("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"[alt]) + "="
	if got, err := base64.StdEncoding.DecodeString(nonCanon); err != nil || !bytes.Equal(got, payload) {
		t.Fatalf("test setup: %q does not decode leniently to the payload (%v)", nonCanon, err)
	}
	ok := mk(`{"payloadType":%q,"payload":%q,"signatures":[{"keyid":%q,"sig":%q}]}`, pt, p, kid, sig)
	if _, _, err := Verify(ok, pt, []PublicKey{k.Public()}); err != nil {
		t.Fatalf("hand-built envelope: %v", err)
	}
	// With whitespace between tokens, it is still the same envelope.
	spaced := mk(" {\n \"payloadType\" : %q ,\t\"payload\":%q,\"signatures\":[ {\"keyid\":%q,\"sig\":%q} ] }\n", pt, p, kid, sig)
	if got, _, err := Verify(spaced, pt, []PublicKey{k.Public()}); err != nil || !bytes.Equal(got, payload) {
		t.Fatalf("whitespace: %v", err)
	}
	cases := map[string][]byte{
		"empty":                nil,
		"not json":             []byte("hello"),
		"array":                []byte("[]"),
		"string":               []byte(`"x"`),
		"null":                 []byte("null"),
		"truncated":            ok[:len(ok)-1],
		"trailing garbage":     append(append([]byte{}, ok...), 'x'),
		"two objects":          append(append([]byte{}, ok...), ok...),
		"unknown field":        mk(`{"payloadType":%q,"payload":%q,"signatures":[{"keyid":%q,"sig":%q}],"x":1}`, pt, p, kid, sig),
		"unknown sig field":    mk(`{"payloadType":%q,"payload":%q,"signatures":[{"keyid":%q,"sig":%q,"cert":""}]}`, pt, p, kid, sig),
		"duplicate field":      mk(`{"payloadType":%q,"payload":%q,"payload":%q,"signatures":[{"keyid":%q,"sig":%q}]}`, pt, p, p, kid, sig),
		"duplicate keyid":      mk(`{"payloadType":%q,"payload":%q,"signatures":[{"keyid":"x","keyid":%q,"sig":%q}]}`, pt, p, kid, sig),
		"case variant name":    mk(`{"PayloadType":%q,"payload":%q,"signatures":[{"keyid":%q,"sig":%q}]}`, pt, p, kid, sig),
		"case variant keyid":   mk(`{"payloadType":%q,"payload":%q,"signatures":[{"keyID":%q,"sig":%q}]}`, pt, p, kid, sig),
		"missing payload":      mk(`{"payloadType":%q,"signatures":[{"keyid":%q,"sig":%q}]}`, pt, kid, sig),
		"missing keyid":        mk(`{"payloadType":%q,"payload":%q,"signatures":[{"sig":%q}]}`, pt, p, sig),
		"empty keyid":          mk(`{"payloadType":%q,"payload":%q,"signatures":[{"keyid":"","sig":%q}]}`, pt, p, sig),
		"no signatures":        mk(`{"payloadType":%q,"payload":%q,"signatures":[]}`, pt, p),
		"null signatures":      mk(`{"payloadType":%q,"payload":%q,"signatures":null}`, pt, p),
		"signature not object": mk(`{"payloadType":%q,"payload":%q,"signatures":[%q]}`, pt, p, sig),
		"sig not string":       mk(`{"payloadType":%q,"payload":%q,"signatures":[{"keyid":%q,"sig":1}]}`, pt, p, kid),
		"payload not string":   mk(`{"payloadType":%q,"payload":{},"signatures":[{"keyid":%q,"sig":%q}]}`, pt, kid, sig),
		"empty payload":        mk(`{"payloadType":%q,"payload":"","signatures":[{"keyid":%q,"sig":%q}]}`, pt, kid, sig),
		"url-safe base64":      mk(`{"payloadType":%q,"payload":%q,"signatures":[{"keyid":%q,"sig":%q}]}`, pt, base64.URLEncoding.EncodeToString([]byte{0xfb, 0xff}), kid, sig),
		"unpadded payload":     mk(`{"payloadType":%q,"payload":%q,"signatures":[{"keyid":%q,"sig":%q}]}`, pt, strings.TrimRight(p, "="), kid, sig),
		"non-canonical bits":   mk(`{"payloadType":%q,"payload":%q,"signatures":[{"keyid":%q,"sig":%q}]}`, pt, nonCanon, kid, sig),
		"escaped newline":      mk(`{"payloadType":%q,"payload":"%s\n%s","signatures":[{"keyid":%q,"sig":%q}]}`, pt, p[:4], p[4:], kid, sig),
		"escaped char":         mk(`{"payloadType":%q,"payload":"\u00%x%s","signatures":[{"keyid":%q,"sig":%q}]}`, pt, p[0], p[1:], kid, sig),
		"sig with newline":     mk(`{"payloadType":%q,"payload":%q,"signatures":[{"keyid":%q,"sig":"%s\r\n%s"}]}`, pt, p, kid, sig[:8], sig[8:]),
		"too many signatures": mk(`{"payloadType":%q,"payload":%q,"signatures":[%s]}`, pt, p,
			strings.TrimSuffix(strings.Repeat(fmt.Sprintf(`{"keyid":%q,"sig":%q},`, kid, sig), MaxSignatures+1), ",")),
	}
	for name, b := range cases {
		t.Run(name, func(t *testing.T) {
			got, _, err := Verify(b, pt, []PublicKey{k.Public()})
			// "escaped char" spells the first payload character as a JSON
			// \u escape: the decoded envelope is identical, so it verifies
			// and yields the identical payload. (Not reachable by a one-byte
			// flip: it needs five more bytes.)
			if name == "escaped char" {
				if err != nil || !bytes.Equal(got, payload) {
					t.Fatalf("JSON-escaped but identical envelope: %q, %v", got, err)
				}
				return
			}
			if got != nil {
				t.Fatalf("returned payload %q", got)
			}
			wantOnly(t, err, ErrMalformedEnvelope)
		})
	}
}

// region names where a byte sits in a compact envelope.
func regions(t *testing.T, env []byte) func(i int) string {
	t.Helper()
	type span struct {
		name       string
		start, end int
	}
	var spans []span
	for _, f := range []struct{ name, key string }{
		{"payloadType", `"payloadType":"`}, {"payload", `"payload":"`},
		{"keyid", `"keyid":"`}, {"sig", `"sig":"`},
	} {
		i := bytes.Index(env, []byte(f.key))
		if i < 0 {
			t.Fatalf("envelope has no %s", f.key)
		}
		start := i + len(f.key)
		end := start + bytes.IndexByte(env[start:], '"')
		spans = append(spans, span{f.name, start, end})
	}
	return func(i int) string {
		for _, s := range spans {
			if i >= s.start && i < s.end {
				return s.name
			}
		}
		return "structure"
	}
}

// TestFlipEveryByte flips every bit of every byte of a small signed manifest
// envelope (and inverts every byte) and runs AcceptManifest on each result.
// Every variant must be rejected with the sentinel its region allows:
//
//	structure (braces, quotes, names, ':' ',')  -> ErrMalformedEnvelope
//	payloadType value                           -> ErrPayloadType, or malformed when the flip makes a '"', '\' or control char
//	payload value                               -> ErrBadSignature, or malformed (not canonical base64)
//	keyid value                                 -> ErrUnknownKey, or malformed
//	sig value                                   -> ErrBadSignature, or malformed
//
// No position is semantically neutral: the envelope is compact (no
// whitespace to flip), field names are matched exactly (encoding/json would
// fold case), unknown/duplicate fields are refused, base64 must be canonical
// standard base64 (a lenient decoder ignores spare trailing bits and CR/LF),
// and keyids are compared exactly. The test fails if any flip is accepted.
func TestFlipEveryByte(t *testing.T) {
	for _, alg := range algs {
		t.Run(string(alg), func(t *testing.T) {
			root, k1 := mustKey(t, Ed25519), mustKey(t, alg)
			tr := mustTrustRoot(t, root, mustKeyList(t, root, 1, t0.AddDate(1, 0, 0), k1))
			m := newManifest("agent-1", 7, 1, 0)
			env := signManifest(t, k1, m)
			st := State{AgentID: "agent-1", Serial: 6}
			if _, err := AcceptManifest(env, tr, st, t0, 0); err != nil {
				t.Fatalf("untampered envelope: %v", err)
			}
			region := regions(t, env)
			allowed := map[string][]error{
				"structure":   {ErrMalformedEnvelope},
				"payloadType": {ErrPayloadType, ErrMalformedEnvelope},
				"payload":     {ErrBadSignature, ErrMalformedEnvelope},
				"keyid":       {ErrUnknownKey, ErrMalformedEnvelope},
				"sig":         {ErrBadSignature, ErrMalformedEnvelope},
			}
			counts := map[string]map[string]int{}
			masks := []byte{1, 2, 4, 8, 16, 32, 64, 128, 0xff}
			flipped := make([]byte, len(env))
			for i := range env {
				r := region(i)
				for _, mask := range masks {
					copy(flipped, env)
					flipped[i] ^= mask
					acc, err := AcceptManifest(flipped, tr, st, t0, 0)
					if err == nil {
						t.Fatalf("flip %#02x at %d (%s, %q->%q) accepted: %+v", mask, i, r, env[i], flipped[i], acc)
					}
					which := ""
					for _, s := range allowed[r] {
						if errors.Is(err, s) {
							which = s.Error()
							break
						}
					}
					if which == "" {
						t.Fatalf("flip %#02x at %d (%s, %q->%q): %v, want one of %v", mask, i, r, env[i], flipped[i], err, allowed[r])
					}
					if counts[r] == nil {
						counts[r] = map[string]int{}
					}
					counts[r][which]++
				}
			}
			t.Logf("%d-byte envelope, %d variants: %v", len(env), len(env)*len(masks), counts)
		})
	}
}
