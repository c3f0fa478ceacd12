package pkgtest

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/drover/drover/internal/testkit"
	"github.com/drover/drover/manifest"
	"github.com/drover/drover/packaging/boottest"
)

// e2eEnabled: the booted end-to-end test runs by default; DROVER_E2E_BOOT=0
// turns it off (e.g. while working on something else), =1 forces it.
func e2eEnabled() bool { return os.Getenv("DROVER_E2E_BOOT") != "0" }

// netnsDialer dials inside the network namespace of pid: the test reaches
// the server in a container booted with --private-network.
func netnsDialer(pid int) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		target, err := os.Open(fmt.Sprintf("/proc/%d/ns/net", pid))
		if err != nil {
			return nil, err
		}
		defer target.Close()
		runtime.LockOSThread()
		orig, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			runtime.UnlockOSThread()
			return nil, err
		}
		defer orig.Close()
		if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			return nil, err
		}
		// The socket is created in the namespace of this thread and keeps it.
		var d net.Dialer
		conn, dialErr := d.DialContext(ctx, network, addr)
		if err := unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET); err != nil {
			// Leave the thread locked: Go retires it with this goroutine.
			if conn != nil {
				conn.Close()
			}
			return nil, fmt.Errorf("restore network namespace: %w", err)
		}
		runtime.UnlockOSThread()
		return conn, dialErr
	}
}

// api talks to the server in the container as its administrator.
type api struct {
	t *testing.T
	testkit.APIClient
}

// do sends a JSON request and fails the test unless it is answered 2xx;
// it decodes the answer into out (a *string takes it as text).
func (a *api) do(method, path string, body any, out any) int {
	a.t.Helper()
	code, b, err := a.Call(method, path, body)
	if err != nil {
		a.t.Fatalf("%s %s: %v", method, path, err)
	}
	if code >= 300 {
		a.t.Fatalf("%s %s: %d %s\n%s", method, path, code, http.StatusText(code), b)
	}
	if out != nil {
		if s, ok := out.(*string); ok {
			*s = string(b)
		} else if err := json.Unmarshal(b, out); err != nil {
			a.t.Fatalf("%s %s: %v\n%s", method, path, err, b)
		}
	}
	return code
}

type runInfo struct {
	ID        string     `json:"id"`
	AgentID   string     `json:"agent_id"`
	Pipe      string     `json:"pipe"`
	Trigger   string     `json:"trigger"`
	Status    string     `json:"status"`
	StartedAt *time.Time `json:"started_at"`
}

func (a *api) runs(pipe string) []runInfo {
	var r struct {
		Runs []runInfo `json:"runs"`
	}
	a.do("GET", "/api/v1/runs?pipe="+pipe, nil, &r)
	return r.Runs
}

// agentStatus is the part of `drover-agent status --json` the test reads.
type agentStatus struct {
	Enrolled      bool   `json:"enrolled"`
	AgentID       string `json:"agent_id"`
	EnrollError   string `json:"enroll_error"`
	AppliedSerial uint64 `json:"applied_serial"`
	Pipes         []struct {
		Name    string    `json:"name"`
		NextRun time.Time `json:"next_run"`
	} `json:"pipes"`
}

func status(t *testing.T, c *boottest.Container) (agentStatus, error) {
	var st agentStatus
	out, errOut, err := c.Output(context.Background(), "drover-agent", "status", "--json")
	if err != nil {
		return st, fmt.Errorf("%v: %s", err, errOut)
	}
	// The answer may be the status itself or wrapped in {"status": ...}.
	var wrapped struct {
		Status *agentStatus `json:"status"`
	}
	if json.Unmarshal([]byte(out), &wrapped) == nil && wrapped.Status != nil {
		return *wrapped.Status, nil
	}
	err = json.Unmarshal([]byte(out), &st)
	return st, err
}

// TestBootedEndToEnd is the packages' end-to-end proof on a booted Debian
// bookworm: the server, droverctl and agent .debs installed in the
// container; a token from droverctl dropped into /etc/drover/enroll.token;
// the agent enrolls; list-timers shows the pipes with the evaluator's next
// elapse; a scheduled run's output is in journalctl -u and on the server; an upgrade to a
// higher version runs nothing unplanned and keeps the state; purge removes
// Drover's units and data and leaves an unrelated timer alone.
func TestBootedEndToEnd(t *testing.T) {
	if !e2eEnabled() {
		t.Skip("DROVER_E2E_BOOT=0")
	}
	t.Parallel()
	dir, ix := packages(t)
	updir, upix := upgradePackages(t)
	c := boottest.Boot(t, boottest.Options{PrivateNetwork: true})
	start := time.Now()
	step := func(format string, args ...any) {
		t.Logf("[%5.1fs] %s", time.Since(start).Seconds(), fmt.Sprintf(format, args...))
	}

	plantTimer(t, c, "unrelated", "")
	v1 := copyDebs(t, c, dir, func(p string) string { return ix.Path(dir, p, "amd64", "deb") }, "/root/v1")
	v2 := copyDebs(t, c, updir, func(p string) string { return upix.Path(updir, p, "amd64", "deb") }, "/root/v2")
	c.Exec(t, append([]string{"dpkg", "-i"}, v1...)...)
	step("installed drover-server, droverctl, drover-agent %s", ix.Version)

	if !testkit.Eventually(30*time.Second, func() bool {
		return exists(t, c, "/var/lib/drover-server/ca.crt") && exists(t, c, "/var/lib/drover-server/admin.token")
	}) {
		t.Fatalf("the server did not start:\n%s", c.Exec(t, "journalctl", "-u", "drover-server", "--no-pager", "-n", "60"))
	}
	adminToken := strings.TrimSpace(c.Exec(t, "cat", "/var/lib/drover-server/admin.token"))
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(c.ReadFile(t, "/var/lib/drover-server/ca.crt")) {
		t.Fatal("ca.crt holds no certificate")
	}
	srv := &api{t: t, APIClient: testkit.APIClient{Token: adminToken, Base: "https://127.0.0.1:8443", HTTP: &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{
		DialContext:     netnsDialer(c.PID),
		TLSClientConfig: &tls.Config{RootCAs: pool, ServerName: "127.0.0.1"},
	}}}}
	if !testkit.Eventually(20*time.Second, func() bool {
		req, _ := http.NewRequest("GET", "https://127.0.0.1:8443/healthz", nil)
		resp, err := srv.HTTP.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		return err == nil && resp.StatusCode == 200
	}) {
		t.Fatal("the server's /healthz does not answer in the container")
	}

	// The agent learns the server URL from agent.yaml (read at start); the
	// token is dropped while it runs and picked up by its watch.
	c.Exec(t, "sed", "-i", "s|^#server: .*|server: https://127.0.0.1:8443|", "/etc/drover/agent.yaml")
	c.Exec(t, "systemctl", "restart", "drover-agent")
	token := createToken(t, c, adminToken)
	step("token created")
	c.WriteFile(t, "/etc/drover/enroll.token", []byte(token+"\n"), 0o600)
	var st agentStatus
	if !testkit.Eventually(60*time.Second, func() bool {
		s, err := status(t, c)
		st = s
		return err == nil && s.Enrolled && !exists(t, c, "/etc/drover/enroll.token")
	}) {
		t.Fatalf("the agent did not enroll (status %+v):\n%s", st, c.Exec(t, "journalctl", "-u", "drover-agent", "--no-pager", "-n", "60"))
	}
	step("agent enrolled as %s; the token file is gone", st.AgentID)

	// Two pipes: one every minute (for a run), one daily (for the upgrade:
	// it must not run at all).
	put := func(name, schedule, script string) {
		spec := map[string]any{
			"name": name, "description": "e2e pipe " + name, "schedule": schedule, "timezone": "UTC",
			"script": script, "catchup": "once", "targets": map[string]any{"agents": []string{st.AgentID}},
		}
		srv.do("PUT", "/api/v1/pipes/"+name, map[string]any{"spec": spec}, nil)
	}
	put("e2e-minutely", "* * * * *", "echo hello-from-drover-e2e\necho \"answer $((6*7))\"\n")
	put("e2e-daily", "30 3 * * *", "echo the daily pipe ran\n")
	for _, p := range []string{"e2e-minutely", "e2e-daily"} {
		if !testkit.Eventually(60*time.Second, func() bool { return show(t, c, "drover-pipe-"+p+".timer", "ActiveState") == "active" }) {
			t.Fatalf("drover-pipe-%s.timer never became active:\n%s", p, c.Exec(t, "journalctl", "-u", "drover-agent", "--no-pager", "-n", "60"))
		}
	}
	step("both pipes installed as timers")

	// list-timers shows them with the evaluator's next elapse.
	timers := c.Exec(t, "systemctl", "list-timers", "--all", "--no-pager")
	for _, p := range []string{"e2e-minutely", "e2e-daily"} {
		if !strings.Contains(timers, "drover-pipe-"+p+".timer") {
			t.Errorf("list-timers lacks drover-pipe-%s.timer:\n%s", p, timers)
		}
		if got := show(t, c, "drover-pipe-"+p+".timer", "Description"); !strings.Contains(got, "e2e pipe "+p) {
			t.Errorf("drover-pipe-%s.timer description %q", p, got)
		}
	}
	checkNextElapse(t, c, "e2e-daily", "30 3 * * *")
	checkNextElapse(t, c, "e2e-minutely", "* * * * *")
	step("list-timers:\n%s", timers)

	// A scheduled run: its output in the journal and on the server.
	var run runInfo
	if !testkit.Eventually(100*time.Second, func() bool {
		for _, r := range srv.runs("e2e-minutely") {
			if r.Status == "succeeded" {
				run = r
				return true
			}
		}
		return false
	}) {
		t.Fatalf("no successful run of e2e-minutely reached the server:\n%s\n%s",
			c.Exec(t, "journalctl", "-u", "drover-pipe-e2e-minutely", "--no-pager", "-n", "40"),
			c.Exec(t, "journalctl", "-u", "drover-agent", "--no-pager", "-n", "40"))
	}
	if run.Trigger != "schedule" {
		t.Errorf("run trigger %q, want schedule", run.Trigger)
	}
	var logs string
	srv.do("GET", "/api/v1/runs/"+run.ID+"/logs", nil, &logs)
	if !strings.Contains(logs, "hello-from-drover-e2e") || !strings.Contains(logs, "answer 42") {
		t.Errorf("server-side log of run %s: %q", run.ID, logs)
	}
	journal := c.Exec(t, "journalctl", "-u", "drover-pipe-e2e-minutely", "--no-pager", "-o", "cat")
	if !strings.Contains(journal, "hello-from-drover-e2e") {
		t.Errorf("journalctl -u drover-pipe-e2e-minutely:\n%s", journal)
	}
	// systemctl status exits 3 for an inactive unit: a oneshot pipe between runs.
	if got, _, _ := c.Output(context.Background(), "systemctl", "status", "--no-pager", "drover-pipe-e2e-minutely.service"); !strings.Contains(got, "e2e pipe e2e-minutely") || !strings.Contains(got, "hello-from-drover-e2e") {
		t.Errorf("systemctl status:\n%s", got)
	}
	step("run %s succeeded; its output is in the journal and on the server", run.ID)

	// ---- upgrade: the daily pipe's timer gets an old stamp first, so a
	// restart of it would fire it at once (catch-up).
	c.Exec(t, "touch", "-d", "2 days ago", "/var/lib/systemd/timers/stamp-drover-pipe-e2e-daily.timer")
	dailyNext := show(t, c, "drover-pipe-e2e-daily.timer", "NextElapseUSecRealtime")
	agentInv := show(t, c, "drover-agent.service", "InvocationID")
	identity := c.Exec(t, "sha256sum", "/var/lib/drover/agent.pem")
	c.Exec(t, append([]string{"dpkg", "-i"}, v2...)...)
	step("upgraded to %s", upix.Version)
	if show(t, c, "drover-agent.service", "InvocationID") == agentInv {
		t.Error("the upgrade did not restart the agent")
	}
	if !testkit.Eventually(30*time.Second, func() bool { s, err := status(t, c); return err == nil && s.Enrolled && s.AgentID == st.AgentID }) {
		t.Errorf("after the upgrade the agent is not the same enrolled agent")
	}
	if c.Exec(t, "sha256sum", "/var/lib/drover/agent.pem") != identity {
		t.Error("the upgrade changed the agent's identity")
	}
	time.Sleep(5 * time.Second) // time for a restarted agent to (wrongly) fire something
	if got := show(t, c, "drover-pipe-e2e-daily.timer", "NextElapseUSecRealtime"); got != dailyNext {
		t.Errorf("the upgrade moved the daily timer: %s -> %s", dailyNext, got)
	}
	if rs := srv.runs("e2e-daily"); len(rs) > 0 {
		t.Errorf("unplanned runs of the daily pipe: %+v", rs)
	}
	if got := show(t, c, "drover-pipe-e2e-daily.service", "InvocationID"); got != "" {
		t.Errorf("drover-pipe-e2e-daily.service was started (invocation %s)", got)
	}
	// Every run of the minutely pipe started on a minute (no catch-up run in between).
	for _, r := range srv.runs("e2e-minutely") {
		if r.Trigger != "schedule" {
			t.Errorf("run %s of e2e-minutely has trigger %s", r.ID, r.Trigger)
		}
		if r.StartedAt != nil && r.StartedAt.Second() > 3 {
			t.Errorf("run %s of e2e-minutely started at %s, not on a minute", r.ID, r.StartedAt)
		}
	}
	step("no unplanned run; identity and state kept")

	// ---- purge: Drover's units and data go, the unrelated timer stays.
	c.Exec(t, "dpkg", "-P", "drover-agent")
	left := c.Exec(t, "sh", "-c", "ls /etc/systemd/system | grep '^drover-pipe-' || true")
	if strings.TrimSpace(left) != "" {
		t.Errorf("purge left units: %s", left)
	}
	for _, f := range []string{"/var/lib/drover", "/etc/drover"} {
		if exists(t, c, f) {
			t.Errorf("purge left %s", f)
		}
	}
	timers = c.Exec(t, "systemctl", "list-timers", "--all", "--no-pager")
	if strings.Contains(timers, "drover-pipe-") || !strings.Contains(timers, "unrelated.timer") || show(t, c, "unrelated.timer", "ActiveState") != "active" {
		t.Errorf("list-timers after purge:\n%s", timers)
	}
	step("purged; list-timers:\n%s", timers)
}

// createToken makes an enrollment token with droverctl (the operator's
// way), falling back to the server's offline command while
// droverctl has no `tokens create`.
func createToken(t *testing.T, c *boottest.Container, adminToken string) string {
	t.Helper()
	ctx := context.Background()
	if _, _, err := c.Output(ctx, "droverctl", "tokens", "create", "--help"); err == nil {
		out, errOut, err := c.Output(ctx, "env", "DROVER_SERVER=https://127.0.0.1:8443", "DROVER_TOKEN="+adminToken,
			"DROVER_CA=/var/lib/drover-server/ca.crt", "droverctl", "tokens", "create", "--ttl", "10m", "-o", "json")
		if err != nil {
			t.Fatalf("droverctl tokens create: %v\n%s%s", err, out, errOut)
		}
		var tok struct {
			Token string `json:"token"`
		}
		if err := json.Unmarshal([]byte(out), &tok); err != nil || !strings.HasPrefix(tok.Token, "drv1.") {
			t.Fatalf("droverctl tokens create -o json printed %q", out)
		}
		return tok.Token
	}
	t.Log("droverctl has no `tokens create` yet: the token comes from `drover-server tokens create` (as the user drover)")
	out := strings.TrimSpace(c.Exec(t, "runuser", "-u", "drover", "--", "drover-server", "tokens", "create", "--ttl", "10m"))
	if !strings.HasPrefix(out, "drv1.") {
		t.Fatalf("drover-server tokens create printed %q", out)
	}
	return out
}

// checkNextElapse compares the timer's next elapse with the evaluator's.
func checkNextElapse(t *testing.T, c *boottest.Container, pipe, cron string) {
	t.Helper()
	unit := "drover-pipe-" + pipe + ".timer"
	sched, err := manifest.ParseSchedule(cron)
	if err != nil {
		t.Fatal(err)
	}
	for attempt := 0; ; attempt++ {
		now := time.Now()
		raw := strings.TrimSpace(c.Exec(t, "env", "TZ=UTC", "systemctl", "show", "-p", "NextElapseUSecRealtime", "--value", unit))
		got, err := time.Parse("Mon 2006-01-02 15:04:05 MST", raw)
		if err != nil {
			t.Fatalf("%s NextElapseUSecRealtime %q: %v", unit, raw, err)
		}
		want := sched.Next(now, time.UTC)
		if got.Equal(want) {
			t.Logf("%s: next elapse %s, as the evaluator predicts", unit, got.UTC().Format(time.RFC3339))
			return
		}
		// A minutely timer may elapse between the two readings.
		if attempt < 2 && got.Before(want) && want.Sub(got) <= time.Minute {
			time.Sleep(2 * time.Second)
			continue
		}
		t.Errorf("%s: next elapse %s, the evaluator says %s", unit, got.UTC(), want.UTC())
		return
	}
}
