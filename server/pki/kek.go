package pki

import (
	"bytes"
	"crypto/cipher"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
)

// DefaultKEKFile is where every replica reads the key-encryption key.
const DefaultKEKFile = "/etc/drover-server/kek"

// The KEK file holds 32 random bytes as 64 hex digits and a newline, mode
// 0600 or stricter. kekFileMax bounds what LoadKEK reads.
const (
	kekBytes   = 32
	kekFileMax = 4096
)

// ErrWrongKEK is returned when the key-encryption key does not open the
// keys stored in the database: it is not the one they were sealed with.
var ErrWrongKEK = errors.New("the key-encryption key does not open the keys stored in the database")

// sealedFormat is the first byte of every sealed server key: AES-256-GCM,
// a 12-byte nonce, then the ciphertext and tag.
const sealedFormat = 1

// KEK is the key-encryption key: AES-256-GCM over the server keys kept in
// the store, each sealed with its id as additional data so that a sealed
// value cannot be moved to another id.
type KEK struct {
	aead cipher.AEAD
	id   string // short fingerprint, safe to log
}

// NewKEK makes a KEK of 32 key bytes.
func NewKEK(key []byte) (*KEK, error) {
	if len(key) != kekBytes {
		return nil, fmt.Errorf("key-encryption key: %d bytes, want %d", len(key), kekBytes)
	}
	aead, err := newAESGCM("key-encryption key", key)
	if err != nil {
		return nil, err
	}
	sum := sha256.Sum256(append([]byte("drover kek id\x00"), key...))
	return &KEK{aead: aead, id: hex.EncodeToString(sum[:4])}, nil
}

// ID is a short fingerprint of the KEK (not of its bytes: a hash under a
// fixed prefix), for logs and errors that must tell two KEKs apart.
func (k *KEK) ID() string { return k.id }

func kekAD(id string) []byte { return []byte("drover-server key\x00" + id) }

// Seal encrypts plain as the server key id.
func (k *KEK) Seal(id string, plain []byte) []byte {
	return sealFreshNonce(k.aead, []byte{sealedFormat}, plain, kekAD(id))
}

// Open decrypts the server key id; a KEK that did not seal it fails with
// ErrWrongKEK (the error never holds key bytes).
func (k *KEK) Open(id string, sealed []byte) ([]byte, error) {
	n := k.aead.NonceSize()
	if len(sealed) < 1+n+k.aead.Overhead() || sealed[0] != sealedFormat {
		return nil, fmt.Errorf("open server key %s: not a sealed key of a known format", id)
	}
	plain, err := k.aead.Open(nil, sealed[1:1+n], sealed[1+n:], kekAD(id))
	if err != nil {
		return nil, fmt.Errorf("open server key %s with KEK %s: %w", id, k.id, ErrWrongKEK)
	}
	return plain, nil
}

// LoadKEK reads the KEK file: a regular file of mode 0600 or stricter
// holding 64 hex digits (whitespace around them is ignored). Each error
// names the file and what to do, never the content.
func LoadKEK(path string) (*KEK, error) {
	fi, err := os.Stat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("kek_file %s does not exist: create it once with `drover-server kek generate --out %s` and copy it to every replica (mode 0600)", path, path)
	}
	if err != nil {
		return nil, fmt.Errorf("kek_file %s: %w", path, err)
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("kek_file %s is not a regular file", path)
	}
	if perm := fi.Mode().Perm(); perm&0o077 != 0 {
		return nil, fmt.Errorf("kek_file %s has mode %#o: group or others may access it; run chmod 600 %s", path, perm, path)
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("kek_file %s: %w", path, err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, kekFileMax+1))
	if err != nil {
		return nil, fmt.Errorf("kek_file %s: %w", path, err)
	}
	key, err := hex.DecodeString(string(bytes.TrimSpace(b)))
	if err != nil || len(key) != kekBytes {
		return nil, fmt.Errorf("kek_file %s does not hold a key: want %d hex digits (32 random bytes), as `drover-server kek generate` writes", path, 2*kekBytes)
	}
	return NewKEK(key)
}

// GenerateKEK writes a new random KEK to path (mode 0600). It refuses to
// replace an existing file: keys sealed with it would be lost.
func GenerateKEK(path string) (*KEK, error) {
	key := make([]byte, kekBytes)
	if _, err := rand.Read(key); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("kek generate: %w", err)
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if errors.Is(err, fs.ErrExist) {
		return nil, fmt.Errorf("kek generate: %s exists; it may seal keys in use, so it is not replaced (remove it first if it really is unused)", path)
	}
	if err != nil {
		return nil, fmt.Errorf("kek generate: %w", err)
	}
	_, err = f.WriteString(hex.EncodeToString(key) + "\n")
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(path)
		return nil, fmt.Errorf("kek generate: %w", err)
	}
	return NewKEK(key)
}
