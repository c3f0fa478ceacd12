package cli

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"path/filepath"
	"strings"

	"go.yaml.in/yaml/v3"
)

// fileConfig is ~/.config/drover/config.yaml, written by "droverctl login".
type fileConfig struct {
	Server string `yaml:"server"`
	Token  string `yaml:"token,omitempty"`
	CA     string `yaml:"ca,omitempty"`
}

// maxConfigBytes bounds the config file.
const maxConfigBytes = 1 << 20

// configPath is the config file: --config, else $XDG_CONFIG_HOME/drover/config.yaml,
// else $HOME/.config/drover/config.yaml; "" when none can be named.
func (a *app) configPath() string {
	if a.config != "" {
		return a.config
	}
	if x := a.env.Getenv("XDG_CONFIG_HOME"); x != "" && filepath.IsAbs(x) {
		return filepath.Join(x, "drover", "config.yaml")
	}
	if h := a.env.Getenv("HOME"); h != "" {
		return filepath.Join(h, ".config", "drover", "config.yaml")
	}
	return ""
}

// readConfig reads the config file; a missing file is an empty config
// unless it was named with --config.
func (a *app) readConfig() (*fileConfig, string, error) {
	p := a.configPath()
	if p == "" {
		return &fileConfig{}, "", nil
	}
	f, err := os.Open(p)
	if errors.Is(err, os.ErrNotExist) && a.config == "" {
		return &fileConfig{}, p, nil
	}
	if err != nil {
		return nil, p, fmt.Errorf("config: %w", err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxConfigBytes+1))
	if err != nil {
		return nil, p, fmt.Errorf("config %s: %w", p, err)
	}
	if len(b) > maxConfigBytes {
		return nil, p, fmt.Errorf("config %s: larger than %d bytes", p, maxConfigBytes)
	}
	var c fileConfig
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	if err := dec.Decode(&c); err != nil && !errors.Is(err, io.EOF) {
		return nil, p, fmt.Errorf("config %s: %s", p, strings.TrimPrefix(err.Error(), "yaml: "))
	}
	if c.CA != "" && !filepath.IsAbs(c.CA) {
		c.CA = filepath.Join(filepath.Dir(p), c.CA)
	}
	return &c, p, nil
}

// writeConfig writes c to path with mode 0600 (directory 0700), atomically.
func writeConfig(path string, c *fileConfig) error {
	b, err := yaml.Marshal(c)
	if err != nil {
		return err
	}
	b = append([]byte("# Written by droverctl login. Holds an API token: keep it private (mode 0600).\n"), b...)
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("config: %w", err)
	}
	tmp, err := os.CreateTemp(dir, ".config-*.yaml")
	if err != nil {
		return fmt.Errorf("config: %w", err)
	}
	defer os.Remove(tmp.Name())
	if err := tmp.Chmod(0o600); err != nil {
		tmp.Close()
		return fmt.Errorf("config: %w", err)
	}
	if _, err := tmp.Write(b); err != nil {
		tmp.Close()
		return fmt.Errorf("config: %w", err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return fmt.Errorf("config: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("config: %w", err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("config: %w", err)
	}
	return nil
}

// conn is where and how to reach the server.
type conn struct {
	server string // https://host:port, no trailing slash
	token  string
	ca     string // PEM file, "" for the system roots
}

// resolveConn merges flags, environment and config file, in that order.
func (a *app) resolveConn() (*conn, error) {
	cfg, path, err := a.readConfig()
	if err != nil {
		return nil, err
	}
	pick := func(flag, env, file string) string {
		if flag != "" {
			return flag
		}
		if v := a.env.Getenv(env); v != "" {
			return v
		}
		return file
	}
	c := &conn{
		server: pick(a.server, "DROVER_SERVER", cfg.Server),
		token:  strings.TrimSpace(pick(a.token, "DROVER_TOKEN", cfg.Token)),
		ca:     pick(a.ca, "DROVER_CA", cfg.CA),
	}
	if c.server == "" {
		hint := "run droverctl login"
		if path != "" {
			hint += " (writes " + path + ")"
		}
		return nil, fmt.Errorf("no server given: use --server, DROVER_SERVER or %s", hint)
	}
	if c.server, err = normalizeServer(c.server); err != nil {
		return nil, err
	}
	return c, nil
}

// normalizeServer accepts "https://host:port[/]" or "host:port" and refuses
// plain HTTP: the token must not cross the network in clear text.
func normalizeServer(s string) (string, error) {
	s = strings.TrimSpace(s)
	if !strings.Contains(s, "://") {
		s = "https://" + s
	}
	u, err := url.Parse(s)
	if err != nil || u.Host == "" {
		return "", fmt.Errorf("server %q is not a URL like https://drover.example:8443", s)
	}
	if u.Scheme != "https" {
		return "", fmt.Errorf("server %q: only https is supported (the token would travel in clear text)", s)
	}
	if u.User != nil || u.RawQuery != "" || u.Fragment != "" {
		return "", fmt.Errorf("server %q: give only scheme, host, port and an optional path prefix", s)
	}
	return strings.TrimRight(u.Scheme+"://"+u.Host+u.EscapedPath(), "/"), nil
}
