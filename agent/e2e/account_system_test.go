package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"github.com/drover/drover/api"
	"strings"
	"testing"
	"time"

	"github.com/drover/drover/agent"
	"github.com/drover/drover/internal/testkit"
	"github.com/drover/drover/packaging/boottest"
)

// TestSystemScopeUnknownUserBooted: on a booted Debian (system scope, the
// agent installed as the packages install it), a pipe whose run_as user
// does not exist (217/USER) ends as exactly one failed run on the server,
// with the reason `systemd: 217/USER` in the agent's record.
func TestSystemScopeUnknownUserBooted(t *testing.T) {
	t.Parallel()
	systemAccount(t, false)
}

// TestSystemScopeMemoryLimitBooted: a pipe with limits.memory_mb: 32 whose
// script allocates 200 MB is ended by the OOM killer (the memory limit is
// enforced): exactly one failed run, reason `oom-kill`. It needs the memory
// cgroup controller inside the container: a host on the legacy cgroup
// hierarchy (v1) does not delegate it to systemd-nspawn and MemoryMax= is
// not enforced there at all; the test then skips (fails when CI=true).
func TestSystemScopeMemoryLimitBooted(t *testing.T) {
	t.Parallel()
	systemAccount(t, true)
}

func systemAccount(t *testing.T, oom bool) {
	c := boottest.Boot(t, boottest.Options{MemoryLimits: oom})
	if oom {
		// Probe: does this container enforce MemoryMax= at all?
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		_, _, _ = c.Output(ctx, "systemd-run", "--wait", "--unit=drover-oom-probe", "-p", "MemoryMax=16M", "-p", "MemorySwapMax=0",
			"/bin/sh", "-c", "head -c 100000000 /dev/zero | tail -n 1 >/dev/null")
		res, _, _ := c.Output(ctx, "systemctl", "show", "-P", "Result", "drover-oom-probe.service")
		cg, _, _ := c.Output(ctx, "cat", "/proc/1/cgroup")
		cancel()
		// cgroup v1 has no memory.events, so systemd says exit-code there
		// rather than oom-kill; what matters is that the limit killed it.
		if strings.TrimSpace(res) == "success" {
			why := fmt.Sprintf("the container does not enforce MemoryMax= (a probe unit allocating 100 MB under MemoryMax=16M ended %q; the container's cgroups:\n%s)", strings.TrimSpace(res), cg)
			testkit.Unavailable(t, "%s", why)
		}
	}
	srv := startServer(t)
	tags := map[string]string{"e2e": "system-account"}
	startAgentInContainer(t, c, srv, tags)
	id := srv.waitSoleAgentOnline("the agent in the container to enroll and connect")
	srv.putPipe("acc-nouser", pipeSpec{Schedule: far, Script: "echo never\n", RunAs: "no_such_user_e2e", Targets: byTags(tags)})
	// tail -n 1 keeps a line without a newline whole: 200 MB of it.
	srv.putPipe("acc-oom", pipeSpec{Schedule: far, Script: "head -c 200000000 /dev/zero | tail -n 1 >/dev/null\necho survived\n",
		Limits: map[string]int{"memory_mb": 32}, Targets: byTags(tags)})
	testkit.WaitFor(t, 60*time.Second, "the pipes in the container", func() bool {
		st := agentStatusInside(t, c)
		n := 0
		for _, p := range st.Pipes {
			if (p.Name == "acc-nouser" || p.Name == "acc-oom") && !p.NextRun.IsZero() {
				n++
			}
		}
		return n == 2
	})
	if mm := c.Exec(t, "systemctl", "show", "-P", "MemoryMax", "drover-pipe-acc-oom.service"); mm != fmt.Sprint(32<<20)+"\n" {
		t.Fatalf("MemoryMax=%q", mm)
	}

	cases := []struct{ pipe, reason string }{{"acc-nouser", "systemd: 217/USER"}}
	if oom {
		cases = []struct{ pipe, reason string }{{"acc-oom", "oom-kill"}}
	}
	for _, tc := range cases {
		req := srv.runNow(tc.pipe, id).RequestID
		run := srv.runOfRequest(req, 90*time.Second, "failed", "succeeded")
		if run.Status != "failed" {
			t.Fatalf("%s: run %+v (log %q)", tc.pipe, run, srv.logText(run.ID))
		}
		testkit.WaitFor(t, 60*time.Second, tc.pipe+"'s reason "+tc.reason+" in the agent's status", func() bool {
			for _, p := range agentStatusInside(t, c).Pipes {
				if p.Name == tc.pipe && p.LastRun != nil && p.LastRun.RunID == run.ID {
					if p.LastRun.Reason != tc.reason {
						t.Fatalf("%s: reason %q, want %q (%+v)", tc.pipe, p.LastRun.Reason, tc.reason, p.LastRun)
					}
					return true
				}
			}
			return false
		})
		runsOnce(t, srv, tc.pipe, id, run.ID, func(r api.Run) bool { return r.RequestID == req && r.Reason == tc.reason })
	}
}

// agentStatusInside is `drover-agent status --json` in the container.
func agentStatusInside(t *testing.T, c *boottest.Container) agent.Status {
	t.Helper()
	var st agent.Status
	out := c.Exec(t, "drover-agent", "status", "--json")
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		t.Fatalf("status: %v\n%s", err, out)
	}
	return st
}
