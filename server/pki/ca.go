// Package pki holds the server's key material, all kept as files in the
// data dir: the certificate authority that signs the server's TLS
// certificate and every agent's client certificate, the keyring of the
// root and manifest signing keys with its root-signed key list
// (docs/design.md, "Manifest"), the AES-GCM sealer of secrets at rest, and
// the bootstrap admin token. Only the server's wiring, its handlers and its
// CLI import it.
package pki

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/drover/drover/api"
	"github.com/drover/drover/internal/pemutil"
	"github.com/drover/drover/server/errs"
)

// Certificate lifetimes of the server's own PKI.
const (
	caLifetime        = 10 * 365 * 24 * time.Hour
	serverCertLife    = 365 * 24 * time.Hour
	serverCertRenewAt = 30 * 24 * time.Hour // re-issue at start when less is left
	certBackdate      = 5 * time.Minute     // tolerate clock skew between hosts
	maxCSRBytes       = 16 << 10
)

// AgentURIPrefix starts the URI SAN that names an agent in its certificate.
const AgentURIPrefix = "drover://agent/"

// CA is the server's certificate authority: it signs the server's TLS
// certificate and every agent's client certificate.
type CA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte // the CA certificate in PEM, as served in ca_bundle
	pin  string // lowercase hex sha256 of the CA's SubjectPublicKeyInfo DER
	pool *x509.CertPool
}

// PEM is the CA certificate in PEM, as served in ca_bundle.
func (c *CA) PEM() []byte { return c.pem }

// Pin is the CA's enrollment-token pin (CAPin of its certificate).
func (c *CA) Pin() string { return c.pin }

// Pool is a pool holding only the CA, to verify client certificates.
func (c *CA) Pool() *x509.CertPool { return c.pool }

// CAPin returns the enrollment-token pin of a CA certificate: the lowercase
// hex sha256 of its SubjectPublicKeyInfo DER.
func CAPin(cert *x509.Certificate) string { return pemutil.Pin(cert) }

// LoadOrCreateCA reads ca.key/ca.crt from dir, creating them on first start.
func LoadOrCreateCA(dir string, now time.Time) (*CA, error) {
	keyPath, certPath := filepath.Join(dir, "ca.key"), filepath.Join(dir, "ca.crt")
	keyPEM, err := readPrivateFile(keyPath)
	if errors.Is(err, fs.ErrNotExist) {
		return createCA(keyPath, certPath, now)
	}
	if err != nil {
		return nil, fmt.Errorf("load CA key: %w", err)
	}
	certPEM, err := os.ReadFile(certPath)
	if err != nil {
		return nil, fmt.Errorf("load CA certificate: %w", err)
	}
	return parseCA(keyPEM, certPEM)
}

func createCA(keyPath, certPath string, now time.Time) (*CA, error) {
	key, der, cert, err := generateCA(now)
	if err != nil {
		return nil, err
	}
	_, certPEM, err := writeKeyPair(keyPath, certPath, key, der, 0o644)
	if err != nil {
		return nil, err
	}
	return newCA(cert, key, certPEM), nil
}

// generateCA makes a new CA key and its self-signed certificate.
func generateCA(now time.Time) (*ecdsa.PrivateKey, []byte, *x509.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("create CA: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          randomSerial(),
		Subject:               pkix.Name{CommonName: "Drover CA", Organization: []string{"Drover"}},
		NotBefore:             now.Add(-certBackdate),
		NotAfter:              now.Add(caLifetime),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("create CA: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("create CA: %w", err)
	}
	return key, der, cert, nil
}

// parseCA builds the CA from its key and certificate PEMs.
func parseCA(keyPEM, certPEM []byte) (*CA, error) {
	key, err := parseECKey(keyPEM)
	if err != nil {
		return nil, fmt.Errorf("load CA key: %w", err)
	}
	cert, err := ParseCertPEM(certPEM)
	if err != nil {
		return nil, fmt.Errorf("load CA certificate: %w", err)
	}
	if !cert.PublicKey.(interface{ Equal(crypto.PublicKey) bool }).Equal(key.Public()) {
		return nil, errors.New("load CA: ca.crt does not match ca.key")
	}
	return newCA(cert, key, certPEM), nil
}

// writeKeyPair writes key (0600) and the certificate der (certPerm) as
// PEM files and returns both PEMs. The key goes first: a crash between the
// two writes leaves a key without a certificate, which the next start
// replaces.
func writeKeyPair(keyPath, certPath string, key *ecdsa.PrivateKey, der []byte, certPerm fs.FileMode) (keyPEM, certPEM []byte, err error) {
	keyPEM, err = MarshalECKey(key)
	if err != nil {
		return nil, nil, err
	}
	certPEM = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	if err := writeFile(keyPath, keyPEM, 0o600); err != nil {
		return nil, nil, err
	}
	if err := writeFile(certPath, certPEM, certPerm); err != nil {
		return nil, nil, err
	}
	return keyPEM, certPEM, nil
}

func newCA(cert *x509.Certificate, key *ecdsa.PrivateKey, certPEM []byte) *CA {
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return &CA{cert: cert, key: key, pem: certPEM, pin: CAPin(cert), pool: pool}
}

// LoadOrCreateServerCert returns the TLS certificate for both listeners,
// (re)issuing it when missing, near expiry, not from this CA, or lacking a
// wanted SAN.
func LoadOrCreateServerCert(dir string, c *CA, sans []string, now time.Time) (tls.Certificate, error) {
	keyPath, certPath := filepath.Join(dir, "tls.key"), filepath.Join(dir, "tls.crt")
	dns, ips := splitSANs(sans)
	if keyPEM, err := readPrivateFile(keyPath); err == nil {
		if certPEM, err := os.ReadFile(certPath); err == nil {
			if cert, err := ParseCertPEM(certPEM); err == nil && serverCertUsable(cert, c, dns, ips, now) {
				pair, err := tls.X509KeyPair(append(certPEM, c.pem...), keyPEM)
				if err == nil {
					return pair, nil
				}
			}
		}
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("create server certificate: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: randomSerial(),
		Subject:      pkix.Name{CommonName: "drover-server"},
		NotBefore:    now.Add(-certBackdate),
		NotAfter:     minTime(now.Add(serverCertLife), c.cert.NotAfter),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames:     dns,
		IPAddresses:  ips,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, c.cert, key.Public(), c.key)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("create server certificate: %w", err)
	}
	keyPEM, certPEM, err := writeKeyPair(keyPath, certPath, key, der, 0o600)
	if err != nil {
		return tls.Certificate{}, err
	}
	// The chain carries the CA so that an enrolling agent can check its pin.
	return tls.X509KeyPair(append(certPEM, c.pem...), keyPEM)
}

func serverCertUsable(cert *x509.Certificate, c *CA, dns []string, ips []net.IP, now time.Time) bool {
	if cert.CheckSignatureFrom(c.cert) != nil || cert.NotAfter.Sub(now) < serverCertRenewAt || now.Before(cert.NotBefore) {
		return false
	}
	for _, d := range dns {
		if !slices.Contains(cert.DNSNames, d) {
			return false
		}
	}
	for _, ip := range ips {
		if !slices.ContainsFunc(cert.IPAddresses, ip.Equal) {
			return false
		}
	}
	return true
}

func splitSANs(sans []string) (dns []string, ips []net.IP) {
	for _, s := range sans {
		if ip := net.ParseIP(s); ip != nil {
			ips = append(ips, ip)
		} else {
			dns = append(dns, strings.ToLower(s))
		}
	}
	return dns, ips
}

// ParseAgentCSR checks a CSR from an agent: one PEM "CERTIFICATE REQUEST",
// a valid self-signature, an ECDSA P-256 key. Its subject and SANs are
// ignored: the identity comes from the server.
func ParseAgentCSR(csrPEM string) (*x509.CertificateRequest, error) {
	if len(csrPEM) > maxCSRBytes {
		return nil, errs.New(errs.ErrInvalidRequest, "csr is too large", api.Detail{Field: "csr", Message: "too large"})
	}
	bad := func(msg string) error {
		return errs.New(errs.ErrInvalidRequest, "invalid csr: "+msg, api.Detail{Field: "csr", Message: msg})
	}
	block, rest := pem.Decode([]byte(csrPEM))
	if block == nil || block.Type != "CERTIFICATE REQUEST" {
		return nil, bad(`not a PEM "CERTIFICATE REQUEST" block`)
	}
	if len(bytes.TrimSpace(rest)) != 0 {
		return nil, bad("trailing data after the PEM block")
	}
	csr, err := x509.ParseCertificateRequest(block.Bytes)
	if err != nil {
		return nil, bad("cannot parse the certificate request")
	}
	if err := csr.CheckSignature(); err != nil {
		return nil, bad("the request's signature does not verify")
	}
	pub, ok := csr.PublicKey.(*ecdsa.PublicKey)
	if !ok || pub.Curve != elliptic.P256() {
		return nil, bad("the key must be ECDSA P-256")
	}
	return csr, nil
}

// IssueAgentCert signs a client certificate for agentID over the CSR's key.
// It returns the certificate PEM, its serial (lowercase hex) and its expiry.
func (c *CA) IssueAgentCert(agentID string, csr *x509.CertificateRequest, now time.Time, life time.Duration) (certPEM []byte, serial string, notAfter time.Time, err error) {
	return c.IssueAgentCertWith(agentID, csr, now, life, nil)
}

// oidKeyHistory names the extension in which a renewed agent certificate
// carries the sha256 of each key the agent held before (newest first, at
// most MaxKeyHistory): the server refuses a renewal on any of them without
// keeping state of its own, and the CA's signature keeps the list honest.
// The arc is 2.25 (an integer UUID), so it cannot clash with anyone's.
var oidKeyHistory = asn1.ObjectIdentifier{2, 25, 1930117461, 16, 1}

const MaxKeyHistory = 16

// SPKIHash is the sha256 of a public key's SubjectPublicKeyInfo.
func SPKIHash(pub any) ([]byte, error) {
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		return nil, fmt.Errorf("marshal public key: %w", err)
	}
	sum := sha256.Sum256(der)
	return sum[:], nil
}

// KeyHistory is the list of earlier keys a certificate carries.
func KeyHistory(cert *x509.Certificate) [][]byte {
	for _, e := range cert.Extensions {
		if e.Id.Equal(oidKeyHistory) {
			var list [][]byte
			if _, err := asn1.Unmarshal(e.Value, &list); err == nil {
				return list
			}
		}
	}
	return nil
}

// IssueAgentCertWith is IssueAgentCert with a key history extension.
func (c *CA) IssueAgentCertWith(agentID string, csr *x509.CertificateRequest, now time.Time, life time.Duration, history [][]byte) (certPEM []byte, serial string, notAfter time.Time, err error) {
	u, err := url.Parse(AgentURIPrefix + agentID)
	if err != nil {
		return nil, "", time.Time{}, fmt.Errorf("issue agent certificate: %w", err)
	}
	sn := randomSerial()
	notAfter = minTime(now.Add(life), c.cert.NotAfter).UTC().Truncate(time.Second)
	tmpl := &x509.Certificate{
		SerialNumber: sn,
		Subject:      pkix.Name{CommonName: agentID},
		NotBefore:    now.Add(-certBackdate),
		NotAfter:     notAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
		URIs:         []*url.URL{u},
	}
	if len(history) > 0 {
		v, err := asn1.Marshal(history)
		if err != nil {
			return nil, "", time.Time{}, fmt.Errorf("issue agent certificate: %w", err)
		}
		tmpl.ExtraExtensions = []pkix.Extension{{Id: oidKeyHistory, Value: v}}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, c.cert, csr.PublicKey, c.key)
	if err != nil {
		return nil, "", time.Time{}, fmt.Errorf("issue agent certificate: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), SerialHex(sn), notAfter, nil
}

// AgentIdentity extracts the agent id from a verified client certificate:
// the CommonName and the single drover://agent/<id> URI SAN must agree.
func AgentIdentity(cert *x509.Certificate) (id, serial string, err error) {
	if len(cert.URIs) != 1 {
		return "", "", errs.New(errs.ErrCertRefused, "the client certificate does not name an agent")
	}
	uri := cert.URIs[0].String()
	id, ok := strings.CutPrefix(uri, AgentURIPrefix)
	if !ok || id == "" || id != cert.Subject.CommonName {
		return "", "", errs.New(errs.ErrCertRefused, "the client certificate does not name an agent")
	}
	return id, SerialHex(cert.SerialNumber), nil
}

func randomSerial() *big.Int {
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		panic(err) // crypto/rand never fails on Linux
	}
	b[0] &= 0x7f
	b[0] |= 0x40 // 127 bits, positive, never short
	return new(big.Int).SetBytes(b)
}

func SerialHex(n *big.Int) string { return hex.EncodeToString(n.Bytes()) }

func MarshalECKey(k *ecdsa.PrivateKey) ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(k)
	if err != nil {
		return nil, fmt.Errorf("marshal key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
}

func parseECKey(b []byte) (*ecdsa.PrivateKey, error) {
	block, _ := pem.Decode(b)
	if block == nil || block.Type != "PRIVATE KEY" {
		return nil, errors.New(`not a PEM "PRIVATE KEY" block`)
	}
	k, err := x509.ParsePKCS8PrivateKey(block.Bytes)
	if err != nil {
		return nil, err
	}
	ek, ok := k.(*ecdsa.PrivateKey)
	if !ok || ek.Curve != elliptic.P256() {
		return nil, errors.New("not an ECDSA P-256 key")
	}
	return ek, nil
}

func ParseCertPEM(b []byte) (*x509.Certificate, error) {
	block, _ := pem.Decode(b)
	if block == nil || block.Type != "CERTIFICATE" {
		return nil, errors.New(`not a PEM "CERTIFICATE" block`)
	}
	return x509.ParseCertificate(block.Bytes)
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}
