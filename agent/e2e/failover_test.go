package e2e

import (
	"encoding/json"
	"fmt"
	"github.com/drover/drover/server/pki"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/drover/drover/agent"
	"github.com/drover/drover/api"
	"github.com/drover/drover/internal/testkit"
	"github.com/drover/drover/server/store/postgres/pgtest"
)

// failoverBudget is how soon after a replica's death an agent must have
// its stream and its polls on another replica.
const failoverBudget = 10 * time.Second

// TestFailoverReplicaKilled: three drover-server replicas on one
// PostgreSQL. An agent enrolled through A receives every replica's URL and
// stream address; A is SIGKILLed while a run is in progress; the agent's
// stream and polls are on B within failoverBudget (measured), the run that
// finished meanwhile arrives on the server exactly once with its whole
// log, and when A comes back the agent stays on B (sticky); when B is
// killed too, the agent goes on to C.
func TestFailoverReplicaKilled(t *testing.T) {
	t.Parallel()
	failover(t, false)
}

// TestFailoverReplicaBlackholed: the same with two replicas, A behind TCP
// proxies that stop forwarding without closing anything (a host that
// dropped off the network): the polls get nothing, the stream's replies
// vanish while A still commits what it receives. The agent notices through
// its liveness probe and the dial timeouts, and the records A committed
// without acknowledging them are sent again to B and stored once.
func TestFailoverReplicaBlackholed(t *testing.T) {
	t.Parallel()
	failover(t, true)
}

func failover(t *testing.T, blackhole bool) {
	pg := pgtest.Start(t)
	dsn := pg.NewDatabase(t)
	port := func() string { return replicaAddr(t) }
	aHTTP, aGRPC, bHTTP, bGRPC, cHTTP, cGRPC := port(), port(), port(), port(), port(), port()
	// What agents are told: A directly, or A through the proxies.
	pubAHTTP, pubAGRPC := aHTTP, aGRPC
	var proxies []*tcpProxy
	if blackhole {
		ph, pgp := startProxy(t, aHTTP), startProxy(t, aGRPC)
		proxies = []*tcpProxy{ph, pgp}
		pubAHTTP, pubAGRPC = ph.addr(), pgp.addr()
	}
	urls := []string{"https://" + pubAHTTP, "https://" + bHTTP}
	addrs := []string{pubAGRPC, bGRPC}
	if !blackhole {
		// Three replicas: after A, B dies too, and the agent goes on to C.
		urls, addrs = append(urls, "https://"+cHTTP), append(addrs, cGRPC)
	}
	env := replicaEnv(t, dsn, urls, addrs)
	a := startReplica(t, "A", aHTTP, aGRPC, env)
	b := startReplica(t, "B", bHTTP, bGRPC, env)
	var c *serverProc
	if !blackhole {
		c = startReplica(t, "C", cHTTP, cGRPC, env)
	}

	tags := map[string]string{"e2e": "failover"}
	// Through the API of A, as an operator would.
	var tok api.EnrollmentTokenCreated
	a.api("POST", "/api/v1/enrollment-tokens", api.EnrollmentTokenRequest{Tags: tags}, &tok)
	ag, id := enrolledAgent(t, a, agentOpts{name: "agent-failover", backend: "cron", tags: tags, serverURL: "https://" + pubAHTTP,
		syncInterval: 2 * time.Second, token: tok.Token})
	var ident agent.Identity
	raw, err := os.ReadFile(filepath.Join(ag.dataDir, "identity.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(raw, &ident); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(ident.ServerURLs, urls) || !slices.Equal(ident.GRPCAddrs, addrs) {
		t.Fatalf("identity.json after enrollment: server_urls %v, grpc_addrs %v", ident.ServerURLs, ident.GRPCAddrs)
	}
	st := ag.statusCLI()
	if st.Server != "https://"+pubAHTTP || st.GRPCAddr != pubAGRPC || st.Replicas == nil || len(st.Replicas.ServerURLs) != len(urls) || st.Replicas.GRPCSince.IsZero() {
		t.Fatalf("status before the failover: %+v %+v", st, st.Replicas)
	}
	if !a.agentView(id).Online {
		t.Fatal("the agent is not online on A")
	}

	// A run of 4 s, 40 numbered lines; A dies 1 s into it.
	const lines = 40
	script := fmt.Sprintf("i=1; while [ $i -le %d ]; do echo line $i; i=$((i+1)); sleep 0.1; done\n", lines)
	a.putPipe("fo-job", pipeSpec{Schedule: far, Script: script, Targets: byTags(tags)})
	ag.waitPipes(60*time.Second, "fo-job")
	req := a.runNow("fo-job", id)
	running := a.runOfRequest(req.RequestID, 30*time.Second, "running")
	time.Sleep(time.Second)

	t0 := time.Now()
	if blackhole {
		// The polls get nothing at all; the stream's replies vanish while A
		// still receives and commits: the records it commits from now on
		// are never acknowledged, and the agent must send them again to B.
		before := strings.Count(a.logText(running.ID), "\n")
		proxies[0].blackhole()
		proxies[1].holeReplies()
		time.Sleep(2 * time.Second)
		after := strings.Count(a.logText(running.ID), "\n")
		st := ag.status()
		t.Logf("A committed %d log lines before its replies vanished and %d after; the agent's outbox holds %d records", before, after-before, st.OutboxRecords)
		if after <= before || st.OutboxRecords == 0 || st.GRPCAddr != pubAGRPC {
			t.Fatalf("no records committed by A without an ack (lines %d -> %d, outbox %d, stream %s): the re-send is not exercised", before, after, st.OutboxRecords, st.GRPCAddr)
		}
	} else {
		a.proc.kill()
	}
	var onB *agent.Status
	testkit.WaitFor(t, 30*time.Second, "the agent's stream on replica B", func() bool {
		st := ag.status()
		if st != nil && st.StreamConnected && st.GRPCAddr == bGRPC && st.Replicas != nil && !st.Replicas.GRPCSince.IsZero() {
			onB = st
			return true
		}
		return false
	})
	streamTook := time.Since(t0)
	// A poll: `drover-agent sync` answered by B.
	if out := ag.syncCLI(); out != "unchanged" && out != "applied" {
		t.Fatalf("sync after the failover: %s", out)
	}
	pollTook := time.Since(t0)
	st = ag.statusCLI()
	t.Logf("blackhole=%v: stream on B %s after A's death, a poll answered by B %s after it; %d failovers",
		blackhole, streamTook.Round(time.Millisecond), pollTook.Round(time.Millisecond), st.Replicas.Failovers)
	if st.Server != "https://"+bHTTP || st.Replicas.ServerSince.IsZero() || st.LastSyncError != "" {
		t.Fatalf("polls not on B: server %s, since %v, last sync error %q", st.Server, st.Replicas.ServerSince, st.LastSyncError)
	}
	if streamTook > failoverBudget || pollTook > failoverBudget {
		t.Errorf("failover took %s (stream) and %s (poll); the budget is %s", streamTook, pollTook, failoverBudget)
	}
	if onB.Replicas.Failovers == 0 {
		t.Error("no failover counted")
	}
	if !b.agentView(id).Online {
		t.Error("B does not see the agent online")
	}

	// The run finished during the failover: exactly once, with every line once.
	run := b.runOfRequest(req.RequestID, 60*time.Second, "succeeded")
	testkit.WaitFor(t, 30*time.Second, "an empty outbox", func() bool {
		st := ag.status()
		return st != nil && st.OutboxRecords == 0
	})
	runs := b.runs("fo-job", id)
	if len(runs) != 1 || runs[0].ID != run.ID {
		t.Fatalf("%d runs on the server, want 1: %+v", len(runs), runs)
	}
	var want strings.Builder
	for i := 1; i <= lines; i++ {
		fmt.Fprintf(&want, "line %d\n", i)
	}
	if got := b.logText(run.ID); got != want.String() {
		t.Fatalf("the run's log on the server:\n%s\nwant %d lines, each once", got, lines)
	}

	// A comes back: the agent stays on B.
	if blackhole {
		for _, p := range proxies {
			p.restore()
		}
	} else {
		a.start(aHTTP, aGRPC)
	}
	for range 3 {
		ag.syncCLI()
	}
	time.Sleep(3 * time.Second)
	st = ag.statusCLI()
	if st.Server != "https://"+bHTTP || st.GRPCAddr != bGRPC || !st.StreamConnected {
		t.Fatalf("after A came back the agent moved: server %s, grpc %s, stream %v", st.Server, st.GRPCAddr, st.StreamConnected)
	}
	if out := ag.cli("status"); !strings.Contains(out, "Replicas:") || !strings.Contains(out, bGRPC) {
		t.Errorf("drover-agent status does not show the replicas:\n%s", out)
	}
	if c == nil {
		return
	}

	// B dies too: the agent goes on to C, the next in the list, not back
	// to A.
	t1 := time.Now()
	b.proc.kill()
	testkit.WaitFor(t, 30*time.Second, "the agent's stream on replica C", func() bool {
		st := ag.status()
		return st != nil && st.StreamConnected && st.GRPCAddr == cGRPC && st.Replicas != nil && !st.Replicas.GRPCSince.IsZero()
	})
	took := time.Since(t1)
	if out := ag.syncCLI(); out != "unchanged" && out != "applied" {
		t.Fatalf("sync on C: %s", out)
	}
	st = ag.statusCLI()
	t.Logf("B killed: stream and polls on C %s later; %d failovers", took.Round(time.Millisecond), st.Replicas.Failovers)
	if st.Server != "https://"+cHTTP || took > failoverBudget || !c.agentView(id).Online {
		t.Fatalf("after B's death: server %s after %s", st.Server, took)
	}
}

// replicaAddr is a 127.0.0.1 address free now, on a port below the
// kernel's ephemeral range (32768 and up on Linux): a replica must be told
// its port before it starts (every replica lists every other's), and comes
// back on it after a kill, and a port from the ephemeral range can be
// taken meanwhile as the local end of some outgoing connection (an agent's,
// PostgreSQL's clients'), which made the replica's bind fail.
// No port is handed out twice in one test binary.
func replicaAddr(t *testing.T) string {
	t.Helper()
	replicaPorts.mu.Lock()
	defer replicaPorts.mu.Unlock()
	for range 100 {
		p := 20000 + rand.IntN(12000)
		if replicaPorts.used[p] {
			continue
		}
		addr := fmt.Sprintf("127.0.0.1:%d", p)
		if l, err := net.Listen("tcp", addr); err == nil {
			l.Close()
			replicaPorts.used[p] = true
			return addr
		}
	}
	t.Fatal("no free port between 20000 and 32000")
	return ""
}

var replicaPorts = struct {
	mu   sync.Mutex
	used map[int]bool
}{used: map[int]bool{}}

// replicaEnv is the environment of replicas that share the PostgreSQL
// database dsn and a new key-encryption key file, and that tell agents
// the replica lists urls (HTTPS) and addrs (gRPC).
func replicaEnv(t *testing.T, dsn string, urls, addrs []string) []string {
	t.Helper()
	kek := filepath.Join(t.TempDir(), "kek")
	if _, err := pki.GenerateKEK(kek); err != nil {
		t.Fatal(err)
	}
	return []string{
		"DROVER_STORE_DRIVER=postgres", "DROVER_STORE_DSN=" + dsn, "DROVER_KEK_FILE=" + kek,
		"DROVER_PUBLIC_URLS=" + strings.Join(urls, ","),
		"DROVER_GRPC_PUBLIC_ADDRS=" + strings.Join(addrs, ","),
	}
}

// startReplica starts a drover-server replica on fixed addresses, with a
// data dir of its own; the replicas share their keys through the store,
// sealed by the KEK file env names.
func startReplica(t *testing.T, name, httpAddr, grpcAddr string, env []string) *serverProc {
	t.Helper()
	s := launchServer(t, "drover-server-"+name, httpAddr, grpcAddr, env)
	t.Cleanup(func() { s.proc.kill() })
	return s
}

// tcpProxy forwards 127.0.0.1 connections to a target until blackhole:
// from then on it accepts connections and reads what it is sent, but
// forwards nothing either way and closes nothing, as a host that dropped
// off the network looks to its peers. holeReplies drops only what the
// target sends (it still receives). A fault the tests cannot cause
// otherwise without root (no firewall rules here).
type tcpProxy struct {
	ln      net.Listener
	target  string
	mu      sync.Mutex
	holed   bool // nothing forwarded, new connections swallowed
	replies bool // the target's bytes dropped
	conns   []net.Conn
}

func startProxy(t *testing.T, target string) *tcpProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &tcpProxy{ln: ln, target: target}
	t.Cleanup(func() {
		ln.Close()
		p.mu.Lock()
		for _, c := range p.conns {
			c.Close()
		}
		p.mu.Unlock()
	})
	go p.serve()
	return p
}

func (p *tcpProxy) addr() string { return p.ln.Addr().String() }

// dropping reports whether bytes in one direction are dropped now.
func (p *tcpProxy) dropping(fromTarget bool) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.holed || fromTarget && p.replies
}

func (p *tcpProxy) blackhole()   { p.mu.Lock(); p.holed = true; p.mu.Unlock() }
func (p *tcpProxy) holeReplies() { p.mu.Lock(); p.replies = true; p.mu.Unlock() }

// restore forwards new connections again (the held ones stay dead).
func (p *tcpProxy) restore() { p.mu.Lock(); p.holed, p.replies = false, false; p.mu.Unlock() }

func (p *tcpProxy) serve() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		p.conns = append(p.conns, c)
		swallow := p.holed || p.replies
		p.mu.Unlock()
		if swallow {
			go io.Copy(io.Discard, c)
			continue
		}
		u, err := net.Dial("tcp", p.target)
		if err != nil {
			c.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, u)
		p.mu.Unlock()
		go p.pipe(c, u, false)
		go p.pipe(u, c, true)
	}
}

// pipe copies from src to dst while that direction is forwarded; when it
// is not, it keeps reading src and drops what it reads.
func (p *tcpProxy) pipe(src, dst net.Conn, fromTarget bool) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 && !p.dropping(fromTarget) {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			if !p.dropping(fromTarget) {
				dst.Close()
			}
			return
		}
	}
}
