package sim

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// clockTicks is USER_HZ, 100 on every Linux architecture Go supports.
const clockTicks = 100

// procSample is one reading of a local process from /proc.
type procSample struct {
	at       time.Time
	cpuTicks int64 // utime + stime
	rssBytes int64
	threads  int64
	fds      int64
}

func readProc(pid int) (procSample, error) {
	s := procSample{at: time.Now()}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return s, fmt.Errorf("server process: %w", err)
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return s, fmt.Errorf("server process: /proc/%d/stat: unexpected format", pid)
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 13 {
		return s, fmt.Errorf("server process: /proc/%d/stat: unexpected format", pid)
	}
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	s.cpuTicks = ut + st
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return s, fmt.Errorf("server process: %w", err)
	}
	sc := bufio.NewScanner(bytes.NewReader(status))
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		fs := strings.Fields(v)
		if len(fs) == 0 {
			continue
		}
		n, _ := strconv.ParseInt(fs[0], 10, 64)
		switch k {
		case "VmRSS":
			s.rssBytes = n << 10
		case "Threads":
			s.threads = n
		}
	}
	if ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid)); err == nil {
		s.fds = int64(len(ents))
	}
	return s, nil
}

// cpuPercent is the CPU used between two samples, in % of one core.
func cpuPercent(a, b procSample) float64 {
	wall := b.at.Sub(a.at).Seconds()
	if wall <= 0 {
		return 0
	}
	return float64(b.cpuTicks-a.cpuTicks) / clockTicks / wall * 100
}

// pidListening finds the local process listening on TCP port (IPv4 or
// IPv6), by the socket inode in /proc/net/tcp* and the processes' fds.
// Only processes this user may inspect are found.
func pidListening(port int) (int, error) {
	inodes := map[string]bool{}
	for _, f := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n")[1:] {
			fs := strings.Fields(line)
			if len(fs) < 10 || fs[3] != "0A" { // 0A: LISTEN
				continue
			}
			_, hexPort, ok := strings.Cut(fs[1], ":")
			if p, err := strconv.ParseInt(hexPort, 16, 32); ok && err == nil && int(p) == port {
				inodes["socket:["+fs[9]+"]"] = true
			}
		}
	}
	if len(inodes) == 0 {
		return 0, fmt.Errorf("no local process listens on port %d", port)
	}
	procs, _ := filepath.Glob("/proc/[0-9]*")
	for _, p := range procs {
		fds, err := os.ReadDir(p + "/fd")
		if err != nil {
			continue
		}
		for _, fd := range fds {
			if l, err := os.Readlink(p + "/fd/" + fd.Name()); err == nil && inodes[l] {
				return strconv.Atoi(filepath.Base(p))
			}
		}
	}
	return 0, fmt.Errorf("the process listening on port %d is not visible to this user (use --server-pid)", port)
}

// loadAvg is the 1, 5 and 15 minute load averages.
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return ""
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return ""
	}
	return strings.Join(f[:3], " ")
}

// cpuTimes is the whole host's CPU time from /proc/stat: all of it, and the
// part the hypervisor gave to other guests (steal), in clock ticks.
type cpuTimes struct{ total, steal uint64 }

// readCPUTimes reads the first line of /proc/stat; ok is false where there
// is none (not Linux) or it does not parse.
func readCPUTimes() (t cpuTimes, ok bool) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return t, false
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 9 || f[0] != "cpu" {
		return t, false
	}
	// user nice system idle iowait irq softirq steal [guest guest_nice]:
	// guest time is already counted in user and nice.
	for i, v := range f[1:9] {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			return cpuTimes{}, false
		}
		t.total += n
		if i == 7 {
			t.steal = n
		}
	}
	return t, true
}

// stealPercent is the share of the host's CPU time between a and b that
// the hypervisor gave to other guests; -1 when unknown.
func stealPercent(a, b cpuTimes) float64 {
	if b.total <= a.total || b.steal < a.steal {
		return -1
	}
	return 100 * float64(b.steal-a.steal) / float64(b.total-a.total)
}
