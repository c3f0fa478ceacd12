package server

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"time"
)

// Profiles (runtime.profile_addr): Go's net/http/pprof on a loopback
// address, for measuring a running server (README, "Performance"). Off
// unless configured; plain HTTP without authentication, so the address
// must be loopback (Validate), and the docs say that every local user can
// read it.

// listenProfiles binds addr ("" binds nothing).
func listenProfiles(addr string) (net.Listener, error) {
	if addr == "" {
		return nil, nil
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listen runtime.profile_addr: %w", err)
	}
	return ln, nil
}

// profileServer serves the profiles on their own mux: nothing else is
// reachable there, and they are reachable nowhere else.
func profileServer() *http.Server {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /debug/pprof/", pprof.Index)
	mux.HandleFunc("GET /debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("GET /debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("GET /debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("GET /debug/pprof/trace", pprof.Trace)
	return &http.Server{
		Handler:           mux,
		ReadHeaderTimeout: 10 * time.Second,
		// A CPU profile or trace takes as long as its seconds parameter.
		WriteTimeout:   5 * time.Minute,
		MaxHeaderBytes: 16 << 10,
	}
}

// serveProfiles serves on ln until srv is closed.
func serveProfiles(srv *http.Server, ln net.Listener, log *slog.Logger) {
	log.Warn("serving Go profiles without authentication on a loopback address (runtime.profile_addr)", "addr", ln.Addr().String())
	if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		log.Warn("profiles", "err", err)
	}
}
