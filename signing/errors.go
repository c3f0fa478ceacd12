package signing

import "errors"

// Sentinel errors. Every error returned by this package for a rejected key,
// envelope, key list or manifest wraps exactly the sentinel that names the
// reason (and may wrap a lower-level cause as well), so callers can use
// errors.Is. They are listed here and nowhere else.
var (
	// ErrTooLarge: the envelope is larger than the caller's size cap.
	ErrTooLarge = errors.New("envelope too large")
	// ErrMalformedEnvelope: the bytes are not a well-formed DSSE envelope
	// (bad JSON, unknown or duplicate fields, non-canonical base64, ...).
	ErrMalformedEnvelope = errors.New("malformed envelope")
	// ErrPayloadType: the envelope's payload type is not the expected one.
	ErrPayloadType = errors.New("unexpected payload type")
	// ErrBadSignature: a signature names a trusted key but does not verify.
	ErrBadSignature = errors.New("bad signature")
	// ErrUnknownKey: no signature names a trusted (and well-formed) key.
	ErrUnknownKey = errors.New("signed by an unknown key")
	// ErrKeyListExpired: the key list is expired.
	ErrKeyListExpired = errors.New("key list expired")
	// ErrKeyListRollback: an offered key list does not have a higher version
	// than the one held (or has the same version with different content).
	ErrKeyListRollback = errors.New("key list rollback")
	// ErrKeyListStale: the manifest names a newer key-list version than the
	// trust root holds; the agent should fetch the current key list.
	ErrKeyListStale = errors.New("key list stale")
	// ErrKeyListMismatch: the manifest names an older key-list version than
	// the trust root holds; the server has not recompiled it yet.
	ErrKeyListMismatch = errors.New("key list version mismatch")
	// ErrInvalidKeyList: a root-signed key list that does not validate.
	ErrInvalidKeyList = errors.New("invalid key list")
	// ErrWrongAgent: the manifest is for another agent.
	ErrWrongAgent = errors.New("manifest for another agent")
	// ErrRollback: the manifest's serial is lower than the last accepted.
	ErrRollback = errors.New("manifest rollback")
	// ErrSerialConflict: same serial as the last accepted, different content.
	ErrSerialConflict = errors.New("manifest serial conflict")
	// ErrExpired: the manifest is expired.
	ErrExpired = errors.New("manifest expired")
	// ErrNotYetValid: the manifest was issued too far in the future.
	ErrNotYetValid = errors.New("manifest not yet valid")
	// ErrInvalidManifest: the verified payload is not a valid manifest; the
	// manifest package's error (e.g. *manifest.ValidationError) is wrapped too.
	ErrInvalidManifest = errors.New("invalid manifest")
	// ErrInvalidKey: key material that is unparseable, of an unsupported type,
	// or whose id is not the hash of its public key.
	ErrInvalidKey = errors.New("invalid key")
	// ErrInsecureKeyFile: a private key file readable or writable by group or
	// others, or not a regular file.
	ErrInsecureKeyFile = errors.New("insecure key file")
)
