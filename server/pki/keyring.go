package pki

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/drover/drover/signing"
)

// Keyring holds the root key, the manifest keys and the root-signed key list
// that names them (docs/design.md, "Manifest"). The newest key in the list signs
// manifests; the previous one stays listed for one rotation so that agents
// holding a manifest it signed are not disturbed.
type Keyring struct {
	alg     signing.Algorithm
	backend keyringBackend

	mu      sync.RWMutex
	root    *signing.Signer
	active  *signing.Signer
	keyList signing.KeyList
	env     []byte // keylist.dsse: the signed key list
}

const keyListFile = "keylist.dsse"

// keyringBackend keeps the keyring: files in the data dir (fileKeyring) or
// sealed keys in the store, shared by replicas (storeKeyring).
type keyringBackend interface {
	// save stores a new key list (and added, a new manifest key, if not
	// nil) over the stored list prev; it fails with errs.ErrConflict when
	// the stored list is no longer prev (another replica changed it).
	save(prev, next signing.KeyList, env []byte, added *signing.Signer) error
	// load returns the stored key list when its version is not have (nil
	// when it is).
	load(ctx context.Context, have uint64) (*keyringState, error)
}

// keyringState is a key list, its envelope and its active (first) key.
type keyringState struct {
	list   signing.KeyList
	env    []byte
	active *signing.Signer
}

// fileKeyring is the keyring of a server alone: files in dir.
type fileKeyring struct{ dir string }

func (f fileKeyring) save(_, next signing.KeyList, env []byte, added *signing.Signer) error {
	if added != nil {
		if err := signing.WriteSigner(filepath.Join(f.dir, manifestKeyFile(added.KeyID())), added); err != nil {
			return fmt.Errorf("rotate keys: %w", err)
		}
	}
	if err := writeFile(filepath.Join(f.dir, keyListFile), env, 0o600); err != nil {
		return err
	}
	// Delete the manifest key files no longer in the key list.
	listed := map[string]bool{}
	for _, pk := range next.Keys {
		listed[manifestKeyFile(pk.ID)] = true
	}
	files, _ := filepath.Glob(filepath.Join(f.dir, "manifest-*.key"))
	for _, file := range files {
		if !listed[filepath.Base(file)] {
			os.Remove(file)
		}
	}
	return nil
}

// load: nobody else writes the files while the server holds the data dir.
func (fileKeyring) load(context.Context, uint64) (*keyringState, error) { return nil, nil }

func manifestKeyFile(id string) string { return "manifest-" + id + ".key" }

// LoadOrCreateKeyring loads root.key, keylist.dsse and the active manifest
// key from dir, creating them on first start.
func LoadOrCreateKeyring(dir string, alg signing.Algorithm, now time.Time, life time.Duration) (*Keyring, error) {
	k := &Keyring{alg: alg, backend: fileKeyring{dir}}
	rootPath := filepath.Join(dir, "root.key")
	root, err := signing.LoadSigner(rootPath)
	if errors.Is(err, fs.ErrNotExist) {
		if root, err = signing.GenerateKey(alg); err != nil {
			return nil, fmt.Errorf("create root key: %w", err)
		}
		if err := signing.WriteSigner(rootPath, root); err != nil {
			return nil, err
		}
	} else if err != nil {
		return nil, err
	}
	k.root = root

	env, err := os.ReadFile(filepath.Join(dir, keyListFile))
	if errors.Is(err, fs.ErrNotExist) {
		// First start (or a crash before the first key list was written):
		// any manifest key file without a list is an orphan.
		return k, k.rotateLocked(now, life)
	}
	if err != nil {
		return nil, fmt.Errorf("read key list: %w", err)
	}
	kl, err := verifyKeyList(env, root)
	if err != nil {
		return nil, err
	}
	if len(kl.Keys) == 0 {
		return nil, errors.New("load key list: it names no key")
	}
	active, err := signing.LoadSigner(filepath.Join(dir, manifestKeyFile(kl.Keys[0].ID)))
	if err != nil {
		return nil, fmt.Errorf("load manifest key: %w", err)
	}
	k.active, k.keyList, k.env = active, *kl, env
	return k, nil
}

// verifyKeyList checks the root signature of a key list (not its expiry:
// the server re-signs an expired list with the root key it holds).
func verifyKeyList(env []byte, root *signing.Signer) (*signing.KeyList, error) {
	payload, _, err := signing.Verify(env, signing.KeyListPayloadType, []signing.PublicKey{root.Public()})
	if err != nil {
		return nil, fmt.Errorf("load key list: %w", err)
	}
	var kl signing.KeyList
	if err := json.Unmarshal(payload, &kl); err != nil {
		return nil, fmt.Errorf("load key list: %w", err)
	}
	return &kl, nil
}

// rotate adds a new manifest key: it becomes the active key, listed first in
// a new key list with a higher version, followed by the previous active key.
func (k *Keyring) Rotate(now time.Time, life time.Duration) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.rotateLocked(now, life)
}

func (k *Keyring) rotateLocked(now time.Time, life time.Duration) error {
	s, err := signing.GenerateKey(k.alg)
	if err != nil {
		return fmt.Errorf("rotate keys: %w", err)
	}
	keys := []signing.PublicKey{s.Public()}
	if k.active != nil {
		keys = append(keys, k.active.Public())
	}
	if err := k.publishLocked(keys, now, life, s); err != nil {
		return err
	}
	k.active = s
	return nil
}

// refresh re-signs the key list with a higher version once half its
// lifetime has passed. It reports whether the list changed.
func (k *Keyring) Refresh(now time.Time, life time.Duration) (bool, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	issued := k.keyList.ExpiresAt.Add(-life)
	if now.Before(issued.Add(life / 2)) {
		return false, nil
	}
	return true, k.publishLocked(k.keyList.Keys, now, life, nil)
}

func (k *Keyring) publishLocked(keys []signing.PublicKey, now time.Time, life time.Duration, added *signing.Signer) error {
	kl := signing.KeyList{
		Version:   k.keyList.Version + 1,
		ExpiresAt: now.Add(life).UTC().Truncate(time.Second),
		Keys:      keys,
	}
	env, err := signing.SignKeyList(k.root, kl)
	if err != nil {
		return fmt.Errorf("sign key list: %w", err)
	}
	if err := k.backend.save(k.keyList, kl, env, added); err != nil {
		return err
	}
	k.keyList, k.env = kl, env
	return nil
}

// Sync loads the key list stored by another replica, if it changed, and
// reports whether it did. A keyring of files never changes underneath.
func (k *Keyring) Sync(ctx context.Context) (bool, error) {
	k.mu.RLock()
	have := k.keyList.Version
	k.mu.RUnlock()
	st, err := k.backend.load(ctx, have)
	if err != nil || st == nil {
		return false, err
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if st.list.Version <= k.keyList.Version && k.active != nil {
		return false, nil // this replica published a newer one meanwhile
	}
	k.keyList, k.env, k.active = st.list, st.env, st.active
	return true, nil
}

// signer returns the active manifest key and the key-list version it is in.
func (k *Keyring) Signer() (*signing.Signer, uint64) {
	k.mu.RLock()
	defer k.mu.RUnlock()
	return k.active, k.keyList.Version
}

// trustRoot returns what an agent pins and refreshes: the root public key
// and the current signed key list.
func (k *Keyring) TrustRoot() signing.TrustRoot {
	k.mu.RLock()
	defer k.mu.RUnlock()
	return signing.TrustRoot{
		RootKeys: []signing.PublicKey{k.root.Public()},
		KeyList:  json.RawMessage(k.env),
	}
}
