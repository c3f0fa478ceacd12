package server

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/drover/drover/api"
	"github.com/drover/drover/internal/testkit"

	"github.com/drover/drover/packaging/boottest"
)

// TestInternalAgentSystemdJobsCannotReadDataDirBooted is the proof for the
// escalation through the internal agent on a host with systemd: a root
// `drover-server --internal-agent` in a booted Debian (PID-1 systemd, so its
// internal agent takes the systemd backend in system scope, not cron) runs
// an admin's pipe that targets the internal agent and tries to read the
// server's admin.token and CA key and list its data dir. The job runs as a
// dynamic user (DynamicUser=yes, uid 61184–65519), every read is refused
// with "Permission denied", and neither secret shows in the run's log.
func TestInternalAgentSystemdJobsCannotReadDataDirBooted(t *testing.T) {
	if testing.Short() {
		t.Skip("boots a container and builds the binaries")
	}
	c := boottest.Boot(t, boottest.Options{}) // the host's loopback: the test reaches the server inside

	// The shipped binaries, static, so they run inside the container.
	bin := testkit.Binaries(t, "grpcnotrace", "drover-server", "drover-agent")
	c.CopyIn(t, filepath.Join(bin, "drover-server"), "/usr/bin/drover-server")
	c.CopyIn(t, filepath.Join(bin, "drover-agent"), "/usr/bin/drover-agent")

	const dataDir = "/var/lib/drover-server"
	httpPort, grpcPort := testkit.FreePort(t), testkit.FreePort(t)
	c.Exec(t, "systemd-run", "--unit=drover-server-ia.service", "--property=Restart=no",
		"/usr/bin/drover-server", "--internal-agent", "--data-dir", dataDir,
		"--http-addr", net.JoinHostPort("127.0.0.1", strconv.Itoa(httpPort)),
		"--grpc-addr", net.JoinHostPort("127.0.0.1", strconv.Itoa(grpcPort)))
	c.LogJournalOnFailure(t, 150, "drover-server-ia", "drover-pipe-*")

	// admin.token and the CA certificate, read as root inside the container.
	var admin, caPEM string
	testkit.WaitFor(t, 60*time.Second, "the server in the container to write admin.token", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		tok, _, err1 := c.Output(ctx, "cat", dataDir+"/admin.token")
		ca, _, err2 := c.Output(ctx, "cat", dataDir+"/ca.crt")
		admin, caPEM = strings.TrimSpace(tok), ca
		return err1 == nil && err2 == nil && admin != "" && strings.Contains(caPEM, "END CERTIFICATE")
	})
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM([]byte(caPEM)) {
		t.Fatalf("ca.crt: no certificate:\n%s", caPEM)
	}
	bapi := &bootAPI{t: t, APIClient: testkit.APIClient{Token: admin, Base: "https://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(httpPort)),
		Accept: "application/json", HTTP: &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}}}

	if got := strings.TrimSpace(c.Exec(t, "stat", "-c", "%a %U:%G", dataDir)); got != "700 root:root" {
		t.Fatalf("%s is %s, want 700 root:root", dataDir, got)
	}

	var ag api.Agent
	testkit.WaitFor(t, 90*time.Second, "the internal agent to come online", func() bool {
		var list api.AgentList
		if bapi.call("GET", "/api/v1/agents", nil, &list) != http.StatusOK {
			return false
		}
		for _, a := range list.Agents {
			if a.Tags[internalAgentTag] == "true" && a.Online && a.Backend != "" {
				ag = a
				return true
			}
		}
		return false
	})
	if ag.Backend != "systemd" || ag.Scope != "system" {
		t.Fatalf("the internal agent runs backend %q scope %q, want systemd in system scope", ag.Backend, ag.Scope)
	}

	script := "id -u\nrc=0\ncat " + dataDir + "/admin.token || rc=1\ncat " + dataDir + "/ca.key || rc=1\nls " + dataDir + " || rc=1\nexit $rc\n"
	if code := bapi.call("PUT", "/api/v1/pipes/steal", map[string]any{"spec": map[string]any{"schedule": "@yearly", "script": script,
		"targets": map[string]any{"tags": map[string]string{internalAgentTag: "true"}}}}, nil); code != http.StatusOK && code != http.StatusCreated {
		t.Fatalf("PUT the pipe as admin: %d", code)
	}
	const unit = "drover-pipe-steal.service"
	testkit.WaitFor(t, 90*time.Second, "the internal agent to install "+unit, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		out, _, err := c.Output(ctx, "systemctl", "show", "-P", "DynamicUser", unit)
		return err == nil && strings.TrimSpace(out) == "yes"
	})
	t.Logf("%s:\n%s", unit, c.Exec(t, "systemctl", "cat", unit))

	var sent api.RunPipeResponse
	if code := bapi.call("POST", "/api/v1/pipes/steal/run", api.RunPipeRequest{Agent: ag.ID}, &sent); code != http.StatusOK && code != http.StatusAccepted {
		t.Fatalf("run now: %d", code)
	}
	if len(sent.Sent) != 1 || sent.Sent[0] != ag.ID {
		t.Fatalf("run now: sent to %v, offline %v", sent.Sent, sent.Offline)
	}
	var run api.Run
	testkit.WaitFor(t, 120*time.Second, "the run of request "+sent.RequestID+" to finish", func() bool {
		var list api.RunList
		if bapi.call("GET", "/api/v1/runs?request_id="+url.QueryEscape(sent.RequestID), nil, &list) != http.StatusOK {
			return false
		}
		for _, r := range list.Runs {
			if terminalStatus(r.Status) {
				run = r
				return true
			}
		}
		return false
	})
	var logs api.Logs
	if code := bapi.call("GET", "/api/v1/runs/"+url.PathEscape(run.ID)+"/logs", nil, &logs); code != http.StatusOK {
		t.Fatalf("logs of %s: %d", run.ID, code)
	}
	var b strings.Builder
	for _, ch := range logs.Chunks {
		b.Write(ch.Data)
	}
	log := b.String()
	t.Logf("run %s: %s (%s), log:\n%s", run.ID, run.Status, run.Reason, log)

	if strings.Contains(log, admin) || strings.Contains(log, "PRIVATE KEY") {
		t.Fatal("the internal agent's job read the server's secrets")
	}
	uid := -1
	for _, line := range strings.Split(log, "\n") {
		if n, err := strconv.Atoi(strings.TrimSpace(line)); err == nil {
			uid = n
			break
		}
	}
	if uid < 61184 || uid > 65519 {
		t.Fatalf("the job ran as uid %d, want a dynamic user (61184–65519)", uid)
	}
	if n := strings.Count(log, "Permission denied"); n < 3 || !strings.Contains(log, "cat: "+dataDir+"/admin.token: Permission denied") {
		t.Fatalf("want cat and ls of %s refused with Permission denied (%d seen)", dataDir, n)
	}
	if run.Status != api.StatusFailed {
		t.Fatalf("run %s, want failed (the reads were refused)", run.Status)
	}
}

// bootAPI talks to a server in a container over the shared loopback.
type bootAPI struct {
	t *testing.T
	testkit.APIClient
}

// call sends a JSON request and decodes a 2xx answer into out; it returns
// the status code (0 when the server did not answer).
func (a *bootAPI) call(method, path string, body, out any) int {
	a.t.Helper()
	code, b, err := a.Call(method, path, body)
	if err != nil {
		a.t.Logf("%s %s: %v", method, path, err)
		return 0
	}
	if code >= 300 {
		a.t.Logf("%s %s: %d %s: %s", method, path, code, http.StatusText(code), b)
		return code
	}
	if out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			a.t.Fatalf("%s %s: %v\n%s", method, path, err, fmt.Sprintf("%.2000s", b))
		}
	}
	return code
}
