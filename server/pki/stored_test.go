package pki_test

import (
	"bytes"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/drover/drover/server/errs"
	"github.com/drover/drover/server/pki"
	"github.com/drover/drover/server/store/sqlite"
	"github.com/drover/drover/signing"
)

var t0 = time.Date(2026, 6, 1, 12, 0, 0, 0, time.UTC)

const life = 30 * 24 * time.Hour

func TestKEKFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "kek")
	if _, err := pki.LoadKEK(path); err == nil || !strings.Contains(err.Error(), "does not exist") || !strings.Contains(err.Error(), "kek generate") {
		t.Fatalf("missing file: %v", err)
	}
	k, err := pki.GenerateKEK(path)
	if err != nil {
		t.Fatal(err)
	}
	fi, _ := os.Stat(path)
	b, _ := os.ReadFile(path)
	if fi.Mode().Perm() != 0o600 || len(bytes.TrimSpace(b)) != 64 {
		t.Fatalf("generated file: mode %v, %d bytes", fi.Mode(), len(b))
	}
	if _, err := pki.GenerateKEK(path); err == nil || !strings.Contains(err.Error(), "exists") {
		t.Fatalf("generate over an existing file: %v", err)
	}
	again, err := pki.LoadKEK(path)
	if err != nil || again.ID() != k.ID() {
		t.Fatalf("load: %v %v", again, err)
	}
	os.Chmod(path, 0o640)
	if _, err := pki.LoadKEK(path); err == nil || !strings.Contains(err.Error(), "chmod 600") {
		t.Fatalf("mode 0640: %v", err)
	}
	os.Chmod(path, 0o400) // stricter is fine
	if _, err := pki.LoadKEK(path); err != nil {
		t.Fatalf("mode 0400: %v", err)
	}
	for name, content := range map[string]string{"short": "abcd\n", "not hex": strings.Repeat("zz", 32), "empty": ""} {
		p := filepath.Join(dir, name)
		os.WriteFile(p, []byte(content), 0o600)
		_, err := pki.LoadKEK(p)
		if err == nil || !strings.Contains(err.Error(), "does not hold a key") || (content != "" && strings.Contains(err.Error(), content)) {
			t.Errorf("%s: %v", name, err)
		}
	}
	if _, err := pki.LoadKEK(dir); err == nil || !strings.Contains(err.Error(), "not a regular file") {
		t.Errorf("a directory: %v", err)
	}
}

func TestKEKSealBindsID(t *testing.T) {
	k, _ := pki.NewKEK(bytes.Repeat([]byte{7}, 32))
	other, _ := pki.NewKEK(bytes.Repeat([]byte{8}, 32))
	sealed := k.Seal("ca.key", []byte("secret"))
	if p, err := k.Open("ca.key", sealed); err != nil || string(p) != "secret" {
		t.Fatalf("open: %q %v", p, err)
	}
	if _, err := k.Open("root.key", sealed); !errors.Is(err, pki.ErrWrongKEK) {
		t.Fatalf("open under another id: %v", err)
	}
	if _, err := other.Open("ca.key", sealed); !errors.Is(err, pki.ErrWrongKEK) || strings.Contains(err.Error(), "secret") {
		t.Fatalf("open with another KEK: %v", err)
	}
	if bytes.Contains(sealed, []byte("secret")) {
		t.Fatal("sealed value holds the plaintext")
	}
}

func openStore(t *testing.T) *sqlite.DB {
	st, err := sqlite.Open(t.Context(), filepath.Join(t.TempDir(), "server.db"), "normal")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

// Replicas on one store: the first initialises, the others (at once) join
// with the same keys; a wrong KEK is refused; a rotation on one is seen by
// the others; nothing private is in the clear.
func TestStoredKeysShared(t *testing.T) {
	st := openStore(t)
	kek, _ := pki.NewKEK(bytes.Repeat([]byte{1}, 32))
	const replicas = 4
	ms := make([]*pki.Material, replicas)
	created := make([]bool, replicas)
	errc := make(chan error, replicas)
	var wg sync.WaitGroup
	for i := range replicas {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var err error
			ms[i], created[i], err = pki.OpenStoredKeys(t.Context(), st, kek, t.TempDir(), signing.Ed25519, t0, life)
			errc <- err
		}()
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		if err != nil {
			t.Fatal(err)
		}
	}
	n := 0
	for i, m := range ms {
		if created[i] {
			n++
		}
		s0, v0 := ms[0].Keys.Signer()
		s, v := m.Keys.Signer()
		if m.CA.Pin() != ms[0].CA.Pin() || s.KeyID() != s0.KeyID() || v != v0 || !bytes.Equal(m.SecretsKey, ms[0].SecretsKey) || m.Admin.Hash() != ms[0].Admin.Hash() {
			t.Fatalf("replica %d has other keys", i)
		}
	}
	if n != 1 {
		t.Fatalf("%d replicas initialised the keys, want 1", n)
	}
	rows, err := st.ServerKeys(t.Context())
	if err != nil || len(rows) != 7 {
		t.Fatalf("stored keys: %d %v", len(rows), err)
	}
	for id, r := range rows {
		if bytes.Contains(r.Sealed, []byte("PRIVATE KEY")) || bytes.Contains(r.Sealed, []byte("CERTIFICATE")) || bytes.Contains(r.Sealed, ms[0].SecretsKey) ||
			bytes.Contains(r.Sealed, []byte(ms[0].AdminTokenText())) {
			t.Fatalf("key %s is stored in the clear", id)
		}
	}

	wrong, _ := pki.NewKEK(bytes.Repeat([]byte{2}, 32))
	if _, _, err := pki.OpenStoredKeys(t.Context(), st, wrong, t.TempDir(), signing.Ed25519, t0, life); !errors.Is(err, pki.ErrWrongKEK) {
		t.Fatalf("wrong KEK: %v", err)
	}

	// Rotate on replica 0; replica 1 sees it on Sync.
	if err := ms[0].Keys.Rotate(t0.Add(time.Hour), life); err != nil {
		t.Fatal(err)
	}
	s0, v0 := ms[0].Keys.Signer()
	if changed, err := ms[1].Keys.Sync(t.Context()); err != nil || !changed {
		t.Fatalf("sync after rotation: %v %v", changed, err)
	}
	if s, v := ms[1].Keys.Signer(); s.KeyID() != s0.KeyID() || v != v0 {
		t.Fatalf("replica 1 signs with %s v%d, replica 0 with %s v%d", s.KeyID(), v, s0.KeyID(), v0)
	}
	if changed, err := ms[1].Keys.Sync(t.Context()); err != nil || changed {
		t.Fatalf("second sync: %v %v", changed, err)
	}
	// Replica 2 has not synced: its rotation loses and changes nothing.
	if err := ms[2].Keys.Rotate(t0.Add(2*time.Hour), life); !errors.Is(err, errs.ErrConflict) {
		t.Fatalf("rotation over a stale key list: %v", err)
	}
	if changed, err := ms[2].Keys.Sync(t.Context()); err != nil || !changed {
		t.Fatalf("sync after the lost rotation: %v %v", changed, err)
	}
	if err := ms[2].Keys.Rotate(t0.Add(2*time.Hour), life); err != nil {
		t.Fatal(err)
	}
	// Two rotations: the first manifest key is no longer listed, nor stored.
	rows, _ = st.ServerKeys(t.Context())
	manifestKeys := 0
	for id := range rows {
		if strings.HasPrefix(id, "manifest/") {
			manifestKeys++
		}
	}
	if manifestKeys != 2 {
		t.Fatalf("%d manifest keys stored after two rotations, want 2", manifestKeys)
	}
	// A replica joining now loads the newest list.
	m, _, err := pki.OpenStoredKeys(t.Context(), st, kek, t.TempDir(), signing.Ed25519, t0, life)
	s2, v2 := ms[2].Keys.Signer()
	if s, v := m.Keys.Signer(); err != nil || s.KeyID() != s2.KeyID() || v != v2 || v != 3 {
		t.Fatalf("late joiner: %v v%d, want %s v%d", err, v, s2.KeyID(), v2)
	}
}

// A data dir's file keys become the stored keys: same CA, same keyring,
// same secrets key and admin token.
func TestStoredKeysFromDataDir(t *testing.T) {
	dir := t.TempDir()
	ca, err := pki.LoadOrCreateCA(dir, t0)
	if err != nil {
		t.Fatal(err)
	}
	ring, err := pki.LoadOrCreateKeyring(dir, signing.ECDSAP256, t0, life)
	if err != nil {
		t.Fatal(err)
	}
	if err := ring.Rotate(t0.Add(time.Minute), life); err != nil { // two listed keys
		t.Fatal(err)
	}
	secrets, _ := pki.LoadOrCreateSecret(dir, "secrets.key")
	admin, _ := pki.LoadOrCreateAdminToken(dir)
	tok, _ := pki.ReadAdminToken(dir)

	st := openStore(t)
	kek, _ := pki.NewKEK(bytes.Repeat([]byte{3}, 32))
	m, created, err := pki.OpenStoredKeys(t.Context(), st, kek, dir, signing.Ed25519, t0, life)
	if err != nil || !created {
		t.Fatalf("from the data dir: %v %v", created, err)
	}
	s, v := ring.Signer()
	ms, mv := m.Keys.Signer()
	if m.CA.Pin() != ca.Pin() || ms.KeyID() != s.KeyID() || mv != v || !bytes.Equal(m.SecretsKey, secrets) || m.Admin.Hash() != admin.Hash() ||
		m.AdminTokenText() != tok || !bytes.Equal(m.Keys.TrustRoot().KeyList, ring.TrustRoot().KeyList) {
		t.Fatal("the stored keys are not the data dir's")
	}
	if rows, _ := st.ServerKeys(t.Context()); len(rows) != 8 || rows["keylist.dsse"].Version != 2 {
		t.Fatalf("stored rows: %d", len(rows))
	}
	other := t.TempDir()
	if err := pki.WriteLocalCopies(other, m); err != nil {
		t.Fatal(err)
	}
	if got, err := pki.ReadAdminToken(other); err != nil || got != tok {
		t.Fatalf("local admin token: %q %v", got, err)
	}
	if b, _ := os.ReadFile(filepath.Join(other, "ca.crt")); !bytes.Equal(b, ca.PEM()) {
		t.Fatal("local ca.crt differs")
	}
	if _, err := hex.DecodeString(tok); err != nil {
		t.Fatal(err)
	}
}
