package agent

import (
	"crypto/tls"
	"net"
	"net/http"
	"os"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/drover/drover/api"
	"github.com/drover/drover/internal/testkit"
)

// handshakes records the TLS handshakes of an agent's HTTP client.
type handshakes struct {
	mu  sync.Mutex
	all []tls.ConnectionState
}

func (h *handshakes) add(cs tls.ConnectionState) {
	h.mu.Lock()
	h.all = append(h.all, cs)
	h.mu.Unlock()
}

func (h *handshakes) count() int { h.mu.Lock(); defer h.mu.Unlock(); return len(h.all) }

// since returns the handshakes after the first n.
func (h *handshakes) since(n int) []tls.ConnectionState {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]tls.ConnectionState(nil), h.all[n:]...)
}

func withHandshakes(h *handshakes) Option { return func(a *Agent) { a.onHandshake = h.add } }

// TestPollSessionResumedAndRenewal: against the real server, a poll after
// the idle connection closed resumes the TLS session; after a renewal the
// next poll succeeds with a full handshake (the session cache was rebuilt
// with the new certificate), a poll after pollIdleTimeout of rest dials
// again (no connection was kept), while a client that kept the old cache
// resumes the old certificate's session and is refused once the renewal
// is promoted — which is why the cache is rebuilt.
func TestPollSessionResumedAndRenewal(t *testing.T) {
	rs := startRealServer(t)
	var tok api.EnrollmentTokenCreated
	rs.api("POST", "/api/v1/enrollment-tokens", api.EnrollmentTokenRequest{Tags: map[string]string{"role": "session"}}, &tok)
	cfg := testConfig(t, nil)
	cfg.Server = rs.srv.URL
	must(t, os.WriteFile(cfg.TokenFile, []byte(tok.Token+"\n"), 0o600))
	h := &handshakes{}
	ta := startAgent(t, cfg, nil, withHandshakes(h))
	ta.enrolled(15 * time.Second)
	testkit.WaitFor(t, 15*time.Second, "the stream", func() bool { return ta.a.Status(t.Context()).StreamConnected })

	if r := ta.syncNow(); r.Outcome == OutcomeError {
		t.Fatalf("first poll: %+v", r)
	}
	ta.a.httpClient().GetClient().CloseIdleConnections()
	n := h.count()
	if r := ta.syncNow(); r.Outcome == OutcomeError {
		t.Fatalf("poll on a new connection: %+v", r)
	}
	if got := h.since(n); len(got) != 1 || !got[0].DidResume {
		t.Fatalf("the poll after the idle connection closed: %d handshakes %+v, want one resumed", len(got), resumedOf(got))
	}

	old := ta.a.httpClient()
	before := ta.a.identity().cert.Leaf.SerialNumber
	must(t, ta.a.renew(t.Context()))
	if after := ta.a.identity().cert.Leaf.SerialNumber; after.Cmp(before) == 0 {
		t.Fatal("renewal kept the serial")
	}
	n = h.count()
	if r := ta.syncNow(); r.Outcome == OutcomeError {
		t.Fatalf("poll after the renewal: %+v", r)
	}
	if got := h.since(n); len(got) != 1 || got[0].DidResume {
		t.Fatalf("the poll after the renewal: handshakes %v, want one full handshake (a new session cache)", resumedOf(got))
	}
	// At rest no poll connection stays open: after pollIdleTimeout the
	// next poll dials again, resuming the new certificate's session.
	time.Sleep(pollIdleTimeout + time.Second)
	n = h.count()
	if r := ta.syncNow(); r.Outcome == OutcomeError {
		t.Fatalf("poll after an idle pause: %+v", r)
	}
	if got := h.since(n); len(got) != 1 || !got[0].DidResume {
		t.Fatalf("the poll after %s idle: handshakes %v, want one resumed (the idle connection closed)", pollIdleTimeout, resumedOf(got))
	}

	// The hazard: a client whose cache outlived the certificate resumes a
	// session of the old one, which the server refuses now that the new
	// one was used.
	old.GetClient().CloseIdleConnections()
	n = h.count()
	resp, err := old.R().SetContext(t.Context()).Get(pathManifest)
	if err != nil {
		t.Fatal(err)
	}
	if got := h.since(n); len(got) != 1 || !got[0].DidResume {
		t.Fatalf("the old client: handshakes %v, want one resumed", resumedOf(got))
	}
	if resp.StatusCode() != http.StatusForbidden && resp.StatusCode() != http.StatusUnauthorized {
		t.Fatalf("the old certificate's session after the renewal was promoted: HTTP %d %s, want a refusal", resp.StatusCode(), resp.Body())
	}
	if r := ta.syncNow(); r.Outcome == OutcomeError {
		t.Fatalf("the agent's own poll after that: %+v", r)
	}
}

func resumedOf(cs []tls.ConnectionState) []bool {
	out := make([]bool, len(cs))
	for i, c := range cs {
		out[i] = c.DidResume
	}
	return out
}

// TestPollIntervalFollowsStream: while the stream is up the agent polls
// every sync_interval_streaming, while it is down every sync_interval, and
// a change of the stream's state during a wait takes effect at once. The
// stream's state is set directly here (its loop only sets it on connect and
// close), against the real server's manifest endpoint.
func TestPollIntervalFollowsStream(t *testing.T) {
	rs := startRealServer(t)
	var tok api.EnrollmentTokenCreated
	rs.api("POST", "/api/v1/enrollment-tokens", api.EnrollmentTokenRequest{Tags: map[string]string{"role": "interval"}}, &tok)
	cfg := testConfig(t, nil)
	cfg.Server = rs.srv.URL
	cfg.SyncInterval = time.Second
	cfg.SyncIntervalStreaming = time.Hour
	must(t, os.WriteFile(cfg.TokenFile, []byte(tok.Token+"\n"), 0o600))
	ta := startAgent(t, cfg, nil)
	ta.enrolled(15 * time.Second)
	testkit.WaitFor(t, 15*time.Second, "the stream and a poll", func() bool {
		st := ta.a.Status(t.Context())
		return st.StreamConnected && !st.LastSync.IsZero()
	})
	lastSync := func() time.Time { return ta.a.Status(t.Context()).LastSync }
	quiet := func(what string) {
		t.Helper()
		time.Sleep(1500 * time.Millisecond) // a poll already due (the enrollment's SyncNow) ends
		first := lastSync()
		time.Sleep(2500 * time.Millisecond)
		if got := lastSync(); !got.Equal(first) {
			t.Fatalf("%s: polled at %s (interval 1h)", what, got.Format(time.RFC3339Nano))
		}
	}
	quiet("stream up")

	ta.a.setStreamUp(false)
	first := lastSync()
	testkit.WaitFor(t, 5*time.Second, "two polls a second apart while the stream is down", func() bool {
		return lastSync().Sub(first) >= 900*time.Millisecond
	})

	ta.a.setStreamUp(true)
	quiet("stream up again")
	if r := ta.syncNow(); r.Outcome == OutcomeError {
		t.Fatalf("a poll on request while streaming: %+v", r)
	}
}

// The probe is due only while a record sent is unanswered and the server
// has been silent for probeIdle: an idle stream costs no probe.
func TestProbeDue(t *testing.T) {
	t0 := time.Unix(1000, 0)
	for _, c := range []struct {
		name           string
		recv, sent, at time.Duration
		due            bool
	}{
		{"idle: nothing sent since the last answer", 0, -time.Second, time.Minute, false},
		{"a record, the server silent since", 0, 10 * time.Second, 10*time.Second + 100*time.Millisecond, true},
		{"records sent, acks stopped 3 s ago", 0, 2900 * time.Millisecond, probeIdle, true},
		{"records sent, last ack 2 s ago", 0, 2 * time.Second, 2 * time.Second, false},
		{"answered after the send", 5 * time.Second, 4 * time.Second, time.Minute, false},
	} {
		if got := probeDue(t0.Add(c.recv), t0.Add(c.sent), t0.Add(c.at)); got != c.due {
			t.Errorf("%s: due %v, want %v", c.name, got, c.due)
		}
	}
}

// The stream's connection to a replica has kernel keepalive and a user
// timeout (read back from a real socket); with a proxy configured the
// agent keeps gRPC's own dialer.
func TestStreamDialerSocketOptions(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	must(t, err)
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			defer c.Close()
		}
	}()
	d := streamDialer(ln.Addr().String())
	if d == nil {
		t.Fatal("no dialer without a proxy")
	}
	c, err := d(t.Context(), ln.Addr().String())
	must(t, err)
	defer c.Close()
	rc, err := c.(*net.TCPConn).SyscallConn()
	must(t, err)
	var ka, idle, intvl, cnt, uto int
	must(t, rc.Control(func(fd uintptr) {
		ka, _ = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_KEEPALIVE)
		idle, _ = unix.GetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_KEEPIDLE)
		intvl, _ = unix.GetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_KEEPINTVL)
		cnt, _ = unix.GetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_KEEPCNT)
		uto, _ = unix.GetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT)
	}))
	if ka != 1 || idle != 4 || intvl != 1 || cnt != 7 || uto != 7000 {
		t.Fatalf("keepalive %d, idle %d s, interval %d s, count %d, user timeout %d ms", ka, idle, intvl, cnt, uto)
	}
	t.Setenv("HTTPS_PROXY", "http://proxy.invalid:3128")
	t.Setenv("NO_PROXY", "")
	if streamDialer("replica.example:8444") != nil {
		t.Error("a custom dialer although a proxy is configured")
	}
}
