package agent

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/net/http/httpproxy"
	"golang.org/x/sys/unix"

	"google.golang.org/grpc"
	grpcbackoff "google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	agentpb "github.com/drover/drover/proto"
)

// Stream tuning.
const (
	// sendWindow bounds the records sent but not yet acknowledged.
	sendWindow = 1024
	// pendingBatch is how many outbox records are read at a time.
	pendingBatch = 256
	// streamHealthy is how long a stream must have lived for the reconnect
	// backoff to start over.
	streamHealthy = 30 * time.Second
)

// errReconnect ends a stream whose identity was replaced.
var errReconnect = errors.New("identity replaced")

// streamLoop keeps the telemetry stream open, reconnecting with backoff and
// jitter, until ctx is done. A stream that fails moves the agent to the
// next replica (replicas.go): at once, give or take failoverJitter, while
// some replica has not been tried since the last healthy stream; with the
// backoff once every replica failed in a row.
func (a *Agent) streamLoop(ctx context.Context) {
	bo := newBackoff(time.Second, a.cfg.MaxBackoff)
	streak := 0 // failed streams since the last healthy one
	for {
		start := time.Now()
		idx, addr, err := a.streamOnce(ctx)
		a.setStreamUp(false)
		if ctx.Err() != nil {
			return
		}
		if errors.Is(err, errReconnect) {
			a.log.Info("stream closed to reconnect with the new identity")
			bo.reset()
			streak = 0
			continue
		}
		a.noteAuth(err) // a refusal marks the identity as lost (reenroll.go)
		if time.Since(start) > streamHealthy {
			bo.reset()
			streak = 0
		}
		streak++
		rs := a.replicaSet()
		moved := rs.grpcFailed(idx)
		_, n := rs.count()
		d := retryDelay(streak, n, bo)
		if moved {
			_, next := rs.grpcAddr()
			a.log.Warn("stream closed; failing over to the next replica", "grpc", addr, "err", err, "next", next, "retry_in", d.Round(time.Millisecond))
		} else {
			a.log.Warn("stream closed; reconnecting", "grpc", addr, "err", err, "retry_in", d.Round(time.Millisecond))
		}
		t := time.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-a.reconnectCh:
			bo.reset()
			streak = 0
		case <-t.C:
		}
		t.Stop()
	}
}

// replicaSet is the agent's replica view (set with the identity).
func (a *Agent) replicaSet() *replicas {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.replicas
}

// dialStream connects to addr and waits until the connection is ready,
// at most connectTimeout: a replica that accepts connections and then
// stays silent (a blackhole) fails here instead of holding the stream.
// With watch (more than one replica to go to) the connection is dialled
// by streamDialer.
func (a *Agent) dialStream(ctx context.Context, id *Identity, addr string, watch bool) (*grpc.ClientConn, error) {
	if _, _, err := net.SplitHostPort(addr); err != nil {
		return nil, fmt.Errorf("grpc_addr %q: %w", addr, err)
	}
	creds := credentials.NewTLS(mtlsConfig("", id.caPool, a.currentCert))
	opts := []grpc.DialOption{
		grpc.WithTransportCredentials(creds),
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: agentpb.StreamKeepalive, Timeout: streamKeepaliveWait, PermitWithoutStream: true}),
		grpc.WithConnectParams(grpc.ConnectParams{Backoff: grpcbackoff.DefaultConfig, MinConnectTimeout: connectTimeout}),
		grpc.WithUserAgent("drover-agent/" + Version),
		// A SyncNow may carry the manifest (at most
		// MaxSyncNowManifestBytes); nothing else the server sends is large.
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(agentpb.MaxServerMessageBytes)),
		// Fixed windows: no bandwidth-estimator PING after each message.
		grpc.WithStaticStreamWindowSize(agentpb.StreamWindowBytes),
		grpc.WithStaticConnWindowSize(agentpb.StreamWindowBytes),
	}
	if d := streamDialer(addr); watch && d != nil {
		opts = append(opts, grpc.WithContextDialer(d))
	}
	conn, err := grpc.NewClient(addr, opts...)
	if err != nil {
		return nil, err
	}
	cctx, cancel := context.WithTimeout(ctx, connectTimeout)
	defer cancel()
	conn.Connect()
	for {
		st := conn.GetState()
		if st == connectivity.Ready {
			return conn, nil
		}
		if st == connectivity.TransientFailure && cctx.Err() == nil {
			// The first attempt failed (refused, TLS): no point waiting
			// for gRPC's own retry while another replica may answer.
			conn.Close()
			return nil, fmt.Errorf("connect %s: %w", addr, errConnect)
		}
		if !conn.WaitForStateChange(cctx, st) {
			conn.Close()
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			return nil, fmt.Errorf("connect %s: no connection within %s", addr, connectTimeout)
		}
	}
}

// errUnresponsive ends a stream whose server stopped answering.
var errUnresponsive = errors.New("the server stopped answering (liveness probe timed out)")

// Liveness probe. gRPC's keepalive pings no more often than every 10 s,
// so a replica that stops answering without closing its connections (a
// host off the network, a wedged process) would hold the stream for 13 s
// or more. Where the agent knows more than one stream address it watches
// for that in two ways, both cheap for the server at fleet scale:
//
//   - While a record it sent is not acknowledged and the server has sent
//     nothing for probeIdle, the agent sends a small unary call on the
//     same connection (the standard health check; a server without the
//     health service answers Unimplemented, which proves it alive just as
//     well) and gives up on the stream when no answer comes within
//     probeTimeout. Records are what a dead replica loses the agent time
//     on (their acks stop), and an agent with nothing outstanding sends no
//     probe at all: at rest the fleet costs the server no probes (one
//     every ~4 s per agent cost ~0.013% of a core each per second, ~63% of
//     a core at 19,500 agents). Heartbeats are not answered by the server
//     and do not count.
//   - The stream's TCP connection has kernel keepalive (streamTCPIdle,
//     then every streamTCPInterval) and a user timeout (streamTCPTimeout):
//     a peer host that stops answering is noticed within the timeout
//     while nothing is sent, and the probes are answered by the server's
//     kernel without waking the server.
//
// What neither notices within the failover bound is a server process that
// hangs while its host still answers and the agent has nothing to send:
// that is gRPC's keepalive (a ping after agentpb.StreamKeepalive, 2 min,
// without reads, 3 s to answer), or the first record the agent sends.
const (
	probeIdle    = 3 * time.Second
	probeTick    = time.Second
	probeTimeout = 3 * time.Second

	streamTCPIdle     = 4 * time.Second
	streamTCPInterval = time.Second
	streamTCPTimeout  = 7 * time.Second
)

// streamClock holds the times of the last message received on a stream
// and the last record sent (unix nanos).
type streamClock struct {
	recv, sent atomic.Int64
}

func (c *streamClock) received() { c.recv.Store(time.Now().UnixNano()) }
func (c *streamClock) wrote()    { c.sent.Store(time.Now().UnixNano()) }

// probeDue reports whether a probe is due at now: a record was sent after
// the last message received, and nothing was received for probeIdle.
func probeDue(lastRecv, lastSent, now time.Time) bool {
	return lastSent.After(lastRecv) && now.Sub(lastRecv) >= probeIdle
}

// probeStream probes conn until ctx ends; it cancels the stream with
// errUnresponsive when a probe goes unanswered.
func probeStream(ctx context.Context, conn *grpc.ClientConn, clock *streamClock, cancel context.CancelCauseFunc) {
	t := time.NewTicker(probeTick)
	defer t.Stop()
	hc := healthpb.NewHealthClient(conn)
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if !probeDue(time.Unix(0, clock.recv.Load()), time.Unix(0, clock.sent.Load()), time.Now()) {
			continue
		}
		pctx, pcancel := context.WithTimeout(ctx, probeTimeout)
		_, err := hc.Check(pctx, &healthpb.HealthCheckRequest{})
		pcancel()
		if ctx.Err() != nil {
			return
		}
		if code := status.Code(err); code == codes.DeadlineExceeded || code == codes.Unavailable {
			cancel(fmt.Errorf("%w: %v", errUnresponsive, err))
			return
		}
		clock.received()
	}
}

// streamDialer dials the stream's TCP connection with kernel keepalive and
// a user timeout (see the liveness probe above), or is nil when a proxy
// is configured for addr (gRPC's own dialer goes through the proxy; a
// custom one would bypass it).
func streamDialer(addr string) func(context.Context, string) (net.Conn, error) {
	// Read now (http.ProxyFromEnvironment reads the environment once).
	if u, err := httpproxy.FromEnvironment().ProxyFunc()(&url.URL{Scheme: "https", Host: addr}); err != nil || u != nil {
		return nil
	}
	d := &net.Dialer{
		Timeout:         connectTimeout,
		KeepAliveConfig: net.KeepAliveConfig{Enable: true, Idle: streamTCPIdle, Interval: streamTCPInterval, Count: int(streamTCPTimeout / streamTCPInterval)},
		Control: func(_, _ string, rc syscall.RawConn) error {
			var serr error
			err := rc.Control(func(fd uintptr) {
				serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT, int(streamTCPTimeout.Milliseconds()))
			})
			return cmp.Or(err, serr)
		},
	}
	return func(ctx context.Context, addr string) (net.Conn, error) { return d.DialContext(ctx, "tcp", addr) }
}

// errConnect: a stream address refused the connection or its handshake.
var errConnect = errors.New("connection failed")

// setStreamUp records the stream's state; a change wakes the sync loop,
// whose poll interval depends on it.
func (a *Agent) setStreamUp(up bool) {
	a.mu.Lock()
	changed := a.streamUp != up
	a.streamUp = up
	a.mu.Unlock()
	if changed {
		select {
		case a.streamChanged <- struct{}{}:
		default:
		}
	}
}

// streamConnected reports whether the stream is up.
func (a *Agent) streamConnected() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.streamUp
}

// streamOnce runs one stream: Hello, then the outbox in order and a
// heartbeat, while a receiver handles acks and commands. It returns when
// the stream breaks or ctx is done.
func (a *Agent) streamOnce(ctx context.Context) (idx int, addr string, err error) {
	id := a.identity()
	rs := a.replicaSet()
	idx, addr = rs.grpcAddr()
	_, n := rs.count()
	conn, err := a.dialStream(ctx, id, addr, n > 1)
	if err != nil {
		return idx, addr, err
	}
	defer conn.Close()
	return idx, addr, a.runStream(ctx, conn, rs, idx, addr)
}

// runStream runs one stream on conn (address idx of rs).
func (a *Agent) runStream(ctx context.Context, conn *grpc.ClientConn, rs *replicas, idx int, addr string) error {
	sctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stream, err := agentpb.NewAgentClient(conn).AgentStream(sctx)
	if err != nil {
		return err
	}
	if err := stream.Send(a.hello()); err != nil {
		return fmt.Errorf("send hello: %w", err)
	}

	var acked atomic.Uint64
	clock := &streamClock{}
	clock.received()
	ackCh := make(chan struct{}, 1)
	recvErr := make(chan error, 1)
	go func() { recvErr <- a.receive(ctx, stream, &acked, ackCh, clock) }()
	if _, n := rs.count(); n > 1 {
		// Only where there is another replica to go to: a lone server
		// (or one name for all) is left to gRPC's keepalive.
		go probeStream(sctx, conn, clock, cancel)
	}
	a.setStreamUp(true)
	rs.grpcOK(idx)
	a.log.Info("stream connected", "grpc", addr)

	// cause prefers the probe's verdict to the error it provoked.
	cause := func(err error) error {
		if c := context.Cause(sctx); errors.Is(c, errUnresponsive) {
			return c
		}
		return err
	}
	hb := time.NewTicker(a.cfg.HeartbeatInterval)
	defer hb.Stop()
	var lastSent uint64
	for {
		if err := a.sendPending(stream, &lastSent, &acked, clock); err != nil {
			return cause(err)
		}
		select {
		case <-ctx.Done():
			_ = stream.CloseSend()
			return ctx.Err()
		case <-sctx.Done():
			return cause(sctx.Err())
		case err := <-recvErr:
			return cause(err)
		case <-a.reconnectCh:
			_ = stream.CloseSend()
			return errReconnect
		case <-a.outboxCh:
		case <-ackCh:
		case <-hb.C:
			if err := stream.Send(a.heartbeat(ctx)); err != nil {
				return cause(fmt.Errorf("send heartbeat: %w", err))
			}
		}
	}
}

// receive reads the server's messages until the stream fails: acks delete
// outbox records (acked, and a signal on ackCh, let the sender move its
// window), commands are handled.
func (a *Agent) receive(ctx context.Context, stream agentpb.Agent_AgentStreamClient, acked *atomic.Uint64, ackCh chan<- struct{}, clock *streamClock) error {
	for {
		msg, err := stream.Recv()
		if err != nil {
			return err
		}
		clock.received()
		ack := msg.GetAck()
		if ack == nil {
			a.handleCommand(ctx, msg)
			continue
		}
		if err := a.store.Ack(ack.GetSeq()); err != nil {
			a.log.Error("outbox ack", "seq", ack.GetSeq(), "err", err)
			continue
		}
		if ack.GetSeq() > acked.Load() {
			acked.Store(ack.GetSeq())
		}
		select {
		case ackCh <- struct{}{}:
		default:
		}
	}
}

// sendPending sends the outbox records after *lastSent (or the last
// acked), in order, while fewer than sendWindow are unacknowledged.
func (a *Agent) sendPending(stream agentpb.Agent_AgentStreamClient, lastSent *uint64, acked *atomic.Uint64, clock *streamClock) error {
	for *lastSent < acked.Load()+sendWindow {
		msgs, err := a.store.Pending(max(*lastSent, acked.Load()), pendingBatch)
		if err != nil {
			return fmt.Errorf("outbox: %w", err)
		}
		if len(msgs) == 0 {
			return nil
		}
		for _, m := range msgs {
			if err := stream.Send(m); err != nil {
				return fmt.Errorf("send: %w", err)
			}
			clock.wrote()
			*lastSent = m.GetSeq()
		}
	}
	return nil
}

// hello is the first message of every stream.
func (a *Agent) hello() *agentpb.AgentMessage {
	ms, _ := a.manifestState()
	h := &agentpb.Hello{
		AgentVersion:   a.host.AgentVersion,
		Os:             a.host.OS,
		Arch:           a.host.Arch,
		Hostname:       a.host.Hostname,
		Backend:        a.backend.Name(),
		Scope:          a.cfg.Scope,
		SystemdVersion: a.systemdVersion(),
		ManifestSerial: ms.Serial,
		ManifestDigest: ms.Digest,
		MachineId:      a.host.MachineID,
	}
	return &agentpb.AgentMessage{Body: &agentpb.AgentMessage_Hello{Hello: h}}
}

func (a *Agent) systemdVersion() string {
	if a.backend.Name() != BackendSystemd {
		return ""
	}
	if v, ok := a.backend.(systemdVersioner); ok {
		return v.SystemdVersion()
	}
	return a.sdVersion
}

func (a *Agent) heartbeat(ctx context.Context) *agentpb.AgentMessage {
	hb := &agentpb.Heartbeat{SentAt: timestamppb.New(time.Now())}
	hb.RunningRunIds = a.runningRunIDs(ctx)
	hb.Load1, hb.Load5, hb.Load15 = readLoadAvg(a.loadAvgPath())
	// Every status pass also settles what ended while no signal said so.
	a.kickAccount()
	hb.OutboxRecords, hb.OutboxBytes, _ = a.store.OutboxStats()
	if ms, err := a.manifestState(); err == nil {
		hb.ManifestSerial = ms.Serial // the server nudges an agent left behind
	}
	return &agentpb.AgentMessage{Body: &agentpb.AgentMessage_Heartbeat{Heartbeat: hb}}
}

// handleCommand carries out SyncNow, RunNow and CancelRun.
func (a *Agent) handleCommand(ctx context.Context, msg *agentpb.ServerMessage) {
	switch b := msg.GetBody().(type) {
	case *agentpb.ServerMessage_SyncNow:
		carried := a.pushManifest(b.SyncNow)
		a.log.Info("server asked for a sync", "serial", b.SyncNow.GetSerial(), "manifest_carried", carried)
		a.RequestSync()
	case *agentpb.ServerMessage_RunNow:
		pipe, req := b.RunNow.GetPipe(), b.RunNow.GetRequestId()
		go a.runNow(ctx, pipe, req)
	case *agentpb.ServerMessage_CancelRun:
		run := b.CancelRun.GetRunId()
		go func() {
			if err := a.cancelRun(ctx, run); err != nil {
				a.log.Error("cancel run", "run_id", run, "err", err)
				return
			}
			a.log.Info("run canceled", "run_id", run)
			a.kickSpool()
		}()
	default:
		a.log.Debug("ignoring an unknown server message")
	}
}

// cancelRun finds the pipe a run belongs to and cancels it.
func (a *Agent) cancelRun(ctx context.Context, runID string) error {
	if runID == "" {
		return errors.New("no run id")
	}
	pipe := a.pipeOfRun(runID)
	if pipe == "" {
		if states, err := a.backend.Status(ctx); err == nil {
			for _, s := range states {
				if s.Running && s.RunID == runID {
					pipe = s.Name
				}
			}
		}
	}
	if pipe == "" {
		return fmt.Errorf("run %s is not known to be running", runID)
	}
	return a.backend.Cancel(ctx, pipe, runID)
}

// runningRunIDs returns the ids of the runs in progress on this host: the
// backend's (systemd: the service's InvocationID, which the runner uses as
// its run id) and, for a pipe whose service is running, the runs its runner
// reported started and not yet finished (catch-up runs have their own ids).
func (a *Agent) runningRunIDs(ctx context.Context) []string {
	states, err := a.backend.Status(ctx)
	if err != nil {
		return nil
	}
	running := map[string]bool{}
	seen := map[string]bool{}
	var out []string
	for _, s := range states {
		if !s.Running {
			continue
		}
		running[s.Name] = true
		if s.RunID != "" && !seen[s.RunID] {
			seen[s.RunID] = true
			out = append(out, s.RunID)
		}
	}
	a.mu.Lock()
	for id, pipe := range a.runPipes {
		if running[pipe] && !seen[id] {
			seen[id] = true
			out = append(out, id)
		}
	}
	a.mu.Unlock()
	sort.Strings(out)
	return out
}

func (a *Agent) loadAvgPath() string {
	if a.loadAvg != "" {
		return a.loadAvg
	}
	return "/proc/loadavg"
}

// readLoadAvg reads the 1, 5 and 15 minute load averages (zeros when the
// file cannot be read).
func readLoadAvg(path string) (l1, l5, l15 float64) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, 0, 0
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return 0, 0, 0
	}
	parse := func(s string) float64 {
		v, err := strconv.ParseFloat(s, 64)
		if err != nil || v < 0 {
			return 0
		}
		return v
	}
	return parse(f[0]), parse(f[1]), parse(f[2])
}
