package signing

import (
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"math/big"
	"testing"
	"time"

	"github.com/drover/drover/manifest"
)

// t0 is the fixed "now" of every test.
var t0 = time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)

var algs = []Algorithm{Ed25519, ECDSAP256}

// sentinels lists every sentinel error, for "exactly this one" assertions.
var sentinels = []error{
	ErrTooLarge, ErrMalformedEnvelope, ErrPayloadType, ErrBadSignature, ErrUnknownKey,
	ErrKeyListExpired, ErrKeyListRollback, ErrKeyListStale, ErrKeyListMismatch, ErrInvalidKeyList,
	ErrWrongAgent, ErrRollback, ErrSerialConflict, ErrExpired, ErrNotYetValid, ErrInvalidManifest,
	ErrInvalidKey, ErrInsecureKeyFile,
}

// wantOnly fails unless err wraps want and no other sentinel except those in also.
func wantOnly(t testing.TB, err, want error, also ...error) {
	t.Helper()
	if err == nil {
		t.Fatalf("got nil error, want %v", want)
	}
	if !errors.Is(err, want) {
		t.Fatalf("got %v, want %v", err, want)
	}
next:
	for _, s := range sentinels {
		if s == want || !errors.Is(err, s) {
			continue
		}
		for _, a := range also {
			if a == s {
				continue next
			}
		}
		t.Fatalf("error %q wraps %v as well as %v", err, s, want)
	}
}

func mustKey(t testing.TB, alg Algorithm) *Signer {
	t.Helper()
	s, err := GenerateKey(alg)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// fixedKey returns a deterministic key for fuzz seeds: the same seed gives
// the same key id on every run.
func fixedKey(alg Algorithm, seed byte) *Signer {
	b := make([]byte, 32)
	for i := range b {
		b[i] = seed + byte(i)
	}
	var s *Signer
	var err error
	switch alg {
	case Ed25519:
		s, err = newSigner(ed25519.NewKeyFromSeed(b))
	case ECDSAP256:
		var k *ecdsa.PrivateKey
		k, err = ecdsa.ParseRawPrivateKey(elliptic.P256(), b)
		if err == nil {
			s, err = newSigner(k)
		}
	}
	if err != nil {
		panic(err)
	}
	return s
}

func mustKeyList(t testing.TB, root *Signer, version uint64, expires time.Time, keys ...*Signer) []byte {
	t.Helper()
	kl := KeyList{Version: version, ExpiresAt: expires}
	for _, k := range keys {
		kl.Keys = append(kl.Keys, k.Public())
	}
	env, err := SignKeyList(root, kl)
	if err != nil {
		t.Fatal(err)
	}
	return env
}

func mustTrustRoot(t testing.TB, root *Signer, keyListEnv []byte) *TrustRoot {
	t.Helper()
	tr, err := NewTrustRoot([]PublicKey{root.Public()}, keyListEnv, t0)
	if err != nil {
		t.Fatal(err)
	}
	return tr
}

var timezones = []string{"UTC", "Europe/Berlin", "America/New_York", "Asia/Tokyo", "Australia/Sydney", "Europe/London", "America/Sao_Paulo"}
var schedules = []string{"*/5 * * * *", "30 2 * * *", "0 */6 * * *", "@hourly", "@daily", "15 4 * * 1-5", "0 0 1 * *", "@every 10m", "45 23 * * sun", "0 9-17 * * mon-fri"}

// realisticPipe builds a normalised manifest pipe as the server would.
func realisticPipe(i int) manifest.Pipe {
	name := fmt.Sprintf("pipe-%04d", i)
	s := manifest.Spec{
		Name:        name,
		Description: fmt.Sprintf("Nightly job %d for the reporting database", i),
		Schedule:    schedules[i%len(schedules)],
		Timezone:    timezones[i%len(timezones)],
		Env:         map[string]string{"PGHOST": "db.internal", "REPORT": name, "RETENTION_DAYS": "14"},
		Secrets:     []string{"PGPASSWORD"},
		RunAs:       "reporting",
		Timeout:     manifest.Duration(30 * time.Minute),
		Jitter:      manifest.Duration(5 * time.Minute),
		Limits:      manifest.Limits{CPUPercent: 50, MemoryMB: 512, Tasks: 64},
	}
	var payload []byte
	if i%3 == 0 {
		s.Command = []string{"./run.sh", "--full", "--shard", fmt.Sprint(i % 16)}
		s.Files = []string{"run.sh", "lib/"}
		payload = []byte(fmt.Sprintf("bundle %d", i))
	} else {
		s.Script = fmt.Sprintf("set -eu\npg_dump --schema=report_%d mydb | gzip > /var/backups/report-%d.sql.gz\nfind /var/backups -name 'report-%d.*' -mtime +14 -delete\n", i, i, i)
		payload = []byte(s.Script)
	}
	s.Normalize()
	return manifest.Pipe{
		Name:    name,
		Version: uint64(i%7 + 1),
		Spec:    s,
		Payload: manifest.Payload{Digest: Digest(payload), Size: int64(len(payload))},
	}
}

func newManifest(agent string, serial, klv uint64, pipes int) *manifest.Manifest {
	m := &manifest.Manifest{
		AgentID:        agent,
		Serial:         serial,
		IssuedAt:       t0.Add(-time.Hour),
		ExpiresAt:      t0.Add(-time.Hour + manifest.DefaultLifetime),
		KeyListVersion: klv,
	}
	for i := 0; i < pipes; i++ {
		m.Pipes = append(m.Pipes, realisticPipe(i))
	}
	return m
}

func encode(t testing.TB, m *manifest.Manifest) []byte {
	t.Helper()
	b, err := m.Encode()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func mustSign(t testing.TB, s *Signer, payloadType string, payload []byte) []byte {
	t.Helper()
	env, err := Sign(s, payloadType, payload)
	if err != nil {
		t.Fatal(err)
	}
	return env
}

func signManifest(t testing.TB, s *Signer, m *manifest.Manifest) []byte {
	t.Helper()
	return mustSign(t, s, manifest.PayloadType, encode(t, m))
}

// rawEnvelope is a lenient view of an envelope for tests and oracles.
type rawEnvelope struct {
	PayloadType string `json:"payloadType"`
	Payload     string `json:"payload"`
	Signatures  []struct {
		KeyID string `json:"keyid"`
		Sig   string `json:"sig"`
	} `json:"signatures"`
}

// pae is an independent implementation of DSSE's pre-authentication encoding.
func pae(payloadType string, payload []byte) []byte {
	return []byte(fmt.Sprintf("DSSEv1 %d %s %d %s", len(payloadType), payloadType, len(payload), payload))
}

// oracleVerify checks with the standard library only that env carries a
// signature by key over PAE(payloadType, payload).
func oracleVerify(env []byte, payloadType string, payload []byte, key PublicKey) error {
	var e rawEnvelope
	if err := json.Unmarshal(env, &e); err != nil {
		return err
	}
	if e.PayloadType != payloadType {
		return fmt.Errorf("payload type %q", e.PayloadType)
	}
	if got, err := base64.StdEncoding.DecodeString(e.Payload); err != nil || string(got) != string(payload) {
		return fmt.Errorf("payload differs from the envelope's (%v)", err)
	}
	pub, err := parsePublicPEM([]byte(key.PEM))
	if err != nil {
		return err
	}
	msg := pae(payloadType, payload)
	for _, s := range e.Signatures {
		if s.KeyID != key.ID {
			continue
		}
		sig, err := base64.StdEncoding.DecodeString(s.Sig)
		if err != nil {
			continue
		}
		switch k := pub.(type) {
		case ed25519.PublicKey:
			if ed25519.Verify(k, msg, sig) {
				return nil
			}
		case *ecdsa.PublicKey:
			h := sha256.Sum256(msg)
			if ecdsa.VerifyASN1(k, h[:], sig) {
				return nil
			}
			// sigstore also accepts the IEEE P1363 form r||s.
			if len(sig) == 64 && ecdsa.Verify(k, h[:], new(big.Int).SetBytes(sig[:32]), new(big.Int).SetBytes(sig[32:])) {
				return nil
			}
		}
	}
	return errors.New("no signature by the key verifies")
}
