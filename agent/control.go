package agent

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"sort"
	"time"

	"golang.org/x/sys/unix"

	"github.com/drover/drover/agent/lease"
)

// The control socket: `drover-agent status`, `sync` and `enroll` talk to
// the running daemon over a unix socket of mode 0600 in a directory of mode
// 0700, and the daemon also checks the peer's uid (root or its own). The
// protocol is one JSON request line and one JSON response line.

type controlRequest struct {
	Cmd   string `json:"cmd"` // status | sync | enroll
	Token string `json:"token,omitempty"`
}

type controlResponse struct {
	OK     bool        `json:"ok"`
	Error  string      `json:"error,omitempty"`
	Status *Status     `json:"status,omitempty"`
	Sync   *SyncResult `json:"sync,omitempty"`
}

// Status is what `drover-agent status` shows.
type Status struct {
	Version       string `json:"version"`
	Enrolled      bool   `json:"enrolled"`
	EnrollError   string `json:"enroll_error,omitempty"`
	IdentityError string `json:"identity_error,omitempty"` // enrolled, but the identity no longer works (reenroll.go)
	AgentID       string `json:"agent_id,omitempty"`
	// Server and GRPCAddr are the replica the agent talks to now;
	// Replicas every one it knows and since when it uses these.
	Server         string         `json:"server,omitempty"`
	GRPCAddr       string         `json:"grpc_addr,omitempty"`
	Replicas       *ReplicaStatus `json:"replicas,omitempty"`
	CertExpiresAt  time.Time      `json:"cert_expires_at,omitzero"`
	Backend        string         `json:"backend"`
	Scope          string         `json:"scope"`
	SystemdVersion string         `json:"systemd_version,omitempty"`
	Serial         uint64         `json:"serial"`
	Digest         string         `json:"digest,omitempty"`
	AppliedSerial  uint64         `json:"applied_serial"`
	// ManifestExpired: the manifest in force passed its expires_at and the
	// server sent no newer one (a stuck server or a proxy answering 304):
	// its pipes keep running, and the agent retries hard.
	ManifestExpired   bool       `json:"manifest_expired,omitempty"`
	ManifestExpiresAt time.Time  `json:"manifest_expires_at,omitzero"`
	LastSync          time.Time  `json:"last_sync,omitzero"`
	LastSyncError     string     `json:"last_sync_error,omitempty"`
	StreamConnected   bool       `json:"stream_connected"`
	OutboxRecords     uint64     `json:"outbox_records"`
	OutboxBytes       uint64     `json:"outbox_bytes"`
	Pipes             []PipeInfo `json:"pipes"`

	// StreamManifests counts the manifests taken from the stream's SyncNow
	// since the daemon started; StreamManifestsRefused those not used (the
	// agent polled instead).
	StreamManifests        uint64 `json:"stream_manifests"`
	StreamManifestsRefused uint64 `json:"stream_manifests_refused"`
}

// PipeInfo is one pipe in Status.
type PipeInfo struct {
	Name       string    `json:"name"`
	Version    uint64    `json:"version"`
	Enabled    bool      `json:"enabled"`
	NextRun    time.Time `json:"next_run,omitzero"`
	Running    bool      `json:"running"`
	RunID      string    `json:"run_id,omitempty"`
	ApplyError string    `json:"apply_error,omitempty"`
	// DropInsRemoved lists drop-ins found beside the pipe's units and
	// removed at the last sync.
	DropInsRemoved []string    `json:"drop_ins_removed,omitempty"`
	LastResult     string      `json:"last_result,omitempty"` // as the backend saw it
	LastRun        *RunSummary `json:"last_run,omitempty"`    // as reported by the runner

	// ElapseMismatch: after the last apply, the scheduler's next elapse
	// disagreed with the schedule.
	ElapseMismatch string `json:"elapse_mismatch,omitempty"`

	// LeaseUntil is the end of this agent's lease on a held pipe
	// (placement: one); LeaseEnded says it passed unrenewed and the pipe
	// does not run here until a fresh manifest renews it.
	LeaseUntil time.Time `json:"lease_until,omitzero"`
	LeaseEnded bool      `json:"lease_ended,omitempty"`
}

// listenControl creates the control socket: its directory 0700, the socket
// 0600. A stale socket is replaced; a live one means another daemon runs.
func listenControl(path string) (*net.UnixListener, error) {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("control socket: %w", err)
	}
	st, err := os.Lstat(dir)
	if err != nil {
		return nil, fmt.Errorf("control socket: %w", err)
	}
	if !st.IsDir() {
		return nil, fmt.Errorf("control socket: %s is not a directory", dir)
	}
	if sys, ok := st.Sys().(*unix.Stat_t); ok && int(sys.Uid) != os.Geteuid() {
		return nil, fmt.Errorf("control socket: %s is owned by uid %d, not by this agent", dir, sys.Uid)
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		return nil, fmt.Errorf("control socket: %w", err)
	}
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode().Type() != fs.ModeSocket {
			return nil, fmt.Errorf("control socket: %s exists and is not a socket", path)
		}
		if c, err := net.DialTimeout("unix", path, time.Second); err == nil {
			c.Close()
			return nil, fmt.Errorf("control socket: %s is in use: another drover-agent runs with this data dir", path)
		}
		if err := os.Remove(path); err != nil {
			return nil, fmt.Errorf("control socket: remove stale %s: %w", path, err)
		}
	}
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("control socket: %w", err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		ln.Close()
		return nil, fmt.Errorf("control socket: %w", err)
	}
	return ln, nil
}

// serveControl answers control requests until ctx is done.
func (a *Agent) serveControl(ctx context.Context, ln *net.UnixListener) {
	go func() {
		<-ctx.Done()
		ln.Close()
	}()
	for {
		c, err := ln.AcceptUnix()
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return
			}
			a.log.Warn("control socket: accept", "err", err)
			time.Sleep(100 * time.Millisecond)
			continue
		}
		go a.handleControl(ctx, c)
	}
}

// peerAllowed reports whether the peer is root or the agent's own user.
func peerAllowed(c *net.UnixConn) (int, bool) {
	raw, err := c.SyscallConn()
	if err != nil {
		return -1, false
	}
	var cred *unix.Ucred
	var cerr error
	if err := raw.Control(func(fd uintptr) {
		cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil || cerr != nil {
		return -1, false
	}
	uid := int(cred.Uid)
	return uid, uid == 0 || uid == os.Geteuid()
}

func (a *Agent) handleControl(ctx context.Context, c *net.UnixConn) {
	defer c.Close()
	reply := func(r controlResponse) {
		_ = c.SetWriteDeadline(time.Now().Add(10 * time.Second))
		b, _ := json.Marshal(r)
		_, _ = c.Write(append(b, '\n'))
	}
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	line, err := bufio.NewReader(io.LimitReader(c, 64<<10)).ReadBytes('\n')
	if err != nil && len(line) == 0 {
		return
	}
	// The request is read first so that a refused client gets the answer
	// rather than a broken pipe.
	if uid, ok := peerAllowed(c); !ok {
		a.log.Warn("control socket: refused a peer", "uid", uid)
		reply(controlResponse{Error: "permission denied"})
		return
	}
	var req controlRequest
	if err := json.Unmarshal(line, &req); err != nil {
		reply(controlResponse{Error: "bad request: " + err.Error()})
		return
	}
	switch req.Cmd {
	case "status":
		st := a.Status(ctx)
		reply(controlResponse{OK: true, Status: &st})
	case "sync":
		if a.identity() == nil {
			reply(controlResponse{Error: "not enrolled"})
			return
		}
		select {
		case res := <-a.RequestSync():
			reply(controlResponse{OK: res.Outcome != OutcomeError && res.Outcome != OutcomeRejected && res.Outcome != OutcomeApplyFailed, Error: res.Error, Sync: &res})
		case <-ctx.Done():
			reply(controlResponse{Error: "agent stopping"})
		}
	case "enroll":
		if id := a.identity(); id != nil && a.identityProblem() == "" {
			reply(controlResponse{Error: "already enrolled as " + id.AgentID + " (its identity works; a token is used only once it stops working)"})
			return
		}
		call := enrollCall{token: req.Token, reply: make(chan error, 1)}
		select {
		case a.enrollCh <- call:
		case <-ctx.Done():
			reply(controlResponse{Error: "agent stopping"})
			return
		case <-time.After(30 * time.Second):
			reply(controlResponse{Error: "the agent is busy enrolling; try again"})
			return
		}
		if err := <-call.reply; err != nil {
			reply(controlResponse{Error: err.Error()})
			return
		}
		reply(controlResponse{OK: true})
	default:
		reply(controlResponse{Error: fmt.Sprintf("unknown command %q", req.Cmd)})
	}
}

// Status returns the daemon's current status.
func (a *Agent) Status(ctx context.Context) Status {
	st := Status{Version: Version, Backend: a.backend.Name(), Scope: a.cfg.Scope, SystemdVersion: a.systemdVersion(), IdentityError: a.identityProblem()}
	a.mu.Lock()
	id, rs := a.id, a.replicas
	st.EnrollError = a.enrollErr
	st.LastSync, st.LastSyncError, st.StreamConnected = a.lastSync, a.lastSyncErr, a.streamUp
	results := append([]PipeResult(nil), a.results...)
	lastRuns := map[string]RunSummary{}
	for k, v := range a.lastRuns {
		lastRuns[k] = v
	}
	cur := a.current
	a.mu.Unlock()
	if cur != nil {
		st.ManifestExpiresAt = cur.ExpiresAt
		st.ManifestExpired = !cur.ExpiresAt.IsZero() && !time.Now().Before(cur.ExpiresAt)
	}
	if id != nil {
		st.Enrolled, st.AgentID, st.CertExpiresAt = true, id.AgentID, id.NotAfter()
		if rs != nil {
			r := rs.status()
			r.Override = len(a.cfg.ServerURLs) > 0 || len(a.cfg.GRPCAddrs) > 0
			if len(r.ServerURLs) > 0 {
				st.Server = r.ServerURLs[r.ServerIndex]
			}
			if len(r.GRPCAddrs) > 0 {
				st.GRPCAddr = r.GRPCAddrs[r.GRPCIndex]
			}
			st.Replicas = &r
		}
	}
	if ms, err := a.manifestState(); err == nil {
		st.Serial, st.Digest, st.AppliedSerial = ms.Serial, ms.Digest, ms.AppliedSerial
	}
	st.OutboxRecords, st.OutboxBytes, _ = a.store.OutboxStats()
	st.StreamManifests, st.StreamManifestsRefused = a.streamManifests.Load(), a.streamRefused.Load()

	pipes := map[string]*PipeInfo{}
	get := func(name string) *PipeInfo {
		if p, ok := pipes[name]; ok {
			return p
		}
		p := &PipeInfo{Name: name}
		pipes[name] = p
		return p
	}
	now := time.Now()
	if cur != nil {
		for _, p := range cur.Pipes {
			pi := get(p.Name)
			pi.Version, pi.Enabled = p.Version, p.Spec.IsEnabled()
			if p.Held() {
				pi.LeaseUntil, pi.LeaseEnded = p.LeaseUntil, lease.Ended(&p, now)
			}
		}
	}
	for _, r := range results {
		pi := get(r.Name)
		pi.ApplyError = r.Error
		pi.ElapseMismatch = r.ElapseMismatch
		pi.DropInsRemoved = r.DropInsRemoved
		if len(r.NextFireTimes) > 0 {
			pi.NextRun = r.NextFireTimes[0]
		}
	}
	sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if states, err := a.backend.Status(sctx); err == nil {
		for _, s := range states {
			pi := get(s.Name)
			if !s.Next.IsZero() && !pi.LeaseEnded && (pi.LeaseUntil.IsZero() || s.Next.Before(pi.LeaseUntil.Add(-lease.Lead))) {
				pi.NextRun = s.Next
			}
			pi.Running, pi.RunID, pi.LastResult = s.Running, s.RunID, s.LastResult
		}
	}
	for name, r := range lastRuns {
		r := r
		get(name).LastRun = &r
	}
	for _, p := range pipes {
		st.Pipes = append(st.Pipes, *p)
	}
	sort.Slice(st.Pipes, func(i, j int) bool { return st.Pipes[i].Name < st.Pipes[j].Name })
	return st
}

// ErrNoDaemon: nothing listens on the control socket.
var ErrNoDaemon = errors.New("the drover-agent daemon is not running (no control socket)")

// controlCall sends one request to the daemon at socket.
func controlCall(ctx context.Context, socket string, req controlRequest) (*controlResponse, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", socket)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) || errors.Is(err, unix.ECONNREFUSED) {
			return nil, fmt.Errorf("%w: %s", ErrNoDaemon, socket)
		}
		return nil, err
	}
	defer c.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = c.SetDeadline(dl)
	}
	stop := context.AfterFunc(ctx, func() { _ = c.SetDeadline(time.Now()) })
	defer stop()
	b, _ := json.Marshal(req)
	if _, err := c.Write(append(b, '\n')); err != nil {
		return nil, err
	}
	line, err := bufio.NewReader(c).ReadBytes('\n')
	if err != nil && len(line) == 0 {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, fmt.Errorf("control socket: %w", err)
	}
	var resp controlResponse
	if err := json.Unmarshal(line, &resp); err != nil {
		return nil, fmt.Errorf("control socket: bad response: %w", err)
	}
	return &resp, nil
}

// QueryStatus asks the daemon listening on socket for its status.
func QueryStatus(ctx context.Context, socket string) (*Status, error) {
	resp, err := controlCall(ctx, socket, controlRequest{Cmd: "status"})
	if err != nil {
		return nil, err
	}
	if !resp.OK || resp.Status == nil {
		return nil, fmt.Errorf("agent: %s", resp.Error)
	}
	return resp.Status, nil
}

// TriggerSync makes the daemon sync at once and returns the result.
func TriggerSync(ctx context.Context, socket string) (*SyncResult, error) {
	resp, err := controlCall(ctx, socket, controlRequest{Cmd: "sync"})
	if err != nil {
		return nil, err
	}
	if resp.Sync == nil {
		return nil, fmt.Errorf("agent: %s", resp.Error)
	}
	if !resp.OK {
		return resp.Sync, fmt.Errorf("sync %s: %s", resp.Sync.Outcome, resp.Sync.Error)
	}
	return resp.Sync, nil
}

// EnrollVia hands a token to the running daemon, which enrolls with it.
func EnrollVia(ctx context.Context, socket, token string) error {
	resp, err := controlCall(ctx, socket, controlRequest{Cmd: "enroll", Token: token})
	if err != nil {
		return err
	}
	if !resp.OK {
		return fmt.Errorf("agent: %s", resp.Error)
	}
	return nil
}
