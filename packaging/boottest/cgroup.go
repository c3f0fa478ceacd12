package boottest

import (
	"errors"
	"github.com/drover/drover/internal/testkit"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// cgroupSet is one cgroup per hierarchy systemd uses (cgroup2 and, on hybrid
// hosts, the v1 name=systemd one), created under the test binary's own
// cgroup there so the container stays inside whatever limits the test runs
// under. systemd-nspawn --keep-unit makes its payload/ and supervisor/
// cgroups inside it; a cgroup per container keeps parallel containers apart.
type cgroupSet struct{ dirs []string }

func newCgroupSet(name string) (*cgroupSet, error) {
	hs, err := cgroupHierarchies()
	if err != nil {
		return nil, err
	}
	if len(hs) == 0 {
		return nil, errors.New("no cgroup2 or name=systemd cgroup hierarchy is mounted")
	}
	cs := &cgroupSet{}
	for _, h := range hs {
		cs.dirs = append(cs.dirs, filepath.Join(h.mount, h.own, name))
	}
	return cs, nil
}

// joinScript is shell that creates the cgroups and moves the shell into
// them ($1..$n are the directories). It retries: `systemd-analyze verify`
// and other transient managers trim empty cgroups below their own cgroup
// when they exit, so a new empty directory may vanish before it is joined.
const joinScript = `for cg in $cgdirs; do
	i=0
	until mkdir -p "$cg" && echo $$ > "$cg/cgroup.procs"; do
		i=$((i+1)); [ $i -lt 20 ] || exit 97; sleep 0.05
	done 2>/dev/null
done`

// killAll SIGKILLs whatever still runs in the cgroups, for up to a few seconds.
func (c *cgroupSet) killAll() { testkit.KillCgroups(100*time.Millisecond, c.dirs...) }

// remove deletes the cgroup trees, deepest first.
func (c *cgroupSet) remove() { testkit.RemoveCgroups(c.dirs...) }

type hierarchy struct {
	mount string // where it is mounted
	own   string // this process's cgroup in it
}

func cgroupHierarchies() ([]hierarchy, error) {
	own, err := ownCgroups()
	if err != nil {
		return nil, err
	}
	ms, err := testkit.CgroupMounts()
	if err != nil {
		return nil, err
	}
	var out []hierarchy
	for _, m := range ms {
		if m.Root != "/" {
			continue
		}
		switch {
		case m.V2:
			if p, ok := own[""]; ok {
				out = append(out, hierarchy{m.Path, p})
			}
		case m.Has("name=systemd"):
			if p, ok := own["name=systemd"]; ok {
				out = append(out, hierarchy{m.Path, p})
			}
		case m.Has("memory"):
			// A cgroup v1 memory controller: the container gets its own
			// memory cgroup too, so what its systemd creates there
			// (Options.MemoryLimits) stays inside it.
			if p, ok := own["memory"]; ok {
				out = append(out, hierarchy{m.Path, p})
			}
		}
	}
	return out, nil
}

// ownCgroups maps controller list ("" for cgroup2) to this process's path.
func ownCgroups() (map[string]string, error) {
	b, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return nil, err
	}
	m := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) == 3 {
			m[parts[1]] = parts[2]
		}
	}
	return m, nil
}
