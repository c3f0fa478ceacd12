package signing

import (
	"crypto/tls"
	"strings"
	"testing"
)

// TestTLSCipherSuitesAEADOnly: every TLS 1.2 suite offered is ECDHE with
// an AEAD cipher, and none is on Go's insecure list.
func TestTLSCipherSuitesAEADOnly(t *testing.T) {
	secure := map[uint16]*tls.CipherSuite{}
	for _, s := range tls.CipherSuites() {
		secure[s.ID] = s
	}
	for _, id := range TLSCipherSuites() {
		s, ok := secure[id]
		name := tls.CipherSuiteName(id)
		if !ok || !strings.HasPrefix(name, "TLS_ECDHE_") || !(strings.Contains(name, "_GCM_") || strings.Contains(name, "CHACHA20_POLY1305")) {
			t.Errorf("%s is not an ECDHE AEAD suite of tls.CipherSuites()", name)
			continue
		}
		if !containsVersion(s.SupportedVersions, tls.VersionTLS12) {
			t.Errorf("%s is not a TLS 1.2 suite", name)
		}
	}
}

func containsVersion(vs []uint16, v uint16) bool {
	for _, x := range vs {
		if x == v {
			return true
		}
	}
	return false
}
