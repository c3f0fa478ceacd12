package pki

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"errors"
	"fmt"
)

// Sealer encrypts secret values at rest with AES-256-GCM. The secret's name
// is the additional data, so a sealed value cannot be moved to another name.
type Sealer struct{ aead cipher.AEAD }

func NewSealer(key []byte) (*Sealer, error) {
	aead, err := newAESGCM("secrets key", key)
	if err != nil {
		return nil, err
	}
	return &Sealer{aead: aead}, nil
}

// Seal returns nonce || ciphertext.
func (s *Sealer) Seal(name string, value []byte) []byte {
	return sealFreshNonce(s.aead, nil, value, []byte(name))
}

func (s *Sealer) Open(name string, sealed []byte) ([]byte, error) {
	n := s.aead.NonceSize()
	if len(sealed) < n {
		return nil, errors.New("open secret: sealed value too short")
	}
	v, err := s.aead.Open(nil, sealed[:n], sealed[n:], []byte(name))
	if err != nil {
		return nil, fmt.Errorf("open secret %s: %w", name, err)
	}
	return v, nil
}

// newAESGCM is AES-GCM under key (16, 24 or 32 bytes: AES-128, -192,
// -256); what names the key in errors.
func newAESGCM(what string, key []byte) (cipher.AEAD, error) {
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	return aead, nil
}

// sealFreshNonce seals plain with ad under a new random nonce and returns
// prefix || nonce || ciphertext.
func sealFreshNonce(aead cipher.AEAD, prefix, plain, ad []byte) []byte {
	nonce := make([]byte, aead.NonceSize())
	if _, err := rand.Read(nonce); err != nil {
		panic(err) // crypto/rand never fails on Linux
	}
	return aead.Seal(append(prefix, nonce...), nonce, plain, ad)
}
