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
