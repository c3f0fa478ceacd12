package server

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/drover/drover/api"
	"github.com/drover/drover/internal/testkit"
	"github.com/drover/drover/server/pki"
	"github.com/drover/drover/server/store/sqlite"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	agentpb "github.com/drover/drover/proto"
	"github.com/drover/drover/signing"
)

// testServer is the real server, in process, with clients for its API.
type testServer struct {
	t      testing.TB
	s      *Server
	cfg    Config
	clock  *testkit.Clock
	admin  string
	base   string
	client *http.Client // trusts the CA, no client certificate
	cancel context.CancelFunc
	done   chan error
}

// testLogger logs warnings and errors to the test log (set DROVER_TEST_LOG
// for everything).
func testLogger(t testing.TB) *slog.Logger { return testkit.Logger(t, slog.LevelWarn) }

func testConfig(dir string) Config {
	cfg := DefaultConfig()
	cfg.DataDir = dir
	cfg.HTTPAddr = "127.0.0.1:0"
	cfg.GRPCAddr = "127.0.0.1:0"
	cfg.Store.Synchronous = "normal"
	return cfg
}

// startServer starts a server on a fresh data dir (or cfg.DataDir when a
// configure function sets it) and stops it when the test ends.
func startServer(t testing.TB, configure ...func(*Config)) *testServer {
	t.Helper()
	cfg := testConfig(t.TempDir())
	for _, f := range configure {
		f(&cfg)
	}
	clock := &testkit.Clock{}
	s, err := New(cfg, testLogger(t), clock)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return runTestServer(t, s, cfg, clock)
}

// runTestServer runs a server made by New and stops it when the test ends.
func runTestServer(t testing.TB, s *Server, cfg Config, clock *testkit.Clock) *testServer {
	t.Helper()
	var err error
	ctx, cancel := context.WithCancel(context.Background())
	ts := &testServer{t: t, s: s, cfg: cfg, clock: clock, cancel: cancel, done: make(chan error, 1)}
	go func() { ts.done <- s.Run(ctx) }()
	t.Cleanup(ts.stop)
	if ts.admin, err = ReadAdminToken(cfg.DataDir); err != nil {
		t.Fatal(err)
	}
	ts.base = "https://" + s.HTTPAddr()
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(s.CACertPEM())
	ts.client = &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	return ts
}

// db is the server's SQLite store, under its cache.
func (ts *testServer) db() *sqlite.DB { return ts.s.store.(*cachedStore).Store.(*sqlite.DB) }

func (ts *testServer) stop() {
	if ts.cancel == nil {
		return
	}
	ts.cancel()
	ts.cancel = nil
	select {
	case err := <-ts.done:
		if err != nil {
			ts.t.Errorf("Run: %v", err)
		}
	case <-time.After(30 * time.Second):
		ts.t.Errorf("the server did not stop within 30s")
	}
}

// apiResult is a decoded response.
type apiResult struct {
	code   int
	header http.Header
	body   []byte
}

func (r *apiResult) errorCode() string {
	var eb api.ErrorBody
	_ = json.Unmarshal(r.body, &eb)
	return eb.Error.Code
}

func (r *apiResult) decode(t testing.TB, v any) {
	t.Helper()
	if err := json.Unmarshal(r.body, v); err != nil {
		t.Fatalf("decode %s: %v", r.body, err)
	}
}

// do sends a request to the API; body is JSON-encoded unless it is []byte.
func (ts *testServer) do(method, path, token string, body any) *apiResult {
	ts.t.Helper()
	var raw []byte
	ct := ""
	switch b := body.(type) {
	case nil:
	case []byte:
		raw, ct = b, "application/json"
	default:
		j, err := json.Marshal(b)
		if err != nil {
			ts.t.Fatal(err)
		}
		raw, ct = j, "application/json"
	}
	return ts.doCT(method, path, token, ct, raw)
}

// doCT sends a raw body with a Content-Type and extra headers (name, value
// pairs).
func (ts *testServer) doCT(method, path, token, ct string, body []byte, headers ...string) *apiResult {
	ts.t.Helper()
	req, err := http.NewRequest(method, ts.base+path, bytes.NewReader(body))
	if err != nil {
		ts.t.Fatal(err)
	}
	if ct != "" {
		req.Header.Set("Content-Type", ct)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := ts.client.Do(req)
	if err != nil {
		ts.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return &apiResult{code: resp.StatusCode, header: resp.Header, body: b}
}

// adminOK sends an admin request and fails the test unless it succeeds.
func (ts *testServer) adminOK(method, path string, body, out any) *apiResult {
	ts.t.Helper()
	r := ts.do(method, path, ts.admin, body)
	if r.code/100 != 2 {
		ts.t.Fatalf("%s %s: %d %s", method, path, r.code, r.body)
	}
	if out != nil {
		r.decode(ts.t, out)
	}
	return r
}

func (ts *testServer) token(tags map[string]string) string {
	ts.t.Helper()
	var tr api.EnrollmentTokenCreated
	ts.adminOK("POST", "/api/v1/enrollment-tokens", api.EnrollmentTokenRequest{Tags: tags}, &tr)
	return tr.Token
}

// putScriptPipe creates or updates an inline-script pipe.
func (ts *testServer) putScriptPipe(name, script string, tags map[string]string, secrets ...string) api.PutPipeResponse {
	ts.t.Helper()
	spec := map[string]any{"schedule": "*/5 * * * *", "script": script, "targets": map[string]any{"tags": tags}}
	if len(secrets) > 0 {
		spec["secrets"] = secrets
	}
	var out api.PutPipeResponse
	ts.adminOK("PUT", "/api/v1/pipes/"+name, map[string]any{"spec": spec}, &out)
	return out
}

// enrollAgent enrolls a test agent with a fresh token.
func (ts *testServer) enrollAgent(tags map[string]string) *testAgent {
	ts.t.Helper()
	a, err := enroll(ts.base, ts.token(tags), "host-"+strings.ToLower(b32.EncodeToString(randomBytes(4))))
	if err != nil {
		ts.t.Fatalf("enroll: %v", err)
	}
	ts.t.Cleanup(a.close)
	return a
}

// apiToken creates an API token with a role (and a ttl, if not empty).
func (ts *testServer) apiToken(name, role, ttl string) (string, string) {
	ts.t.Helper()
	var out api.APITokenCreated
	ts.adminOK("POST", "/api/v1/api-tokens", api.APITokenRequest{Name: name, Role: role, TTL: ttl}, &out)
	return out.Token, out.ID
}

// testAgent is an enrollment client, an mTLS HTTP client and a stream
// client, built from crypto/x509, signing and proto only.
type testAgent struct {
	id       string
	base     string
	grpcAddr string
	key      *ecdsa.PrivateKey
	cert     tls.Certificate
	certPEM  []byte
	pool     *x509.CertPool
	trust    *signing.TrustRoot
	client   *http.Client
	state    signing.State
}

// errPinMismatch: the server's CA does not match the token's pin.
var errPinMismatch = errors.New("the server's CA does not match the token's pin")

func newCSR(key *ecdsa.PrivateKey) string {
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{Subject: pkix.Name{CommonName: "ignored"}, DNSNames: []string{"evil.example"}}, key)
	if err != nil {
		panic(err)
	}
	return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}))
}

// pinnedTLS trusts exactly the CA in the server's chain whose SPKI hash is
// pin; it fails the handshake (before any request is sent) otherwise.
func pinnedTLS(pin string) *tls.Config {
	return &tls.Config{
		InsecureSkipVerify: true, // replaced by VerifyConnection below
		VerifyConnection: func(cs tls.ConnectionState) error {
			for _, c := range cs.PeerCertificates {
				if c.IsCA && pki.CAPin(c) == pin {
					pool := x509.NewCertPool()
					pool.AddCert(c)
					_, err := cs.PeerCertificates[0].Verify(x509.VerifyOptions{Roots: pool, DNSName: cs.ServerName})
					return err
				}
			}
			return errPinMismatch
		},
	}
}

// enrollMachineID, when set, is the machine_id enroll sends.
var enrollMachineID string

// enroll runs the agent side of enrollment against base.
func enroll(base, token, hostname string) (*testAgent, error) {
	parts := strings.Split(token, ".")
	if len(parts) != 4 {
		return nil, fmt.Errorf("malformed token")
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	client := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: pinnedTLS(parts[3])}}
	defer client.CloseIdleConnections()
	body, _ := json.Marshal(api.EnrollRequest{Token: token, Hostname: hostname, OS: "linux", Arch: "amd64", AgentVersion: "test", CSR: newCSR(key), MachineID: enrollMachineID})
	resp, err := client.Post(base+"/api/v1/agents/enroll", "application/json", bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		return nil, &httpError{code: resp.StatusCode, body: b}
	}
	var er api.EnrollResponse
	if err := json.Unmarshal(b, &er); err != nil {
		return nil, err
	}
	a := &testAgent{id: er.AgentID, base: base, grpcAddr: er.GRPCAddr, key: key, pool: x509.NewCertPool()}
	a.pool.AppendCertsFromPEM([]byte(er.CABundle))
	tr, err := signing.NewTrustRoot(er.TrustRoot.RootKeys, er.TrustRoot.KeyList, time.Now())
	if err != nil {
		return nil, fmt.Errorf("trust root: %w", err)
	}
	a.trust = tr
	a.state = signing.State{AgentID: er.AgentID}
	if err := a.setCert(key, []byte(er.Certificate)); err != nil {
		return nil, err
	}
	return a, nil
}

type httpError struct {
	code int
	body []byte
}

func (e *httpError) Error() string { return fmt.Sprintf("HTTP %d: %s", e.code, e.body) }

func (e *httpError) errorCode() string {
	var eb api.ErrorBody
	_ = json.Unmarshal(e.body, &eb)
	return eb.Error.Code
}

func (a *testAgent) setCert(key *ecdsa.PrivateKey, certPEM []byte) error {
	keyPEM, err := pki.MarshalECKey(key)
	if err != nil {
		return err
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return err
	}
	a.key, a.cert, a.certPEM = key, cert, certPEM
	if a.client != nil {
		a.client.CloseIdleConnections()
	}
	a.client = &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{
		TLSClientConfig:     a.tlsConfig(),
		MaxIdleConnsPerHost: 64,
	}}
	return nil
}

func (a *testAgent) tlsConfig() *tls.Config {
	cert := a.cert
	return &tls.Config{RootCAs: a.pool, Certificates: []tls.Certificate{cert}}
}

func (a *testAgent) close() {
	if a.client != nil {
		a.client.CloseIdleConnections()
	}
}

// get performs an mTLS GET; extra headers are name, value pairs.
func (a *testAgent) get(path string, headers ...string) (*apiResult, error) {
	req, err := http.NewRequest("GET", a.base+path, nil)
	if err != nil {
		return nil, err
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := a.client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	return &apiResult{code: resp.StatusCode, header: resp.Header, body: b}, nil
}

// renew posts a CSR for a fresh key and returns the new certificate PEM and
// key without switching to them.
func (a *testAgent) renew() (*ecdsa.PrivateKey, []byte, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	body, _ := json.Marshal(api.RenewRequest{CSR: newCSR(key)})
	resp, err := a.client.Post(a.base+"/api/v1/agents/self/renew", "application/json", bytes.NewReader(body))
	if err != nil {
		return nil, nil, err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		return nil, nil, &httpError{code: resp.StatusCode, body: b}
	}
	var rr api.RenewResponse
	if err := json.Unmarshal(b, &rr); err != nil {
		return nil, nil, err
	}
	return key, []byte(rr.Certificate), nil
}

// pullManifest fetches and accepts the manifest as an agent would,
// refreshing the key list once when the manifest needs a newer one.
func (a *testAgent) pullManifest() (*signing.Accepted, error) {
	for attempt := 0; ; attempt++ {
		r, err := a.get("/api/v1/agents/self/manifest")
		if err != nil {
			return nil, err
		}
		if r.code != 200 {
			return nil, &httpError{code: r.code, body: r.body}
		}
		acc, err := signing.AcceptManifest(r.body, a.trust, a.state, time.Now(), 0)
		// After a rotation the manifest is signed by a key the held list
		// does not name yet (ErrUnknownKey), or names a newer list
		// (ErrKeyListStale): fetch the root-signed list once and retry.
		if (errors.Is(err, signing.ErrKeyListStale) || errors.Is(err, signing.ErrUnknownKey)) && attempt == 0 {
			if err := a.refreshTrust(); err != nil {
				return nil, err
			}
			continue
		}
		if err != nil {
			return nil, err
		}
		a.state.Serial, a.state.Digest = acc.Manifest.Serial, acc.Digest
		return acc, nil
	}
}

func (a *testAgent) refreshTrust() error {
	r, err := a.get("/api/v1/agents/self/trust")
	if err != nil {
		return err
	}
	if r.code != 200 {
		return &httpError{code: r.code, body: r.body}
	}
	var tr signing.TrustRoot
	if err := json.Unmarshal(r.body, &tr); err != nil {
		return err
	}
	return a.trust.UpdateKeyList(tr.KeyList, time.Now())
}

// dial opens a gRPC connection with the agent's certificate.
func (a *testAgent) dial(addr string) (*grpc.ClientConn, error) {
	if addr == "" {
		addr = a.grpcAddr
	}
	return grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(a.tlsConfig())))
}

// testStream is an open AgentStream with a receiver goroutine.
type testStream struct {
	conn   *grpc.ClientConn
	stream agentpb.Agent_AgentStreamClient
	cancel context.CancelFunc

	mu       sync.Mutex
	acked    uint64
	syncs    []uint64
	syncMsgs []*agentpb.SyncNow // every SyncNow, with what it carried
	runNows  []*agentpb.RunNow
	cancels  []string
	ackCh    chan uint64
	recvErr  error
	recvDone chan struct{}
}

// openStream dials, opens AgentStream and sends Hello.
func (a *testAgent) openStream(addr string) (*testStream, error) {
	return a.openStreamHello(addr, &agentpb.Hello{AgentVersion: "test", Os: "linux", Arch: "amd64", Hostname: "h", Backend: "systemd", Scope: "user", ManifestSerial: a.state.Serial})
}

// openStreamHello dials addr, opens AgentStream and sends hello.
func (a *testAgent) openStreamHello(addr string, hello *agentpb.Hello) (*testStream, error) {
	conn, err := a.dial(addr)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	st, err := agentpb.NewAgentClient(conn).AgentStream(ctx)
	if err != nil {
		cancel()
		conn.Close()
		return nil, err
	}
	s := &testStream{conn: conn, stream: st, cancel: cancel, ackCh: make(chan uint64, 1024), recvDone: make(chan struct{})}
	if err := st.Send(&agentpb.AgentMessage{Body: &agentpb.AgentMessage_Hello{Hello: hello}}); err != nil {
		s.close()
		return nil, err
	}
	go s.recv()
	return s, nil
}

func (s *testStream) recv() {
	defer close(s.recvDone)
	for {
		m, err := s.stream.Recv()
		if err != nil {
			s.mu.Lock()
			s.recvErr = err
			s.mu.Unlock()
			return
		}
		s.mu.Lock()
		switch b := m.GetBody().(type) {
		case *agentpb.ServerMessage_Ack:
			if b.Ack.GetSeq() > s.acked {
				s.acked = b.Ack.GetSeq()
			}
			select {
			case s.ackCh <- b.Ack.GetSeq():
			default:
			}
		case *agentpb.ServerMessage_SyncNow:
			s.syncs = append(s.syncs, b.SyncNow.GetSerial())
			s.syncMsgs = append(s.syncMsgs, b.SyncNow)
		case *agentpb.ServerMessage_RunNow:
			s.runNows = append(s.runNows, b.RunNow)
		case *agentpb.ServerMessage_CancelRun:
			s.cancels = append(s.cancels, b.CancelRun.GetRunId())
		}
		s.mu.Unlock()
	}
}

func (s *testStream) lastAck() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.acked
}

func (s *testStream) err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.recvErr
}

// waitAck waits until seq is acknowledged.
func (s *testStream) waitAck(seq uint64, timeout time.Duration) error {
	deadline := time.After(timeout)
	for {
		if s.lastAck() >= seq {
			return nil
		}
		select {
		case <-s.ackCh:
		case <-s.recvDone:
			if s.lastAck() >= seq {
				return nil
			}
			return fmt.Errorf("stream ended before ack %d (last %d): %v", seq, s.lastAck(), s.err())
		case <-deadline:
			return fmt.Errorf("no ack %d within %s (last %d)", seq, timeout, s.lastAck())
		}
	}
}

// mustStream opens the agent's stream to the server or fails t; the
// stream is closed when the test ends.
func (a *testAgent) mustStream(t testing.TB) *testStream {
	t.Helper()
	st, err := a.openStream("")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.close)
	return st
}

func (s *testStream) close() {
	s.cancel()
	s.conn.Close()
}

// keysOf is key of each item, in order (nil for none).
func keysOf[T any](items []T, key func(T) string) []string {
	var out []string
	for _, x := range items {
		out = append(out, key(x))
	}
	return out
}
