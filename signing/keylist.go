package signing

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// KeyListPayloadType is the DSSE payload type of a root-signed key list
// (pinned). Manifests use manifest.PayloadType.
const KeyListPayloadType = "application/vnd.drover.keylist.v1+json"

// MaxKeys bounds the keys in one key list and the root keys of a trust root.
const MaxKeys = 64

// KeyList names the online keys allowed to sign manifests. It is signed by a
// root key; a new list replaces the held one only with a higher version.
type KeyList struct {
	Version   uint64      `json:"version"`
	ExpiresAt time.Time   `json:"expires_at"`
	Keys      []PublicKey `json:"keys"`
}

// Validate checks that the version is at least 1, the expiry is set, and that
// there are 1-MaxKeys valid keys with distinct ids.
func (kl *KeyList) Validate() error {
	if kl.Version == 0 {
		return fmt.Errorf("%w: version must be at least 1", ErrInvalidKeyList)
	}
	if kl.ExpiresAt.IsZero() {
		return fmt.Errorf("%w: expires_at is required", ErrInvalidKeyList)
	}
	if err := validateKeys(kl.Keys); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidKeyList, err)
	}
	return nil
}

func validateKeys(keys []PublicKey) error {
	if len(keys) == 0 {
		return errors.New("no keys")
	}
	if len(keys) > MaxKeys {
		return fmt.Errorf("%d keys, at most %d", len(keys), MaxKeys)
	}
	seen := make(map[string]int, len(keys))
	for i, k := range keys {
		if err := k.Validate(); err != nil {
			return fmt.Errorf("keys[%d]: %w", i, err)
		}
		if j, ok := seen[k.ID]; ok {
			return fmt.Errorf("keys[%d]: duplicate of keys[%d]", i, j)
		}
		seen[k.ID] = i
	}
	return nil
}

// Encode returns the compact JSON bytes of kl that SignKeyList signs.
func (kl *KeyList) Encode() ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(kl); err != nil {
		return nil, fmt.Errorf("encode key list: %w", err)
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
}

// decodeKeyList parses verified key-list bytes strictly and validates them.
func decodeKeyList(b []byte) (*KeyList, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	var kl KeyList
	if err := dec.Decode(&kl); err != nil {
		return nil, fmt.Errorf("%w: decode: %w", ErrInvalidKeyList, err)
	}
	if dec.More() {
		return nil, fmt.Errorf("%w: trailing data after the JSON object", ErrInvalidKeyList)
	}
	if err := kl.Validate(); err != nil {
		return nil, err
	}
	return &kl, nil
}

// SignKeyList validates kl, encodes it and returns the envelope signed by root.
func SignKeyList(root *Signer, kl KeyList) ([]byte, error) {
	if err := kl.Validate(); err != nil {
		return nil, fmt.Errorf("sign key list: %w", err)
	}
	b, err := kl.Encode()
	if err != nil {
		return nil, fmt.Errorf("sign key list: %w", err)
	}
	env, err := Sign(root, KeyListPayloadType, b)
	if err != nil {
		return nil, fmt.Errorf("sign key list: %w", err)
	}
	return env, nil
}

// TrustRoot is what an agent pins at enrollment: the root public keys, and
// the current root-signed key list. It is a plain value; callers persist it
// and serialise access to it.
type TrustRoot struct {
	RootKeys []PublicKey     `json:"root_keys"`
	KeyList  json.RawMessage `json:"key_list"` // exact bytes of the current root-signed key-list envelope
}

// NewTrustRoot builds a trust root from root keys and a key-list envelope,
// which must verify under them and be unexpired at now.
func NewTrustRoot(rootKeys []PublicKey, keyListEnv []byte, now time.Time) (*TrustRoot, error) {
	t := &TrustRoot{
		RootKeys: append([]PublicKey(nil), rootKeys...),
		KeyList:  append(json.RawMessage(nil), keyListEnv...),
	}
	if _, err := t.CurrentKeyList(now); err != nil {
		return nil, err
	}
	return t, nil
}

// hasKeyList reports whether t holds a key list; JSON null (what a nil
// KeyList marshals to) counts as none.
func (t *TrustRoot) hasKeyList() bool {
	b := bytes.TrimSpace(t.KeyList)
	return len(b) > 0 && !bytes.Equal(b, []byte("null"))
}

// verifyKeyList verifies a key-list envelope under the root keys and decodes
// it, without looking at its expiry.
func (t *TrustRoot) verifyKeyList(env []byte) (*KeyList, error) {
	if t == nil {
		return nil, errors.New("key list: no trust root")
	}
	if err := validateKeys(t.RootKeys); err != nil {
		return nil, fmt.Errorf("trust root: root keys: %w", err)
	}
	payload, _, err := Verify(env, KeyListPayloadType, t.RootKeys)
	if err != nil {
		return nil, fmt.Errorf("key list: %w", err)
	}
	kl, err := decodeKeyList(payload)
	if err != nil {
		return nil, fmt.Errorf("key list: %w", err)
	}
	return kl, nil
}

// CurrentKeyList verifies the held key list under RootKeys and returns it;
// an expired list (now >= expires_at) is refused with ErrKeyListExpired.
func (t *TrustRoot) CurrentKeyList(now time.Time) (*KeyList, error) {
	if t != nil && !t.hasKeyList() {
		return nil, fmt.Errorf("key list: %w: the trust root holds no key list", ErrMalformedEnvelope)
	}
	kl, err := t.verifyKeyList(t.KeyList)
	if err != nil {
		return nil, err
	}
	if !now.Before(kl.ExpiresAt) {
		return nil, fmt.Errorf("key list: %w: version %d expired at %s", ErrKeyListExpired, kl.Version, kl.ExpiresAt.UTC().Format(time.RFC3339))
	}
	return kl, nil
}

// UpdateKeyList replaces t.KeyList with env if env is root-signed, unexpired,
// and has a higher version than the held list. An equal version with
// identical bytes is a no-op (nil error); an equal version with other bytes or
// a lower version is refused with ErrKeyListRollback. An expired env is
// refused with ErrKeyListExpired even if it is the held one. The held list
// may itself be expired: that is when an update is needed. A trust root that
// holds no key list yet takes any valid root-signed one. On any error t is
// unchanged.
func (t *TrustRoot) UpdateKeyList(env []byte, now time.Time) error {
	next, err := t.verifyKeyList(env)
	if err != nil {
		return err
	}
	if !now.Before(next.ExpiresAt) {
		return fmt.Errorf("key list: %w: version %d expired at %s", ErrKeyListExpired, next.Version, next.ExpiresAt.UTC().Format(time.RFC3339))
	}
	if t.hasKeyList() {
		cur, err := t.verifyKeyList(t.KeyList)
		if err != nil {
			return fmt.Errorf("update key list: the held key list does not verify: %w", err)
		}
		switch {
		case next.Version < cur.Version:
			return fmt.Errorf("key list: %w: version %d is lower than the held version %d", ErrKeyListRollback, next.Version, cur.Version)
		case next.Version == cur.Version && bytes.Equal(env, t.KeyList):
			return nil
		case next.Version == cur.Version:
			return fmt.Errorf("key list: %w: version %d is already held with different content", ErrKeyListRollback, next.Version)
		}
	}
	t.KeyList = append(json.RawMessage(nil), env...)
	return nil
}
