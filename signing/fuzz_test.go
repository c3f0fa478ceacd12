package signing

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/drover/drover/manifest"
)

// Fuzz fixtures are deterministic (fixed key seeds, Ed25519 root, fixed
// clock) so that the checked-in seed corpus under testdata/fuzz stays valid.
var (
	fuzzRoot = fixedKey(Ed25519, 1)
	fuzzKeyE = fixedKey(Ed25519, 2)
	fuzzKeyP = fixedKey(ECDSAP256, 3)
	fuzzNow  = time.Date(2030, 6, 1, 0, 0, 0, 0, time.UTC)
	fuzzKeys = []PublicKey{fuzzKeyE.Public(), fuzzKeyP.Public()}
)

const fuzzAgent = "agent-1"

// fuzzTrustRoot holds key list v1 {fuzzKeyE, fuzzKeyP}, signed by fuzzRoot.
// Ed25519 signatures are deterministic, so its bytes never change.
func fuzzTrustRoot(t testing.TB) *TrustRoot {
	env, err := SignKeyList(fuzzRoot, KeyList{Version: 1, ExpiresAt: time.Date(2100, 1, 1, 0, 0, 0, 0, time.UTC), Keys: fuzzKeys})
	if err != nil {
		t.Fatal(err)
	}
	tr, err := NewTrustRoot([]PublicKey{fuzzRoot.Public()}, env, fuzzNow)
	if err != nil {
		t.Fatal(err)
	}
	return tr
}

func fuzzManifest(serial uint64, pipes int) *manifest.Manifest {
	m := newManifest(fuzzAgent, serial, 1, pipes)
	m.IssuedAt = fuzzNow.Add(-time.Hour)
	m.ExpiresAt = time.Date(2100, 1, 1, 0, 0, 0, 0, time.UTC)
	return m
}

// fuzzSeeds are the envelopes written to testdata/fuzz: valid ones by both
// algorithms and near misses that exercise each rejection.
func fuzzSeeds(t testing.TB) map[string][]byte {
	good := encode(t, fuzzManifest(5, 1))
	seeds := map[string][]byte{
		"valid-ed25519":       mustSign(t, fuzzKeyE, manifest.PayloadType, good),
		"valid-ecdsa":         mustSign(t, fuzzKeyP, manifest.PayloadType, good),
		"valid-no-pipes":      mustSign(t, fuzzKeyE, manifest.PayloadType, encode(t, fuzzManifest(6, 0))),
		"valid-three-pipes":   mustSign(t, fuzzKeyE, manifest.PayloadType, encode(t, fuzzManifest(7, 3))),
		"keylist-type":        mustSign(t, fuzzKeyE, KeyListPayloadType, good),
		"root-signed":         mustSign(t, fuzzRoot, manifest.PayloadType, good),
		"invalid-manifest":    mustSign(t, fuzzKeyE, manifest.PayloadType, []byte(`{"agent_id":"agent-1","serial":0}`)),
		"not-json-payload":    mustSign(t, fuzzKeyE, manifest.PayloadType, []byte("\x00\xff")),
		"empty-object":        []byte("{}"),
		"valid-unchanged":     mustSign(t, fuzzKeyE, manifest.PayloadType, encode(t, fuzzManifest(4, 1))),
		"lower-serial":        mustSign(t, fuzzKeyE, manifest.PayloadType, encode(t, fuzzManifest(3, 1))),
		"equal-serial-other":  mustSign(t, fuzzKeyE, manifest.PayloadType, encode(t, fuzzManifest(4, 2))),
		"other-agent":         mustSign(t, fuzzKeyE, manifest.PayloadType, bytes.Replace(good, []byte(fuzzAgent), []byte("agent-2"), 1)),
		"keylist-envelope":    fuzzTrustRoot(t).KeyList,
		"truncated":           good[:len(good)/2],
		"whitespace-envelope": []byte(" {\"payloadType\" : \"x\" , \"payload\":\"eA==\",\"signatures\":[{\"keyid\":\"k\",\"sig\":\"AA==\"}]}\n"),
	}
	return seeds
}

// fuzzState: serial 4 was accepted with the digest of fuzzManifest(4, 1).
func fuzzState(t testing.TB) State {
	return State{AgentID: fuzzAgent, Serial: 4, Digest: Digest(encode(t, fuzzManifest(4, 1)))}
}

// TestWriteFuzzCorpus regenerates testdata/fuzz when DROVER_WRITE_FUZZ_CORPUS=1.
func TestWriteFuzzCorpus(t *testing.T) {
	if os.Getenv("DROVER_WRITE_FUZZ_CORPUS") != "1" {
		t.Skip("set DROVER_WRITE_FUZZ_CORPUS=1 to regenerate testdata/fuzz")
	}
	for _, target := range []string{"FuzzVerify", "FuzzAcceptManifest"} {
		dir := filepath.Join("testdata", "fuzz", target)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		for name, b := range fuzzSeeds(t) {
			body := "go test fuzz v1\n[]byte(" + strconv.Quote(string(b)) + ")\n"
			if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// TestFuzzSeedsBehave pins what the seed corpus exercises, so a seed that
// silently stops reaching its path is noticed.
func TestFuzzSeedsBehave(t *testing.T) {
	tr, st := fuzzTrustRoot(t), fuzzState(t)
	want := map[string]error{
		"valid-ed25519": nil, "valid-ecdsa": nil, "valid-no-pipes": nil, "valid-three-pipes": nil, "valid-unchanged": nil,
		"keylist-type": ErrPayloadType, "root-signed": ErrUnknownKey, "invalid-manifest": ErrInvalidManifest,
		"not-json-payload": ErrInvalidManifest, "empty-object": ErrMalformedEnvelope, "lower-serial": ErrRollback,
		"equal-serial-other": ErrSerialConflict, "other-agent": ErrWrongAgent, "keylist-envelope": ErrPayloadType,
		"truncated": ErrMalformedEnvelope, "whitespace-envelope": ErrPayloadType,
	}
	for _, target := range []string{"FuzzVerify", "FuzzAcceptManifest"} {
		dir := filepath.Join("testdata", "fuzz", target)
		for name, w := range want {
			b, err := os.ReadFile(filepath.Join(dir, name))
			if err != nil {
				t.Fatalf("seed corpus: %v (regenerate with DROVER_WRITE_FUZZ_CORPUS=1)", err)
			}
			env, err := parseCorpusFile(b)
			if err != nil {
				t.Fatalf("%s/%s: %v", target, name, err)
			}
			_, err = AcceptManifest(env, tr, st, fuzzNow, 0)
			if w == nil && err != nil || w != nil && !errors.Is(err, w) {
				t.Errorf("%s/%s: %v, want %v", target, name, err, w)
			}
		}
	}
}

func parseCorpusFile(b []byte) ([]byte, error) {
	const head = "go test fuzz v1\n[]byte("
	if !bytes.HasPrefix(b, []byte(head)) || !bytes.HasSuffix(b, []byte(")\n")) {
		return nil, fmt.Errorf("not a single []byte corpus file")
	}
	s, err := strconv.Unquote(string(b[len(head) : len(b)-2]))
	return []byte(s), err
}

// envelopeSentinels are the only errors Verify may return.
var envelopeSentinels = []error{ErrMalformedEnvelope, ErrPayloadType, ErrUnknownKey, ErrBadSignature}

func FuzzVerify(f *testing.F) {
	f.Add([]byte(`{"payloadType":"","payload":"","signatures":[]}`))
	f.Fuzz(func(t *testing.T, env []byte) {
		payload, kid, err := Verify(env, manifest.PayloadType, fuzzKeys)
		if err != nil {
			if payload != nil || kid != "" {
				t.Fatalf("rejected envelope returned payload %q key %q", payload, kid)
			}
			for _, s := range envelopeSentinels {
				if errors.Is(err, s) {
					return
				}
			}
			t.Fatalf("error without a sentinel: %v", err)
		}
		var key PublicKey
		for _, k := range fuzzKeys {
			if k.ID == kid {
				key = k
			}
		}
		if key.ID == "" {
			t.Fatalf("accepted with key %q, which is not trusted", kid)
		}
		// Independent check with the standard library: the returned bytes are
		// exactly what a signature by that key covers.
		if err := oracleVerify(env, manifest.PayloadType, payload, key); err != nil {
			t.Fatalf("accepted, but the standard library disagrees: %v\n%q", err, env)
		}
	})
}

func FuzzAcceptManifest(f *testing.F) {
	tr, st := fuzzTrustRoot(f), fuzzState(f)
	const maxBytes = 64 << 10
	f.Fuzz(func(t *testing.T, env []byte) {
		held := append([]byte(nil), tr.KeyList...)
		acc, err := AcceptManifest(env, tr, st, fuzzNow, maxBytes)
		if !bytes.Equal(held, tr.KeyList) {
			t.Fatal("AcceptManifest changed the trust root")
		}
		if len(env) > maxBytes && !errors.Is(err, ErrTooLarge) {
			t.Fatalf("oversize envelope: %v", err)
		}
		if err != nil {
			if acc != nil {
				t.Fatalf("rejected envelope returned %+v", acc)
			}
			for _, s := range sentinels {
				if errors.Is(err, s) {
					return
				}
			}
			t.Fatalf("error without a sentinel: %v", err)
		}
		m := acc.Manifest
		switch {
		case acc.Digest != Digest(acc.Payload):
			t.Fatalf("digest %s is not that of the payload", acc.Digest)
		case m.AgentID != st.AgentID:
			t.Fatalf("accepted a manifest for %q", m.AgentID)
		case m.Serial < st.Serial || m.Serial == st.Serial && (!acc.Unchanged || acc.Digest != st.Digest):
			t.Fatalf("serial %d accepted after %d (unchanged %v)", m.Serial, st.Serial, acc.Unchanged)
		case acc.Unchanged != (m.Serial == st.Serial):
			t.Fatalf("unchanged %v for serial %d", acc.Unchanged, m.Serial)
		case !fuzzNow.Before(m.ExpiresAt) || m.IssuedAt.After(fuzzNow.Add(MaxClockSkew)):
			t.Fatalf("accepted outside its validity: %s - %s", m.IssuedAt, m.ExpiresAt)
		case m.KeyListVersion != 1:
			t.Fatalf("accepted key list version %d", m.KeyListVersion)
		}
		if err := m.Validate(); err != nil {
			t.Fatalf("accepted an invalid manifest: %v", err)
		}
		var key PublicKey
		for _, k := range fuzzKeys {
			if k.ID == acc.KeyID {
				key = k
			}
		}
		if err := oracleVerify(env, manifest.PayloadType, acc.Payload, key); err != nil {
			t.Fatalf("accepted, but the standard library disagrees: %v", err)
		}
	})
}
