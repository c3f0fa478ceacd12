package server

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/drover/drover/api"
	"github.com/drover/drover/internal/testkit"
	"github.com/drover/drover/server/notify"

	agentpb "github.com/drover/drover/proto"
)

// fastNotify makes deliveries quick to retry in tests.
func fastNotify(cfg *Config) {
	cfg.Notify.Poll = 200 * time.Millisecond
	cfg.Notify.RetryMin = time.Second
	cfg.Notify.RetryMax = 8 * time.Second
}

// liveAgent enrolls an agent holding pipes and opens its stream.
func (ts *testServer) liveAgent(pipes ...string) (*testAgent, *testStream) {
	ts.t.Helper()
	tags := map[string]string{"env": "prod"}
	for _, p := range pipes {
		ts.putMonPipe(p, tags, map[string]any{"schedule": "@daily"})
	}
	a := ts.enrollAgent(tags)
	st, err := a.openStream("")
	if err != nil {
		ts.t.Fatal(err)
	}
	ts.t.Cleanup(st.close)
	return a, st
}

// runOf is a finished run of pipe with status st.
func runOf(id, pipe string, st agentpb.RunStatus) []*agentpb.AgentMessage {
	return []*agentpb.AgentMessage{started(id, pipe, time.Now()), finished(id, pipe, st, "")}
}

const (
	runFailed    = agentpb.RunStatus_RUN_STATUS_FAILED
	runSucceeded = agentpb.RunStatus_RUN_STATUS_SUCCEEDED
)

// startAlertmanager starts Debian's prometheus-alertmanager on a free
// 127.0.0.1 port with a temporary config and storage, and returns its URL.
func startAlertmanager(t *testing.T) string {
	bin := testkit.RequireCommand(t, "prometheus-alertmanager", "Debian package prometheus-alertmanager")
	dir := t.TempDir()
	cfg := filepath.Join(dir, "alertmanager.yml")
	if err := os.WriteFile(cfg, []byte("route:\n  receiver: none\nreceivers:\n  - name: none\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	addr := fmt.Sprintf("127.0.0.1:%d", testkit.FreePort(t))
	cmd := exec.Command(bin, "--config.file="+cfg, "--storage.path="+filepath.Join(dir, "data"), "--web.listen-address="+addr, "--cluster.listen-address=")
	cmd.Stdout, cmd.Stderr = io.Discard, io.Discard
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	base := "http://" + addr
	testkit.WaitFor(t, 30*time.Second, "alertmanager to be ready", func() bool {
		resp, err := http.Get(base + "/-/ready")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == 200
	})
	return base
}

type amAlert struct {
	Labels      map[string]string `json:"labels"`
	Annotations map[string]string `json:"annotations"`
	EndsAt      time.Time         `json:"endsAt"`
	Status      struct {
		State string `json:"state"`
	} `json:"status"`
}

func amAlerts(t *testing.T, base string) []amAlert {
	resp, err := http.Get(base + "/api/v2/alerts")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out []amAlert
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		t.Fatal(err)
	}
	return out
}

// A real Alertmanager receives the alert of a failing pipe once (however
// often it fails), with the labels alertname, pipe, agent and severity, and
// its resolution when the pipe succeeds again: both seen through
// Alertmanager's own API. The channel test endpoint reaches it too.
func TestNotifyAlertmanager(t *testing.T) {
	am := startAlertmanager(t)
	ts := startServer(t, fastNotify)
	ts.adminOK("PUT", "/api/v1/notify/channels/am", api.NotifyChannel{Kind: "alertmanager", URL: am}, nil)
	ts.adminOK("PUT", "/api/v1/notify/rules/failures", api.NotifyRule{Kinds: []string{"run.failed", "run.missed"}, Pipes: []string{"backup"}, Channels: []string{"am"}, Severity: "critical"}, nil)
	a, st := ts.liveAgent("backup", "other")

	var msgs []*agentpb.AgentMessage
	for i := range 3 { // failing every time: one alert
		msgs = append(msgs, runOf(fmt.Sprintf("fail-%d", i), "backup", runFailed)...)
	}
	msgs = append(msgs, runOf("other-fail", "other", runFailed)...) // not the rule's pipe
	seq := sendAll(t, st, 1, msgs...)
	var firing amAlert
	testkit.WaitFor(t, 30*time.Second, "the alert in Alertmanager", func() bool {
		as := amAlerts(t, am)
		if len(as) == 1 {
			firing = as[0]
		}
		return len(as) == 1
	})
	want := map[string]string{"alertname": "DroverRunFailed", "pipe": "backup", "agent": a.id, "severity": "critical"}
	for k, v := range want {
		if firing.Labels[k] != v {
			t.Errorf("alert label %s=%q, want %q (%+v)", k, firing.Labels[k], v, firing)
		}
	}
	if firing.Status.State != "active" || firing.Annotations["run_id"] != "fail-0" {
		t.Errorf("firing alert %+v", firing)
	}

	sendAll(t, st, seq, runOf("ok-1", "backup", runSucceeded)...)
	testkit.WaitFor(t, 30*time.Second, "the alert to resolve in Alertmanager", func() bool { return len(amAlerts(t, am)) == 0 })
	// Alertmanager has the resolution before the deliverer records it as
	// delivered: wait for the record, then check it.
	var status api.ChannelStatusList
	testkit.Eventually(10*time.Second, func() bool {
		ts.adminOK("GET", "/api/v1/notify/status", nil, &status)
		return len(status.Channels) == 1 && status.Channels[0].Pending == 0
	})
	if len(status.Channels) != 1 || status.Channels[0].Delivered != 2 || status.Channels[0].Pending != 0 {
		t.Errorf("status: %+v (want 2 delivered: the alert and its resolution)", status)
	}

	var tr api.NotifyTestResponse
	ts.adminOK("POST", "/api/v1/notify/channels/am/test", nil, &tr)
	if !tr.OK {
		t.Fatalf("test: %+v", tr)
	}
	testkit.WaitFor(t, 10*time.Second, "the test alert", func() bool {
		as := amAlerts(t, am)
		return len(as) == 1 && as[0].Labels["alertname"] == "DroverTest"
	})
}

// receiver is a webhook receiver on 127.0.0.1 that checks signatures and
// counts every notification by id.
type receiver struct {
	secret string
	mu     sync.Mutex
	order  []string
	seen   map[string]int
	bodies map[string]notify.Notification
	bad    int
}

func (rc *receiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	m := hmac.New(sha256.New, []byte(rc.secret))
	m.Write(body)
	want := "sha256=" + hex.EncodeToString(m.Sum(nil))
	rc.mu.Lock()
	defer rc.mu.Unlock()
	if !hmac.Equal([]byte(r.Header.Get("X-Drover-Signature")), []byte(want)) {
		rc.bad++
		http.Error(w, "bad signature", http.StatusUnauthorized)
		return
	}
	var n notify.Notification
	if err := json.Unmarshal(body, &n); err != nil {
		rc.bad++
		http.Error(w, "bad body", http.StatusBadRequest)
		return
	}
	if rc.seen[n.ID] == 0 {
		rc.order = append(rc.order, n.Pipe+" "+n.State)
	}
	rc.seen[n.ID]++
	rc.bodies[n.ID] = n
}

func (rc *receiver) count() int {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return len(rc.seen)
}

// A webhook receiver that is down for two minutes, while the server
// restarts, then comes back, gets every notification exactly once, in
// order, each signed (X-Drover-Signature: sha256=HMAC of the body); the
// secret is never answered; delivery status shows the errors meanwhile.
func TestNotifyWebhookOutageAndRestart(t *testing.T) {
	if testing.Short() {
		t.Skip("two-minute outage")
	}
	begin := time.Now()
	port := testkit.FreePort(t)
	url := fmt.Sprintf("http://127.0.0.1:%d/hook", port)
	secret := "s3cret-s3cret-s3cret-s3cret"
	dir := t.TempDir()
	ts := startServer(t, fastNotify, func(c *Config) { c.DataDir = dir })

	// The API: validation with field paths, the secret write-only, audit.
	r := ts.do("PUT", "/api/v1/notify/channels/hook", ts.admin, api.NotifyChannel{Kind: "webhook", URL: "ftp://x"})
	if r.code != 422 || !strings.Contains(string(r.body), `"field":"url"`) || !strings.Contains(string(r.body), `"field":"secret"`) {
		t.Fatalf("invalid channel: %d %s", r.code, r.body)
	}
	ts.adminOK("PUT", "/api/v1/notify/channels/hook", api.NotifyChannel{Kind: "webhook", URL: url, Secret: &secret}, nil)
	ts.adminOK("PUT", "/api/v1/notify/rules/all", api.NotifyRule{Kinds: []string{"run.failed"}, Tags: map[string]string{"env": "prod"}, Channels: []string{"hook"}}, nil)
	for _, p := range []string{"/api/v1/notify/channels/hook", "/api/v1/notify/channels"} {
		if r := ts.adminOK("GET", p, nil, nil); strings.Contains(string(r.body), secret) || !strings.Contains(string(r.body), `"has_secret":true`) {
			t.Fatalf("GET %s shows the secret or not that it is set: %s", p, r.body)
		}
	}
	if r := ts.do("DELETE", "/api/v1/notify/channels/hook", ts.admin, nil); r.code != 409 {
		t.Fatalf("deleting a channel a rule uses: %d %s", r.code, r.body)
	}
	if r := ts.adminOK("GET", "/api/v1/audit?action=notify.channels.write", nil, nil); !strings.Contains(string(r.body), "channel/hook") {
		t.Fatalf("audit: %s", r.body)
	}

	agent, st := ts.liveAgent("p1", "p2", "p3")
	seq := sendAll(t, st, 1, append(append(append(runOf("a1", "p1", runFailed), runOf("a2", "p1", runFailed)...),
		runOf("b1", "p2", runFailed)...), runOf("a3", "p1", runSucceeded)...)...)
	testkit.WaitFor(t, 30*time.Second, "failed attempts in the channel's status", func() bool {
		var s api.ChannelStatusList
		ts.adminOK("GET", "/api/v1/notify/status", nil, &s)
		return len(s.Channels) == 1 && s.Channels[0].Pending == 3 && s.Channels[0].LastError != ""
	})

	// The server restarts while the receiver is down.
	time.Sleep(time.Until(begin.Add(50 * time.Second)))
	st.close()
	ts.stop()
	ts2 := startServer(t, fastNotify, func(c *Config) { c.DataDir = dir })
	st2, err := agent.openStream(ts2.s.GRPCAddr())
	if err != nil {
		t.Fatal(err)
	}
	defer st2.close()
	sendAll(t, st2, seq, append(runOf("b2", "p2", runSucceeded), runOf("c1", "p3", runFailed)...)...)

	// The receiver comes back two minutes after the start.
	time.Sleep(time.Until(begin.Add(2 * time.Minute)))
	rc := &receiver{secret: secret, seen: map[string]int{}, bodies: map[string]notify.Notification{}}
	ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: rc}
	go srv.Serve(ln)
	defer srv.Close()
	testkit.WaitFor(t, 60*time.Second, "every notification", func() bool { return rc.count() >= 5 })
	time.Sleep(10 * time.Second) // past the longest backoff: nothing comes twice
	rc.mu.Lock()
	defer rc.mu.Unlock()
	if want := "p1 firing,p2 firing,p1 resolved,p2 resolved,p3 firing"; strings.Join(rc.order, ",") != want || rc.bad != 0 {
		t.Errorf("received %v (bad %d), want %s", rc.order, rc.bad, want)
	}
	for id, n := range rc.seen {
		if n != 1 {
			t.Errorf("notification %s received %d times", id, n)
		}
	}
	var s api.ChannelStatusList
	testkit.Eventually(10*time.Second, func() bool {
		ts2.adminOK("GET", "/api/v1/notify/status", nil, &s)
		return len(s.Channels) == 1 && s.Channels[0].Pending == 0
	})
	if c := s.Channels[0]; c.Delivered != 5 || c.Pending != 0 || c.Failed != 0 || c.LastDeliveredAt.IsZero() {
		t.Errorf("status after the outage: %+v", c)
	}
}

// notifyRoutes calls every notification route successfully (for
// TestAPIEndpoints): viewers read, admins write, each write audited.
func (ts *testServer) notifyRoutes(t *testing.T, audit func(action, target, actorID string, before, after bool) api.AuditEntry) {
	t.Helper()
	viewer, _ := ts.apiToken("notify-viewer", "viewer", "")
	hook := &http.Server{Handler: http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go hook.Serve(ln)
	defer hook.Close()
	secret := "s3cret-for-the-hook"
	ch := api.NotifyChannel{Kind: "webhook", URL: "http://" + ln.Addr().String() + "/hook", Secret: &secret}
	ts.as(viewer, 403, "PUT", "/api/v1/notify/channels/hook", ch, nil)
	ts.as(ts.admin, 200, "PUT", "/api/v1/notify/channels/hook", ch, nil)
	audit("notify.channels.write", "channel/hook", "", false, true)
	ts.as(viewer, 200, "GET", "/api/v1/notify/channels", nil, nil)
	if r := ts.as(viewer, 200, "GET", "/api/v1/notify/channels/hook", nil, nil); strings.Contains(string(r.body), secret) {
		t.Fatalf("a channel's secret in an answer: %s", r.body)
	}
	ts.as(ts.admin, 200, "PUT", "/api/v1/notify/rules/all", api.NotifyRule{Kinds: []string{"run.failed"}, Channels: []string{"hook"}}, nil)
	audit("notify.rules.write", "rule/all", "", false, true)
	ts.as(viewer, 200, "GET", "/api/v1/notify/rules", nil, nil)
	ts.as(viewer, 200, "GET", "/api/v1/notify/rules/all", nil, nil)
	var tr api.NotifyTestResponse
	ts.as(ts.admin, 200, "POST", "/api/v1/notify/channels/hook/test", nil, &tr)
	if !tr.OK {
		t.Fatalf("channel test: %+v", tr)
	}
	audit("notify.channels.test", "channel/hook", "", false, false)
	ts.as(viewer, 200, "GET", "/api/v1/notify/status", nil, nil)
	ts.as(ts.admin, 204, "DELETE", "/api/v1/notify/rules/all", nil, nil)
	audit("notify.rules.delete", "rule/all", "", true, false)
	ts.as(ts.admin, 204, "DELETE", "/api/v1/notify/channels/hook", nil, nil)
	audit("notify.channels.delete", "channel/hook", "", true, false)
}
