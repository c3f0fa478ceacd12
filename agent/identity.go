package agent

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/drover/drover/internal/atomicfile"
	"github.com/drover/drover/internal/pemutil"
)

// Files in the data directory. identity.json is written last at enrollment,
// so its presence means "enrolled"; agent.pem holds the client certificate
// and its key together, so that renewal replaces both in one rename.
const (
	identityFile = "identity.json"
	credFile     = "agent.pem"
	caFile       = "ca.pem"
)

// Identity is what enrollment leaves in the data directory.
type Identity struct {
	AgentID string `json:"agent_id"`
	// Server is the URL the agent enrolled through, GRPCAddr the first
	// stream address; an identity written before replicas has only these.
	Server   string `json:"server"`
	GRPCAddr string `json:"grpc_addr"`
	// ServerURLs and GRPCAddrs are every replica's addresses as the server
	// last sent them (enrollment, renewal, manifest answers); empty: the
	// server has none configured, Server and GRPCAddr are the lists.
	ServerURLs []string  `json:"server_urls,omitempty"`
	GRPCAddrs  []string  `json:"grpc_addrs,omitempty"`
	EnrolledAt time.Time `json:"enrolled_at"`

	cert   tls.Certificate // leaf set
	caPEM  []byte
	caPool *x509.CertPool
}

// serverURLs is the list of HTTPS base URLs this identity knows.
func (id *Identity) serverURLs() []string { return listOrOne(id.ServerURLs, id.Server) }

// grpcAddrs is the list of stream addresses this identity knows.
func (id *Identity) grpcAddrs() []string { return listOrOne(id.GRPCAddrs, id.GRPCAddr) }

// listOrOne is list, or when it is empty the single entry one that
// identities had before replica lists ("" for none).
func listOrOne(list []string, one string) []string {
	if len(list) > 0 {
		return list
	}
	if one == "" {
		return nil
	}
	return []string{one}
}

// withReplicas returns a copy of id (credentials shared) with the
// replica lists urls and addrs.
func (id *Identity) withReplicas(urls, addrs []string) *Identity {
	next := *id
	next.ServerURLs, next.GRPCAddrs = urls, addrs
	if len(addrs) > 0 {
		next.GRPCAddr = addrs[0]
	}
	return &next
}

// NotAfter is the client certificate's expiry.
func (id *Identity) NotAfter() time.Time { return id.cert.Leaf.NotAfter }

// NotBefore is the client certificate's start.
func (id *Identity) NotBefore() time.Time { return id.cert.Leaf.NotBefore }

// RenewAt is two thirds into the certificate's lifetime.
func (id *Identity) RenewAt() time.Time {
	nb, na := id.NotBefore(), id.NotAfter()
	return nb.Add(na.Sub(nb) * 2 / 3)
}

// errNotEnrolled: no identity.json in the data directory.
var errNotEnrolled = errors.New("not enrolled")

// ensureDataDir creates dir with mode 0700, and tightens an existing one.
func ensureDataDir(dir string) error {
	if err := atomicfile.PrivateDir(dir); err != nil {
		return fmt.Errorf("data dir: %w", err)
	}
	return nil
}

// loadIdentity reads the identity from dir. It returns errNotEnrolled when
// identity.json does not exist.
func loadIdentity(dir string) (*Identity, error) {
	b, err := os.ReadFile(filepath.Join(dir, identityFile))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, errNotEnrolled
	}
	if err != nil {
		return nil, err
	}
	var id Identity
	if err := json.Unmarshal(b, &id); err != nil {
		return nil, fmt.Errorf("%s: %w", identityFile, err)
	}
	if id.AgentID == "" {
		return nil, fmt.Errorf("%s: no agent_id", identityFile)
	}
	if urls, addrs, err := checkReplicaLists(id.ServerURLs, id.GRPCAddrs); err == nil {
		id.ServerURLs, id.GRPCAddrs = urls, addrs
	} else {
		// Lists that do not check out are forgotten: Server and GRPCAddr
		// still reach a replica, whose answers bring the lists back.
		id.ServerURLs, id.GRPCAddrs = nil, nil
	}
	cred, err := readPrivate(filepath.Join(dir, credFile))
	if err != nil {
		return nil, err
	}
	ca, err := os.ReadFile(filepath.Join(dir, caFile))
	if err != nil {
		return nil, err
	}
	if err := id.setCredentials(cred, ca); err != nil {
		return nil, err
	}
	if cn := id.cert.Leaf.Subject.CommonName; cn != "" && cn != id.AgentID {
		// The server names the agent in the certificate's CommonName. They
		// differ only after a crash between writing agent.pem and
		// identity.json in a re-enrollment: the certificate is the new one.
		id.AgentID = cn
	}
	return &id, nil
}

// setCredentials parses agent.pem (certificate chain and key) and the CA
// bundle.
func (id *Identity) setCredentials(cred, caPEM []byte) error {
	cert, err := tls.X509KeyPair(cred, cred)
	if err != nil {
		return fmt.Errorf("%s: %w", credFile, err)
	}
	if cert.Leaf == nil {
		if cert.Leaf, err = x509.ParseCertificate(cert.Certificate[0]); err != nil {
			return fmt.Errorf("%s: %w", credFile, err)
		}
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return fmt.Errorf("%s: no CA certificate", caFile)
	}
	id.cert, id.caPEM, id.caPool = cert, caPEM, pool
	return nil
}

// readPrivate reads a file that must not be readable by group or others.
func readPrivate(path string) ([]byte, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !st.Mode().IsRegular() || st.Mode().Perm()&0o077 != 0 {
		return nil, fmt.Errorf("%s: must be a regular file of mode 0600", path)
	}
	var buf bytes.Buffer
	_, err = buf.ReadFrom(f)
	return buf.Bytes(), err
}

// encodeCredentials returns the agent.pem bytes: the certificate chain PEM
// followed by the private key.
func encodeCredentials(chainPEM []byte, key *ecdsa.PrivateKey) ([]byte, error) {
	keyPEM, err := pemutil.ECKey(key)
	if err != nil {
		return nil, err
	}
	var b bytes.Buffer
	b.Write(bytes.TrimSpace(chainPEM))
	b.WriteByte('\n')
	b.Write(keyPEM)
	return b.Bytes(), nil
}

// saveCredentials replaces agent.pem and ca.pem.
func saveCredentials(dir string, cred, caPEM []byte) error {
	if err := atomicfile.Write(filepath.Join(dir, caFile), caPEM, 0o600); err != nil {
		return err
	}
	return atomicfile.Write(filepath.Join(dir, credFile), cred, 0o600)
}

// saveIdentity writes identity.json, the mark of a finished enrollment.
func saveIdentity(dir string, id *Identity) error {
	b, err := json.MarshalIndent(id, "", "  ")
	if err != nil {
		return err
	}
	return atomicfile.Write(filepath.Join(dir, identityFile), append(b, '\n'), 0o600)
}

// removeStaleTemps deletes the temporary files atomicfile.Write leaves in
// dir when the process is killed between creating and renaming one.
func removeStaleTemps(dir string) {
	matches, _ := filepath.Glob(filepath.Join(dir, ".*.tmp-*"))
	for _, m := range matches {
		_ = os.Remove(m)
	}
}
