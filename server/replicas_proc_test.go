package server

import (
	"bufio"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/drover/drover/internal/testkit"
	"github.com/drover/drover/server/store/postgres/pgtest"
)

// replicaProc is one drover-server process of TestReplicasSIGKILLHolder.
type replicaProc struct {
	cmd    *exec.Cmd
	dir    string
	https  string
	stderr *testkit.Buffer
	killed time.Time
}

// Three real drover-server processes on one PostgreSQL: SIGKILL of the
// process holding the leader lock, and another takes the singleton work
// within 15 s; their logs show one term at a time.
func TestReplicasSIGKILLHolder(t *testing.T) {
	c := pgtest.Start(t)
	dsn := c.NewDatabase(t)
	bin := filepath.Join(testkit.Binaries(t, "", "drover-server"), "drover-server")
	kek := testKEKFile(t)
	conf := filepath.Join(t.TempDir(), "server.yaml")
	if err := os.WriteFile(conf, []byte("log_format: json\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var env []string
	for _, e := range os.Environ() {
		if !strings.HasPrefix(e, "DROVER_") {
			env = append(env, e)
		}
	}
	procs := make([]*replicaProc, 3)
	for i := range procs {
		p := &replicaProc{dir: t.TempDir(), stderr: &testkit.Buffer{}}
		httpPort, grpcPort := testkit.FreePort(t), testkit.FreePort(t)
		p.https = fmt.Sprintf("https://127.0.0.1:%d", httpPort)
		p.cmd = exec.Command(bin, "serve", "--config", conf)
		p.cmd.Env = append(slices.Clip(env), "DROVER_DATA_DIR="+p.dir, fmt.Sprintf("DROVER_HTTP_ADDR=127.0.0.1:%d", httpPort), fmt.Sprintf("DROVER_GRPC_ADDR=127.0.0.1:%d", grpcPort),
			"DROVER_STORE_DRIVER=postgres", "DROVER_STORE_DSN="+dsn, "DROVER_KEK_FILE="+kek, "DROVER_STORE_MAX_CONNS=4")
		p.cmd.Stderr = p.stderr
		procs[i] = p
	}
	for i, p := range procs {
		if err := p.cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if p.killed.IsZero() {
				p.cmd.Process.Signal(syscall.SIGTERM)
			}
			p.cmd.Wait()
			if t.Failed() {
				t.Logf("replica %d stderr:\n%s", i, p.stderr.String())
			}
		})
	}
	var client *http.Client
	testkit.WaitFor(t, 60*time.Second, "the CA certificate in a data dir", func() bool {
		b, err := os.ReadFile(filepath.Join(procs[0].dir, "ca.crt"))
		if err != nil {
			return false
		}
		pool := x509.NewCertPool()
		pool.AppendCertsFromPEM(b)
		client = &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
		return true
	})
	leading := func(p *replicaProc) (bool, bool) {
		resp, err := client.Get(p.https + "/healthz")
		if err != nil {
			return false, false
		}
		defer resp.Body.Close()
		var h struct{ Leader bool }
		return json.NewDecoder(resp.Body).Decode(&h) == nil && h.Leader, resp.StatusCode == 200
	}
	holder := -1
	testkit.WaitFor(t, 60*time.Second, "every replica up and one leader", func() bool {
		holder = -1
		for i, p := range procs {
			lead, up := leading(p)
			if !up {
				return false
			}
			if lead {
				if holder >= 0 {
					t.Fatalf("replicas %d and %d both lead", holder, i)
				}
				holder = i
			}
		}
		return holder >= 0
	})

	procs[holder].killed = time.Now()
	if err := procs[holder].cmd.Process.Kill(); err != nil { // SIGKILL
		t.Fatal(err)
	}
	next := -1
	testkit.WaitFor(t, 20*time.Second, "another replica to lead", func() bool {
		for i, p := range procs {
			if i == holder {
				continue
			}
			if lead, _ := leading(p); lead {
				next = i
				return true
			}
		}
		return false
	})
	took := time.Since(procs[holder].killed)
	t.Logf("SIGKILL of lock holder %d: replica %d runs the singletons %v later (poll %v, grace %v)", holder, next, took.Round(time.Millisecond), leaderPoll, leaderGrace)
	if took > 15*time.Second {
		t.Fatalf("takeover after %v, want within 15s", took)
	}
	for i, p := range procs {
		if i != holder && i != next {
			if lead, _ := leading(p); lead {
				t.Fatalf("replicas %d and %d both lead", next, i)
			}
		}
	}

	// The logs: terms never overlap (the killed holder's ends at the kill).
	type ev struct {
		at    time.Time
		delta int
		who   int
	}
	var evs []ev
	for i, p := range procs {
		sc := bufio.NewScanner(strings.NewReader(p.stderr.String()))
		for sc.Scan() {
			var line struct {
				Time time.Time `json:"time"`
				Msg  string    `json:"msg"`
			}
			if json.Unmarshal(sc.Bytes(), &line) != nil {
				continue
			}
			switch line.Msg {
			case "leader: this replica runs the singletons":
				evs = append(evs, ev{line.Time, +1, i})
			case "leader: this replica stopped the singletons":
				evs = append(evs, ev{line.Time, -1, i})
			}
		}
		if !p.killed.IsZero() {
			evs = append(evs, ev{p.killed, -1, i})
		}
	}
	sort.SliceStable(evs, func(i, j int) bool { return evs[i].at.Before(evs[j].at) })
	active, terms := 0, 0
	for _, e := range evs {
		active += e.delta
		if e.delta > 0 {
			terms++
		}
		if active > 1 {
			t.Fatalf("two terms at once at %v (replica %d began)", e.at, e.who)
		}
	}
	if terms != 2 {
		t.Fatalf("%d terms logged, want 2 (the holder's, then the new leader's): %v", terms, evs)
	}
}
