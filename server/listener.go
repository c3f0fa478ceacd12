package server

import (
	"errors"
	"log/slog"
	"net"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// acceptWarnEvery is how often a listener logs failed accepts at most; the
// ones in between are counted and reported with the next line.
const acceptWarnEvery = 10 * time.Second

// watchedListener counts and logs (at warn, rate-limited) the errors of
// Accept. It returns every error unchanged: net/http and gRPC retry
// temporary ones (EMFILE and ENFILE among them) with a back-off, so a server
// out of file descriptors keeps serving the connections it holds.
type watchedListener struct {
	net.Listener
	name       string
	fdLimit    prometheus.Counter
	other      prometheus.Counter
	log        *slog.Logger
	now        func() time.Time
	mu         sync.Mutex
	lastWarn   time.Time
	unlogged   int
	everWarned bool
}

func newWatchedListener(ln net.Listener, name string, errs *prometheus.CounterVec, log *slog.Logger) *watchedListener {
	return &watchedListener{Listener: ln, name: name, log: log, now: time.Now,
		fdLimit: errs.WithLabelValues(name, "fd_limit"), other: errs.WithLabelValues(name, "other")}
}

func (l *watchedListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil && !errors.Is(err, net.ErrClosed) {
		l.failed(err)
	}
	return c, err
}

func (l *watchedListener) failed(err error) {
	fds := errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE)
	if fds {
		l.fdLimit.Inc()
	} else {
		l.other.Inc()
	}
	l.mu.Lock()
	now := l.now()
	if l.everWarned && now.Sub(l.lastWarn) < acceptWarnEvery {
		l.unlogged++
		l.mu.Unlock()
		return
	}
	unlogged := l.unlogged
	l.everWarned, l.lastWarn, l.unlogged = true, now, 0
	l.mu.Unlock()
	msg := "accept failed"
	if fds {
		msg = "accept failed: out of file descriptors (raise LimitNOFILE)"
	}
	l.log.Warn(msg, "listener", l.name, "err", err, "unlogged_since_last", unlogged)
}
