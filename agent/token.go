package agent

import (
	"errors"
	"fmt"
	"regexp"
	"strings"
)

// Token is a parsed enrollment token `drv1.<id>.<secret>.<ca-pin>`
// (docs/design.md, "Enrollment token").
type Token struct {
	Raw    string
	ID     string
	Secret string
	// Pin is the lowercase hex sha256 of the server CA certificate's
	// SubjectPublicKeyInfo DER.
	Pin string
}

// ErrBadToken is wrapped by every token parse error.
var ErrBadToken = errors.New("malformed enrollment token")

var (
	tokenPartRE = regexp.MustCompile(`^[A-Za-z0-9_-]{1,128}$`)
	pinRE       = regexp.MustCompile(`^[0-9a-f]{64}$`)
)

// ParseToken parses a token, trimming surrounding white space (a token file
// usually ends with a newline). Its secret never appears in the error.
func ParseToken(s string) (Token, error) {
	s = strings.TrimSpace(s)
	parts := strings.Split(s, ".")
	if len(parts) != 4 || parts[0] != "drv1" {
		return Token{}, fmt.Errorf("%w: want drv1.<id>.<secret>.<ca-pin>", ErrBadToken)
	}
	if !tokenPartRE.MatchString(parts[1]) {
		return Token{}, fmt.Errorf("%w: bad id", ErrBadToken)
	}
	if !tokenPartRE.MatchString(parts[2]) {
		return Token{}, fmt.Errorf("%w: bad secret", ErrBadToken)
	}
	pin := strings.ToLower(parts[3])
	if !pinRE.MatchString(pin) {
		return Token{}, fmt.Errorf("%w: the CA pin must be 64 hex digits", ErrBadToken)
	}
	return Token{Raw: s, ID: parts[1], Secret: parts[2], Pin: pin}, nil
}

// String hides the secret.
func (t Token) String() string { return "drv1." + t.ID + ".***." + t.Pin }
