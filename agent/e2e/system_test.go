package e2e

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"github.com/drover/drover/api"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/drover/drover/agent/internal/sdtest"
	"github.com/drover/drover/internal/testkit"
	"github.com/drover/drover/packaging/boottest"
	"github.com/drover/drover/units"
)

// Dynamic users get uids in this range (systemd.exec(5), DynamicUser=).
const dynUIDMin, dynUIDMax = 61184, 65519

// secretScript prints who runs the pipe and the secret, from the
// environment and from the credential file.
const secretScript = `echo "uid=$(id -u) user=$(id -un 2>/dev/null)"
echo "secret-env=$E2E_SECRET"
echo "cred=$(cat "$CREDENTIALS_DIRECTORY/E2E_SECRET")"
`

// TestSystemScopeBooted runs the main scenario once in system scope on a
// booted Debian bookworm (packaging/boottest; skipped when the machine
// cannot boot one, failed instead when CI=true): drover-server on the host,
// drover-agent inside as root under the shipped drover-agent.service
// (Type=notify), enrolled from /etc/drover/enroll.token. The pipes go to
// /etc/systemd/system; list-timers shows the evaluator's next elapse and
// `systemctl show` the default hardening profile and a dynamic user; RunNow,
// Cancel, a timeout, a scheduled run, schedule edits with no extra run (the
// system manager's timer stamps), drift and removal work as in user scope.
// A secret set through the API reaches the runs (RunNow and scheduled) as a
// LoadCredential= file and in the environment, they run as a dynamic user,
// and the server stores their logs with the value masked as ***.
func TestSystemScopeBooted(t *testing.T) {
	t.Parallel()
	c := boottest.Boot(t, boottest.Options{})
	srv := startServer(t)
	tags := map[string]string{"e2e": "system"}
	startAgentInContainer(t, c, srv, tags)
	inside := func(args ...string) (string, string, error) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		return c.Output(ctx, args...)
	}
	h := &pipeHost{
		unitDir:   "/etc/systemd/system",
		readFile:  func(p string) ([]byte, error) { return os.ReadFile(c.HostPath(p)) },
		writeFile: func(p string, b []byte) error { return os.WriteFile(c.HostPath(p), b, 0o644) },
		timers: func() map[string]sdtest.Timer {
			out, _, err := inside("systemctl", "list-timers", "--all", "--output=json")
			if err != nil {
				t.Fatalf("list-timers in the container: %v", err)
			}
			timers, err := sdtest.ParseListTimers([]byte(out))
			if err != nil {
				t.Fatalf("list-timers: %v\n%s", err, out)
			}
			return timers
		},
		show: func(unit, prop string) string {
			return strings.TrimSpace(c.Exec(t, "systemctl", "show", "-P", prop, unit))
		},
		sync: func() string {
			stdout, stderr, err := inside("drover-agent", "sync", "--timeout", "60s")
			return syncOutcome(t, stdout, stderr, err)
		},
		alive: func(pid int) bool {
			p := strconv.Itoa(pid)
			_, _, err := inside("/bin/sh", "-c", "kill -0 "+p+" && ! grep -q '^State:.*Z' /proc/"+p+"/status")
			return err == nil
		},
	}

	id := srv.waitSoleAgentOnline("the agent in the container to enroll and connect")
	if _, err := h.readFile("/etc/drover/enroll.token"); !os.IsNotExist(err) {
		t.Fatalf("the token file is still there after enrollment (%v)", err)
	}
	var v api.Agent
	testkit.WaitFor(t, 30*time.Second, "the agent's Hello in the server's view", func() bool {
		v = srv.agentView(id)
		return v.Scope != "" || v.Backend != ""
	})
	if v.Scope != "system" || v.Backend != "systemd" {
		t.Fatalf("the agent reports scope %q, backend %q", v.Scope, v.Backend)
	}

	secret := "s3cr3t-" + randomHex(8)
	srv.api("PUT", "/api/v1/secrets/E2E_SECRET", map[string]string{"value": secret}, nil)
	// The scripts write pids into their StateDirectory=, the one place a
	// dynamic user under ProtectSystem=strict may write that outlives the
	// run's private /tmp; the test reads them through /var/lib/private.
	specs := mainSpecs(tags, `"$STATE_DIRECTORY/pids"`, `"$STATE_DIRECTORY/pids"`)
	for _, name := range []string{"tick", "api"} {
		sp := specs[name]
		sp.Script += secretScript
		sp.Secrets = []string{"E2E_SECRET"}
		specs[name] = sp
	}
	for _, name := range []string{"tick", "api", "slow", "tmo"} {
		srv.putPipe(name, specs[name])
	}
	testkit.WaitFor(t, 60*time.Second, "the pipes' timers in the container", func() bool {
		timers := h.timers()
		for name := range specs {
			if timers[units.TimerName(name)].Next.IsZero() {
				return false // not there, or loaded but not started yet
			}
		}
		return true
	})
	checkTimers(t, h, specs)

	// The default hardening profile and a dynamic user, as systemd sees
	// them, and the secret as a credential.
	svc := units.ServiceName("tick")
	props := map[string]string{}
	for _, l := range strings.Split(c.Exec(t, "systemctl", "show", "-p", "DynamicUser,ProtectSystem,ProtectHome,PrivateTmp,NoNewPrivileges", svc), "\n") {
		if k, v, ok := strings.Cut(l, "="); ok {
			props[k] = v
		}
	}
	for k, want := range map[string]string{"DynamicUser": "yes", "ProtectSystem": "strict", "ProtectHome": "read-only", "PrivateTmp": "yes", "NoNewPrivileges": "yes"} {
		if props[k] != want {
			t.Errorf("%s: %s=%q, want %q", svc, k, props[k], want)
		}
	}
	// systemd 252's `show` prints LoadCredential= as "[unprintable]": read
	// the unit as the manager loaded it.
	const cred = "LoadCredential=E2E_SECRET:/var/lib/drover/secrets/tick/E2E_SECRET"
	if unit := c.Exec(t, "systemctl", "cat", svc); !strings.Contains(unit, "\n"+cred+"\n") || strings.Contains(unit, secret) {
		t.Errorf("%s does not load the secret as a credential (or shows its value):\n%s", svc, unit)
	}
	t.Logf("%s: %v, %s", svc, props, cred)

	checkSecretRun := func(r api.Run) {
		t.Helper()
		log := srv.logText(r.ID)
		if strings.Contains(log, secret) {
			t.Fatalf("the secret's value is in the log the server stored: %q", log)
		}
		for _, want := range []string{"secret-env=***\n", "cred=***\n"} {
			if !strings.Contains(log, want) {
				t.Fatalf("the log the server stored lacks %q: %q", want, log)
			}
		}
		// The minbase root has no nss-systemd, so `id -un` cannot name the
		// dynamic user: the uid range tells.
		m := regexp.MustCompile(`uid=(\d+)`).FindStringSubmatch(log)
		if m == nil {
			t.Fatalf("no uid in the log: %q", log)
		}
		uid, _ := strconv.Atoi(m[1])
		if uid < dynUIDMin || uid > dynUIDMax {
			t.Fatalf("the pipe ran as uid %d, not a dynamic user", uid)
		}
		t.Logf("%s run %s: dynamic uid %d, stored log %q", r.Trigger, r.ID, uid, log)
	}

	checkSecretRun(proveRunNow(t, srv, id))
	proveCancel(t, srv, h, id, "/var/lib/private/drover-runs/slow/pids")
	proveTimeout(t, srv, h, id, "/var/lib/private/drover-runs/tmo/pids")
	checkSecretRun(firstScheduledRun(t, srv, id))
	proveScheduleEdits(t, srv, h, id, specs["tick"], func() { proveDrift(t, srv, h, id) })
	if j := c.Exec(t, "journalctl", "--no-pager", "-o", "cat", "-u", svc); !strings.Contains(j, "tick at ") {
		t.Errorf("journalctl -u %s does not show the runs' output:\n%s", svc, j)
	} else if strings.Contains(j, secret) {
		t.Logf("note: journalctl -u %s shows the secret's value (only the shipped log is masked)", svc)
	}
	removePipes(t, srv, h, specs)
}

func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// startAgentInContainer installs the agent binary and its packaged unit in
// the booted container, configures it for system scope against srv with a
// token carrying tags, and starts it; on failure the test logs the
// container's journal of the agent and its pipes.
func startAgentInContainer(t *testing.T, c *boottest.Container, srv *serverProc, tags map[string]string) {
	t.Helper()
	root, err := testkit.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	c.CopyIn(t, agentBin(), "/usr/bin/drover-agent")
	c.CopyIn(t, filepath.Join(root, "packaging", "systemd", "drover-agent.service"), "/etc/systemd/system/drover-agent.service")
	c.WriteFile(t, "/etc/drover/agent.yaml", fmt.Appendf(nil, "server: %s\nbackend: systemd\nscope: system\nsync_interval: 10s\nheartbeat_interval: 5s\nmax_backoff: 2s\nlog_format: json\n", srv.base), 0o644)
	c.WriteFile(t, "/etc/drover/enroll.token", []byte(srv.token(tags)+"\n"), 0o600)
	c.Exec(t, "systemctl", "daemon-reload")
	c.Exec(t, "systemctl", "start", "drover-agent.service")
	c.LogJournalOnFailure(t, 80, "drover-agent", "drover-pipe-*")
}
