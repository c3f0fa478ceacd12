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
