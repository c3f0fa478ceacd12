package pki

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/drover/drover/server/store"
	"github.com/drover/drover/signing"
)

// The ids of the server keys in the store (store.KeyStore). Each is sealed
// with the KEK, its id as additional data. The CA certificate and the key
// list are public, sealed all the same so that a database writer without
// the KEK cannot swap them.
const (
	idCAKey           = "ca.key"       // PKCS#8 PEM
	idCACert          = "ca.crt"       // PEM
	idRootKey         = "root.key"     // PKCS#8 PEM
	idKeyList         = "keylist.dsse" // the root-signed key list; its row version is the list's
	idSecretsKey      = "secrets.key"  // 32 bytes
	idAdminToken      = "admin.token"  // 64 hex digits
	manifestKeyPrefix = "manifest/"    // + key id: PKCS#8 PEM
)

// storeTimeout bounds a keyring write to the store (Rotate and Refresh take
// no context).
const storeTimeout = 30 * time.Second

// Material is the key material that every replica on one database shares.
type Material struct {
	CA         *CA
	Keys       *Keyring
	SecretsKey []byte
	Admin      *AdminToken
	adminToken string
}

// AdminTokenText is the bootstrap admin token itself, which WriteLocalCopies
// writes to the data dir for the tools on the replica's host.
func (m *Material) AdminTokenText() string { return m.adminToken }

// OpenStoredKeys loads the server keys from ks and opens them with kek.
// When the store holds none, it initialises them: from the keys in dataDir
// when there are any (a server that kept its keys in files, so that its
// agents keep working), otherwise new ones; of several replicas starting
// at once one stores its keys and the others load them. It reports whether
// this call stored them. A KEK that does not open the stored keys fails
// with an error wrapping ErrWrongKEK.
func OpenStoredKeys(ctx context.Context, ks store.KeyStore, kek *KEK, dataDir string, alg signing.Algorithm, now time.Time, life time.Duration) (*Material, bool, error) {
	rows, err := ks.ServerKeys(ctx)
	if err != nil {
		return nil, false, err
	}
	stored := false
	if len(rows) == 0 {
		var plain PlainKeys
		if _, err = os.Stat(filepath.Join(dataDir, "ca.key")); errors.Is(err, fs.ErrNotExist) {
			plain, err = newKeys(alg, now, life)
		} else {
			plain, err = FileKeys(dataDir)
		}
		if err != nil {
			return nil, false, err
		}
		sealed, err := SealKeys(kek, plain, now)
		if err != nil {
			return nil, false, err
		}
		if stored, err = ks.InitServerKeys(ctx, sealed); err != nil {
			return nil, false, err
		}
		if rows, err = ks.ServerKeys(ctx); err != nil {
			return nil, false, err
		}
	}
	m, err := openKeys(rows, ks, kek, alg)
	return m, stored, err
}

// openKeys opens and parses the stored keys.
func openKeys(rows map[string]*store.ServerKey, ks store.KeyStore, kek *KEK, alg signing.Algorithm) (*Material, error) {
	open := func(id string) ([]byte, error) {
		r := rows[id]
		if r == nil {
			return nil, fmt.Errorf("the server keys in the database lack %s", id)
		}
		return kek.Open(id, r.Sealed)
	}
	// Open the CA key first: with a wrong KEK this is the error reported.
	var plain [6][]byte
	for i, id := range []string{idCAKey, idCACert, idRootKey, idKeyList, idSecretsKey, idAdminToken} {
		b, err := open(id)
		if err != nil {
			return nil, err
		}
		plain[i] = b
	}
	ca, err := parseCA(plain[0], plain[1])
	if err != nil {
		return nil, fmt.Errorf("server keys in the database: %w", err)
	}
	root, err := signing.ParseSignerPEM(plain[2])
	if err != nil {
		return nil, fmt.Errorf("server keys in the database: root key: %w", err)
	}
	st, err := parseKeyring(plain[3], root, func(id string) ([]byte, error) { return open(manifestKeyPrefix + id) })
	if err != nil {
		return nil, fmt.Errorf("server keys in the database: %w", err)
	}
	if len(plain[4]) != 32 {
		return nil, errors.New("server keys in the database: the secrets key is not 32 bytes")
	}
	admin := strings.TrimSpace(string(plain[5]))
	if b, err := hex.DecodeString(admin); err != nil || len(b) != 32 {
		return nil, errors.New("server keys in the database: the admin token is not 64 hex digits")
	}
	k := &Keyring{alg: alg, backend: &storeKeyring{ks: ks, kek: kek, root: root}, root: root,
		active: st.active, keyList: st.list, env: st.env}
	return &Material{CA: ca, Keys: k, SecretsKey: plain[4], Admin: &AdminToken{hash: sha256.Sum256([]byte(admin))}, adminToken: admin}, nil
}

// parseKeyring verifies a key list with root and loads its active key
// through key.
func parseKeyring(env []byte, root *signing.Signer, key func(id string) ([]byte, error)) (*keyringState, error) {
	kl, err := verifyKeyList(env, root)
	if err != nil {
		return nil, err
	}
	if len(kl.Keys) == 0 {
		return nil, errors.New("load key list: it names no key")
	}
	b, err := key(kl.Keys[0].ID)
	if err != nil {
		return nil, err
	}
	active, err := signing.ParseSignerPEM(b)
	if err != nil {
		return nil, fmt.Errorf("load manifest key: %w", err)
	}
	if active.KeyID() != kl.Keys[0].ID {
		return nil, fmt.Errorf("load manifest key: key %s is stored as %s", active.KeyID(), kl.Keys[0].ID)
	}
	return &keyringState{list: *kl, env: env, active: active}, nil
}

// storeKeyring keeps the keyring in the store, sealed: a key list change is
// a compare-and-swap on the stored list's version, so that two replicas
// rotating at once cannot both win.
type storeKeyring struct {
	ks   store.KeyStore
	kek  *KEK
	root *signing.Signer
}

func (b *storeKeyring) save(prev, next signing.KeyList, env []byte, added *signing.Signer) error {
	now := time.Now()
	put := []*store.ServerKey{{ID: idKeyList, Sealed: b.kek.Seal(idKeyList, env), Version: next.Version, UpdatedAt: now}}
	if added != nil {
		pemKey, err := added.MarshalPEM()
		if err != nil {
			return fmt.Errorf("rotate keys: %w", err)
		}
		id := manifestKeyPrefix + added.KeyID()
		put = append(put, &store.ServerKey{ID: id, Sealed: b.kek.Seal(id, pemKey), Version: 1, UpdatedAt: now})
	}
	listed := map[string]bool{}
	for _, pk := range next.Keys {
		listed[pk.ID] = true
	}
	var del []string
	for _, pk := range prev.Keys {
		if !listed[pk.ID] {
			del = append(del, manifestKeyPrefix+pk.ID)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), storeTimeout)
	defer cancel()
	if err := b.ks.UpdateServerKeys(ctx, idKeyList, prev.Version, put, del); err != nil {
		return fmt.Errorf("store the key list: %w", err)
	}
	return nil
}

func (b *storeKeyring) load(ctx context.Context, have uint64) (*keyringState, error) {
	rows, err := b.ks.ServerKeys(ctx, idKeyList)
	if err != nil {
		return nil, err
	}
	r := rows[idKeyList]
	if r == nil {
		return nil, errors.New("the server keys in the database lack the key list")
	}
	if r.Version == have {
		return nil, nil
	}
	env, err := b.kek.Open(idKeyList, r.Sealed)
	if err != nil {
		return nil, err
	}
	return parseKeyring(env, b.root, func(id string) ([]byte, error) {
		kr, err := b.ks.ServerKeys(ctx, manifestKeyPrefix+id)
		if err != nil {
			return nil, err
		}
		if kr[manifestKeyPrefix+id] == nil {
			return nil, fmt.Errorf("the server keys in the database lack manifest key %s", id)
		}
		return b.kek.Open(manifestKeyPrefix+id, kr[manifestKeyPrefix+id].Sealed)
	})
}

// PlainKeys is server key material in the clear, by store id: only in
// memory, between reading or generating it and sealing it.
type PlainKeys map[string][]byte

// newKeys generates the key material of a new installation.
func newKeys(alg signing.Algorithm, now time.Time, life time.Duration) (PlainKeys, error) {
	caKey, der, _, err := generateCA(now)
	if err != nil {
		return nil, err
	}
	caKeyPEM, err := MarshalECKey(caKey)
	if err != nil {
		return nil, err
	}
	root, err := signing.GenerateKey(alg)
	if err != nil {
		return nil, fmt.Errorf("create root key: %w", err)
	}
	mk, err := signing.GenerateKey(alg)
	if err != nil {
		return nil, fmt.Errorf("create manifest key: %w", err)
	}
	env, err := signing.SignKeyList(root, signing.KeyList{Version: 1, ExpiresAt: now.Add(life).UTC().Truncate(time.Second), Keys: []signing.PublicKey{mk.Public()}})
	if err != nil {
		return nil, fmt.Errorf("sign key list: %w", err)
	}
	rootPEM, err := root.MarshalPEM()
	if err != nil {
		return nil, err
	}
	mkPEM, err := mk.MarshalPEM()
	if err != nil {
		return nil, err
	}
	secrets, admin := make([]byte, 32), make([]byte, 32)
	if _, err := rand.Read(secrets); err != nil {
		return nil, err
	}
	if _, err := rand.Read(admin); err != nil {
		return nil, err
	}
	return PlainKeys{
		idCAKey: caKeyPEM, idCACert: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		idRootKey: rootPEM, idKeyList: env, manifestKeyPrefix + mk.KeyID(): mkPEM,
		idSecretsKey: secrets, idAdminToken: []byte(hex.EncodeToString(admin)),
	}, nil
}

// FileKeys reads the key material a server keeps in its data dir (the CA,
// the keyring with every listed manifest key, the secrets key and the
// admin token).
func FileKeys(dir string) (PlainKeys, error) {
	caKey, err := readPrivateFile(filepath.Join(dir, "ca.key"))
	if err != nil {
		return nil, fmt.Errorf("read the data dir's keys: %w", err)
	}
	caCert, err := os.ReadFile(filepath.Join(dir, "ca.crt"))
	if err != nil {
		return nil, fmt.Errorf("read the data dir's keys: %w", err)
	}
	if _, err := parseCA(caKey, caCert); err != nil {
		return nil, fmt.Errorf("read the data dir's keys: %w", err)
	}
	root, err := signing.LoadSigner(filepath.Join(dir, "root.key"))
	if err != nil {
		return nil, fmt.Errorf("read the data dir's keys: %w", err)
	}
	rootPEM, err := root.MarshalPEM()
	if err != nil {
		return nil, err
	}
	env, err := os.ReadFile(filepath.Join(dir, keyListFile))
	if err != nil {
		return nil, fmt.Errorf("read the data dir's keys: %w", err)
	}
	out := PlainKeys{idCAKey: caKey, idCACert: caCert, idRootKey: rootPEM, idKeyList: env}
	kl, err := verifyKeyList(env, root)
	if err != nil {
		return nil, fmt.Errorf("read the data dir's keys: %w", err)
	}
	if len(kl.Keys) == 0 {
		return nil, errors.New("read the data dir's keys: the key list names no key")
	}
	for i, pk := range kl.Keys {
		s, err := signing.LoadSigner(filepath.Join(dir, manifestKeyFile(pk.ID)))
		if err != nil {
			if i > 0 && errors.Is(err, fs.ErrNotExist) {
				continue // only the active key signs
			}
			return nil, fmt.Errorf("read the data dir's keys: %w", err)
		}
		b, err := s.MarshalPEM()
		if err != nil {
			return nil, err
		}
		out[manifestKeyPrefix+pk.ID] = b
	}
	// The secrets key and the admin token: the files, or new ones for a
	// data dir that never had them.
	for _, name := range []string{idSecretsKey, idAdminToken} {
		key, err := LoadOrCreateSecret(dir, name)
		if err != nil {
			return nil, fmt.Errorf("read the data dir's keys: %w", err)
		}
		if name == idAdminToken {
			key = []byte(hex.EncodeToString(key))
		}
		out[name] = key
	}
	return out, nil
}

// SealKeys seals plain with kek as store rows (the key list's row carries
// the list's version).
func SealKeys(kek *KEK, plain PlainKeys, now time.Time) ([]*store.ServerKey, error) {
	root, err := signing.ParseSignerPEM(plain[idRootKey])
	if err != nil {
		return nil, fmt.Errorf("seal the keys: root key: %w", err)
	}
	kl, err := verifyKeyList(plain[idKeyList], root)
	if err != nil {
		return nil, fmt.Errorf("seal the keys: %w", err)
	}
	out := make([]*store.ServerKey, 0, len(plain))
	for id, b := range plain {
		v := uint64(1)
		if id == idKeyList {
			v = kl.Version
		}
		out = append(out, &store.ServerKey{ID: id, Sealed: kek.Seal(id, b), Version: v, UpdatedAt: now})
	}
	return out, nil
}

// WriteLocalCopies writes what the tools on a replica's host read from the
// data dir when the keys live in the store: the CA certificate (public)
// and the admin token (0600, as a server keeping files writes it).
func WriteLocalCopies(dir string, m *Material) error {
	if old, err := os.ReadFile(filepath.Join(dir, "ca.crt")); err != nil || string(old) != string(m.CA.PEM()) {
		if err := writeFile(filepath.Join(dir, "ca.crt"), m.CA.PEM(), 0o644); err != nil {
			return err
		}
	}
	if old, err := ReadAdminToken(dir); err != nil || old != m.adminToken {
		if err := writeFile(filepath.Join(dir, "admin.token"), []byte(m.adminToken+"\n"), 0o600); err != nil {
			return err
		}
	}
	return nil
}

// RewrapKeys opens every stored key with old and seals it again with next,
// for replacing the KEK; the keys themselves do not change.
func RewrapKeys(rows map[string]*store.ServerKey, old, next *KEK, now time.Time) ([]*store.ServerKey, error) {
	out := make([]*store.ServerKey, 0, len(rows))
	for id, r := range rows {
		plain, err := old.Open(id, r.Sealed)
		if err != nil {
			return nil, err
		}
		out = append(out, &store.ServerKey{ID: id, Sealed: next.Seal(id, plain), Version: r.Version, UpdatedAt: now})
	}
	return out, nil
}
