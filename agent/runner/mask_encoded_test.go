package runner

import (
	"encoding/base64"
	"net/url"
	"strings"
	"testing"
)

// TestMaskerEncodedForms: a job that prints a secret in base64 (either
// alphabet, padded or not, alone or inside a longer encoded text at any
// alignment) or URL-encoded does not ship it.
func TestMaskerEncodedForms(t *testing.T) {
	secret := "p@ss w0rd/+?&=s3cret"
	leaks := map[string]string{
		"std":      base64.StdEncoding.EncodeToString([]byte(secret)),
		"raw std":  base64.RawStdEncoding.EncodeToString([]byte(secret)),
		"url":      base64.URLEncoding.EncodeToString([]byte(secret)),
		"raw url":  base64.RawURLEncoding.EncodeToString([]byte(secret)),
		"query":    url.QueryEscape(secret),
		"path":     url.PathEscape(secret),
		"basic":    base64.StdEncoding.EncodeToString([]byte("user:" + secret)),
		"shift 1":  base64.StdEncoding.EncodeToString([]byte("x" + secret + "tail")),
		"shift 2":  base64.StdEncoding.EncodeToString([]byte("xy" + secret + "t")),
		"shift 0":  base64.StdEncoding.EncodeToString([]byte("xyz" + secret + "tt")),
		"url sh 1": base64.URLEncoding.EncodeToString([]byte("{" + secret + "}")),
	}
	for name, leak := range leaks {
		out := maskAll(newMasker([]string{secret}), []string{"before " + leak[:len(leak)/2], leak[len(leak)/2:] + " after\n"})
		// The characters that depend on the secret alone must be gone.
		core := shiftedBase64(base64.RawStdEncoding, secret, 2)
		if strings.Contains(out, secret) || strings.Contains(out, leak) || (strings.HasPrefix(name, "shift") && strings.Contains(out, core[:len(core)-4])) {
			t.Errorf("%s: %q leaked: %q", name, leak, out)
		}
		if !strings.Contains(out, Mask) {
			t.Errorf("%s: nothing masked in %q", name, out)
		}
	}
	// Short values mask only themselves, not their short encodings.
	if got := maskAll(newMasker([]string{"ab"}), []string{"YWI= ab"}); got != "YWI= "+Mask {
		t.Errorf("short value: %q", got)
	}
}
