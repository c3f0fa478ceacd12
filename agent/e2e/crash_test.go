package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/drover/drover/agent/internal/sdtest"
	"github.com/drover/drover/internal/testkit"
	"github.com/drover/drover/manifest"
	"github.com/drover/drover/units"
)

// crashKills is how many times the agent is killed.
const crashKills = 50

// crashGroup is how many pipes each of the two tag groups has: a change of
// the agent's tags removes one group and installs the other (4 x crashGroup
// unit files), which makes sync and apply long enough to be hit.
const crashGroup = 30

// TestCrashDuringSyncAndApply SIGKILLs the agent process 50 times at random
// points of a sync and its apply, restarts it each time, and checks once it
// has settled that the unit files on disk are exactly those the manifest
// asks for (names and bytes, rendered from the manifest by the units
// package), that the enable links and the manager's timers match, and that
// no temporary file (units, links, payloads, pipe generations, guard
// drop-ins, the batch target) remains in the unit dir, the runtime unit
// dir or the data dir.
func TestCrashDuringSyncAndApply(t *testing.T) {
	t.Parallel()
	sdtest.Require(t)
	mgr := sdtest.NewManager(t)
	diagnoseOnFailure(t, mgr)
	srv := startServer(t)
	ag, id := enrolledAgent(t, srv, agentOpts{name: "agent-crash", backend: "systemd", mgr: &mgr, tags: map[string]string{"grp": "a"}})

	// Two groups selected by the agent's tags, and a few pipes that stay.
	var groupA []string
	for g, tag := range []string{"a", "b"} {
		for i := range crashGroup {
			name := fmt.Sprintf("c%s-%02d", tag, i)
			srv.putPipe(name, pipeSpec{Schedule: fmt.Sprintf("%d %d 1 1 *", i, 3+g), Script: "echo " + name + "\n",
				Targets: byTags(map[string]string{"grp": tag})})
			if tag == "a" {
				groupA = append(groupA, name)
			}
		}
	}
	for i := range 5 {
		name := fmt.Sprintf("cc-%d", i)
		srv.putPipe(name, pipeSpec{Schedule: fmt.Sprintf("%d 5 1 1 *", i), Script: "echo stays\n",
			Targets: map[string]any{"agents": []string{id}}})
		groupA = append(groupA, name)
	}
	ag.waitPipes(120*time.Second, groupA...)
	client := agentHTTP(t, ag.dataDir)

	tag := "a"
	toggle := func() {
		if tag == "a" {
			tag = "b"
		} else {
			tag = "a"
		}
		srv.api("PUT", "/api/v1/agents/"+id+"/tags", map[string]any{"tags": map[string]string{"grp": tag}}, nil)
	}

	// Warm-up: how long a sync and apply of a group change takes, to place
	// the kills inside it.
	ag.waitOnline()
	off := ag.log.size()
	t0 := time.Now()
	toggle()
	settle(t, ag, srv, client, mgr)
	window := appliedAfter(t, ag.log.since(off), t0)
	if window < 100*time.Millisecond {
		window = 100 * time.Millisecond
	}
	t.Logf("a group change (%d unit files removed, %d written) syncs and applies in %s", 2*crashGroup, 2*crashGroup, window.Round(time.Millisecond))

	where := map[string]int{}
	kills := 0
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 42))
	for kills < crashKills {
		ag.waitOnline()
		off := ag.log.size()
		t0 := time.Now()
		toggle()
		time.Sleep(time.Duration(rng.Int64N(int64(window))))
		ag.kill()
		kills++
		log := ag.log.since(off)
		where[killPoint(log)]++
		if d, ok := appliedIn(log, t0); ok {
			// Too late: the apply was done. Aim at the latest duration.
			window = max(d, 100*time.Millisecond)
		}
		ag.start()
		if kills%5 == 0 && kills < crashKills {
			// Also kill the restarted agent during its first apply and sync.
			off := ag.log.size()
			time.Sleep(time.Duration(rng.Int64N(int64(window))))
			ag.kill()
			kills++
			where["restart: "+killPoint(ag.log.since(off))]++
			ag.start()
		}
		settle(t, ag, srv, client, mgr)
	}
	var points []string
	for p, n := range where {
		points = append(points, fmt.Sprintf("%3d  %s", n, p))
	}
	sort.Slice(points, func(i, j int) bool { return points[i][4:] < points[j][4:] })
	t.Logf("%d SIGKILLs; last thing the agent logged before each:\n%s", kills, strings.Join(points, "\n"))
}

// settle waits until the agent has applied the server's current manifest
// and then checks the host against it. It returns that manifest.
func settle(t *testing.T, ag *agentProc, srv *serverProc, client *http.Client, mgr sdtest.Env) *manifest.Manifest {
	t.Helper()
	var m *manifest.Manifest
	testkit.WaitFor(t, 120*time.Second, "the agent to apply the server's manifest", func() bool {
		st := ag.status()
		if st == nil || st.LastSync.IsZero() {
			return false
		}
		_, m = fetchManifest(t, client, srv.base)
		return st.Serial == m.Serial && st.AppliedSerial == m.Serial && st.LastSyncError == ""
	})
	checkHost(t, m, ag, mgr)
	return m
}

// checkHost compares the unit dir, the enable links, the manager's timers,
// the runtime unit dir and the data dir with manifest m.
func checkHost(t *testing.T, m *manifest.Manifest, ag *agentProc, mgr sdtest.Env) {
	t.Helper()
	want := map[string][]byte{}
	timers := map[string]bool{}
	for _, p := range m.Pipes {
		spec := p.Spec.Clone()
		spec.Normalize()
		files, err := units.Render(spec, units.Options{AgentPath: agentBin(), Scope: units.ScopeUser, DataDir: ag.dataDir})
		if err != nil {
			t.Fatalf("render %s: %v", p.Name, err)
		}
		for _, f := range files {
			want[f.Name] = f.Content
		}
		if spec.IsEnabled() {
			timers[units.TimerName(p.Name)] = true
		}
	}
	got := unitFiles(t, mgr.UnitDir())
	var diffs []string
	for name, b := range want {
		g, ok := got[name]
		switch {
		case !ok:
			diffs = append(diffs, name+" missing")
		case !bytes.Equal(g, b):
			diffs = append(diffs, name+" differs")
		}
	}
	for name := range got {
		if _, ok := want[name]; !ok {
			diffs = append(diffs, name+" not in the manifest")
		}
	}
	wants := filepath.Join(mgr.UnitDir(), "timers.target.wants")
	ents, _ := os.ReadDir(wants)
	links := map[string]bool{}
	for _, e := range ents {
		target, err := os.Readlink(filepath.Join(wants, e.Name()))
		if err != nil || target != filepath.Join(mgr.UnitDir(), e.Name()) || !timers[e.Name()] {
			diffs = append(diffs, fmt.Sprintf("stray enable link %s -> %s", e.Name(), target))
		}
		links[e.Name()] = true
	}
	for tm := range timers {
		if !links[tm] {
			diffs = append(diffs, tm+" not enabled")
		}
	}
	out := mgr.Systemctl(t, "list-units", "--all", "--plain", "--no-legend", "--output=json", "drover-pipe-*.timer")
	var loaded []struct {
		Unit   string `json:"unit"`
		Active string `json:"active"`
	}
	if err := json.Unmarshal([]byte(out), &loaded); err != nil {
		t.Fatalf("list-units: %v\n%s", err, out)
	}
	active := map[string]bool{}
	for _, u := range loaded {
		if u.Active == "active" {
			active[u.Unit] = true
		}
	}
	for tm := range timers {
		if !active[tm] {
			diffs = append(diffs, tm+" not active in the manager")
		}
	}
	for tm := range active {
		if !timers[tm] {
			diffs = append(diffs, tm+" active but not in the manifest")
		}
	}
	diffs = append(diffs, leftovers(mgr.UnitDir(), "unit dir")...)
	diffs = append(diffs, leftovers(ag.dataDir, "data dir")...)
	rt := filepath.Join(mgr.RuntimeDir, "systemd", "user")
	if _, err := os.Stat(filepath.Join(rt, "drover-apply-batch.target")); err == nil {
		diffs = append(diffs, "drover-apply-batch.target left in "+rt)
	}
	if g, _ := filepath.Glob(filepath.Join(rt, "drover-pipe-*.timer.d", "*")); len(g) > 0 {
		diffs = append(diffs, fmt.Sprintf("guard drop-ins left: %v", g))
	}
	// Every pipe generation is the one its link points at.
	pipes := filepath.Join(ag.dataDir, "pipes")
	gens, _ := os.ReadDir(pipes)
	linked := map[string]bool{}
	for _, p := range m.Pipes {
		target, err := os.Readlink(filepath.Join(pipes, p.Name))
		if err != nil {
			diffs = append(diffs, "no pipe dir link for "+p.Name)
			continue
		}
		linked[target] = true
		if _, err := os.Stat(filepath.Join(pipes, target, "pipe.json")); err != nil {
			diffs = append(diffs, fmt.Sprintf("pipe %s links to an incomplete generation %s", p.Name, target))
		}
	}
	for _, g := range gens {
		if strings.HasPrefix(g.Name(), ".") && !linked[g.Name()] {
			diffs = append(diffs, "orphan pipe generation "+g.Name())
		}
	}
	if len(diffs) > 0 {
		sort.Strings(diffs)
		if len(diffs) > 20 {
			diffs = append(diffs[:20], fmt.Sprintf("... and %d more", len(diffs)-20))
		}
		t.Fatalf("the host differs from manifest serial %d:\n  %s", m.Serial, strings.Join(diffs, "\n  "))
	}
}

// leftovers lists temporary files below dir: apply's .drover-tmp-*, the
// pipe links' .lnk-*, the spool's .tmp-* and the agent's .<name>.tmp-*.
func leftovers(dir, what string) []string {
	var out []string
	filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		n := d.Name()
		if strings.HasPrefix(n, ".drover-tmp-") || strings.HasPrefix(n, ".lnk-") || strings.HasPrefix(n, ".tmp-") || strings.Contains(n, ".tmp-") {
			rel, _ := filepath.Rel(dir, p)
			out = append(out, fmt.Sprintf("temporary file in the %s: %s", what, rel))
		}
		return nil
	})
	return out
}

// logLine is the part of an agent log line the crash test reads.
type logLine struct {
	Time  time.Time `json:"time"`
	Msg   string    `json:"msg"`
	Phase string    `json:"phase"`
}

func logLines(log string) []logLine {
	var out []logLine
	for _, l := range strings.Split(log, "\n") {
		var x logLine
		if json.Unmarshal([]byte(l), &x) == nil && x.Msg != "" {
			out = append(out, x)
		}
	}
	return out
}

// appliedAfter is how long after t0 the agent logged "manifest applied".
func appliedAfter(t *testing.T, log string, t0 time.Time) time.Duration {
	t.Helper()
	d, ok := appliedIn(log, t0)
	if !ok {
		t.Fatalf("no \"manifest applied\" in the agent log:\n%s", tailLines(log, 30))
	}
	return d
}

func appliedIn(log string, t0 time.Time) (time.Duration, bool) {
	for _, l := range logLines(log) {
		if l.Msg == "manifest applied" {
			return l.Time.Sub(t0), true
		}
	}
	return 0, false
}

// killPoint names where the agent was when it was killed, from the last
// relevant line it logged.
func killPoint(log string) string {
	point := "before the sync"
	for _, l := range logLines(log) {
		switch {
		case l.Msg == "agent starting":
			point = "starting"
		case l.Msg == "server asked for a sync":
			point = "sync: fetch and verify"
		case l.Msg == "apply" && l.Phase == "gc":
			point = "apply: done, recording the result"
		case l.Msg == "apply" && l.Phase != "":
			point = "apply: after " + l.Phase
		case l.Msg == "manifest applied":
			point = "after the apply"
		}
	}
	return point
}
