package signing

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestKeyRoundTrip(t *testing.T) {
	for _, alg := range algs {
		t.Run(string(alg), func(t *testing.T) {
			s := mustKey(t, alg)
			if s.Algorithm() != alg || s.Public().Algorithm != alg {
				t.Fatalf("algorithm %s / %s, want %s", s.Algorithm(), s.Public().Algorithm, alg)
			}
			// KeyID is the hex sha256 of the SPKI DER.
			block, _ := pem.Decode([]byte(s.Public().PEM))
			if block == nil || block.Type != "PUBLIC KEY" {
				t.Fatalf("public PEM %q", s.Public().PEM)
			}
			sum := sha256.Sum256(block.Bytes)
			if want := hex.EncodeToString(sum[:]); s.KeyID() != want || s.Public().ID != want {
				t.Fatalf("key id %s, want %s", s.KeyID(), want)
			}
			if err := s.Public().Validate(); err != nil {
				t.Fatal(err)
			}
			pk, err := ParsePublicKeyPEM([]byte(s.Public().PEM))
			if err != nil || pk != s.Public() {
				t.Fatalf("ParsePublicKeyPEM: %+v, %v", pk, err)
			}

			b, err := s.MarshalPEM()
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.HasPrefix(b, []byte("-----BEGIN PRIVATE KEY-----\n")) {
				t.Fatalf("not PKCS#8 PEM: %q", b[:40])
			}
			s2, err := ParseSignerPEM(b)
			if err != nil {
				t.Fatal(err)
			}
			if s2.KeyID() != s.KeyID() || s2.Algorithm() != alg {
				t.Fatalf("parsed key %s %s, want %s %s", s2.KeyID(), s2.Algorithm(), s.KeyID(), alg)
			}

			// A signature by the parsed key verifies under the original public key.
			payload := []byte(`{"hello":"world"}`)
			env := mustSign(t, s2, "application/x-test", payload)
			got, kid, err := Verify(env, "application/x-test", []PublicKey{s.Public()})
			if err != nil || !bytes.Equal(got, payload) || kid != s.KeyID() {
				t.Fatalf("Verify = %q, %s, %v", got, kid, err)
			}
			if err := oracleVerify(env, "application/x-test", payload, s.Public()); err != nil {
				t.Fatalf("standard-library check: %v", err)
			}
		})
	}
}

func TestGenerateKeyAlgorithms(t *testing.T) {
	s, err := GenerateKey("")
	if err != nil || s.Algorithm() != Ed25519 {
		t.Fatalf("default algorithm: %v, %v", s, err)
	}
	if a, b := mustKey(t, Ed25519), mustKey(t, Ed25519); a.KeyID() == b.KeyID() {
		t.Fatal("two generated keys share an id")
	}
	for _, alg := range []Algorithm{"rsa", "ecdsa-p384", "ED25519"} {
		_, err := GenerateKey(alg)
		wantOnly(t, err, ErrInvalidKey)
	}
}

func TestParseRefusesOtherKeys(t *testing.T) {
	rsaKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	p384, err := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	p256, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	pkcs8 := func(k any) []byte {
		der, err := x509.MarshalPKCS8PrivateKey(k)
		if err != nil {
			t.Fatal(err)
		}
		return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})
	}
	pkix := func(k any) []byte {
		der, err := x509.MarshalPKIXPublicKey(k)
		if err != nil {
			t.Fatal(err)
		}
		return pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der})
	}
	sec1, err := x509.MarshalECPrivateKey(p256)
	if err != nil {
		t.Fatal(err)
	}
	good := pkcs8(p256)
	privCases := map[string][]byte{
		"rsa":            pkcs8(rsaKey),
		"p384":           pkcs8(p384),
		"sec1 EC block":  pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: sec1}),
		"public block":   pkix(&p256.PublicKey),
		"garbage":        []byte("not a key"),
		"empty":          nil,
		"trailing data":  append(append([]byte{}, good...), "junk"...),
		"two blocks":     append(append([]byte{}, good...), good...),
		"headers":        pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Headers: map[string]string{"Proc-Type": "4,ENCRYPTED"}, Bytes: []byte{1}}),
		"bad pkcs8 body": pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: []byte{0x30, 0x00}}),
	}
	for name, b := range privCases {
		if _, err := ParseSignerPEM(b); err == nil {
			t.Errorf("ParseSignerPEM(%s) succeeded", name)
		} else {
			wantOnly(t, err, ErrInvalidKey)
		}
	}
	if _, err := ParseSignerPEM(good); err != nil {
		t.Fatalf("P-256 PKCS#8: %v", err)
	}

	pubCases := map[string][]byte{
		"rsa":           pkix(&rsaKey.PublicKey),
		"p384":          pkix(&p384.PublicKey),
		"private block": good,
		"garbage":       []byte("-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n"),
	}
	for name, b := range pubCases {
		if _, err := ParsePublicKeyPEM(b); err == nil {
			t.Errorf("ParsePublicKeyPEM(%s) succeeded", name)
		} else {
			wantOnly(t, err, ErrInvalidKey)
		}
		// A hand-made PublicKey around it is refused by Validate too.
		sum := sha256.Sum256(b)
		k := PublicKey{ID: hex.EncodeToString(sum[:]), Algorithm: ECDSAP256, PEM: string(b)}
		wantOnly(t, k.Validate(), ErrInvalidKey)
	}
}

func TestPublicKeyValidate(t *testing.T) {
	ed, ec := mustKey(t, Ed25519), mustKey(t, ECDSAP256)
	cases := map[string]PublicKey{
		"id of another key":   {ID: ec.KeyID(), Algorithm: Ed25519, PEM: ed.Public().PEM},
		"uppercase id":        {ID: strings.ToUpper(ed.KeyID()), Algorithm: Ed25519, PEM: ed.Public().PEM},
		"algorithm mismatch":  {ID: ed.KeyID(), Algorithm: ECDSAP256, PEM: ed.Public().PEM},
		"unknown algorithm":   {ID: ed.KeyID(), Algorithm: "rsa", PEM: ed.Public().PEM},
		"empty":               {},
		"pem with trailing":   {ID: ed.KeyID(), Algorithm: Ed25519, PEM: ed.Public().PEM + "x"},
		"pem of another key":  {ID: ed.KeyID(), Algorithm: ECDSAP256, PEM: ec.Public().PEM},
		"missing pem, has id": {ID: ed.KeyID(), Algorithm: Ed25519},
	}
	for name, k := range cases {
		t.Run(name, func(t *testing.T) { wantOnly(t, k.Validate(), ErrInvalidKey) })
	}
}

func TestWriteLoadSigner(t *testing.T) {
	for _, alg := range algs {
		t.Run(string(alg), func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, "manifest.key")
			s := mustKey(t, alg)
			if err := WriteSigner(path, s); err != nil {
				t.Fatal(err)
			}
			fi, err := os.Stat(path)
			if err != nil {
				t.Fatal(err)
			}
			if fi.Mode().Perm() != 0o600 {
				t.Fatalf("written mode %#o, want 0600", fi.Mode().Perm())
			}
			got, err := LoadSigner(path)
			if err != nil {
				t.Fatal(err)
			}
			if got.KeyID() != s.KeyID() {
				t.Fatalf("loaded %s, wrote %s", got.KeyID(), s.KeyID())
			}

			// Overwriting an existing, too-open file leaves a 0600 file and no temp files.
			if err := os.Chmod(path, 0o644); err != nil {
				t.Fatal(err)
			}
			_, err = LoadSigner(path)
			wantOnly(t, err, ErrInsecureKeyFile)
			if !strings.Contains(err.Error(), "chmod 600") {
				t.Errorf("error does not say how to fix it: %v", err)
			}
			s2 := mustKey(t, alg)
			if err := WriteSigner(path, s2); err != nil {
				t.Fatal(err)
			}
			if fi, _ := os.Stat(path); fi.Mode().Perm() != 0o600 {
				t.Fatalf("rewritten mode %#o, want 0600", fi.Mode().Perm())
			}
			if got, err := LoadSigner(path); err != nil || got.KeyID() != s2.KeyID() {
				t.Fatalf("after rewrite: %v", err)
			}
			entries, _ := os.ReadDir(dir)
			if len(entries) != 1 {
				t.Fatalf("directory holds %d entries, want only the key", len(entries))
			}
		})
	}
}

func TestLoadSignerRefusesOpenModes(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "k.pem")
	if err := WriteSigner(path, mustKey(t, Ed25519)); err != nil {
		t.Fatal(err)
	}
	for _, mode := range []os.FileMode{0o644, 0o640, 0o604, 0o620, 0o602, 0o601, 0o610, 0o666} {
		if err := os.Chmod(path, mode); err != nil {
			t.Fatal(err)
		}
		_, err := LoadSigner(path)
		wantOnly(t, err, ErrInsecureKeyFile)
	}
	for _, mode := range []os.FileMode{0o600, 0o400} {
		if err := os.Chmod(path, mode); err != nil {
			t.Fatal(err)
		}
		if _, err := LoadSigner(path); err != nil {
			t.Fatalf("mode %#o: %v", mode, err)
		}
	}
	// Not a regular file.
	sub := filepath.Join(dir, "d")
	if err := os.Mkdir(sub, 0o700); err != nil {
		t.Fatal(err)
	}
	_, err := LoadSigner(sub)
	wantOnly(t, err, ErrInsecureKeyFile)
	// Missing file: an ordinary error, no sentinel.
	if _, err := LoadSigner(filepath.Join(dir, "missing")); err == nil || !os.IsNotExist(err) && !strings.Contains(err.Error(), "no such file") {
		t.Fatalf("missing file: %v", err)
	}
	// A private file that holds no key.
	junk := filepath.Join(dir, "junk")
	if err := os.WriteFile(junk, []byte("hello"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = LoadSigner(junk)
	wantOnly(t, err, ErrInvalidKey)
	// WriteSigner into a missing directory fails and leaves nothing.
	if err := WriteSigner(filepath.Join(dir, "nope", "k.pem"), mustKey(t, Ed25519)); err == nil {
		t.Fatal("WriteSigner into a missing directory succeeded")
	}
}
