// Package pemutil holds the certificate handling of enrollment
// (docs/design.md, "Enrollment") that the agent, the simulator's agents and
// the tests' fake agents share: an ECDSA P-256 key with its CSR, the key in
// PEM, the certificates of a PEM bundle, the CA pin an enrollment token
// carries (which the server's PKI computes with Pin too) and the TLS
// configuration that trusts only the pinned CA.
//
// Imported by agent, server/pki, cmd/drover-sim/sim and tests.
package pemutil

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"

	"github.com/drover/drover/signing"
)

// NewKeyAndCSR generates an ECDSA P-256 key and a PEM certificate request
// for it with commonName as the subject.
func NewKeyAndCSR(commonName string) (*ecdsa.PrivateKey, string, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, "", err
	}
	tmpl := &x509.CertificateRequest{Subject: pkix.Name{CommonName: commonName}}
	der, err := x509.CreateCertificateRequest(rand.Reader, tmpl, key)
	if err != nil {
		return nil, "", err
	}
	return key, string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der})), nil
}

// ECKey returns key as an "EC PRIVATE KEY" PEM block.
func ECKey(key *ecdsa.PrivateKey) ([]byte, error) {
	der, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der}), nil
}

// Certificates parses the CERTIFICATE blocks of b (other blocks are
// skipped); it fails when there is none.
func Certificates(b []byte) ([]*x509.Certificate, error) {
	var out []*x509.Certificate
	for {
		var block *pem.Block
		block, b = pem.Decode(b)
		if block == nil {
			break
		}
		if block.Type != "CERTIFICATE" {
			continue
		}
		c, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			return nil, err
		}
		out = append(out, c)
	}
	if len(out) == 0 {
		return nil, errors.New("no certificate")
	}
	return out, nil
}

// Pin returns the enrollment-token pin of a certificate: the lowercase hex
// sha256 of its SubjectPublicKeyInfo DER.
func Pin(c *x509.Certificate) string {
	sum := sha256.Sum256(c.RawSubjectPublicKeyInfo)
	return hex.EncodeToString(sum[:])
}

// ErrPinMismatch: no certificate the server presented matches the token's pin.
var ErrPinMismatch = errors.New("server CA does not match the enrollment token's pin")

// PinnedTLS is the TLS configuration of an enrollment request. The only
// trust anchor is the CA whose pin is pin: some certificate of the chain
// the server presents must be it, and the leaf must verify under it for
// host. Both checks happen in the handshake, so nothing is sent to a
// server that fails them.
func PinnedTLS(host, pin string) *tls.Config {
	return &tls.Config{
		MinVersion:         tls.VersionTLS12,
		CipherSuites:       signing.TLSCipherSuites(),
		ServerName:         host,
		InsecureSkipVerify: true, // replaced by VerifyConnection below
		VerifyConnection: func(cs tls.ConnectionState) error {
			return VerifyPinned(cs.PeerCertificates, host, pin)
		},
	}
}

// VerifyPinned checks a presented chain as PinnedTLS does; a chain without
// the pinned CA fails with ErrPinMismatch.
func VerifyPinned(chain []*x509.Certificate, host, pin string) error {
	if len(chain) == 0 {
		return fmt.Errorf("%w: the server sent no certificate", ErrPinMismatch)
	}
	var ca *x509.Certificate
	for _, c := range chain {
		if Pin(c) == pin {
			ca = c
			break
		}
	}
	if ca == nil {
		return ErrPinMismatch
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca)
	inter := x509.NewCertPool()
	for _, c := range chain[1:] {
		inter.AddCert(c)
	}
	opts := x509.VerifyOptions{Roots: roots, Intermediates: inter, DNSName: host}
	if _, err := chain[0].Verify(opts); err != nil {
		return fmt.Errorf("server certificate does not verify under the pinned CA: %w", err)
	}
	return nil
}
