package pemutil

import (
	"crypto/x509"
	"encoding/pem"
	"errors"
	"testing"
)

func TestKeyCSRAndCertificates(t *testing.T) {
	key, csrPEM, err := NewKeyAndCSR("host-1")
	if err != nil {
		t.Fatal(err)
	}
	block, _ := pem.Decode([]byte(csrPEM))
	if block == nil || block.Type != "CERTIFICATE REQUEST" {
		t.Fatalf("CSR PEM %q", csrPEM)
	}
	csr, err := x509.ParseCertificateRequest(block.Bytes)
	if err != nil || csr.CheckSignature() != nil || csr.Subject.CommonName != "host-1" {
		t.Fatalf("CSR %v %v", csr, err)
	}
	keyPEM, err := ECKey(key)
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := pem.Decode(keyPEM); b == nil || b.Type != "EC PRIVATE KEY" {
		t.Fatalf("key PEM %q", keyPEM)
	}
	if _, err := Certificates(keyPEM); err == nil || err.Error() != "no certificate" {
		t.Fatalf("Certificates of a key: %v", err)
	}
	if _, err := Certificates([]byte("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n")); err == nil {
		t.Fatal("a broken certificate parsed")
	}
}

func TestVerifyPinnedRefusesUnpinned(t *testing.T) {
	if err := VerifyPinned(nil, "h", "00"); !errors.Is(err, ErrPinMismatch) {
		t.Fatalf("empty chain: %v", err)
	}
}
