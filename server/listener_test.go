package server

import (
	"bytes"
	"errors"
	"log/slog"
	"net"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"io"

	"github.com/drover/drover/internal/testkit"
)

// failingListener returns its errors from Accept, then net.ErrClosed. Running
// a real server out of file descriptors is slow and would starve the other
// tests of the process, so EMFILE is injected here.
type failingListener struct {
	net.Listener
	errs []error
}

func (l *failingListener) Accept() (net.Conn, error) {
	if len(l.errs) == 0 {
		return nil, net.ErrClosed
	}
	err := l.errs[0]
	l.errs = l.errs[1:]
	return nil, err
}

func TestWatchedListenerCountsAndLogsAcceptErrors(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelWarn}))
	errs := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "x"}, []string{"listener", "reason"})
	emfile := &net.OpError{Op: "accept", Net: "tcp", Err: os.NewSyscallError("accept4", syscall.EMFILE)}
	fake := &failingListener{errs: []error{emfile, emfile, errors.New("boom"), emfile}}
	l := newWatchedListener(fake, "grpc", errs, log)
	now := time.Unix(1000, 0)
	l.now = func() time.Time { return now }

	for i := 0; i < 3; i++ {
		if _, err := l.Accept(); err == nil {
			t.Fatal("Accept hid the error")
		} else if i == 0 && !errors.Is(err, syscall.EMFILE) {
			t.Fatalf("error not returned unchanged: %v", err)
		}
	}
	now = now.Add(acceptWarnEvery)
	if _, err := l.Accept(); !errors.Is(err, syscall.EMFILE) {
		t.Fatal(err)
	}
	if _, err := l.Accept(); !errors.Is(err, net.ErrClosed) {
		t.Fatal(err)
	}
	if got := counterValue(errs.WithLabelValues("grpc", "fd_limit")); got != 3 {
		t.Fatalf("fd_limit count %v, want 3", got)
	}
	if got := counterValue(errs.WithLabelValues("grpc", "other")); got != 1 {
		t.Fatalf("other count %v, want 1 (a closed listener is not counted)", got)
	}
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 2 {
		t.Fatalf("want 2 rate-limited warnings, got %d:\n%s", len(lines), buf.String())
	}
	for i, want := range []string{"unlogged_since_last=0", "unlogged_since_last=2"} {
		if !strings.Contains(lines[i], "level=WARN") || !strings.Contains(lines[i], "out of file descriptors") ||
			!strings.Contains(lines[i], "listener=grpc") || !strings.Contains(lines[i], want) {
			t.Fatalf("line %d: %s", i, lines[i])
		}
	}
}

func TestAcceptErrorsOnMetrics(t *testing.T) {
	ts := startServer(t)
	if !strings.Contains(ts.scrape(ts.admin), `drover_listener_accept_errors_total{listener="https",reason="fd_limit"} 0`) {
		t.Fatal("accept error series missing")
	}
	ts.s.grpcLn.(*watchedListener).failed(syscall.EMFILE)
	if m := ts.scrape(ts.admin); !strings.Contains(m, `drover_listener_accept_errors_total{listener="grpc",reason="fd_limit"} 1`) {
		t.Fatalf("grpc accept error not counted:\n%s", m)
	}
}

func counterValue(c prometheus.Counter) float64 {
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		panic(err)
	}
	return m.GetCounter().GetValue()
}

// TestFDReserveKeepsOperatorAPI: agents' streams cannot take the file
// descriptors HTTPS needs, and HTTPS stops keeping connections open between
// requests when few are left. Running the server's process into a real
// 20,000-file limit would starve every other test of the process, so the
// budget's limit is set low here; the listeners, the connections and the
// requests are real.
func TestFDReserveKeepsOperatorAPI(t *testing.T) {
	cfg := testConfig(t.TempDir())
	clock := &testkit.Clock{}
	s, err := New(cfg, testLogger(t), clock)
	if err != nil {
		t.Fatal(err)
	}
	const streams = 10
	s.fds.limit = s.fds.base + streamFDReserve + streams
	s.fds.press = streamFDReserve + streams/2 // pressed once the streams are full, not before
	ts := runTestServer(t, s, cfg, clock)
	waitOpen := func(want int64) {
		t.Helper()
		for deadline := time.Now().Add(5 * time.Second); s.fds.open.Load() != want; {
			if time.Now().After(deadline) {
				t.Fatalf("budget counts %d open connections, want %d", s.fds.open.Load(), want)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	// The operator's first request, on a kept-alive connection.
	res, err := ts.client.Get(ts.base + "/healthz")
	if err != nil || res.StatusCode != 200 || res.Close {
		t.Fatalf("healthz before: %v %v", res, err)
	}
	res.Body.Close()
	ts.client.CloseIdleConnections()
	waitOpen(0)

	// A flood of stream connections: streams of them are held, the rest
	// refused at once.
	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	refused := 0
	for i := 0; i < streams+15; i++ {
		c, err := net.Dial("tcp", s.GRPCAddr())
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
	}
	eofs := make(chan bool, len(conns))
	for _, c := range conns {
		go func() {
			c.SetReadDeadline(time.Now().Add(time.Second))
			_, err := c.Read(make([]byte, 1))
			eofs <- err == io.EOF
		}()
	}
	for range conns {
		if <-eofs {
			refused++
		}
	}
	if refused != 15 {
		t.Fatalf("%d of %d stream connections refused, want 15", refused, len(conns))
	}
	waitOpen(streams)
	if got := counterValue(s.metrics.acceptErrors.WithLabelValues("grpc", "fd_reserve")); got != 15 {
		t.Fatalf("grpc fd_reserve count %v, want 15", got)
	}

	// The operator API still answers. With the streams at their limit
	// fewer than pressFDReserve descriptors are left (HTTPS sheds its idle
	// connections before any stream is refused): every answer closes its
	// connection.
	if !s.fds.pressed() {
		t.Fatalf("budget not pressed with %d free", s.fds.free())
	}
	res, err = ts.client.Get(ts.base + "/healthz")
	if err != nil || res.StatusCode != 200 || !res.Close {
		t.Fatalf("healthz with the streams full: %v %v", res, err)
	}
	res.Body.Close()
	waitOpen(streams) // the request's connection is closed again
	idle := 0

	// HTTPS itself keeps the last httpFDReserve descriptors.
	more := int(s.fds.free()) - httpFDReserve
	for i := 0; i < more+3; i++ {
		c, err := net.Dial("tcp", s.HTTPAddr())
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
	}
	waitOpen(streams + int64(idle+more))
	for deadline := time.Now().Add(5 * time.Second); counterValue(s.metrics.acceptErrors.WithLabelValues("https", "fd_reserve")) != 3; {
		if time.Now().After(deadline) {
			t.Fatalf("https fd_reserve count %v, want 3", counterValue(s.metrics.acceptErrors.WithLabelValues("https", "fd_reserve")))
		}
		time.Sleep(10 * time.Millisecond)
	}

	// Once the connections are gone the budget is whole again.
	for _, c := range conns {
		c.Close()
	}
	conns = nil
	waitOpen(0)
	res, err = ts.client.Get(ts.base + "/healthz")
	if err != nil || res.StatusCode != 200 || res.Close {
		t.Fatalf("healthz after: %v %v", res, err)
	}
	res.Body.Close()
}
