package sim

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"regexp"
	"strings"
	"time"

	"github.com/drover/drover/api"
	"github.com/drover/drover/internal/pemutil"
	"github.com/drover/drover/signing"
)

// identity is what one simulated agent holds after enrollment.
type identity struct {
	agentID  string
	grpcAddr string
	cert     tls.Certificate
	caPool   *x509.CertPool
	trust    *signing.TrustRoot
}

var pinRE = regexp.MustCompile(`^[0-9a-f]{64}$`)

// tokenPin returns the CA pin of an enrollment token drv1.<id>.<secret>.<pin>.
func tokenPin(tok string) (string, error) {
	parts := strings.Split(strings.TrimSpace(tok), ".")
	if len(parts) != 4 || parts[0] != "drv1" || !pinRE.MatchString(parts[3]) {
		return "", errors.New("malformed enrollment token: want drv1.<id>.<secret>.<ca-pin>")
	}
	return parts[3], nil
}

// keyCSR is an agent's key and its certificate request, made before the
// enrollment (as a host's own agent does on its own CPU).
type keyCSR struct {
	key *ecdsa.PrivateKey
	csr string
}

// newKeyCSR makes a fresh ECDSA P-256 key and its CSR.
func newKeyCSR(hostname string) (*keyCSR, error) {
	key, csr, err := pemutil.NewKeyAndCSR(hostname)
	if err != nil {
		return nil, fmt.Errorf("key: %w", err)
	}
	return &keyCSR{key: key, csr: csr}, nil
}

// enroll runs the enrollment protocol once: kc's key (a fresh one when kc
// is nil), the server's CA checked against the token's pin in the
// handshake, the CSR posted, the certificate checked against the key and
// the CA bundle, the trust root verified.
func enroll(ctx context.Context, server, host, token, hostname, machineID string, kc *keyCSR, src net.IP, timeout time.Duration) (*identity, error) {
	pin, err := tokenPin(token)
	if err != nil {
		return nil, err
	}
	if kc == nil {
		if kc, err = newKeyCSR(hostname); err != nil {
			return nil, err
		}
	}
	key, csr := kc.key, kc.csr
	body, _ := json.Marshal(api.EnrollRequest{Token: token, Hostname: hostname, OS: "linux", Arch: "amd64", AgentVersion: "drover-sim", CSR: csr, MachineID: machineID})
	tr := &http.Transport{TLSClientConfig: pemutil.PinnedTLS(host, pin), DialContext: dialer(src, timeout), DisableKeepAlives: true}
	defer tr.CloseIdleConnections()
	c := &http.Client{Timeout: timeout, Transport: tr}
	req, err := http.NewRequestWithContext(ctx, "POST", server+"/api/v1/agents/enroll", bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, api.ReadError(resp)
	}
	var out api.EnrollResponse
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&out); err != nil {
		return nil, fmt.Errorf("enrollment answer: %w", err)
	}
	if _, _, err := net.SplitHostPort(out.GRPCAddr); err != nil || out.AgentID == "" {
		return nil, fmt.Errorf("enrollment answer: agent_id %q, grpc_addr %q", out.AgentID, out.GRPCAddr)
	}
	cas, err := pemutil.Certificates([]byte(out.CABundle))
	if err != nil {
		return nil, fmt.Errorf("ca_bundle: %w", err)
	}
	pool := x509.NewCertPool()
	pinned := false
	for _, ca := range cas {
		pool.AddCert(ca)
		pinned = pinned || pemutil.Pin(ca) == pin
	}
	if !pinned {
		return nil, errors.New("ca_bundle: no CA matches the token's pin")
	}
	keyPEM, err := pemutil.ECKey(key)
	if err != nil {
		return nil, fmt.Errorf("certificate: %w", err)
	}
	cert, err := tls.X509KeyPair([]byte(out.Certificate), keyPEM)
	if err != nil {
		return nil, fmt.Errorf("certificate: %w", err)
	}
	leaf, err := x509.ParseCertificate(cert.Certificate[0])
	if err != nil {
		return nil, fmt.Errorf("certificate: %w", err)
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		return nil, fmt.Errorf("certificate: %w", err)
	}
	cert.Leaf = leaf
	var kl bytes.Buffer
	if err := json.Compact(&kl, out.TrustRoot.KeyList); err != nil {
		return nil, fmt.Errorf("trust_root.key_list: %w", err)
	}
	trust, err := signing.NewTrustRoot(out.TrustRoot.RootKeys, kl.Bytes(), time.Now())
	if err != nil {
		return nil, fmt.Errorf("trust_root: %w", err)
	}
	return &identity{agentID: out.AgentID, grpcAddr: out.GRPCAddr, cert: cert, caPool: pool, trust: trust}, nil
}
