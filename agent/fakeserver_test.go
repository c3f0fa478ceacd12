package agent

// fakeServer is a test double of drover-server's agent API (HTTPS and the
// gRPC stream), written for these tests. It is also a fault injector: tests
// install an intercept to tamper with responses, and can make the stream
// drop or hold back acks. It issues real certificates from its own CA, signs
// real manifests and key lists with the signing package, and serves over
// real TLS on 127.0.0.1.

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"log"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/drover/drover/api"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"

	"github.com/drover/drover/manifest"
	agentpb "github.com/drover/drover/proto"
	"github.com/drover/drover/signing"
)

type fakeToken struct {
	secret  string
	expires time.Time
	used    bool
}

type fakeAgentState struct {
	serial   uint64
	env      []byte
	digest   string
	history  [][]byte // every envelope published, oldest first
	payloads map[string][]byte
	secrets  map[string]string
}

type fakeServer struct {
	t      *testing.T
	caKey  *ecdsa.PrivateKey
	caCert *x509.Certificate
	caPEM  []byte
	pin    string
	http   *httptest.Server
	grpc   *grpc.Server
	grpcLn net.Listener
	root   *signing.Signer
	mkey   *signing.Signer
	klEnv  []byte
	klVer  uint64

	mu           sync.Mutex
	certLifetime time.Duration
	requests     map[string]int // "METHOD /path" -> count
	notModified  int
	tokens       map[string]*fakeToken
	agents       map[string]*fakeAgentState
	nextAgent    int
	intercept    func(w http.ResponseWriter, r *http.Request, agentID string) bool
	renewals     int
	// manifestLifetime overrides manifest.DefaultLifetime for the next
	// manifests signed (0: the default).
	manifestLifetime time.Duration

	// stream
	hellos []*agentpb.Hello
	// enrollMachineIDs are the machine_id of every enrollment request.
	enrollMachineIDs []string
	heartbeats       []*agentpb.Heartbeat
	committed        map[uint64]*agentpb.AgentMessage // by seq
	order            []uint64                         // seqs in commit order
	dupes            int                              // records received again after commit
	statusesBy       []fakeStatus                     // every ManifestStatus received, dupes too, with its stream's agent
	holdAcks         bool
	dropAfter        int // close a stream after this many records (0: never)
	streams          map[string]chan *agentpb.ServerMessage
	recvd            chan struct{}
}

func newFakeServer(t *testing.T) *fakeServer {
	t.Helper()
	s := &fakeServer{
		t: t, certLifetime: time.Hour, requests: map[string]int{}, tokens: map[string]*fakeToken{},
		agents: map[string]*fakeAgentState{}, committed: map[uint64]*agentpb.AgentMessage{},
		streams: map[string]chan *agentpb.ServerMessage{}, recvd: make(chan struct{}, 1),
	}
	var err error
	s.caKey, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	must(t, err)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "fake drover CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &s.caKey.PublicKey, s.caKey)
	must(t, err)
	s.caCert, _ = x509.ParseCertificate(der)
	s.caPEM = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	sum := sha256.Sum256(s.caCert.RawSubjectPublicKeyInfo)
	s.pin = hex.EncodeToString(sum[:])

	// Server certificate for 127.0.0.1 and localhost; the chain includes the CA.
	leafKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	must(t, err)
	leafT := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "localhost"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		DNSNames: []string{"localhost"}, IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	leafDER, err := x509.CreateCertificate(rand.Reader, leafT, s.caCert, &leafKey.PublicKey, s.caKey)
	must(t, err)
	pool := x509.NewCertPool()
	pool.AddCert(s.caCert)
	tlsConf := &tls.Config{
		Certificates: []tls.Certificate{{Certificate: [][]byte{leafDER, der}, PrivateKey: leafKey}},
		ClientAuth:   tls.VerifyClientCertIfGiven,
		ClientCAs:    pool,
	}

	s.root, err = signing.GenerateKey(signing.Ed25519)
	must(t, err)
	s.mkey, err = signing.GenerateKey(signing.Ed25519)
	must(t, err)
	s.setKeyList(1, s.mkey)

	s.http = httptest.NewUnstartedServer(http.HandlerFunc(s.serveHTTP))
	s.http.TLS = tlsConf
	s.http.Config.ErrorLog = log.New(io.Discard, "", 0) // pin-mismatch tests abort handshakes on purpose
	s.http.StartTLS()
	t.Cleanup(s.http.Close)

	s.grpcLn, err = net.Listen("tcp", "127.0.0.1:0")
	must(t, err)
	gconf := tlsConf.Clone()
	gconf.ClientAuth = tls.RequireAndVerifyClientCert
	s.grpc = grpc.NewServer(grpc.Creds(credentials.NewTLS(gconf)))
	agentpb.RegisterAgentServer(s.grpc, &fakeStream{s: s})
	go func() { _ = s.grpc.Serve(s.grpcLn) }()
	t.Cleanup(s.grpc.Stop)
	return s
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func (s *fakeServer) URL() string { return s.http.URL }

func (s *fakeServer) setKeyList(version uint64, keys ...*signing.Signer) {
	kl := signing.KeyList{Version: version, ExpiresAt: time.Now().Add(30 * 24 * time.Hour)}
	for _, k := range keys {
		kl.Keys = append(kl.Keys, k.Public())
	}
	env, err := signing.SignKeyList(s.root, kl)
	must(s.t, err)
	s.mu.Lock()
	s.klEnv, s.klVer = env, version
	s.mu.Unlock()
}

// token creates a one-time token valid for ttl.
func (s *fakeServer) token(ttl time.Duration) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	id := fmt.Sprintf("tok%d", len(s.tokens)+1)
	secret := "s3cr3t" + id
	s.tokens[id] = &fakeToken{secret: secret, expires: time.Now().Add(ttl)}
	return "drv1." + id + "." + secret + "." + s.pin
}

func (s *fakeServer) count(key string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.requests[key]
}

func (s *fakeServer) totalRequests() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, c := range s.requests {
		n += c
	}
	return n
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

func writeErr(w http.ResponseWriter, code int, kind, msg string) {
	writeJSON(w, code, map[string]any{"error": map[string]string{"code": kind, "message": msg}})
}

func (s *fakeServer) agentOf(r *http.Request) string {
	if r.TLS == nil || len(r.TLS.PeerCertificates) == 0 {
		return ""
	}
	return r.TLS.PeerCertificates[0].Subject.CommonName
}

func (s *fakeServer) serveHTTP(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	s.requests[r.Method+" "+r.URL.Path]++
	icpt := s.intercept
	s.mu.Unlock()
	agentID := s.agentOf(r)
	if icpt != nil && icpt(w, r, agentID) {
		return
	}
	switch {
	case r.Method == "POST" && r.URL.Path == pathEnroll:
		s.enroll(w, r)
		return
	}
	if agentID == "" {
		writeErr(w, 401, "unauthenticated", "client certificate required")
		return
	}
	switch {
	case r.Method == "POST" && r.URL.Path == pathRenew:
		var req api.RenewRequest
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			writeErr(w, 400, "invalid_request", err.Error())
			return
		}
		cert, err := s.issue(agentID, req.CSR)
		if err != nil {
			writeErr(w, 400, "invalid_request", err.Error())
			return
		}
		s.mu.Lock()
		s.renewals++
		s.mu.Unlock()
		writeJSON(w, 200, api.RenewResponse{Certificate: string(cert), CABundle: string(s.caPEM)})
	case r.Method == "GET" && r.URL.Path == pathManifest:
		s.mu.Lock()
		a := s.agents[agentID]
		var env []byte
		var digest string
		if a != nil {
			env, digest = a.env, a.digest
		}
		s.mu.Unlock()
		if env == nil {
			writeErr(w, 404, "not_found", "no manifest yet")
			return
		}
		etag := `"` + digest + `"`
		if r.Header.Get("If-None-Match") == etag {
			s.mu.Lock()
			s.notModified++
			s.mu.Unlock()
			w.WriteHeader(304)
			return
		}
		w.Header().Set("ETag", etag)
		w.Header().Set("Content-Type", "application/vnd.dsse+json")
		_, _ = w.Write(env)
	case r.Method == "GET" && r.URL.Path == pathTrust:
		s.mu.Lock()
		kl := s.klEnv
		s.mu.Unlock()
		writeJSON(w, 200, signing.TrustRoot{RootKeys: []signing.PublicKey{s.root.Public()}, KeyList: kl})
	case r.Method == "GET" && strings.HasPrefix(r.URL.Path, pathPayloads):
		d := strings.TrimPrefix(r.URL.Path, pathPayloads)
		s.mu.Lock()
		var b []byte
		if a := s.agents[agentID]; a != nil {
			b = a.payloads[d]
		}
		s.mu.Unlock()
		if b == nil {
			writeErr(w, 404, "not_found", "no such payload")
			return
		}
		_, _ = w.Write(b)
	case r.Method == "GET" && r.URL.Path == pathSecrets:
		s.mu.Lock()
		sec := map[string]string{}
		if a := s.agents[agentID]; a != nil {
			for k, v := range a.secrets {
				sec[k] = v
			}
		}
		s.mu.Unlock()
		writeJSON(w, 200, secretsResponse{Secrets: sec})
	default:
		writeErr(w, 404, "not_found", "no route")
	}
}

func (s *fakeServer) enroll(w http.ResponseWriter, r *http.Request) {
	var req api.EnrollRequest
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		writeErr(w, 400, "invalid_request", err.Error())
		return
	}
	parts := strings.Split(req.Token, ".")
	if len(parts) != 4 {
		writeErr(w, 401, "invalid_token", "invalid enrollment token")
		return
	}
	s.mu.Lock()
	s.enrollMachineIDs = append(s.enrollMachineIDs, req.MachineID)
	tok := s.tokens[parts[1]]
	switch {
	case tok == nil || tok.secret != parts[2]:
		s.mu.Unlock()
		writeErr(w, 401, "invalid_token", "invalid enrollment token")
		return
	case tok.used:
		s.mu.Unlock()
		writeErr(w, 401, "token_used", "enrollment token already used")
		return
	case time.Now().After(tok.expires):
		s.mu.Unlock()
		writeErr(w, 401, "token_expired", "enrollment token expired")
		return
	}
	tok.used = true
	s.nextAgent++
	agentID := fmt.Sprintf("agent-%d", s.nextAgent)
	s.agents[agentID] = &fakeAgentState{payloads: map[string][]byte{}, secrets: map[string]string{}}
	kl := s.klEnv
	s.mu.Unlock()
	cert, err := s.issue(agentID, req.CSR)
	if err != nil {
		writeErr(w, 400, "invalid_request", err.Error())
		return
	}
	writeJSON(w, 200, map[string]any{
		"agent_id":    agentID,
		"certificate": string(cert),
		"ca_bundle":   string(s.caPEM),
		"trust_root": map[string]any{
			"root_keys": []signing.PublicKey{s.root.Public()},
			"key_list":  json.RawMessage(kl),
		},
		"grpc_addr":       s.grpcLn.Addr().String(),
		"cert_expires_at": time.Now().Add(s.lifetime()),
	})
}

func (s *fakeServer) lifetime() time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.certLifetime
}

func (s *fakeServer) issue(agentID, csrPEM string) ([]byte, error) {
	block, _ := pem.Decode([]byte(csrPEM))
	if block == nil {
		return nil, fmt.Errorf("no CSR")
	}
	csr, err := x509.ParseCertificateRequest(block.Bytes)
	if err != nil {
		return nil, err
	}
	if err := csr.CheckSignature(); err != nil {
		return nil, err
	}
	sn, _ := rand.Int(rand.Reader, big.NewInt(1<<62))
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: sn, Subject: pkix.Name{CommonName: agentID},
		NotBefore: now.Add(-time.Second), NotAfter: now.Add(s.lifetime()),
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}, KeyUsage: x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, s.caCert, csr.PublicKey, s.caKey)
	if err != nil {
		return nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), nil
}

// testPipe returns a pipe running script every hour, with its payload.
func testPipe(t *testing.T, name, schedule, script string, version uint64) (manifest.Pipe, []byte) {
	t.Helper()
	b, err := manifest.ScriptBundle(script)
	must(t, err)
	return manifest.Pipe{
		Name: name, Version: version,
		Spec:    manifest.Spec{Name: name, Schedule: schedule, Script: script},
		Payload: manifest.Payload{Digest: manifest.Digest(b), Size: int64(len(b))},
	}, b
}

// signManifest signs a manifest for agentID with the server's manifest key.
func (s *fakeServer) signManifest(agentID string, serial uint64, pipes []manifest.Pipe) ([]byte, string) {
	s.mu.Lock()
	klVer := s.klVer
	lifetime := s.manifestLifetime
	s.mu.Unlock()
	if lifetime == 0 {
		lifetime = manifest.DefaultLifetime
	}
	m := manifest.Manifest{
		AgentID: agentID, Serial: serial, IssuedAt: time.Now().Add(-time.Second).UTC().Truncate(time.Second),
		ExpiresAt: time.Now().Add(lifetime).UTC().Truncate(time.Second), KeyListVersion: klVer,
		Pipes: pipes,
	}
	if m.Pipes == nil {
		m.Pipes = []manifest.Pipe{}
	}
	b, err := m.Encode()
	must(s.t, err)
	env, err := signing.Sign(s.mkey, manifest.PayloadType, b)
	must(s.t, err)
	return env, signing.Digest(b)
}

// publish makes a new manifest for agentID with the given pipes and payloads.
func (s *fakeServer) publish(agentID string, pipes []manifest.Pipe, payloads ...[]byte) uint64 {
	s.mu.Lock()
	a := s.agents[agentID]
	if a == nil {
		a = &fakeAgentState{payloads: map[string][]byte{}, secrets: map[string]string{}}
		s.agents[agentID] = a
	}
	a.serial++
	serial := a.serial
	s.mu.Unlock()
	env, digest := s.signManifest(agentID, serial, pipes)
	s.mu.Lock()
	defer s.mu.Unlock()
	a.env, a.digest = env, digest
	a.history = append(a.history, env)
	for _, p := range payloads {
		a.payloads[manifest.Digest(p)] = p
	}
	if ch := s.streams[agentID]; ch != nil {
		select {
		case ch <- &agentpb.ServerMessage{Body: &agentpb.ServerMessage_SyncNow{SyncNow: &agentpb.SyncNow{Serial: serial}}}:
		default:
		}
	}
	return serial
}

func (s *fakeServer) setIntercept(f func(w http.ResponseWriter, r *http.Request, agentID string) bool) {
	s.mu.Lock()
	s.intercept = f
	s.mu.Unlock()
}

// send pushes a command to an agent's live stream.
func (s *fakeServer) send(agentID string, msg *agentpb.ServerMessage) bool {
	s.mu.Lock()
	ch := s.streams[agentID]
	s.mu.Unlock()
	if ch == nil {
		return false
	}
	ch <- msg
	return true
}

// fakeStream is the gRPC side: it commits durable records by seq (once;
// a record sent again after commit counts as a dupe) and acks cumulatively
// unless told to hold acks.
type fakeStream struct {
	agentpb.UnimplementedAgentServer
	s *fakeServer
}

func (f *fakeStream) AgentStream(stream grpc.BidiStreamingServer[agentpb.AgentMessage, agentpb.ServerMessage]) error {
	s := f.s
	p, _ := peer.FromContext(stream.Context())
	tlsInfo, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok || len(tlsInfo.State.PeerCertificates) == 0 {
		return fmt.Errorf("no client certificate")
	}
	agentID := tlsInfo.State.PeerCertificates[0].Subject.CommonName
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	if first.GetHello() == nil {
		return fmt.Errorf("first message is not Hello")
	}
	cmds := make(chan *agentpb.ServerMessage, 16)
	s.mu.Lock()
	s.hellos = append(s.hellos, first.GetHello())
	s.streams[agentID] = cmds
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		if s.streams[agentID] == cmds {
			delete(s.streams, agentID)
		}
		s.mu.Unlock()
	}()
	errc := make(chan error, 1)
	go func() {
		for {
			select {
			case <-stream.Context().Done():
				return
			case m := <-cmds:
				if err := stream.Send(m); err != nil {
					errc <- err
					return
				}
			}
		}
	}()
	n := 0
	for {
		select {
		case err := <-errc:
			return err
		default:
		}
		msg, err := stream.Recv()
		if err != nil {
			return err
		}
		if msg.GetSeq() == 0 {
			if hb := msg.GetHeartbeat(); hb != nil {
				s.mu.Lock()
				s.heartbeats = append(s.heartbeats, hb)
				s.mu.Unlock()
			}
			continue
		}
		n++
		s.mu.Lock()
		if ms := msg.GetManifestStatus(); ms != nil {
			s.statusesBy = append(s.statusesBy, fakeStatus{agentID: agentID, status: ms})
		}
		if _, dup := s.committed[msg.GetSeq()]; dup {
			s.dupes++
		} else {
			s.committed[msg.GetSeq()] = msg
			s.order = append(s.order, msg.GetSeq())
		}
		hold, dropAfter := s.holdAcks, s.dropAfter
		if dropAfter > 0 && n >= dropAfter {
			s.dropAfter = 0
		}
		s.mu.Unlock()
		select {
		case s.recvd <- struct{}{}:
		default:
		}
		if dropAfter > 0 && n >= dropAfter {
			return fmt.Errorf("fault: stream dropped after %d records", n)
		}
		if !hold {
			cmds <- &agentpb.ServerMessage{Body: &agentpb.ServerMessage_Ack{Ack: &agentpb.Ack{Seq: msg.GetSeq()}}}
		}
	}
}

// fakeStatus is a ManifestStatus as received on the stream of agentID.
type fakeStatus struct {
	agentID string
	status  *agentpb.ManifestStatus
}

// manifestStatuses returns the committed ManifestStatus records in order.
func (s *fakeServer) manifestStatuses() []*agentpb.ManifestStatus {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []*agentpb.ManifestStatus
	for _, seq := range s.order {
		if ms := s.committed[seq].GetManifestStatus(); ms != nil {
			out = append(out, ms)
		}
	}
	return out
}

// runsFinished returns the committed RunFinished records in order.
func (s *fakeServer) runsFinished() []*agentpb.RunFinished {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []*agentpb.RunFinished
	for _, seq := range s.order {
		if f := s.committed[seq].GetRunFinished(); f != nil {
			out = append(out, f)
		}
	}
	return out
}

// runsStarted returns the committed RunStarted records in order.
func (s *fakeServer) runsStarted() []*agentpb.RunStarted {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []*agentpb.RunStarted
	for _, seq := range s.order {
		if r := s.committed[seq].GetRunStarted(); r != nil {
			out = append(out, r)
		}
	}
	return out
}

// finishedWhere returns the committed RunFinished records match accepts.
func (s *fakeServer) finishedWhere(match func(*agentpb.RunFinished) bool) []*agentpb.RunFinished {
	var out []*agentpb.RunFinished
	for _, f := range s.runsFinished() {
		if match(f) {
			out = append(out, f)
		}
	}
	return out
}

// lastHeartbeat returns the last heartbeat received, or nil.
func (s *fakeServer) lastHeartbeat() *agentpb.Heartbeat {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.heartbeats) == 0 {
		return nil
	}
	return s.heartbeats[len(s.heartbeats)-1]
}
