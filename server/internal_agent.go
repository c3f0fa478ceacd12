package server

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/drover/drover/api"
)

// The internal agent: with internal_agent.enabled (or --internal-agent) the
// server runs a drover-agent for its own host as a child process. It goes
// through the same path as any other agent — a one-time enrollment token,
// the CA pin check, mTLS, signed manifests — so nothing about it is special
// except that the server creates its token. The child is restarted with
// backoff if it exits, and stopped (SIGTERM) when the server drains.
//
// It is a separate process, not the agent package linked in: pipe services
// run `<agent binary> run <pipe>`, and the agent must outlive a server
// restart without its pipes noticing.

// internalAgentTag marks the agent the server enrolled for itself.
const internalAgentTag = "drover.internal"

func (s *Server) internalAgentPaths() (bin, dataDir string) {
	ia := s.cfg.InternalAgent
	bin, dataDir = ia.AgentPath, ia.DataDir
	if bin == "" {
		bin = "/usr/bin/drover-agent"
		if self, err := os.Executable(); err == nil {
			if cand := filepath.Join(filepath.Dir(self), "drover-agent"); fileExecutable(cand) {
				bin = cand
			}
		}
	}
	if dataDir == "" {
		dataDir = filepath.Join(s.cfg.DataDir, "internal-agent")
		if os.Geteuid() == 0 && ia.Backend == "cron" {
			// The agent runs as an unprivileged user, which cannot enter
			// the server's 0700 data dir: its own lives beside it.
			dataDir = filepath.Clean(s.cfg.DataDir) + "-internal-agent"
		}
	}
	return bin, dataDir
}

// internalAgentUser is the user a root server runs a cron-backend internal
// agent (and so every job of it) as: internal_agent.user, default nobody.
func internalAgentUser(name string) (*syscall.Credential, error) {
	if name == "" {
		name = "nobody"
	}
	u, err := user.Lookup(name)
	if err != nil {
		return nil, fmt.Errorf("internal agent user: %w", err)
	}
	uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
	gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
	if err1 != nil || err2 != nil || uid == 0 {
		return nil, fmt.Errorf("internal agent user %s: not an unprivileged user (uid %s)", name, u.Uid)
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), Groups: []uint32{}}, nil
}

func fileExecutable(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0
}

// superviseInternalAgent runs the child until ctx ends.
func (s *Server) superviseInternalAgent(ctx context.Context) {
	bin, dataDir := s.internalAgentPaths()
	backoff := time.Second
	for ctx.Err() == nil {
		started := time.Now()
		err := s.runInternalAgent(ctx, bin, dataDir)
		if ctx.Err() != nil {
			return
		}
		s.log.Error("internal agent exited; restarting", "err", err, "in", backoff)
		if time.Since(started) > time.Minute {
			backoff = time.Second
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, time.Minute)
	}
}

func (s *Server) runInternalAgent(ctx context.Context, bin, dataDir string) error {
	if err := os.MkdirAll(dataDir, 0o700); err != nil {
		return err
	}
	ia := s.cfg.InternalAgent
	scope := ia.Scope
	if scope == "" {
		scope = "user"
		if os.Geteuid() == 0 {
			scope = "system"
		}
	}
	backend := internalAgentBackend(ia.Backend, os.Geteuid())
	var cred *syscall.Credential
	if os.Geteuid() == 0 && backend == "cron" {
		// The cron backend runs jobs as the agent's own user: as root they
		// would sit beside the CA key, the signing keys and admin.token.
		// Drop to an unprivileged user for the agent and all its jobs.
		c, err := internalAgentUser(ia.User)
		if err != nil {
			return err
		}
		if inside(dataDir, s.cfg.DataDir) {
			return fmt.Errorf("internal agent: its data dir %s must not be inside the server's data dir when it runs as %s", dataDir, ia.User)
		}
		if err := os.Chown(dataDir, int(c.Uid), int(c.Gid)); err != nil {
			return err
		}
		cred = c
		if scope == "system" {
			scope = "user" // the cron backend as an unprivileged user
		}
	}
	// The server's certificate always names 127.0.0.1; dial the listener there.
	_, port, _ := net.SplitHostPort(s.HTTPAddr())
	_, grpcPort, _ := net.SplitHostPort(s.GRPCAddr())
	local := "https://" + net.JoinHostPort("127.0.0.1", port)
	env := []string{
		"DROVER_SERVER=" + local,
		// This replica's own agent talks to this replica only, whatever
		// public_urls lists (it lives and dies with this process).
		"DROVER_SERVER_URLS=" + local,
		"DROVER_GRPC_ADDRS=" + net.JoinHostPort("127.0.0.1", grpcPort),
		"DROVER_DATA_DIR=" + dataDir,
		"DROVER_TOKEN_FILE=" + filepath.Join(dataDir, "enroll.token"),
		"DROVER_BACKEND=" + backend,
		"DROVER_SCOPE=" + scope,
		"DROVER_AGENT_PATH=" + bin,
	}
	for _, kv := range os.Environ() {
		// The server's own DROVER_* settings are not the agent's.
		if !strings.HasPrefix(kv, "DROVER_") {
			env = append(env, kv)
		}
	}
	if scope == "user" && (os.Getenv("XDG_RUNTIME_DIR") == "" || cred != nil) {
		rt := filepath.Join(dataDir, "runtime")
		if err := os.MkdirAll(rt, 0o700); err != nil {
			return err
		}
		if cred != nil {
			if err := os.Chown(rt, int(cred.Uid), int(cred.Gid)); err != nil {
				return err
			}
			env = append(env, "HOME="+dataDir)
		}
		env = append(env, "XDG_RUNTIME_DIR="+rt)
	}
	if _, err := os.Stat(filepath.Join(dataDir, "identity.json")); errors.Is(err, os.ErrNotExist) {
		host, _ := os.Hostname()
		tok, err := createToken(ctx, s.store, s.cfg.Enrollment, s.ca.Pin(), s.clock.Now(),
			api.EnrollmentTokenRequest{TTL: "10m", Name: host, Tags: map[string]string{internalAgentTag: "true"}})
		if err != nil {
			return err
		}
		env = append(env, "DROVER_ENROLL_TOKEN="+tok.Token)
	}
	cmd := exec.CommandContext(ctx, bin)
	cmd.Env = env
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM, Credential: cred}
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 15 * time.Second
	s.log.Info("starting the internal agent", "binary", bin, "data_dir", dataDir, "backend", backend, "scope", scope)
	return cmd.Run()
}

// internalAgentBackend picks the internal agent's backend: "" means auto.
// How a root server keeps the internal agent's jobs away from its data dir:
// with systemd each job runs as a dynamic user (DynamicUser=) that cannot
// enter the server's 0700 data dir; with cron the agent itself, and so
// every job, runs as an unprivileged user (internal_agent.user, default
// nobody; see runInternalAgent). A non-root server's jobs run as the
// server's own user whatever the backend: only admins may write pipes that
// reach the internal agent (policy.go).
func internalAgentBackend(configured string, euid int) string {
	if configured == "" {
		configured = "auto"
	}
	if euid == 0 && configured == "auto" {
		// Decide here what the agent would: a root agent that fell back to
		// cron on its own would run jobs as root.
		if fi, err := os.Stat("/run/systemd/system"); err == nil && fi.IsDir() {
			return "systemd"
		}
		return "cron"
	}
	return configured
}

// inside reports whether p is dir or below it.
func inside(p, dir string) bool {
	p, dir = filepath.Clean(p), filepath.Clean(dir)
	return p == dir || strings.HasPrefix(p, dir+string(filepath.Separator))
}
