package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/drover/drover/agent"
	"github.com/drover/drover/packaging/boottest"
	"github.com/drover/drover/server"
)

// TestSystemScopeAccountsBooted: on a booted Debian (system scope, the
// agent installed as the packages install it), a pipe whose run_as user
// does not exist (217/USER) and one with limits.memory_mb: 32 whose script
// allocates 200 MB (the OOM killer ends its cgroup: the memory limit is
// enforced) both end as exactly one failed run on the server, with the
// reasons `systemd: 217/USER` and `oom-kill` in the agent's records.
func TestSystemScopeAccountsBooted(t *testing.T) {
	t.Parallel()
	c := boottest.Boot(t, boottest.Options{})
	root, err := moduleRoot()
	if err != nil {
		t.Fatal(err)
	}
	srv := startServer(t)
	tags := map[string]string{"e2e": "system-account"}
	c.CopyIn(t, agentBin(), "/usr/bin/drover-agent")
	c.CopyIn(t, filepath.Join(root, "packaging", "systemd", "drover-agent.service"), "/etc/systemd/system/drover-agent.service")
	c.WriteFile(t, "/etc/drover/agent.yaml", fmt.Appendf(nil, "server: %s\nbackend: systemd\nscope: system\nsync_interval: 10s\nheartbeat_interval: 5s\nmax_backoff: 2s\nlog_format: json\n", srv.base), 0o644)
	c.WriteFile(t, "/etc/drover/enroll.token", []byte(srv.token(tags)+"\n"), 0o600)
	c.Exec(t, "systemctl", "daemon-reload")
	c.Exec(t, "systemctl", "start", "drover-agent.service")
	t.Cleanup(func() {
		if t.Failed() {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			out, _, _ := c.Output(ctx, "journalctl", "--no-pager", "-n", "80", "-u", "drover-agent", "-u", "drover-pipe-*")
			t.Logf("---- container journal ----\n%s", out)
		}
	})
	var id string
	waitFor(t, 60*time.Second, "the agent in the container to enroll and connect", func() bool {
		var list server.AgentList
		srv.api("GET", "/api/v1/agents", nil, &list)
		if len(list.Agents) == 1 && list.Agents[0].Online {
			id = list.Agents[0].ID
			return true
		}
		return false
	})
	srv.putPipe("acc-nouser", pipeSpec{Schedule: far, Script: "echo never\n", RunAs: "no_such_user_e2e", Targets: byTags(tags)})
	// tail -n 1 keeps a line without a newline whole: 200 MB of it.
	srv.putPipe("acc-oom", pipeSpec{Schedule: far, Script: "cg=$(cut -d: -f3 /proc/self/cgroup); echo cg=$cg; cat /sys/fs/cgroup/cgroup.controllers; cat /sys/fs/cgroup$cg/memory.max; head -c 200000000 /dev/zero | tail -n 1 >/dev/null; echo tail=$?; cat /sys/fs/cgroup$cg/memory.events\necho survived\n",
		Limits: map[string]int{"memory_mb": 32}, Targets: byTags(tags)})
	waitFor(t, 60*time.Second, "the pipes in the container", func() bool {
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

	for _, tc := range []struct{ pipe, reason string }{
		{"acc-nouser", "systemd: 217/USER"},
		{"acc-oom", "oom-kill"},
	} {
		req := srv.runNow(tc.pipe, id).RequestID
		run := srv.runOfRequest(req, 90*time.Second, "failed", "succeeded")
		if run.Status != "failed" {
			t.Fatalf("%s: run %+v (log %q)", tc.pipe, run, srv.logText(run.ID))
		}
		waitFor(t, 60*time.Second, tc.pipe+"'s reason "+tc.reason+" in the agent's status", func() bool {
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
		runsOnce(t, srv, tc.pipe, id, run.ID, func(r server.RunJSON) bool { return r.RequestID == req })
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
