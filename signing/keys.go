package signing

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/drover/drover/internal/atomicfile"
	"github.com/sigstore/sigstore/pkg/signature"
)

// Algorithm names a signature algorithm.
type Algorithm string

// Supported algorithms. Ed25519 is the default.
const (
	Ed25519   Algorithm = "ed25519"
	ECDSAP256 Algorithm = "ecdsa-p256"
)

// DefaultAlgorithm is used by GenerateKey when alg is empty.
const DefaultAlgorithm = Ed25519

// maxKeyFileBytes bounds what LoadSigner and ParseSignerPEM read.
const maxKeyFileBytes = 64 << 10

// hash is the hash sigstore uses with the algorithm: none (pure Ed25519) or
// SHA-256 for ECDSA P-256.
func (a Algorithm) hash() (crypto.Hash, error) {
	switch a {
	case Ed25519:
		return crypto.Hash(0), nil
	case ECDSAP256:
		return crypto.SHA256, nil
	}
	return 0, fmt.Errorf("%w: unsupported algorithm %q (use %s or %s)", ErrInvalidKey, string(a), Ed25519, ECDSAP256)
}

// Signer is a private signing key. The zero value is not usable; get one from
// GenerateKey, ParseSignerPEM or LoadSigner. A Signer is safe for concurrent use.
type Signer struct {
	alg  Algorithm
	priv crypto.Signer
	sv   signature.SignerVerifier
	pub  PublicKey
}

// GenerateKey creates a new key. An empty alg means DefaultAlgorithm.
func GenerateKey(alg Algorithm) (*Signer, error) {
	if alg == "" {
		alg = DefaultAlgorithm
	}
	var priv crypto.Signer
	switch alg {
	case Ed25519:
		_, k, err := ed25519.GenerateKey(rand.Reader)
		if err != nil {
			return nil, fmt.Errorf("generate ed25519 key: %w", err)
		}
		priv = k
	case ECDSAP256:
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return nil, fmt.Errorf("generate ecdsa-p256 key: %w", err)
		}
		priv = k
	default:
		_, err := alg.hash()
		return nil, fmt.Errorf("generate key: %w", err)
	}
	return newSigner(priv)
}

// newSigner wraps a supported private key.
func newSigner(priv crypto.PrivateKey) (*Signer, error) {
	var cs crypto.Signer
	var alg Algorithm
	switch k := priv.(type) {
	case ed25519.PrivateKey:
		if len(k) != ed25519.PrivateKeySize {
			return nil, fmt.Errorf("%w: ed25519 private key of %d bytes", ErrInvalidKey, len(k))
		}
		cs, alg = k, Ed25519
	case *ecdsa.PrivateKey:
		if k == nil || k.Curve != elliptic.P256() {
			return nil, fmt.Errorf("%w: only the P-256 curve is supported for ECDSA", ErrInvalidKey)
		}
		cs, alg = k, ECDSAP256
	default:
		return nil, fmt.Errorf("%w: unsupported private key type %T (use %s or %s)", ErrInvalidKey, priv, Ed25519, ECDSAP256)
	}
	h, err := alg.hash()
	if err != nil {
		return nil, err
	}
	sv, err := signature.LoadSignerVerifier(cs, h)
	if err != nil {
		return nil, fmt.Errorf("%w: load %s signer: %w", ErrInvalidKey, alg, err)
	}
	pub, err := publicKeyOf(cs.Public())
	if err != nil {
		return nil, err
	}
	return &Signer{alg: alg, priv: cs, sv: sv, pub: pub}, nil
}

// Algorithm returns the key's algorithm.
func (s *Signer) Algorithm() Algorithm { return s.alg }

// KeyID returns the lowercase hex sha256 of the PKIX (SPKI) DER public key.
func (s *Signer) KeyID() string { return s.pub.ID }

// Public returns the public half, ready to be placed in a key list or a trust root.
func (s *Signer) Public() PublicKey { return s.pub }

// MarshalPEM returns the private key as a PKCS#8 "PRIVATE KEY" PEM block.
func (s *Signer) MarshalPEM() ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(s.priv)
	if err != nil {
		return nil, fmt.Errorf("marshal private key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
}

// ParseSignerPEM parses one unencrypted PKCS#8 "PRIVATE KEY" PEM block holding
// an Ed25519 or ECDSA P-256 key. Anything else (other key types, other block
// types, PEM headers, several blocks, trailing data) is refused.
func ParseSignerPEM(b []byte) (*Signer, error) {
	if len(b) > maxKeyFileBytes {
		return nil, fmt.Errorf("%w: private key PEM of %d bytes", ErrInvalidKey, len(b))
	}
	der, err := onePEMBlock(b, "PRIVATE KEY", "PKCS#8", "are not supported (encrypted keys are not)")
	if err != nil {
		return nil, err
	}
	priv, err := x509.ParsePKCS8PrivateKey(der)
	if err != nil {
		return nil, fmt.Errorf("%w: parse PKCS#8: %w", ErrInvalidKey, err)
	}
	return newSigner(priv)
}

// LoadSigner reads a private key file written by WriteSigner. It refuses a
// file that is not a regular file or whose mode lets group or others read or
// write it (mode&0077 != 0).
func LoadSigner(path string) (*Signer, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("load signing key: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("load signing key: %w", err)
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("load signing key %s: %w: not a regular file", path, ErrInsecureKeyFile)
	}
	if perm := fi.Mode().Perm(); perm&0o077 != 0 {
		return nil, fmt.Errorf("load signing key %s: %w: mode %#o lets group or others access it; run chmod 600 %s", path, ErrInsecureKeyFile, perm, path)
	}
	b, err := io.ReadAll(io.LimitReader(f, maxKeyFileBytes+1))
	if err != nil {
		return nil, fmt.Errorf("load signing key %s: %w", path, err)
	}
	s, err := ParseSignerPEM(b)
	if err != nil {
		return nil, fmt.Errorf("load signing key %s: %w", path, err)
	}
	return s, nil
}

// WriteSigner writes s as PKCS#8 PEM to path with mode 0600, atomically: a
// temporary file in the same directory is written, synced and renamed over
// path, and the directory is synced.
func WriteSigner(path string, s *Signer) error {
	if s == nil {
		return errors.New("write signing key: nil signer")
	}
	b, err := s.MarshalPEM()
	if err != nil {
		return fmt.Errorf("write signing key: %w", err)
	}
	if err := atomicfile.Write(path, b, 0o600); err != nil {
		return fmt.Errorf("write signing key: %w", err)
	}
	return nil
}

// PublicKey is a public key as carried in key lists and trust roots.
type PublicKey struct {
	ID        string    `json:"id"`        // = KeyID of the signer
	Algorithm Algorithm `json:"algorithm"` // ed25519 | ecdsa-p256
	PEM       string    `json:"pem"`       // PKIX "PUBLIC KEY" PEM
}

func publicKeyOf(pub crypto.PublicKey) (PublicKey, error) {
	alg, err := algorithmOf(pub)
	if err != nil {
		return PublicKey{}, err
	}
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		return PublicKey{}, fmt.Errorf("%w: marshal public key: %w", ErrInvalidKey, err)
	}
	return PublicKey{
		ID:        keyIDFromDER(der),
		Algorithm: alg,
		PEM:       string(pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der})),
	}, nil
}

func keyIDFromDER(der []byte) string {
	sum := sha256.Sum256(der)
	return hex.EncodeToString(sum[:])
}

func algorithmOf(pub crypto.PublicKey) (Algorithm, error) {
	switch k := pub.(type) {
	case ed25519.PublicKey:
		if len(k) != ed25519.PublicKeySize {
			return "", fmt.Errorf("%w: ed25519 public key of %d bytes", ErrInvalidKey, len(k))
		}
		return Ed25519, nil
	case *ecdsa.PublicKey:
		if k == nil || k.Curve != elliptic.P256() {
			return "", fmt.Errorf("%w: only the P-256 curve is supported for ECDSA", ErrInvalidKey)
		}
		return ECDSAP256, nil
	}
	return "", fmt.Errorf("%w: unsupported public key type %T (use %s or %s)", ErrInvalidKey, pub, Ed25519, ECDSAP256)
}

// ParsePublicKeyPEM parses one PKIX "PUBLIC KEY" PEM block holding an Ed25519
// or ECDSA P-256 key and returns it with its id and algorithm filled in.
func ParsePublicKeyPEM(b []byte) (PublicKey, error) {
	pub, err := parsePublicPEM(b)
	if err != nil {
		return PublicKey{}, err
	}
	return publicKeyOf(pub)
}

func parsePublicPEM(b []byte) (crypto.PublicKey, error) {
	der, err := onePEMBlock(b, "PUBLIC KEY", "PKIX", "are not allowed")
	if err != nil {
		return nil, err
	}
	pub, err := x509.ParsePKIXPublicKey(der)
	if err != nil {
		return nil, fmt.Errorf("%w: parse PKIX public key: %w", ErrInvalidKey, err)
	}
	return pub, nil
}

// onePEMBlock returns the bytes of b's only PEM block, which must be of
// type typ (format names its encoding in the error) and carry no headers
// (headers says why not) and nothing after it.
func onePEMBlock(b []byte, typ, format, headers string) ([]byte, error) {
	block, rest := pem.Decode(b)
	if block == nil {
		return nil, fmt.Errorf("%w: no PEM block found", ErrInvalidKey)
	}
	if block.Type != typ {
		return nil, fmt.Errorf("%w: PEM block is %q, want %q (%s)", ErrInvalidKey, block.Type, typ, format)
	}
	if len(block.Headers) != 0 {
		return nil, fmt.Errorf("%w: PEM headers %s", ErrInvalidKey, headers)
	}
	if len(bytes.TrimSpace(rest)) != 0 {
		return nil, fmt.Errorf("%w: trailing data after the PEM block", ErrInvalidKey)
	}
	return block.Bytes, nil
}

// Validate checks that k's PEM holds a supported public key, that Algorithm
// names its type and that ID is the hash of its DER. A key that fails this is
// never used to verify anything.
func (k PublicKey) Validate() error {
	_, err := k.verifier()
	return err
}

// verifier parses and checks k and returns a sigstore verifier for it.
func (k PublicKey) verifier() (signature.Verifier, error) {
	if len(k.PEM) > maxKeyFileBytes {
		return nil, fmt.Errorf("%w: public key PEM of %d bytes", ErrInvalidKey, len(k.PEM))
	}
	pub, err := parsePublicPEM([]byte(k.PEM))
	if err != nil {
		return nil, err
	}
	alg, err := algorithmOf(pub)
	if err != nil {
		return nil, err
	}
	if alg != k.Algorithm {
		return nil, fmt.Errorf("%w: key %s is %s, but its algorithm says %q", ErrInvalidKey, shortID(k.ID), alg, string(k.Algorithm))
	}
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		return nil, fmt.Errorf("%w: marshal public key: %w", ErrInvalidKey, err)
	}
	if id := keyIDFromDER(der); id != k.ID {
		return nil, fmt.Errorf("%w: key id %s is not the hash of its public key (%s)", ErrInvalidKey, shortID(k.ID), shortID(id))
	}
	h, err := alg.hash()
	if err != nil {
		return nil, err
	}
	v, err := signature.LoadVerifier(pub, h)
	if err != nil {
		return nil, fmt.Errorf("%w: load %s verifier: %w", ErrInvalidKey, alg, err)
	}
	return v, nil
}

// shortID shortens a key id for messages.
func shortID(id string) string {
	if len(id) > 16 {
		return fmt.Sprintf("%q…", id[:16])
	}
	return fmt.Sprintf("%q", id)
}
