package server

import (
	"bufio"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/drover/drover/api"
	"github.com/drover/drover/internal/testkit"

	agentpb "github.com/drover/drover/proto"
)

// buildServer builds cmd/drover-server once per test binary. A missing
// toolchain fails the test: this proof must not be skipped.
func buildServer(t *testing.T) string {
	t.Helper()
	return filepath.Join(testkit.Binaries(t, "", "drover-server"), "drover-server")
}

// serverProcess is drover-server running as a child process.
type serverProcess struct {
	cmd   *exec.Cmd
	https string
	grpc  string
	done  chan struct{} // closed when the process has exited
	err   error         // its exit status, once done is closed
}

func startProcess(t *testing.T, bin, dataDir string) *serverProcess {
	t.Helper()
	cmd := exec.Command(bin, "serve", "--data-dir", dataDir, "--http-addr", "127.0.0.1:0", "--grpc-addr", "127.0.0.1:0")
	cmd.Env = append(os.Environ(), "DROVER_LOG_FORMAT=json", "DROVER_STORE_SYNCHRONOUS=full")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &serverProcess{cmd: cmd, done: make(chan struct{})}
	ready := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			var line struct {
				Msg   string `json:"msg"`
				HTTPS string `json:"https"`
				GRPC  string `json:"grpc"`
			}
			if json.Unmarshal(sc.Bytes(), &line) == nil && line.Msg == "drover-server ready" {
				p.https, p.grpc = line.HTTPS, line.GRPC
				close(ready)
			} else if os.Getenv("DROVER_TEST_LOG") != "" {
				t.Log(sc.Text())
			}
		}
		io.Copy(io.Discard, stderr)
	}()
	go func() { p.err = cmd.Wait(); close(p.done) }()
	select {
	case <-ready:
	case <-p.done:
		t.Fatalf("drover-server exited before it was ready: %v", p.err)
	case <-time.After(30 * time.Second):
		cmd.Process.Kill()
		t.Fatal("drover-server was not ready within 30s")
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-p.done
	})
	return p
}

func adminClient(t *testing.T, dataDir string) (*http.Client, string) {
	t.Helper()
	caPEM, err := os.ReadFile(filepath.Join(dataDir, "ca.crt"))
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	token, err := ReadAdminToken(dataDir)
	if err != nil {
		t.Fatal(err)
	}
	return &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}, token
}

// crashRecord is record seq of the crash workload: log chunks of runs of 500.
func crashRecord(seq uint64) *agentpb.AgentMessage {
	run := fmt.Sprintf("crash-%04d", (seq-1)/500)
	return &agentpb.AgentMessage{Seq: seq, Body: &agentpb.AgentMessage_LogChunk{LogChunk: &agentpb.LogChunk{
		RunId: run, ChunkSeq: (seq - 1) % 500, Data: fmt.Appendf(nil, "record %d\n", seq)}}}
}

// TestCrashKeepsAcknowledgedRecords kills a real drover-server process with
// SIGKILL while records stream in, restarts it on the same data dir, and
// checks that every acknowledged record is there; the agent then replays
// the rest, and a SIGTERM ends the server cleanly.
func TestCrashKeepsAcknowledgedRecords(t *testing.T) {
	bin := buildServer(t)
	dir := filepath.Join(t.TempDir(), "data")
	p := startProcess(t, bin, dir)
	client, admin := adminClient(t, dir)

	ts := &testServer{t: t, admin: admin, base: "https://" + p.https, client: client}
	a := ts.enrollAgent(nil)
	st, err := a.openStream(p.grpc)
	if err != nil {
		t.Fatal(err)
	}

	// Stream without pause until the server dies.
	var mu sync.Mutex
	var sent uint64
	go func() {
		for seq := uint64(1); ; seq++ {
			if err := st.stream.Send(crashRecord(seq)); err != nil {
				return
			}
			mu.Lock()
			sent = seq
			mu.Unlock()
		}
	}()
	testkit.WaitFor(t, 60*time.Second, "3,000 acknowledged records", func() bool { return st.lastAck() >= 3000 })
	if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-p.done
	<-st.recvDone
	acked := st.lastAck()
	mu.Lock()
	maxSent := sent
	mu.Unlock()
	st.close()
	t.Logf("killed with %d records sent and %d acknowledged", maxSent, acked)

	p2 := startProcess(t, bin, dir)
	ts.base = "https://" + p2.https
	a.base = ts.base
	a.client.CloseIdleConnections()
	have := func(upTo uint64) {
		t.Helper()
		for run := uint64(0); run <= (upTo-1)/500; run++ {
			id := fmt.Sprintf("crash-%04d", run)
			req, _ := http.NewRequest("GET", ts.base+"/api/v1/runs/"+id+"/logs", nil)
			req.Header.Set("Authorization", "Bearer "+admin)
			req.Header.Set("Accept", "application/json")
			resp, err := client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			var logs struct{ Chunks []api.LogChunk }
			json.NewDecoder(resp.Body).Decode(&logs)
			resp.Body.Close()
			for i := uint64(0); i < 500 && run*500+i+1 <= upTo; i++ {
				if i >= uint64(len(logs.Chunks)) || logs.Chunks[i].Seq != i || string(logs.Chunks[i].Data) != fmt.Sprintf("record %d\n", run*500+i+1) {
					t.Fatalf("record %d is missing after the crash (run %s has %d chunks)", run*500+i+1, id, len(logs.Chunks))
				}
			}
		}
	}
	have(acked)

	// The agent resumes from its last ack and the rest arrives once.
	st2, err := a.openStream(p2.grpc)
	if err != nil {
		t.Fatal(err)
	}
	defer st2.close()
	for seq := acked + 1; seq <= maxSent; seq++ {
		if err := st2.stream.Send(crashRecord(seq)); err != nil {
			t.Fatal(err)
		}
	}
	if maxSent > acked {
		if err := st2.waitAck(maxSent, 30*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	have(maxSent)

	if err := p2.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-p2.done:
		if p2.err != nil {
			t.Fatalf("drover-server after SIGTERM: %v", p2.err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("drover-server did not stop within 30s of SIGTERM")
	}
	<-st2.recvDone
	if st2.err() == nil {
		t.Fatal("the stream did not end when the server stopped")
	}
}

// TestCrashDuringEnrollments kills a real drover-server process with
// SIGKILL while enrollments are being batched, restarts it on the same data
// dir and checks that every enrollment is whole or absent: each answered
// one has its agent and its token used by it, and every token is either
// unused (and still enrolls) or used by an agent that exists.
func TestCrashDuringEnrollments(t *testing.T) {
	bin := buildServer(t)
	dir := filepath.Join(t.TempDir(), "data")
	p := startProcess(t, bin, dir)
	client, admin := adminClient(t, dir)
	ts := &testServer{t: t, admin: admin, base: "https://" + p.https, client: client}

	const n = 120
	toks := make([]string, n)
	for i := range toks {
		toks[i] = ts.token(nil)
	}
	var mu sync.Mutex
	answered := map[int]string{} // token index -> agent id
	next, done := 0, 0
	var wg sync.WaitGroup
	for range 12 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				mu.Lock()
				i := next
				next++
				mu.Unlock()
				if i >= n {
					return
				}
				a, err := enroll(ts.base, toks[i], fmt.Sprintf("crash-%d", i))
				if err != nil {
					return // the server died
				}
				a.close()
				mu.Lock()
				answered[i] = a.id
				done++
				mu.Unlock()
			}
		}()
	}
	testkit.WaitFor(t, 60*time.Second, "20 enrollments answered", func() bool { mu.Lock(); defer mu.Unlock(); return done >= 20 })
	if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-p.done
	wg.Wait()
	t.Logf("killed with %d of %d enrollments answered", len(answered), n)

	p2 := startProcess(t, bin, dir)
	ts.base = "https://" + p2.https
	client.CloseIdleConnections()
	var list api.EnrollmentTokenList
	ts.adminOK("GET", "/api/v1/enrollment-tokens?limit=1000", nil, &list)
	byID := map[string]api.EnrollmentToken{}
	for _, tk := range list.Tokens {
		byID[tk.ID] = tk
	}
	var agents struct{ Agents []api.Agent }
	ts.adminOK("GET", "/api/v1/agents?limit=1000", nil, &agents)
	exists := map[string]bool{}
	for _, a := range agents.Agents {
		exists[a.ID] = true
	}
	used := 0
	for i, tok := range toks {
		tk, ok := byID[strings.Split(tok, ".")[1]]
		if !ok {
			t.Fatalf("token %d is gone", i)
		}
		if id, ok := answered[i]; ok && tk.AgentID != id {
			t.Fatalf("enrollment %d was answered with agent %s but its token names %q", i, id, tk.AgentID)
		}
		switch {
		case tk.UsedAt != nil:
			used++
			if tk.AgentID == "" || !exists[tk.AgentID] {
				t.Fatalf("token %d is used but its agent %q does not exist", i, tk.AgentID)
			}
		case tk.AgentID != "":
			t.Fatalf("token %d names agent %s but is unused", i, tk.AgentID)
		default:
			a, err := enroll(ts.base, tok, fmt.Sprintf("crash-%d", i))
			if err != nil {
				t.Fatalf("token %d was not used before the crash but does not enroll after it: %v", i, err)
			}
			a.close()
		}
	}
	if used != len(agents.Agents) {
		t.Fatalf("%d tokens used, %d agents: an agent without its token", used, len(agents.Agents))
	}
}
