package server

import (
	"math"
	"net"
	"net/http"
	"os"
	"sync/atomic"
	"syscall"
)

// The process's open-files limit is shared by every connection of both
// listeners, the store's files and the logs. A fleet whose agents each hold
// a stream can fill it on its own (19,500 streams under a 20,000-file
// limit), and a server out of descriptors accepts nothing at all, not even
// the operator who has come to see why. fdBudget keeps descriptors back:
//
//   - below pressFDReserve free descriptors every HTTPS answer closes its
//     connection and connections that go idle are closed, so agents' polls
//     and fetches (and an operator's) hold a descriptor only while they are
//     served instead of for the clients' idle timeout; this starts well
//     before any connection is refused;
//   - the stream listener refuses a new connection (closes it as soon as it
//     is accepted) when fewer than streamFDReserve descriptors would be left,
//     so agents' streams never take what HTTPS needs;
//   - HTTPS refuses one only when fewer than httpFDReserve would be left.
//
// A refused agent reconnects with its back-off (a stream to another replica
// if it knows several). Refusals are counted in
// drover_listener_accept_errors_total{reason="fd_reserve"} and logged at
// warn with the failed accepts. Under a generous limit (the packaged units
// set LimitNOFILE=524288) none of this ever acts.
type fdBudget struct {
	limit int64        // RLIMIT_NOFILE when the server started (Go raises the soft limit to the hard one)
	base  int64        // descriptors open before the listeners accepted anything, and PostgreSQL's pool
	open  atomic.Int64 // connections accepted on either listener and not yet closed
	press int64        // pressFDReserve (a test sets another)
}

const (
	pressFDReserve  = 512
	streamFDReserve = 128
	httpFDReserve   = 16
)

// newFDBudget reads the limit and counts the descriptors open now (the
// store, the logs, the listeners themselves).
func newFDBudget() *fdBudget {
	b := &fdBudget{limit: math.MaxInt64, press: pressFDReserve}
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err == nil && rl.Cur < math.MaxInt64 {
		b.limit = int64(rl.Cur)
	}
	if fds, err := os.ReadDir("/proc/self/fd"); err == nil {
		b.base = int64(len(fds))
	}
	return b
}

// free is how many descriptors are left by the budget's count.
func (b *fdBudget) free() int64 { return b.limit - b.base - b.open.Load() }

// pressed says HTTPS connections should not be kept open between requests.
func (b *fdBudget) pressed() bool { return b.free() < b.press }

// admit counts a newly accepted connection if at least reserve descriptors
// stay free, and returns it wrapped so that its Close gives the descriptor
// back; it returns nil when the connection must be refused.
func (b *fdBudget) admit(c net.Conn, reserve int64) net.Conn {
	if b.open.Add(1); b.free() < reserve {
		b.open.Add(-1)
		return nil
	}
	return &budgetConn{Conn: c, b: b}
}

// budgetConn gives its descriptor back to the budget on its first Close.
type budgetConn struct {
	net.Conn
	b      *fdBudget
	closed atomic.Bool
}

func (c *budgetConn) Close() error {
	if c.closed.CompareAndSwap(false, true) {
		c.b.open.Add(-1)
	}
	return c.Conn.Close()
}

// closeWhenPressed makes every answer close its connection while the
// budget is pressed.
func (b *fdBudget) closeWhenPressed(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if b.pressed() {
			w.Header().Set("Connection", "close")
		}
		h.ServeHTTP(w, r)
	})
}

// closeIdleWhenPressed is for http.Server.ConnState: a connection that goes
// idle while the budget is pressed is closed (one kept alive from before).
func (b *fdBudget) closeIdleWhenPressed(c net.Conn, st http.ConnState) {
	if st == http.StateIdle && b.pressed() {
		c.Close()
	}
}
