package agent

import (
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/drover/drover/api"
)

// The order of replicas, stickiness and the waits between attempts, as
// pure logic: the next replica is tried after at most failoverJitter until
// every one failed in a row, then the backoff (jittered, doubling, capped)
// paces whole rounds; a replica that worked is kept; a failure reported
// for a replica no longer in use moves nothing.
func TestReplicaRotationAndRetryDelays(t *testing.T) {
	r := rotation{n: 3}
	var order []int
	for range 7 {
		order = append(order, r.cur)
		r.failed(r.cur)
	}
	if got := order; got[0] != 0 || got[1] != 1 || got[2] != 2 || got[3] != 0 || got[6] != 0 {
		t.Fatalf("order %v, want 0 1 2 0 1 2 0", got)
	}
	// Sticky: a stale failure (entry 2 while 1 is in use) moves nothing.
	r = rotation{n: 3, cur: 1}
	if r.failed(2) || r.cur != 1 {
		t.Fatalf("a stale failure moved the rotation to %d", r.cur)
	}
	one := rotation{n: 1}
	if one.failed(0) || one.cur != 0 {
		t.Fatal("a single entry moved")
	}

	for round := range 200 {
		bo := newBackoff(time.Second, 8*time.Second)
		var delays []time.Duration
		for streak := 1; streak <= 12; streak++ {
			delays = append(delays, retryDelay(streak, 3, bo))
		}
		for i, d := range delays {
			streak := i + 1
			if streak%3 != 0 {
				if d < 0 || d > failoverJitter {
					t.Fatalf("round %d: delay %s after %d failures of 3 replicas, want at most %s", round, d, streak, failoverJitter)
				}
				continue
			}
			// Whole rounds: 1 s, 2 s, 4 s, 8 s, each drawn from [d/2, d].
			want := time.Second << (streak/3 - 1)
			if d < want/2 || d > want {
				t.Fatalf("round %d: delay %s after %d failures, want within [%s, %s]", round, d, streak, want/2, want)
			}
		}
	}
	// One replica: every failure is a whole round (the backoff as before).
	bo := newBackoff(time.Second, 4*time.Second)
	if d := retryDelay(1, 1, bo); d < 500*time.Millisecond || d > time.Second {
		t.Fatalf("single replica: %s", d)
	}
	// The jitter is spread, not constant.
	seen := map[time.Duration]bool{}
	for range 50 {
		seen[retryDelay(1, 2, bo)] = true
	}
	if len(seen) < 10 {
		t.Fatalf("the failover jitter took %d values in 50 draws", len(seen))
	}
}

// Paired lists move together; new lists keep the replica in use when it is
// still listed; the status names the entries in use.
func TestReplicasPairedAndRelisted(t *testing.T) {
	rs := newReplicas([]string{"https://a:1", "https://b:1"}, []string{"a:2", "b:2"}, true)
	rs.now = func() time.Time { return time.Unix(100, 0) }
	rs.grpcOK(0)
	if !rs.grpcFailed(0) {
		t.Fatal("no move")
	}
	if i, u := rs.httpURL(); i != 1 || u != "https://b:1" {
		t.Fatalf("HTTP did not follow the stream: %d %s", i, u)
	}
	if rs.httpFailed(0) {
		t.Fatal("a stale HTTP failure moved")
	}
	rs.httpOK(1)
	st := rs.status()
	if st.ServerIndex != 1 || st.GRPCIndex != 1 || st.Failovers != 1 || st.ServerSince != time.Unix(100, 0) || !st.GRPCSince.IsZero() {
		t.Fatalf("status %+v", st)
	}
	rs.set([]string{"https://c:1", "https://B:1/", "https://a:1"}, []string{"c:2", "b:2", "a:2"}, true)
	if i, u := rs.httpURL(); i != 1 || u != "https://B:1/" {
		t.Fatalf("after relisting: %d %s", i, u)
	}
	if st := rs.status(); st.ServerSince.IsZero() {
		t.Fatal("relisting forgot since when the replica answers")
	}
	rs.set([]string{"https://c:1"}, []string{"c:2"}, true)
	if i, _ := rs.httpURL(); i != 0 {
		t.Fatalf("an unlisted replica stayed in use: %d", i)
	}
	// Unpaired lists move on their own.
	rs = newReplicas([]string{"https://a:1", "https://b:1", "https://lb:1"}, []string{"a:2", "b:2"}, true)
	rs.grpcFailed(0)
	if i, _ := rs.httpURL(); i != 0 {
		t.Fatal("unpaired lists moved together")
	}

	if _, _, err := checkReplicaLists([]string{"http://a"}, nil); err == nil || !strings.Contains(err.Error(), "server_urls[0]") {
		t.Fatalf("err = %v", err)
	}
	if _, _, err := checkReplicaLists(nil, []string{"a:1", "b"}); err == nil || !strings.Contains(err.Error(), "grpc_addrs[1]") {
		t.Fatalf("err = %v", err)
	}
	if u, a, err := checkReplicaLists([]string{"https://a/", "https://A"}, []string{"a:1", "A:1"}); err != nil || len(u) != 1 || len(a) != 1 {
		t.Fatalf("duplicates: %v %v %v", u, a, err)
	}
	many := make([]string, api.MaxReplicaAddrs+1)
	for i := range many {
		many[i] = "x:1"
	}
	if _, _, err := checkReplicaLists(nil, many); err == nil {
		t.Fatal("too many addresses accepted")
	}
}

// The HTTP transport sends a request to the next replica when the one in
// use refuses connections or answers 503, stays on the one that answered,
// keeps the request body, and learns the replica lists from the answer's
// headers. Real TLS servers on 127.0.0.1; the dead replica is a closed
// listener.
func TestFailoverTransport(t *testing.T) {
	var hitsB, hitsC atomic.Int32
	b := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hitsB.Add(1)
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	defer b.Close()
	c := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hitsC.Add(1)
		body := make([]byte, 5)
		n, _ := r.Body.Read(body)
		w.Header().Set(api.ServerURLsHeader, "https://x.example:1, https://y.example:1")
		w.Header().Set(api.GRPCAddrsHeader, "x.example:2,y.example:2")
		w.Write([]byte(r.URL.Path + "?" + r.URL.RawQuery + " " + string(body[:n])))
	}))
	defer c.Close()
	dead := httptest.NewTLSServer(http.NotFoundHandler())
	deadURL := dead.URL
	dead.Close()

	rs := newReplicas([]string{deadURL, b.URL, c.URL + "/prefix/"}, nil, false)
	var learned []string
	tr := &failoverTransport{rs: rs, base: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}},
		learn: func(urls, addrs []string) { learned = append(urls, addrs...) }}
	client := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	resp, err := client.Post(deadURL+"/api/v1/agents/self/renew?x=1", "application/json", strings.NewReader("hello"))
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 100)
	n, _ := resp.Body.Read(buf)
	resp.Body.Close()
	if got := string(buf[:n]); got != "/prefix/api/v1/agents/self/renew?x=1 hello" {
		t.Fatalf("the third replica got %q", got)
	}
	if i, _ := rs.httpURL(); i != 2 || rs.status().Failovers != 2 {
		t.Fatalf("in use: %d, status %+v", i, rs.status())
	}
	if strings.Join(learned, " ") != "https://x.example:1 https://y.example:1 x.example:2 y.example:2" {
		t.Fatalf("learned %v", learned)
	}
	// Sticky: the next request goes straight to the replica that answered.
	resp, err = client.Get(deadURL + "/api/v1/agents/self/manifest")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if hitsB.Load() != 1 || hitsC.Load() != 2 {
		t.Fatalf("hits: b %d, c %d", hitsB.Load(), hitsC.Load())
	}
	// Every replica down: one error naming them.
	c.Close()
	rs2 := newReplicas([]string{deadURL, c.URL}, nil, false)
	tr.rs = rs2
	if _, err := client.Get(deadURL + "/api/v1/agents/self/manifest"); err == nil || !strings.Contains(err.Error(), "no replica answered") {
		t.Fatalf("err = %v", err)
	}
}

// TestFailoverTransportLeavesStuckReplica: a poll waiting on a replica that
// accepted it and stays silent (a blackhole) is sent to the next replica as
// soon as the stream finds the first one dead and the agent moves on, not
// after the header timeout; the answer's body is whole.
func TestFailoverTransportLeavesStuckReplica(t *testing.T) {
	release := make(chan struct{})
	stuck := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	defer stuck.Close()
	defer close(release)
	body := strings.Repeat("manifest ", 10000)
	good := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte(body))
	}))
	defer good.Close()
	rs := newReplicas([]string{stuck.URL, good.URL}, []string{"a.example:1", "b.example:1"}, true)
	tr := &failoverTransport{rs: rs, base: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, ResponseHeaderTimeout: time.Minute}}
	client := &http.Client{Transport: tr, Timeout: 2 * time.Minute}
	time.AfterFunc(300*time.Millisecond, func() { rs.grpcFailed(0) }) // the stream on replica 0 failed
	start := time.Now()
	resp, err := client.Get(stuck.URL + "/api/v1/agents/self/manifest")
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	took := time.Since(start)
	if err != nil || string(got) != body {
		t.Fatalf("body: %d bytes, %v", len(got), err)
	}
	if took > 10*time.Second {
		t.Fatalf("the poll was answered %s after it started: it waited on the replica the agent had left", took)
	}
	if i, _ := rs.httpURL(); i != 1 {
		t.Fatalf("URL in use: %d", i)
	}
	// A request that does not wait on a replica being left is untouched.
	resp, err = client.Get(stuck.URL + "/api/v1/agents/self/manifest")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	t.Logf("answered by the next replica %s after the request started (the move came at 300 ms)", took.Round(time.Millisecond))
}

// The lists a server sends on its manifest answers replace the identity's,
// are stored in identity.json (an identity without them, as older agents
// wrote it, keeps working), survive a restart, and show in status; a
// configured server URL outside them stays the last resort; an agent.yaml
// override wins.
func TestAgentLearnsReplicaLists(t *testing.T) {
	srv := newFakeServer(t)
	cfg := testConfig(t, srv)
	must(t, os.WriteFile(cfg.TokenFile, []byte(srv.token(time.Hour)), 0o600))
	ta := startAgent(t, cfg, nil)
	id := ta.enrolled(15 * time.Second)
	if len(id.ServerURLs) != 0 || id.Server != srv.URL() {
		t.Fatalf("enrolled with a server that sends no lists: %+v", id)
	}
	srv.publish(id.AgentID, nil)
	ta.syncNow()
	grpcAddr := srv.grpcLn.Addr().String()
	urls := srv.URL() + ",https://127.0.0.1:1"
	srv.setIntercept(func(w http.ResponseWriter, r *http.Request, _ string) bool {
		if r.URL.Path == pathManifest {
			w.Header().Set(api.ServerURLsHeader, urls)
			w.Header().Set(api.GRPCAddrsHeader, grpcAddr+",127.0.0.1:1")
		}
		return false
	})
	ta.syncNow()
	var stored Identity
	raw, err := os.ReadFile(filepath.Join(cfg.DataDir, identityFile))
	must(t, err)
	must(t, json.Unmarshal(raw, &stored))
	if strings.Join(stored.ServerURLs, ",") != urls || len(stored.GRPCAddrs) != 2 || stored.Server != srv.URL() {
		t.Fatalf("identity.json: %s", raw)
	}
	st := ta.a.Status(t.Context())
	if st.Replicas == nil || len(st.Replicas.ServerURLs) != 2 || st.Server != srv.URL() || st.GRPCAddr != grpcAddr || st.Replicas.ServerSince.IsZero() {
		t.Fatalf("status: %+v %+v", st, st.Replicas)
	}

	// A bad list changes nothing.
	srv.setIntercept(func(w http.ResponseWriter, r *http.Request, _ string) bool {
		w.Header().Set(api.ServerURLsHeader, "http://plain.example")
		return false
	})
	ta.syncNow()
	if got := ta.a.identity().ServerURLs; strings.Join(got, ",") != urls {
		t.Fatalf("a bad list was taken: %v", got)
	}
	ta.stop()
	back, err := loadIdentity(cfg.DataDir)
	must(t, err)
	if strings.Join(back.serverURLs(), ",") != urls {
		t.Fatalf("after a restart: %v", back.serverURLs())
	}

	// The lists the agent uses.
	u, g, paired := replicaLists(Config{Server: "https://lb.example"}, back)
	if len(u) != 3 || u[2] != "https://lb.example" || len(g) != 2 || paired {
		t.Fatalf("configured server outside the lists: %v %v %v", u, g, paired)
	}
	u, _, paired = replicaLists(Config{Server: srv.URL() + "/"}, back)
	if len(u) != 2 || !paired {
		t.Fatalf("configured server among the lists: %v %v", u, paired)
	}
	old := &Identity{Server: "https://old.example", GRPCAddr: "old.example:8444"}
	if u, g, paired := replicaLists(Config{Server: "https://new.example"}, old); strings.Join(u, ",") != "https://new.example" || g[0] != "old.example:8444" || !paired {
		t.Fatalf("an identity from before replicas: %v %v %v", u, g, paired)
	}
	over := Config{ServerURLs: []string{"https://x.example", "https://y.example"}, GRPCAddrs: []string{"x.example:1"}}
	if u, g, paired := replicaLists(over, back); strings.Join(u, ",") != "https://x.example,https://y.example" || len(g) != 1 || paired {
		t.Fatalf("agent.yaml override: %v %v %v", u, g, paired)
	}
}

// agent.yaml's server_urls and grpc_addrs are validated with field paths.
func TestConfigReplicaLists(t *testing.T) {
	cfg := DefaultConfig()
	cfg.ServerURLs = []string{"https://a.example", "ftp://b", "https://A.example/"}
	cfg.GRPCAddrs = []string{"a:1", "nope"}
	err := cfg.Validate()
	for _, f := range []string{"server_urls[1]", "server_urls[2]", "grpc_addrs[1]"} {
		if err == nil || !strings.Contains(err.Error(), f) {
			t.Errorf("no problem for %s: %v", f, err)
		}
	}
	if err != nil && (strings.Contains(err.Error(), "server_urls[0]: ") || strings.Contains(err.Error(), "grpc_addrs[0]: ")) {
		t.Errorf("a good entry refused: %v", err)
	}
	cfg = DefaultConfig()
	cfg.ServerURLs = make([]string, api.MaxReplicaAddrs+1)
	for i := range cfg.ServerURLs {
		cfg.ServerURLs[i] = fmt.Sprintf("https://r%d.example", i)
	}
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "server_urls") {
		t.Errorf("%d URLs accepted: %v", len(cfg.ServerURLs), err)
	}
	env, err := LoadConfig("", false, []string{"DROVER_SERVER_URLS=https://a.example,https://b.example"})
	if err != nil || len(env.ServerURLs) != 2 {
		t.Fatalf("DROVER_SERVER_URLS: %v %v", env.ServerURLs, err)
	}
}
