package agent

import (
	"context"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/drover/drover/internal/testkit"
	"github.com/drover/drover/manifest"
)

// TestControlSocket: `status` and `sync` over the local socket, whose
// directory is 0700 and the socket itself 0600.
func TestControlSocket(t *testing.T) {
	srv := newFakeServer(t)
	ta, agentID := enrolledAgent(t, srv)
	sock := ta.cfg.SocketPath()

	fi, err := os.Lstat(sock)
	must(t, err)
	if fi.Mode().Type() != os.ModeSocket || fi.Mode().Perm() != 0o600 {
		t.Fatalf("socket mode %v", fi.Mode())
	}
	di, err := os.Stat(filepath.Dir(sock))
	must(t, err)
	if di.Mode().Perm() != 0o700 {
		t.Fatalf("socket dir mode %v", di.Mode().Perm())
	}

	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	st, err := QueryStatus(ctx, sock)
	must(t, err)
	if !st.Enrolled || st.AgentID != agentID || st.Backend != "cron" || st.Server != srv.URL() || !st.StreamConnected {
		t.Fatalf("status %+v", st)
	}

	p, b := testPipe(t, "viasocket", "@hourly", "true", 1)
	// Publish without the stream's SyncNow: only `sync` can make the agent pull.
	// The agent counts its stream connected before the server has read its
	// Hello and registered it, so wait for that first: a stream registered
	// after the delete would carry the SyncNow.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		srv.mu.Lock()
		registered := srv.streams[agentID] != nil
		if registered {
			delete(srv.streams, agentID)
		}
		srv.mu.Unlock()
		if registered {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the server never registered the agent's stream")
		}
	}
	srv.publish(agentID, []manifest.Pipe{p}, b)
	res, err := TriggerSync(ctx, sock)
	must(t, err)
	if res.Outcome != OutcomeApplied || res.Serial != 1 {
		t.Fatalf("sync %+v", res)
	}
	st, err = QueryStatus(ctx, sock)
	must(t, err)
	if st.Serial != 1 || st.AppliedSerial != 1 || len(st.Pipes) != 1 || st.Pipes[0].Name != "viasocket" || st.Pipes[0].NextRun.IsZero() || st.LastSync.IsZero() {
		t.Fatalf("status after sync %+v", st)
	}

	// A second daemon on the same data dir is refused; the first keeps its socket.
	if _, err := listenControl(sock); err == nil || !strings.Contains(err.Error(), "in use") {
		t.Fatalf("second listener: %v", err)
	}
	if _, err := QueryStatus(ctx, sock); err != nil {
		t.Fatal(err)
	}

	ta.stop()
	if _, err := QueryStatus(ctx, sock); !errors.Is(err, ErrNoDaemon) {
		t.Fatalf("status without a daemon: %v", err)
	}
}

// TestControlSocketStale: a socket left by a killed daemon is replaced.
func TestControlSocketStale(t *testing.T) {
	dir := testkit.ShortTempDir(t, "dra")
	sock := filepath.Join(dir, "c", "agent.sock")
	must(t, os.MkdirAll(filepath.Dir(sock), 0o700))
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: sock, Net: "unix"})
	must(t, err)
	ln.SetUnlinkOnClose(false)
	ln.Close() // the file stays, nothing listens
	ln2, err := listenControl(sock)
	must(t, err)
	ln2.Close()
	// Something that is not a socket is never removed.
	must(t, os.WriteFile(sock, []byte("x"), 0o600))
	if _, err := listenControl(sock); err == nil {
		t.Fatal("replaced a regular file")
	}
}

// TestControlSocketOtherUser: another user can neither reach the socket
// nor, if it could, would be served.
func TestControlSocketOtherUser(t *testing.T) {
	if os.Getenv("DROVER_TEST_DIAL") != "" {
		return // the child half runs in TestHelperDial
	}
	if os.Geteuid() != 0 {
		testkit.Unavailable(t, "needs root to run a process as another user")
	}
	cfg := testConfig(t, nil)
	ta := startAgent(t, cfg, nil)
	sock := cfg.SocketPath()
	testkit.WaitFor(t, 5*time.Second, "the socket", func() bool { _, err := os.Stat(sock); return err == nil })
	// Make the path traversable (the data dir's parent is a 0700 temp dir)
	// so that only the socket's own directory and mode stand in the way.
	must(t, os.Chmod(filepath.Dir(cfg.DataDir), 0o755))
	must(t, os.Chmod(cfg.DataDir, 0o755))
	out, err := runAsNobody(t, sock)
	if err == nil {
		t.Fatalf("another user reached the control socket: %s", out)
	}
	if !strings.Contains(out, "permission denied") {
		t.Fatalf("unexpected failure: %v: %s", err, out)
	}
	// Even with the directory open, the 0600 socket refuses the connection.
	must(t, os.Chmod(filepath.Dir(sock), 0o755))
	out, err = runAsNobody(t, sock)
	if err == nil || !strings.Contains(out, "permission denied") {
		t.Fatalf("socket mode did not refuse another user: %v: %s", err, out)
	}
	// And with the socket open too, the daemon checks the peer's uid.
	must(t, os.Chmod(sock, 0o666))
	out, err = runAsNobody(t, sock)
	if err == nil || !strings.Contains(out, "permission denied") {
		t.Fatalf("the daemon served another user: %v: %s", err, out)
	}
	_ = ta
}

func runAsNobody(t *testing.T, sock string) (string, error) {
	t.Helper()
	// The test binary's own directory is private: run a copy.
	dir := testkit.ShortTempDir(t, "dra")
	must(t, os.Chmod(dir, 0o755))
	bin := filepath.Join(dir, "helper")
	data, err := os.ReadFile(os.Args[0])
	must(t, err)
	must(t, os.WriteFile(bin, data, 0o755))
	cmd := exec.Command(bin, "-test.run=^TestHelperDial$", "-test.v")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "DROVER_TEST_DIAL="+sock)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	out, err := cmd.CombinedOutput()
	if err != nil && strings.Contains(string(out), "DIAL-OK") {
		err = nil
	}
	return string(out), err
}

// TestHelperDial is the child process of TestControlSocketOtherUser.
func TestHelperDial(t *testing.T) {
	sock := os.Getenv("DROVER_TEST_DIAL")
	if sock == "" {
		t.Skip("helper")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	st, err := QueryStatus(ctx, sock)
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	t.Logf("DIAL-OK %+v", st)
}
