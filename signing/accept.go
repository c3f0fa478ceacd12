package signing

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"github.com/drover/drover/manifest"
)

// MaxClockSkew is how far in the future a manifest's issued_at may be.
const MaxClockSkew = 5 * time.Minute

// DefaultMaxManifestBytes is the envelope size cap AcceptManifest applies when
// called with maxBytes <= 0.
const DefaultMaxManifestBytes = 16 << 20

// State is what the agent remembers of the last manifest it accepted.
type State struct {
	AgentID string
	Serial  uint64 // 0: none accepted yet
	Digest  string // "sha256:<hex>" of the last accepted payload bytes
}

// Accepted is a manifest that passed every check.
type Accepted struct {
	Manifest  *manifest.Manifest
	Payload   []byte // exact verified bytes
	Digest    string // "sha256:<hex>" of Payload
	KeyID     string // the manifest key that signed it
	Unchanged bool   // equal serial + same digest: a no-op
}

// Digest returns "sha256:<hex>" of b, the form State.Digest and
// Accepted.Digest use.
func Digest(b []byte) string {
	sum := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// AcceptManifest decides whether an agent may act on a manifest envelope. It
// enforces every rule pinned under "Manifest" in docs/design.md, in this order:
//
//  1. size: len(env) <= maxBytes (maxBytes <= 0 means DefaultMaxManifestBytes),
//     before anything else (ErrTooLarge);
//  2. the trust root's key list verifies under its root keys and is unexpired
//     (its errors, e.g. ErrKeyListExpired);
//  3. the envelope is well formed, has manifest.PayloadType and a signature by
//     a key of that key list (ErrMalformedEnvelope, ErrPayloadType,
//     ErrUnknownKey, ErrBadSignature);
//  4. only then the payload is parsed with manifest.DecodeManifest
//     (ErrInvalidManifest, wrapping the manifest package's error);
//  5. agent_id is st.AgentID (ErrWrongAgent);
//  6. key_list_version equals the held key list's version (newer:
//     ErrKeyListStale, so the agent fetches the key list; older:
//     ErrKeyListMismatch);
//  7. serial > st.Serial; an equal serial with the same digest is Unchanged,
//     with another digest ErrSerialConflict; lower is ErrRollback;
//  8. not expired: now < expires_at (ErrExpired), also for an Unchanged
//     manifest, so a frozen manifest is noticed;
//  9. issued_at <= now + MaxClockSkew (ErrNotYetValid).
//
// It has no side effects: the caller stores the new State on success.
//
// After a key rotation the agent may hold an older key list than the one the
// server signs with. A manifest signed by a key the held list still names says
// so with ErrKeyListStale; one signed by a key new to the agent can only fail
// with ErrUnknownKey, because nothing in it can be trusted before the
// signature verifies. So on ErrKeyListStale, ErrUnknownKey or
// ErrKeyListExpired the agent should fetch the key list, call
// TrustRoot.UpdateKeyList, and retry once.
func AcceptManifest(env []byte, tr *TrustRoot, st State, now time.Time, maxBytes int) (*Accepted, error) {
	if maxBytes <= 0 {
		maxBytes = DefaultMaxManifestBytes
	}
	if len(env) > maxBytes {
		return nil, fmt.Errorf("manifest: %w: %d bytes, at most %d", ErrTooLarge, len(env), maxBytes)
	}
	if tr == nil {
		return nil, errors.New("manifest: no trust root")
	}
	kl, err := tr.CurrentKeyList(now)
	if err != nil {
		return nil, fmt.Errorf("manifest: %w", err)
	}
	payload, keyID, err := Verify(env, manifest.PayloadType, kl.Keys)
	if err != nil {
		return nil, fmt.Errorf("manifest: %w", err)
	}
	m, err := manifest.DecodeManifest(payload)
	if err != nil {
		return nil, fmt.Errorf("manifest: %w: %w", ErrInvalidManifest, err)
	}
	if m.AgentID != st.AgentID {
		return nil, fmt.Errorf("manifest: %w: it is for %q, this agent is %q", ErrWrongAgent, m.AgentID, st.AgentID)
	}
	switch {
	case m.KeyListVersion > kl.Version:
		return nil, fmt.Errorf("manifest: %w: it names key list version %d, the trust root holds %d", ErrKeyListStale, m.KeyListVersion, kl.Version)
	case m.KeyListVersion < kl.Version:
		return nil, fmt.Errorf("manifest: %w: it names key list version %d, the trust root holds %d", ErrKeyListMismatch, m.KeyListVersion, kl.Version)
	}
	digest := Digest(payload)
	unchanged := false
	switch {
	case m.Serial < st.Serial:
		return nil, fmt.Errorf("manifest: %w: serial %d is lower than the accepted %d", ErrRollback, m.Serial, st.Serial)
	case m.Serial == st.Serial && digest != st.Digest:
		return nil, fmt.Errorf("manifest: %w: serial %d was accepted with digest %s, this one is %s", ErrSerialConflict, m.Serial, st.Digest, digest)
	case m.Serial == st.Serial:
		unchanged = true
	}
	if !now.Before(m.ExpiresAt) {
		return nil, fmt.Errorf("manifest: %w: serial %d expired at %s", ErrExpired, m.Serial, m.ExpiresAt.UTC().Format(time.RFC3339))
	}
	if m.IssuedAt.After(now.Add(MaxClockSkew)) {
		return nil, fmt.Errorf("manifest: %w: issued at %s, more than %s after now (%s)", ErrNotYetValid, m.IssuedAt.UTC().Format(time.RFC3339), MaxClockSkew, now.UTC().Format(time.RFC3339))
	}
	return &Accepted{Manifest: m, Payload: payload, Digest: digest, KeyID: keyID, Unchanged: unchanged}, nil
}
