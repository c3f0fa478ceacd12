// Package pemutil holds the PEM and key handling that the agent, the
// simulator's agents and the tests' fake agents share for enrollment
// (docs/design.md, "Enrollment"): an ECDSA P-256 key with its CSR, the key
// in PEM, and the certificates of a PEM bundle.
//
// Imported by agent, cmd/drover-sim/sim and tests; not by the server.
package pemutil

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
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
