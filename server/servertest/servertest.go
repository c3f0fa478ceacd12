// Package servertest runs a real drover-server in process, on 127.0.0.1
// with its TLS listeners and a SQLite file in a temporary directory, for
// the tests of its clients: the agent, droverctl and the simulator.
//
// Imported only by tests outside package server (the server's own tests
// cannot import it: it imports server).
package servertest

import (
	"crypto/tls"
	"crypto/x509"
	"log/slog"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"github.com/drover/drover/internal/testkit"
	"github.com/drover/drover/server"
)

// Server is a running drover-server and what its clients need to reach it.
type Server struct {
	*server.Server
	// Dir is the data directory.
	Dir string
	// URL is the HTTPS base URL (https://127.0.0.1:port).
	URL string
	// AdminToken is the bootstrap admin API token.
	AdminToken string
	// CAPEM is the server's CA certificate; CAFile the file holding it.
	CAPEM  []byte
	CAFile string
	// Client is an HTTP client that trusts the CA.
	Client *http.Client

	t    testing.TB
	stop func()
}

// Start runs a server with the default configuration and a fresh data
// directory; the test's cleanup stops it.
func Start(t testing.TB) *Server {
	t.Helper()
	cfg := server.DefaultConfig()
	cfg.DataDir = t.TempDir()
	cfg.HTTPAddr = "127.0.0.1:0"
	cfg.GRPCAddr = "127.0.0.1:0"
	cfg.Store.Synchronous = "normal"
	var s *server.Server
	var err error
	for attempt := 0; ; attempt++ {
		if s, err = server.New(cfg, slog.New(slog.DiscardHandler), server.SystemClock()); err == nil || attempt == 2 {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("server.New: %v", err)
	}
	ts := &Server{Server: s, Dir: cfg.DataDir, URL: "https://" + s.HTTPAddr(), CAPEM: s.CACertPEM(),
		CAFile: filepath.Join(cfg.DataDir, "ca.crt"), t: t}
	ts.stop = testkit.Go(t, "server", 30*time.Second, s.Run)
	t.Cleanup(ts.stop)
	if ts.AdminToken, err = server.ReadAdminToken(cfg.DataDir); err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ts.CAPEM)
	ts.Client = &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	t.Cleanup(ts.Client.CloseIdleConnections)
	return ts
}

// Stop stops the server and waits for it (at most 30 s); later calls do
// nothing.
func (ts *Server) Stop() { ts.stop() }

// API calls the API with the admin token, body (if not nil) as JSON, and
// returns the status and the response body. A failed request fails the
// test.
func (ts *Server) API(method, path string, body any) (int, []byte) {
	ts.t.Helper()
	code, b, err := ts.Admin().Call(method, path, body)
	if err != nil {
		ts.t.Fatalf("%s %s: %v", method, path, err)
	}
	return code, b
}

// Admin is an API client with the admin token.
func (ts *Server) Admin() testkit.APIClient {
	return testkit.APIClient{HTTP: ts.Client, Base: ts.URL, Token: ts.AdminToken}
}
