package agent

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"runtime"
	"strings"
	"time"

	"github.com/drover/drover/api"
	"github.com/drover/drover/internal/pemutil"

	"github.com/drover/drover/signing"
)

// HostInfo describes the host in enrollment and in Hello.
type HostInfo struct {
	Hostname     string
	OS           string
	Arch         string
	AgentVersion string
	// MachineID is the host's machine id (machine-id(5)); "" when unknown.
	MachineID string
}

// checkIssued checks that certPEM's leaf is for key and verifies as a client
// certificate under the CAs of caPEM.
func checkIssued(certPEM, caPEM []byte, key *ecdsa.PrivateKey, now time.Time) (*x509.Certificate, error) {
	chain, err := pemutil.Certificates(certPEM)
	if err != nil {
		return nil, fmt.Errorf("certificate: %w", err)
	}
	leaf := chain[0]
	pub, ok := leaf.PublicKey.(*ecdsa.PublicKey)
	if !ok || !pub.Equal(&key.PublicKey) {
		return nil, errors.New("certificate: not for the key this agent generated")
	}
	cas, err := pemutil.Certificates(caPEM)
	if err != nil {
		return nil, fmt.Errorf("ca_bundle: %w", err)
	}
	roots := x509.NewCertPool()
	for _, c := range cas {
		roots.AddCert(c)
	}
	inter := x509.NewCertPool()
	for _, c := range chain[1:] {
		inter.AddCert(c)
	}
	if _, err := leaf.Verify(x509.VerifyOptions{
		Roots: roots, Intermediates: inter, CurrentTime: now,
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}); err != nil {
		return nil, fmt.Errorf("certificate: does not verify under the CA bundle: %w", err)
	}
	return leaf, nil
}

// compactJSON normalises the bytes of a key-list envelope so that the same
// list always compares equal.
func compactJSON(b []byte) ([]byte, error) {
	var buf bytes.Buffer
	if err := json.Compact(&buf, b); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// enrollServers are the URLs enrollment tries, in order: server, then
// the configured replica URLs.
func enrollServers(cfg Config) []string {
	var out []string
	for _, u := range append([]string{cfg.Server}, cfg.ServerURLs...) {
		if u != "" && indexOf(out, u, sameURL) < 0 {
			out = append(out, u)
		}
	}
	return out
}

// enroll enrolls with tok through the first of servers that answers: a
// server that cannot be reached is skipped, any answer (an acceptance or
// a refusal) ends the attempt.
func enroll(ctx context.Context, servers []string, tok Token, host HostInfo, dataDir string, st Store, timeout time.Duration, now func() time.Time, log *slog.Logger) (*Identity, error) {
	if len(servers) == 0 {
		return nil, errors.New("enroll: no server URL configured (server: in agent.yaml, --server or DROVER_SERVER)")
	}
	var err error
	for i, server := range servers {
		var id *Identity
		id, err = enrollAt(ctx, server, tok, host, dataDir, st, timeout, now, log)
		if err == nil || ctx.Err() != nil || !unreachable(err) {
			return id, err
		}
		if i < len(servers)-1 {
			log.Warn("enrollment: the server does not answer; trying the next one", "server", server, "err", err)
		}
	}
	return nil, err
}

// unreachable reports whether err says a server was not reached at all
// (no HTTP answer, no TLS refusal of ours).
func unreachable(err error) bool {
	var ae *api.Error
	if errors.As(err, &ae) || errors.Is(err, pemutil.ErrPinMismatch) {
		return false
	}
	var ne net.Error
	var oe *net.OpError
	return errors.As(err, &ne) || errors.As(err, &oe)
}

// enrollAt runs the enrollment protocol with tok against server and
// stores the result in dataDir and st. Nothing is sent unless the
// server's chain holds the CA the token pins.
func enrollAt(ctx context.Context, server string, tok Token, host HostInfo, dataDir string, st Store, timeout time.Duration, now func() time.Time, log *slog.Logger) (*Identity, error) {
	if err := checkServerURL(server); err != nil {
		return nil, fmt.Errorf("enroll: server: %w", err)
	}
	hostName, err := serverHost(server)
	if err != nil {
		return nil, err
	}
	key, csr, err := pemutil.NewKeyAndCSR(host.Hostname)
	if err != nil {
		return nil, fmt.Errorf("enroll: key: %w", err)
	}
	c := newHTTPClient(server, pemutil.PinnedTLS(hostName, tok.Pin), timeout, log)
	var out api.EnrollResponse
	body := api.EnrollRequest{
		Token: tok.Raw, Hostname: host.Hostname, OS: host.OS, Arch: host.Arch,
		AgentVersion: host.AgentVersion, CSR: csr, MachineID: host.MachineID,
	}
	resp, err := c.R().SetContext(ctx).SetBody(body).SetResult(&out).Post(pathEnroll)
	err = checkResponse(resp, err)
	var ae *api.Error
	if errors.As(err, &ae) && ae.Status == 400 && body.MachineID != "" && strings.Contains(ae.Message, "machine_id") {
		// A server older than machine binding refuses the field (it
		// decodes strictly, before it looks at the token): enroll without.
		log.Warn("the server does not know machine ids; enrolling without binding this machine")
		body.MachineID = ""
		resp, err = c.R().SetContext(ctx).SetBody(body).SetResult(&out).Post(pathEnroll)
		err = checkResponse(resp, err)
	}
	if err != nil {
		return nil, fmt.Errorf("enroll: %w", err)
	}
	if resp.StatusCode() != 200 && resp.StatusCode() != 201 {
		return nil, fmt.Errorf("enroll: unexpected HTTP %d", resp.StatusCode())
	}
	if out.AgentID == "" {
		return nil, errors.New("enroll: the response has no agent_id")
	}
	urls, addrs, err := checkReplicaLists(out.ServerURLs, out.GRPCAddrs)
	if err != nil {
		return nil, fmt.Errorf("enroll: %w", err)
	}
	if out.GRPCAddr == "" && len(addrs) > 0 {
		out.GRPCAddr = addrs[0]
	}
	if _, _, err := net.SplitHostPort(out.GRPCAddr); err != nil {
		return nil, fmt.Errorf("enroll: grpc_addr %q: %w", out.GRPCAddr, err)
	}
	caPEM := []byte(out.CABundle)
	cas, err := pemutil.Certificates(caPEM)
	if err != nil {
		return nil, fmt.Errorf("enroll: ca_bundle: %w", err)
	}
	pinned := false
	for _, ca := range cas {
		if pemutil.Pin(ca) == tok.Pin {
			pinned = true
		}
	}
	if !pinned {
		return nil, fmt.Errorf("enroll: ca_bundle: %w", pemutil.ErrPinMismatch)
	}
	if _, err := checkIssued([]byte(out.Certificate), caPEM, key, now()); err != nil {
		return nil, fmt.Errorf("enroll: %w", err)
	}
	kl, err := compactJSON(out.TrustRoot.KeyList)
	if err != nil {
		return nil, fmt.Errorf("enroll: trust_root.key_list: %w", err)
	}
	tr, err := signing.NewTrustRoot(out.TrustRoot.RootKeys, kl, now())
	if err != nil {
		return nil, fmt.Errorf("enroll: trust_root: %w", err)
	}
	cred, err := encodeCredentials([]byte(out.Certificate), key)
	if err != nil {
		return nil, err
	}
	id := &Identity{AgentID: out.AgentID, Server: strings.TrimSuffix(server, "/"), GRPCAddr: out.GRPCAddr, EnrolledAt: now().UTC()}
	id.ServerURLs, id.GRPCAddrs = urls, addrs
	if err := id.setCredentials(cred, caPEM); err != nil {
		return nil, fmt.Errorf("enroll: %w", err)
	}
	if err := saveCredentials(dataDir, cred, caPEM); err != nil {
		return nil, fmt.Errorf("enroll: save credentials: %w", err)
	}
	if err := st.SetTrustRoot(tr); err != nil {
		return nil, fmt.Errorf("enroll: save trust root: %w", err)
	}
	if err := saveIdentity(dataDir, id); err != nil {
		return nil, fmt.Errorf("enroll: save identity: %w", err)
	}
	return id, nil
}

// Enroll enrolls once with token, outside the daemon (`drover-agent enroll`
// when no daemon runs), storing the identity in cfg.DataDir and st. An
// agent that is already enrolled is left alone, unless its certificate
// expired (it enrolls again, as the daemon would; reenroll.go). Whether
// the server refuses a certificate only the daemon finds out.
func Enroll(ctx context.Context, cfg Config, st Store, token string, host HostInfo, log *slog.Logger) (*Identity, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if err := ensureDataDir(cfg.DataDir); err != nil {
		return nil, err
	}
	if id, err := loadIdentity(cfg.DataDir); err == nil {
		if time.Now().Before(id.NotAfter()) {
			return nil, fmt.Errorf("already enrolled as %s", id.AgentID)
		}
		log.Info("the certificate expired; enrolling again", "agent_id", id.AgentID, "expired", id.NotAfter())
	}
	tok, err := ParseToken(token)
	if err != nil {
		return nil, err
	}
	return enroll(ctx, enrollServers(cfg), tok, host, cfg.DataDir, st, cfg.RequestTimeout, time.Now, log)
}

// DefaultHostInfo describes this host.
func DefaultHostInfo() HostInfo {
	h, _ := os.Hostname()
	return HostInfo{Hostname: h, OS: runtime.GOOS, Arch: runtime.GOARCH, AgentVersion: Version, MachineID: ReadMachineID(DefaultMachineIDFile)}
}

// ReadMachineID returns the machine id in path (32 hex digits, lower
// case), or "" when the file is missing or holds something else.
func ReadMachineID(path string) string {
	b, err := os.ReadFile(path)
	if err != nil || len(b) > 256 {
		return ""
	}
	id := strings.ToLower(strings.TrimSpace(string(b)))
	if len(id) != 32 {
		return ""
	}
	for _, c := range id {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return ""
		}
	}
	return id
}
