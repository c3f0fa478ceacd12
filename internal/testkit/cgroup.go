package testkit

import (
	"bufio"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// CgroupMount is a mounted cgroup hierarchy, from /proc/self/mountinfo.
type CgroupMount struct {
	Path      string // where it is mounted
	Root      string // the hierarchy's directory mounted there ("/" for all of it)
	V2        bool   // cgroup2; else a v1 hierarchy
	SuperOpts string // its super options, e.g. "rw,name=systemd" or "rw,memory"
}

// Has reports whether a v1 hierarchy has option opt ("name=systemd",
// "memory").
func (m CgroupMount) Has(opt string) bool {
	return strings.Contains(","+m.SuperOpts+",", ","+opt+",")
}

// CgroupMounts lists the cgroup hierarchies mounted in this mount namespace.
func CgroupMounts() ([]CgroupMount, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []CgroupMount
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// id parent maj:min root mountpoint opts [optional...] - fstype source superopts
		pre, post, ok := strings.Cut(sc.Text(), " - ")
		if !ok {
			continue
		}
		fields, tail := strings.Fields(pre), strings.Fields(post)
		if len(fields) < 5 || len(tail) < 3 || (tail[0] != "cgroup2" && tail[0] != "cgroup") {
			continue
		}
		out = append(out, CgroupMount{Path: fields[4], Root: fields[3], V2: tail[0] == "cgroup2", SuperOpts: tail[2]})
	}
	return out, sc.Err()
}

// KillCgroups SIGKILLs every process (but pid 1) in the cgroup trees dirs,
// again after pause until none is left, for at most 50 rounds.
func KillCgroups(pause time.Duration, dirs ...string) {
	for range 50 {
		n := 0
		for _, d := range dirs {
			_ = filepath.WalkDir(d, func(p string, e os.DirEntry, err error) error {
				if err != nil || e.IsDir() || e.Name() != "cgroup.procs" {
					return nil
				}
				b, _ := os.ReadFile(p)
				for _, f := range strings.Fields(string(b)) {
					if pid, err := strconv.Atoi(f); err == nil && pid > 1 {
						_ = syscall.Kill(pid, syscall.SIGKILL)
						n++
					}
				}
				return nil
			})
		}
		if n == 0 {
			return
		}
		time.Sleep(pause)
	}
}

// RemoveCgroups deletes the cgroup trees dirs, deepest first (a cgroup
// goes only once it is empty of processes and children).
func RemoveCgroups(dirs ...string) {
	for _, d := range dirs {
		var tree []string
		_ = filepath.WalkDir(d, func(p string, e os.DirEntry, err error) error {
			if err == nil && e.IsDir() {
				tree = append(tree, p)
			}
			return nil
		})
		for i := len(tree) - 1; i >= 0; i-- {
			_ = syscall.Rmdir(tree[i])
		}
	}
}
