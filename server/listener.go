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
// out of file descriptors keeps serving the connections it holds. With a
// budget it also refuses, the same way, a connection that would leave fewer
// than reserve descriptors free (fdbudget.go).
type watchedListener struct {
	net.Listener
	name       string
	budget     *fdBudget
	reserve    int64
	fdLimit    prometheus.Counter
	fdReserve  prometheus.Counter
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
		fdLimit: errs.WithLabelValues(name, "fd_limit"), fdReserve: errs.WithLabelValues(name, "fd_reserve"),
		other: errs.WithLabelValues(name, "other")}
}

// withBudget makes the listener count its connections in b and refuse one
// that would leave fewer than reserve descriptors free.
func (l *watchedListener) withBudget(b *fdBudget, reserve int64) *watchedListener {
	l.budget, l.reserve = b, reserve
	return l
}

// errFDReserve is what a refused connection is logged with.
var errFDReserve = errors.New("connection refused: it would take one of the file descriptors kept for the operator API and the store")

func (l *watchedListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			if !errors.Is(err, net.ErrClosed) {
				l.failed(err)
			}
			return c, err
		}
		if l.budget == nil {
			return c, nil
		}
		if bc := l.budget.admit(c, l.reserve); bc != nil {
			return bc, nil
		}
		c.Close()
		l.failed(errFDReserve)
	}
}

func (l *watchedListener) failed(err error) {
	fds := errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE)
	switch {
	case errors.Is(err, errFDReserve):
		l.fdReserve.Inc()
	case fds:
		l.fdLimit.Inc()
	default:
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
	switch {
	case errors.Is(err, errFDReserve):
		msg = "connection refused: the file descriptors left are kept for the operator API (raise LimitNOFILE)"
	case fds:
		msg = "accept failed: out of file descriptors (raise LimitNOFILE)"
	}
	l.log.Warn(msg, "listener", l.name, "err", err, "unlogged_since_last", unlogged)
}
