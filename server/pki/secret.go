package pki

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/drover/drover/internal/atomicfile"
)

// LoadOrCreateSecret reads a 32-byte random secret stored hex-encoded in
// dir/name (0600), creating it on first start.
func LoadOrCreateSecret(dir, name string) ([]byte, error) {
	path := filepath.Join(dir, name)
	b, err := readPrivateFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		key := make([]byte, 32)
		if _, err := rand.Read(key); err != nil {
			return nil, err
		}
		if err := writeFile(path, []byte(hex.EncodeToString(key)+"\n"), 0o600); err != nil {
			return nil, err
		}
		return key, nil
	}
	if err != nil {
		return nil, fmt.Errorf("load %s: %w", name, err)
	}
	key, err := hex.DecodeString(strings.TrimSpace(string(b)))
	if err != nil || len(key) != 32 {
		return nil, fmt.Errorf("load %s: not 32 hex-encoded bytes", name)
	}
	return key, nil
}

// AdminToken is the bootstrap admin token's hash (ensureBootstrapToken
// stores it as the API token "bootstrap"). Only its hash is kept in memory.
type AdminToken struct{ hash [32]byte }

// Hash is the sha256 of the admin token.
func (a *AdminToken) Hash() [32]byte { return a.hash }

// LoadOrCreateAdminToken reads admin.token, creating it on first start. The
// token is the file's content: 64 hex digits.
func LoadOrCreateAdminToken(dir string) (*AdminToken, error) {
	key, err := LoadOrCreateSecret(dir, "admin.token")
	if err != nil {
		return nil, err
	}
	return &AdminToken{hash: sha256.Sum256([]byte(hex.EncodeToString(key)))}, nil
}

// ReadAdminToken returns the admin token stored in a data dir, for clients
// on the same host (tests, `drover-server keys rotate`).
func ReadAdminToken(dataDir string) (string, error) {
	b, err := readPrivateFile(filepath.Join(dataDir, "admin.token"))
	if err != nil {
		return "", fmt.Errorf("read admin token: %w", err)
	}
	return strings.TrimSpace(string(b)), nil
}

// readPrivateFile reads a file that must not be accessible by group or
// others (keys, tokens).
func readPrivateFile(path string) ([]byte, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%s is not a regular file", path)
	}
	if fi.Mode().Perm()&0o077 != 0 {
		return nil, fmt.Errorf("%s has mode %#o: group or others may access it; run chmod 600 %s", path, fi.Mode().Perm(), path)
	}
	return os.ReadFile(path)
}

// writeFile replaces path atomically, naming the file in its error.
func writeFile(path string, b []byte, perm fs.FileMode) error {
	if err := atomicfile.Write(path, b, perm); err != nil {
		return fmt.Errorf("write %s: %w", filepath.Base(path), err)
	}
	return nil
}
