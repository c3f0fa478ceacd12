package server

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/json"
	"errors"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/drover/drover/api"
	"github.com/drover/drover/internal/testkit"
	"github.com/drover/drover/server/errs"
	"github.com/drover/drover/server/pki"
)

func TestEnrollSuccess(t *testing.T) {
	ts := startServer(t)
	tok := ts.token(map[string]string{"role": "web"})
	if !strings.HasPrefix(tok, "drv1.") || !strings.HasSuffix(tok, "."+ts.s.CAPin()) {
		t.Fatalf("token %q is not drv1.<id>.<secret>.<ca-pin>", tok)
	}
	a, err := enroll(ts.base, tok, "web-1")
	if err != nil {
		t.Fatal(err)
	}
	defer a.close()

	leaf, err := x509.ParseCertificate(a.cert.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	if leaf.Subject.CommonName != a.id || len(leaf.URIs) != 1 || leaf.URIs[0].String() != pki.AgentURIPrefix+a.id {
		t.Errorf("certificate identity: CN %q URIs %v, want %s", leaf.Subject.CommonName, leaf.URIs, a.id)
	}
	if len(leaf.DNSNames) != 0 || len(leaf.ExtKeyUsage) != 1 || leaf.ExtKeyUsage[0] != x509.ExtKeyUsageClientAuth {
		t.Errorf("the CSR's SANs must be ignored and EKU must be clientAuth only: %v %v", leaf.DNSNames, leaf.ExtKeyUsage)
	}
	if life := time.Until(leaf.NotAfter); life < 29*24*time.Hour || life > 31*24*time.Hour {
		t.Errorf("certificate lifetime %s, want about 30 days", life)
	}
	if _, port, _ := net.SplitHostPort(a.grpcAddr); !strings.HasSuffix(ts.s.GRPCAddr(), ":"+port) {
		t.Errorf("grpc_addr %s does not name the gRPC listener %s", a.grpcAddr, ts.s.GRPCAddr())
	}
	if _, err := a.trust.CurrentKeyList(time.Now()); err != nil {
		t.Errorf("trust root: %v", err)
	}

	var ag api.Agent
	ts.adminOK("GET", "/api/v1/agents/"+a.id, nil, &ag)
	if ag.Hostname != "web-1" || ag.Tags["role"] != "web" || ag.Manifest == nil || ag.Manifest.Serial != 1 {
		t.Errorf("agent after enrollment: %+v", ag)
	}
	acc, err := a.pullManifest()
	if err != nil {
		t.Fatalf("the first manifest does not verify: %v", err)
	}
	if acc.Manifest.AgentID != a.id || len(acc.Manifest.Pipes) != 0 {
		t.Errorf("first manifest: %+v", acc.Manifest)
	}
}

func TestEnrollTokenRefusals(t *testing.T) {
	ts := startServer(t)
	expectCode := func(t *testing.T, err error, code string) {
		t.Helper()
		var he *httpError
		if !errors.As(err, &he) || he.errorCode() != code || he.code != 401 {
			t.Fatalf("got %v, want 401 %s", err, code)
		}
	}
	t.Run("reuse", func(t *testing.T) {
		tok := ts.token(nil)
		if _, err := enroll(ts.base, tok, "a"); err != nil {
			t.Fatal(err)
		}
		_, err := enroll(ts.base, tok, "b")
		expectCode(t, err, "token_used")
	})
	t.Run("expiry", func(t *testing.T) {
		var tr api.EnrollmentTokenCreated
		ts.adminOK("POST", "/api/v1/enrollment-tokens", api.EnrollmentTokenRequest{TTL: "2m"}, &tr)
		ts.clock.Advance(3 * time.Minute)
		defer ts.clock.Advance(-3 * time.Minute)
		_, err := enroll(ts.base, tr.Token, "a")
		expectCode(t, err, "token_expired")
	})
	t.Run("unknown id", func(t *testing.T) {
		tok := ts.token(nil)
		parts := strings.Split(tok, ".")
		parts[1] = "aaaaaaaaaaaaaaaa"
		_, err := enroll(ts.base, strings.Join(parts, "."), "a")
		expectCode(t, err, "invalid_token")
	})
	t.Run("wrong secret", func(t *testing.T) {
		tok := ts.token(nil)
		parts := strings.Split(tok, ".")
		parts[2] = strings.Repeat("A", 43)
		_, err := enroll(ts.base, strings.Join(parts, "."), "a")
		expectCode(t, err, "invalid_token")
		if _, err := enroll(ts.base, tok, "a"); err != nil {
			t.Fatalf("a failed attempt must not consume the token: %v", err)
		}
	})
	t.Run("malformed", func(t *testing.T) {
		_, err := enroll(ts.base, "drv1.x.y."+ts.s.CAPin(), "a")
		expectCode(t, err, "invalid_token")
	})
}

func TestEnrollWrongPinNeverReachesServer(t *testing.T) {
	ts := startServer(t)
	tok := ts.token(nil)
	parts := strings.Split(tok, ".")
	parts[3] = strings.Repeat("0", 64)
	before := ts.s.enrollRequests.Load()
	_, err := enroll(ts.base, strings.Join(parts, "."), "a")
	if !errors.Is(err, errPinMismatch) {
		t.Fatalf("enroll with a wrong pin: %v, want the client's pin check to fail", err)
	}
	if n := ts.s.enrollRequests.Load() - before; n != 0 {
		t.Fatalf("the server saw %d enrollment requests", n)
	}
	if _, err := enroll(ts.base, tok, "a"); err != nil {
		t.Fatalf("the token must still be unused: %v", err)
	}
}

func TestEnrollConcurrentOneToken(t *testing.T) {
	ts := startServer(t)
	tok := ts.token(nil)
	const n = 50
	var wg sync.WaitGroup
	var mu sync.Mutex
	ok, used := 0, 0
	var other []error
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			a, err := enroll(ts.base, tok, "racer")
			mu.Lock()
			defer mu.Unlock()
			var he *httpError
			switch {
			case err == nil:
				a.close()
				ok++
			case errors.As(err, &he) && he.errorCode() == "token_used":
				used++
			default:
				other = append(other, err)
			}
		}()
	}
	wg.Wait()
	if ok != 1 || used != n-1 || len(other) > 0 {
		t.Fatalf("%d enrolled, %d refused as used, other errors %v; want 1 and %d", ok, used, other, n-1)
	}
	var list struct{ Agents []api.Agent }
	ts.adminOK("GET", "/api/v1/agents", nil, &list)
	if len(list.Agents) != 1 {
		t.Fatalf("%d agents exist, want exactly 1", len(list.Agents))
	}
}

func TestEnrollRateLimited(t *testing.T) {
	ts := startServer(t, func(c *Config) { c.Enrollment.RatePerMinute, c.Enrollment.Burst = 1, 3 })
	codes := map[int]int{}
	for range 5 {
		r := ts.do("POST", "/api/v1/agents/enroll", "", api.EnrollRequest{Token: "x", Hostname: "h", CSR: "x"})
		codes[r.code]++
	}
	if codes[429] != 2 {
		t.Fatalf("status codes %v, want 2 × 429 after a burst of 3", codes)
	}
}

func TestRenewalRetiresOldCertificate(t *testing.T) {
	ts := startServer(t)
	a := ts.enrollAgent(nil)
	oldKey, oldPEM := a.key, a.certPEM

	// A renewal that the agent never uses is superseded by the next one.
	_, stalePEM, err := a.renew()
	if err != nil {
		t.Fatal(err)
	}
	key, certPEM, err := a.renew()
	if err != nil {
		t.Fatal(err)
	}
	// Until the new certificate is used, the current one keeps working.
	if r, err := a.get("/api/v1/agents/self/trust"); err != nil || r.code != 200 {
		t.Fatalf("the current certificate must work before the new one is used: %v %v", r, err)
	}
	if err := a.setCert(key, certPEM); err != nil {
		t.Fatal(err)
	}
	if _, err := a.pullManifest(); err != nil {
		t.Fatalf("the renewed certificate: %v", err)
	}

	old := &testAgent{id: a.id, base: a.base, grpcAddr: a.grpcAddr, pool: a.pool}
	if err := old.setCert(oldKey, oldPEM); err != nil {
		t.Fatal(err)
	}
	defer old.close()
	r, err := old.get("/api/v1/agents/self/manifest")
	if err != nil || r.code != 401 || r.errorCode() != "certificate_refused" {
		t.Errorf("old certificate over HTTPS: %v %v, want 401 certificate_refused", r, err)
	}
	if st, err := old.openStream(""); err == nil {
		<-st.recvDone
		if status.Code(st.err()) != codes.Unauthenticated {
			t.Errorf("old certificate over gRPC: %v, want Unauthenticated", st.err())
		}
		st.close()
	}
	// The stale renewal's serial is neither current nor next.
	stale, _ := pki.ParseCertPEM(stalePEM)
	if _, err := ts.s.checkAgentCert(t.Context(), stale); !errors.Is(err, errs.ErrCertRefused) {
		t.Errorf("stale renewal: %v, want certificate refused", err)
	}
	if _, _, err := a.renew(); err != nil {
		t.Errorf("renewing again with the new certificate: %v", err)
	}
	// A renewal must use a new key.
	a2 := ts.enrollAgent(nil)
	body, _ := json.Marshal(api.RenewRequest{CSR: newCSR(a2.key)})
	resp, err := a2.client.Post(a2.base+"/api/v1/agents/self/renew", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 400 {
		t.Errorf("renewal with the same key: %d, want 400", resp.StatusCode)
	}
}

func TestRevocationClosesLiveStream(t *testing.T) {
	ts := startServer(t)
	a := ts.enrollAgent(nil)
	st := a.mustStream(t)
	// Make sure the stream is registered before revoking.
	testkit.WaitFor(t, 5*time.Second, "the stream to be online", func() bool { return ts.s.hub.Online(a.id) })

	start := time.Now()
	ts.adminOK("POST", "/api/v1/agents/"+a.id+"/revoke", nil, nil)
	select {
	case <-st.recvDone:
	case <-time.After(time.Second):
		t.Fatal("the live stream was not closed within 1s of revocation")
	}
	t.Logf("stream closed %s after the revoke request was sent", time.Since(start))
	if status.Code(st.err()) != codes.PermissionDenied {
		t.Errorf("stream error %v, want PermissionDenied", st.err())
	}
	if r, err := a.get("/api/v1/agents/self/manifest"); err != nil || r.code != 403 || r.errorCode() != "agent_revoked" {
		t.Errorf("HTTPS after revocation: %v %v, want 403 agent_revoked", r, err)
	}
	st2, err := a.openStream("")
	if err == nil {
		<-st2.recvDone
		if status.Code(st2.err()) != codes.PermissionDenied {
			t.Errorf("new stream after revocation: %v, want PermissionDenied", st2.err())
		}
		st2.close()
	}
}

// Agents are given every replica's addresses: grpc_addr is the first
// (derived from public_urls with the gRPC listener's port when no stream
// addresses are configured), renewal answers both lists, and every
// manifest answer carries them in headers.
func TestReplicaAddressesToAgents(t *testing.T) {
	ts := startServer(t, func(cfg *Config) {
		cfg.PublicURLs = []string{"https://a.example:8443", "https://b.example:8443/"}
	})
	a := ts.enrollAgent(nil)
	_, port, _ := net.SplitHostPort(ts.s.GRPCAddr())
	wantAddrs := []string{"a.example:" + port, "b.example:" + port}
	if a.grpcAddr != wantAddrs[0] {
		t.Fatalf("grpc_addr %s, want %s", a.grpcAddr, wantAddrs[0])
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	code, body := a.renewWith(key)
	var rr api.RenewResponse
	if code != 200 || json.Unmarshal(body, &rr) != nil {
		t.Fatalf("renew: %d %s", code, body)
	}
	if strings.Join(rr.ServerURLs, " ") != "https://a.example:8443 https://b.example:8443" || strings.Join(rr.GRPCAddrs, " ") != strings.Join(wantAddrs, " ") {
		t.Fatalf("renewal: server_urls %v, grpc_addrs %v", rr.ServerURLs, rr.GRPCAddrs)
	}
	resp, err := a.client.Get(a.base + "/api/v1/agents/self/manifest")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if h := resp.Header.Get(api.ServerURLsHeader); h != "https://a.example:8443,https://b.example:8443" {
		t.Errorf("%s: %q", api.ServerURLsHeader, h)
	}
	if h := resp.Header.Get(api.GRPCAddrsHeader); h != strings.Join(wantAddrs, ",") {
		t.Errorf("%s: %q", api.GRPCAddrsHeader, h)
	}

	// Without public addresses: no lists, no headers (the agent keeps what
	// it enrolled with).
	plain := startServer(t)
	b := plain.enrollAgent(nil)
	resp, err = b.client.Get(b.base + "/api/v1/agents/self/manifest")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if h := resp.Header.Get(api.ServerURLsHeader); h != "" {
		t.Errorf("a server without public_urls sent %q", h)
	}
}
