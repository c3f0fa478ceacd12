// Package signing signs and verifies everything Drover trusts: DSSE envelopes
// (built on github.com/sigstore/sigstore's pkg/signature and
// pkg/signature/dsse), the trust root an agent pins at enrollment, the
// root-signed key list that names the online manifest keys and lets them
// rotate without re-enrolling, and AcceptManifest, the one function that
// decides whether an agent may act on a manifest (docs/design.md, "Manifest").
//
// The server imports it to generate and store keys (GenerateKey, WriteSigner,
// LoadSigner), to sign key lists with a root key (SignKeyList) and to sign
// each compiled manifest's exact bytes (Sign with manifest.PayloadType). The
// agent imports it to keep its TrustRoot current (UpdateKeyList) and to accept
// or reject each manifest it pulls (AcceptManifest). droverctl may use it to
// inspect envelopes (Verify).
//
// Envelopes are the standard DSSE JSON form
//
//	{"payloadType":"…","payload":"<base64>","signatures":[{"keyid":"…","sig":"<base64>"}]}
//
// with signatures over PAE(payloadType, payload). A key id is the lowercase hex
// sha256 of the key's PKIX (SubjectPublicKeyInfo) DER. Verification parses the
// envelope strictly (exact field names, no unknown or duplicate fields, one
// JSON object, canonical standard base64), matches signatures to trusted keys
// by key id, and only uses a trusted key whose id is the hash of its own key
// material. It returns the exact signed payload bytes and never parses them;
// parsing happens in AcceptManifest only after the signature verified.
//
// Supported algorithms are Ed25519 (the default) and ECDSA P-256 with SHA-256,
// for manifest keys and root keys alike. Other key types are refused.
//
// Every rejection wraps one of the sentinel errors in errors.go, so callers
// can report and count them with errors.Is. A rejected manifest or key list
// changes nothing.
//
// The package does no I/O except LoadSigner and WriteSigner. TrustRoot is a
// plain value: callers serialise access to one TrustRoot themselves.
package signing
