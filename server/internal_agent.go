package server

import (
	"context"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
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
	}
	return bin, dataDir
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
	backend, err := internalAgentBackend(ia.Backend, os.Geteuid())
	if err != nil {
		return err
	}
	// The server's certificate always names 127.0.0.1; dial the listener there.
	_, port, _ := net.SplitHostPort(s.HTTPAddr())
	env := []string{
		"DROVER_SERVER=https://" + net.JoinHostPort("127.0.0.1", port),
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
	if scope == "user" && os.Getenv("XDG_RUNTIME_DIR") == "" {
		rt := filepath.Join(dataDir, "runtime")
		if err := os.MkdirAll(rt, 0o700); err != nil {
			return err
		}
		env = append(env, "XDG_RUNTIME_DIR="+rt)
	}
	if _, err := os.Stat(filepath.Join(dataDir, "identity.json")); errors.Is(err, os.ErrNotExist) {
		host, _ := os.Hostname()
		tok, err := createToken(ctx, s.store, s.cfg.Enrollment, s.ca.pin, s.clock.Now(),
			TokenRequest{TTL: "10m", Name: host, Tags: map[string]string{internalAgentTag: "true"}})
		if err != nil {
			return err
		}
		env = append(env, "DROVER_ENROLL_TOKEN="+tok.Token)
	}
	cmd := exec.CommandContext(ctx, bin)
	cmd.Env = env
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 15 * time.Second
	s.log.Info("starting the internal agent", "binary", bin, "data_dir", dataDir, "backend", backend, "scope", scope)
	return cmd.Run()
}

// internalAgentBackend picks the internal agent's backend. As root it must
// be systemd: systemd runs each job as a dynamic user (DynamicUser=) that
// cannot enter the server's 0700 data dir, while the cron backend would run
// jobs as root, next to the CA key, the signing keys and admin.token. A
// non-root server's jobs run as the server's own user whatever the backend;
// only admins may write pipes that reach the internal agent (policy.go).
func internalAgentBackend(configured string, euid int) (string, error) {
	switch {
	case euid == 0 && configured == "cron":
		return "", errors.New("internal agent: the cron backend would run jobs as root beside the server's keys; use backend systemd (or auto)")
	case euid == 0:
		return "systemd", nil
	case configured == "":
		return "auto", nil
	}
	return configured, nil
}
