package server

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base32"
	"encoding/base64"
	"errors"
	"regexp"
	"strings"
	"time"

	"github.com/drover/drover/server/errs"
	"github.com/drover/drover/server/store"
)

// Enrollment tokens are "drv1.<id>.<secret>.<ca-pin>" (docs/design.md,
// "Enrollment token"): id is 16 lowercase base32 characters, secret 43
// base64url characters (32 random bytes), ca-pin 64 lowercase hex digits.
// Only sha256(secret) is stored.
const tokenPrefix = "drv1"

var (
	tokenIDRE     = regexp.MustCompile(`^[a-z2-7]{16}$`)
	tokenSecretRE = regexp.MustCompile(`^[A-Za-z0-9_-]{43}$`)
	pinRE         = regexp.MustCompile(`^[0-9a-f]{64}$`)
)

var b32 = base32.StdEncoding.WithPadding(base32.NoPadding)

func randomBytes(n int) []byte {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(err) // crypto/rand never fails on Linux
	}
	return b
}

// newAgentID returns a fresh agent id: "agt-" and 26 lowercase base32 characters.
func newAgentID() string {
	return "agt-" + strings.ToLower(b32.EncodeToString(randomBytes(16)))
}

// newToken makes a token and the record to store for it.
func newToken(pin, name string, tags map[string]string, now time.Time, ttl time.Duration) (string, *store.EnrollmentToken) {
	id := strings.ToLower(b32.EncodeToString(randomBytes(10)))
	secret := base64.RawURLEncoding.EncodeToString(randomBytes(32))
	sum := sha256.Sum256([]byte(secret))
	if tags == nil {
		tags = map[string]string{}
	}
	t := &store.EnrollmentToken{ID: id, SecretHash: sum[:], Name: name, Tags: tags, CreatedAt: now, ExpiresAt: now.Add(ttl)}
	return strings.Join([]string{tokenPrefix, id, secret, pin}, "."), t
}

// parsedToken is a token split into its parts.
type parsedToken struct {
	id, secret, pin string
}

// parseToken splits a token; any deviation from the pinned shape is ErrInvalidToken.
func parseToken(s string) (*parsedToken, error) {
	parts := strings.Split(strings.TrimSpace(s), ".")
	if len(parts) != 4 || parts[0] != tokenPrefix || !tokenIDRE.MatchString(parts[1]) || !tokenSecretRE.MatchString(parts[2]) || !pinRE.MatchString(parts[3]) {
		return nil, errs.New(errs.ErrInvalidToken, "the enrollment token is malformed")
	}
	return &parsedToken{id: parts[1], secret: parts[2], pin: parts[3]}, nil
}

// checkToken verifies a presented token against its stored record. Unknown
// ids and wrong secrets are indistinguishable to the caller.
func checkToken(ctx context.Context, store store.TokenStore, p *parsedToken, now time.Time) (*store.EnrollmentToken, error) {
	invalid := errs.New(errs.ErrInvalidToken, "the enrollment token is not valid")
	t, err := store.GetToken(ctx, p.id)
	if errors.Is(err, errs.ErrNotFound) {
		return nil, invalid
	}
	if err != nil {
		return nil, err
	}
	sum := sha256.Sum256([]byte(p.secret))
	if subtle.ConstantTimeCompare(sum[:], t.SecretHash) != 1 {
		return nil, invalid
	}
	if !t.UsedAt.IsZero() {
		return nil, errs.New(errs.ErrTokenUsed, "the enrollment token was already used")
	}
	if !now.Before(t.ExpiresAt) {
		return nil, errs.New(errs.ErrTokenExpired, "the enrollment token has expired")
	}
	return t, nil
}
