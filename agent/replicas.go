package agent

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/drover/drover/api"
)

// Replicas.
//
// An agent knows every replica of the server: the HTTPS base URLs
// (server_urls) and the stream addresses (grpc_addrs) the server gave it at
// enrollment, refreshed from every renewal and every manifest answer
// (api.ServerURLsHeader), or the lists set in agent.yaml, which then win.
// It talks to one replica at a time and stays with it while it works
// (sticky); when a request or the stream fails it moves to the next one in
// the list, at once for polls (the same request is tried on the next
// replica) and after at most failoverJitter for the stream; only when
// every replica failed in a row does it wait, with the jittered
// exponential backoff of every retry. A replica that comes back does not
// take its agents back: they stay where they are until that one fails.
//
// When both lists came from the server and are as long as each other,
// entry i of each is the same replica (the server configuration says so),
// and a failure seen on either channel moves both: a dead replica noticed
// by the stream is not polled again (a poll already waiting on it is sent
// to the next replica at once), and the other way round.
//
// One DNS name with several addresses is one entry: every new connection
// resolves it and dials the addresses in the order the resolver gives
// (Go's dialer and gRPC's pick_first both go on to the next address when
// one does not answer).

// Failover timing. A dead replica's connections end at once (the kernel
// answers with a reset). One that stops answering without closing them is
// noticed by the stream's liveness probe (probeStream: at most probeIdle +
// probeTick + probeTimeout after the last answer), by the dial and TLS
// handshake timeouts, and by the response-header timeout of a poll;
// gRPC's own keepalive (a PING after agentpb.StreamKeepalive without
// reads) and the TCP_USER_TIMEOUT it sets are the backstop.
const (
	streamKeepaliveWait = 3 * time.Second
	connectTimeout      = 5 * time.Second
	// httpHeaderTimeout bounds the wait for an answer's headers from one
	// replica (at most half the request timeout, so that the next replica
	// gets its turn within the same request).
	httpHeaderTimeout = 8 * time.Second
	// failoverJitter spreads the agents of a dead replica over time as
	// they move to the next one.
	failoverJitter = 500 * time.Millisecond
)

// rotation is the choice of one entry among n: it stays on the current
// one until that fails, then moves to the next, round the list.
type rotation struct {
	n, cur int
}

// failed records that entry i failed; it reports whether the current
// entry moved (an entry that is no longer current moves nothing).
func (r *rotation) failed(i int) bool {
	if r.n <= 1 || i != r.cur {
		return false
	}
	r.cur = (r.cur + 1) % r.n
	return true
}

// retryDelay is the wait before the next attempt after streak
// consecutive failures over n entries: a short jitter while the round is
// not complete (the next entry has not been tried), the backoff once every
// entry failed since the last success.
func retryDelay(streak, n int, bo *backoff) time.Duration {
	if n > 1 && streak%n != 0 {
		return rand.N(failoverJitter + 1)
	}
	return bo.next()
}

// replicas is the agent's view of the server's replicas: both lists and
// the entry in use on each channel.
type replicas struct {
	mu        sync.Mutex
	urls      []string
	addrs     []string
	paired    bool
	http      rotation
	grpc      rotation
	httpSince time.Time // first success on the current URL; zero: none yet
	grpcSince time.Time
	failovers uint64
	now       func() time.Time
	// httpMoved is closed (and replaced) whenever the URL in use changes:
	// a request waiting on a replica the agent has left gives up at once.
	httpMoved chan struct{}
}

func newReplicas(urls, addrs []string, paired bool) *replicas {
	r := &replicas{now: time.Now, httpMoved: make(chan struct{})}
	r.set(urls, addrs, paired)
	return r
}

// set installs new lists, keeping the entries in use when they are still
// listed.
func (r *replicas) set(urls, addrs []string, paired bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var curURL, curAddr string
	if len(r.urls) > 0 {
		curURL = r.urls[r.http.cur]
	}
	if len(r.addrs) > 0 {
		curAddr = r.addrs[r.grpc.cur]
	}
	r.urls, r.addrs = append([]string(nil), urls...), append([]string(nil), addrs...)
	r.paired = paired && len(urls) == len(addrs)
	r.http = rotation{n: len(urls), cur: indexOf(urls, curURL, sameURL)}
	r.grpc = rotation{n: len(addrs), cur: indexOf(addrs, curAddr, strings.EqualFold)}
	if r.http.cur < 0 {
		r.http.cur, r.httpSince = 0, time.Time{}
		if curURL != "" {
			r.httpMovedLocked()
		}
	}
	if r.grpc.cur < 0 {
		r.grpc.cur, r.grpcSince = 0, time.Time{}
	}
}

func indexOf(list []string, v string, eq func(a, b string) bool) int {
	if v == "" {
		return -1
	}
	for i, s := range list {
		if eq(s, v) {
			return i
		}
	}
	return -1
}

func sameURL(a, b string) bool {
	return strings.EqualFold(strings.TrimSuffix(a, "/"), strings.TrimSuffix(b, "/"))
}

// httpURL is the URL to use now.
func (r *replicas) httpURL() (int, string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.urls) == 0 {
		return 0, ""
	}
	return r.http.cur, r.urls[r.http.cur]
}

// grpcAddr is the stream address to use now.
func (r *replicas) grpcAddr() (int, string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.addrs) == 0 {
		return 0, ""
	}
	return r.grpc.cur, r.addrs[r.grpc.cur]
}

// httpMovedLocked wakes the requests waiting on the URL that was in use.
func (r *replicas) httpMovedLocked() {
	close(r.httpMoved)
	r.httpMoved = make(chan struct{})
}

// httpWatch returns a channel that is closed when URL i is no longer the
// one in use (closed already if it is not).
func (r *replicas) httpWatch(i int) <-chan struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	if i != r.http.cur {
		ch := make(chan struct{})
		close(ch)
		return ch
	}
	return r.httpMoved
}

func (r *replicas) httpOK(i int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if i == r.http.cur && r.httpSince.IsZero() {
		r.httpSince = r.now()
	}
}

func (r *replicas) grpcOK(i int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if i == r.grpc.cur && r.grpcSince.IsZero() {
		r.grpcSince = r.now()
	}
}

// httpFailed records a failed request to URL i; it reports whether the
// agent moved to another replica.
func (r *replicas) httpFailed(i int) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.http.failed(i) {
		return false
	}
	r.httpSince = time.Time{}
	r.failovers++
	r.httpMovedLocked()
	if r.paired && r.grpc.cur == i {
		r.grpc.cur, r.grpcSince = r.http.cur, time.Time{}
	}
	return true
}

// grpcFailed records a failed stream to address i.
func (r *replicas) grpcFailed(i int) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.grpc.failed(i) {
		return false
	}
	r.grpcSince = time.Time{}
	r.failovers++
	if r.paired && r.http.cur == i {
		r.http.cur, r.httpSince = r.grpc.cur, time.Time{}
		r.httpMovedLocked()
	}
	return true
}

// count is the number of stream addresses.
func (r *replicas) count() (urls, addrs int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.urls), len(r.addrs)
}

// ReplicaStatus is the replica part of Status.
type ReplicaStatus struct {
	// ServerURLs and GRPCAddrs are the lists the agent knows, in order.
	ServerURLs []string `json:"server_urls,omitempty"`
	GRPCAddrs  []string `json:"grpc_addrs,omitempty"`
	// ServerIndex and GRPCIndex are the entries in use (0-based).
	ServerIndex int `json:"server_index"`
	GRPCIndex   int `json:"grpc_index"`
	// ServerSince and GRPCSince: since when the entry in use answers
	// (zero: it has not answered yet).
	ServerSince time.Time `json:"server_since,omitzero"`
	GRPCSince   time.Time `json:"grpc_since,omitzero"`
	// Failovers counts the moves to another replica since the daemon
	// started.
	Failovers uint64 `json:"failovers"`
	// Override: the lists come from agent.yaml, not from the server.
	Override bool `json:"override,omitempty"`
}

func (r *replicas) status() ReplicaStatus {
	r.mu.Lock()
	defer r.mu.Unlock()
	return ReplicaStatus{
		ServerURLs: append([]string(nil), r.urls...), GRPCAddrs: append([]string(nil), r.addrs...),
		ServerIndex: r.http.cur, GRPCIndex: r.grpc.cur, ServerSince: r.httpSince, GRPCSince: r.grpcSince,
		Failovers: r.failovers,
	}
}

// checkReplicaLists checks lists of replica addresses a server sent or a
// configuration names: at most api.MaxReplicaAddrs each, every URL an
// https URL, every address host:port; duplicates are dropped.
func checkReplicaLists(urls, addrs []string) ([]string, []string, error) {
	if len(urls) > api.MaxReplicaAddrs || len(addrs) > api.MaxReplicaAddrs {
		return nil, nil, fmt.Errorf("more than %d replica addresses", api.MaxReplicaAddrs)
	}
	var cu, ca []string
	for i, u := range urls {
		if err := checkServerURL(u); err != nil {
			return nil, nil, fmt.Errorf("server_urls[%d]: %w", i, err)
		}
		if indexOf(cu, u, sameURL) < 0 {
			cu = append(cu, strings.TrimSuffix(u, "/"))
		}
	}
	for i, a := range addrs {
		if err := checkGRPCAddr(a); err != nil {
			return nil, nil, fmt.Errorf("grpc_addrs[%d]: %w", i, err)
		}
		if indexOf(ca, a, strings.EqualFold) < 0 {
			ca = append(ca, a)
		}
	}
	return cu, ca, nil
}

func checkGRPCAddr(a string) error {
	h, p, err := net.SplitHostPort(a)
	if err != nil || h == "" || p == "" || strings.ContainsAny(a, " ,/") {
		return fmt.Errorf("%q is not host:port", a)
	}
	return nil
}

// splitHeader parses a comma-separated replica header.
func splitHeader(v string) []string {
	var out []string
	for _, s := range strings.Split(v, ",") {
		if s = strings.TrimSpace(s); s != "" {
			out = append(out, s)
		}
	}
	return out
}

// failoverTransport sends each request to the replica in use and, when
// it does not answer (a connection error, a timeout, or 502, 503 or 504),
// moves to the next replica and sends it there, until every replica was
// tried once. Successful answers carrying the server's replica lists
// (api.ServerURLsHeader) are handed to learn.
type failoverTransport struct {
	rs    *replicas
	base  http.RoundTripper
	learn func(urls, addrs []string)
}

// rebase moves u to the replica base URL: the API path (from /api/ on)
// and the query are kept.
func rebase(u *url.URL, base string) (*url.URL, error) {
	b, err := url.Parse(base)
	if err != nil {
		return nil, err
	}
	p := u.Path
	if i := strings.Index(p, "/api/"); i >= 0 {
		p = p[i:]
	}
	nu := *b
	nu.Path = strings.TrimSuffix(b.Path, "/") + p
	nu.RawPath = ""
	nu.RawQuery = u.RawQuery
	return &nu, nil
}

func (t *failoverTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	n, _ := t.rs.count()
	tried := map[int]bool{}
	var errs []string
	var lastErr error
	for attempt := 0; attempt < max(n, 1); attempt++ {
		i, base := t.rs.httpURL()
		if tried[i] {
			break
		}
		tried[i] = true
		r := req
		if base != "" {
			u, err := rebase(req.URL, base)
			if err != nil {
				return nil, err
			}
			r = req.Clone(req.Context())
			r.URL, r.Host = u, ""
			if attempt > 0 && req.Body != nil && req.Body != http.NoBody {
				if req.GetBody == nil {
					break
				}
				body, err := req.GetBody()
				if err != nil {
					return nil, err
				}
				r.Body = body
			}
		}
		resp, left, err := t.send(r, i)
		if left && req.Context().Err() == nil {
			// The stream found this replica dead while the request waited
			// on it, and the agent moved on: send it where it went.
			lastErr = fmt.Errorf("left replica %s while waiting for it", r.URL.Host)
			errs = append(errs, fmt.Sprintf("%s: %v", r.URL.Host, lastErr))
			continue
		}
		if err == nil && !unavailable(resp.StatusCode) {
			t.rs.httpOK(i)
			if t.learn != nil && resp.StatusCode < 400 {
				if urls := splitHeader(resp.Header.Get(api.ServerURLsHeader)); len(urls) > 0 {
					t.learn(urls, splitHeader(resp.Header.Get(api.GRPCAddrsHeader)))
				}
			}
			return resp, nil
		}
		if req.Context().Err() != nil {
			if resp != nil {
				resp.Body.Close()
			}
			return nil, req.Context().Err()
		}
		if err == nil {
			err = fmt.Errorf("HTTP %d", resp.StatusCode)
		}
		t.rs.httpFailed(i)
		if resp != nil {
			if attempt == n-1 || len(tried) == n {
				return resp, nil // the last replica's answer, for the caller to judge
			}
			io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
			resp.Body.Close()
		}
		lastErr = err
		errs = append(errs, fmt.Sprintf("%s: %v", r.URL.Host, err))
	}
	if lastErr == nil {
		lastErr = errors.New("no server URL")
	}
	if len(errs) > 1 {
		return nil, fmt.Errorf("no replica answered (%s): %w", strings.Join(errs[:len(errs)-1], "; "), lastErr)
	}
	return nil, lastErr
}

// send sends r to replica i. It stops waiting for the answer when the
// agent leaves replica i meanwhile (left): its stream found the replica
// dead, and a poll stuck there would otherwise hold the sync for the whole
// header timeout. A successful answer's body keeps the request's context
// until it is closed.
func (t *failoverTransport) send(r *http.Request, i int) (resp *http.Response, left bool, err error) {
	moved := t.rs.httpWatch(i)
	ctx, cancel := context.WithCancel(r.Context())
	done, exited := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(exited)
		select {
		case <-moved:
			left = true
			cancel()
		case <-done:
		}
	}()
	resp, err = t.base.RoundTrip(r.WithContext(ctx))
	close(done)
	<-exited
	if left || err != nil {
		if resp != nil {
			resp.Body.Close()
		}
		cancel()
		return nil, left, err
	}
	resp.Body = &cancelOnClose{ReadCloser: resp.Body, cancel: cancel}
	return resp, false, nil
}

// cancelOnClose is an answer's body that ends its request's context when
// closed.
type cancelOnClose struct {
	io.ReadCloser
	cancel context.CancelFunc
}

func (b *cancelOnClose) Close() error {
	err := b.ReadCloser.Close()
	b.cancel()
	return err
}

// CloseIdleConnections closes the idle connections of the transport
// underneath (http.Client.CloseIdleConnections calls it).
func (t *failoverTransport) CloseIdleConnections() {
	if c, ok := t.base.(interface{ CloseIdleConnections() }); ok {
		c.CloseIdleConnections()
	}
}

func unavailable(code int) bool {
	return code == http.StatusBadGateway || code == http.StatusServiceUnavailable || code == http.StatusGatewayTimeout
}

// newBaseTransport is the HTTP transport under failoverTransport: the
// dial, handshake and response-header timeouts notice a replica that
// stopped answering. The TLS configuration leaves ServerName empty, so
// that each replica is checked against its own host name. At most one idle
// connection per replica is kept, and none for longer than
// pollIdleTimeout (client.go): at rest the agent holds only its stream.
func newBaseTransport(tlsConf *tls.Config, requestTimeout time.Duration) *http.Transport {
	return &http.Transport{
		Proxy:                 http.ProxyFromEnvironment,
		DialContext:           (&net.Dialer{Timeout: connectTimeout, KeepAlive: 15 * time.Second}).DialContext,
		TLSClientConfig:       tlsConf,
		TLSHandshakeTimeout:   connectTimeout,
		ResponseHeaderTimeout: min(httpHeaderTimeout, requestTimeout/2),
		ForceAttemptHTTP2:     true,
		MaxIdleConns:          4,
		MaxIdleConnsPerHost:   1,
		IdleConnTimeout:       pollIdleTimeout,
	}
}
