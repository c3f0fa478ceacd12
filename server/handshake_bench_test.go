package server

import (
	"crypto/tls"
	"testing"

	"github.com/drover/drover/signing"
)

// BenchmarkStreamHandshake measures one TLS handshake of an agent's stream
// connection against the real gRPC listener, both ends in this process on
// one goroutine at a time (so ns/op is the CPU of both ends together): the
// agent's own settings (Go's default key exchange, X25519MLKEM768), the
// same with the classical X25519 only, and a resumed session. The handshake
// counts as done when the server's first HTTP/2 frame arrives, which it
// sends only once it has checked the agent's certificate.
//
//	go test ./server -run '^$' -bench StreamHandshake -benchtime 2000x
func BenchmarkStreamHandshake(b *testing.B) {
	ts := startServer(b)
	a := ts.enrollAgent(map[string]string{"role": "web"})
	conf := func() *tls.Config {
		return &tls.Config{MinVersion: tls.VersionTLS12, CipherSuites: signing.TLSCipherSuites(), ServerName: "localhost",
			RootCAs: a.pool, Certificates: []tls.Certificate{a.cert}, NextProtos: []string{"h2"}}
	}
	shake := func(b *testing.B, c *tls.Config) {
		conn, err := tls.Dial("tcp", a.grpcAddr, c)
		if err != nil {
			b.Fatal(err)
		}
		defer conn.Close()
		buf := make([]byte, 64)
		if _, err := conn.Read(buf); err != nil {
			b.Fatal(err)
		}
		if resumed := conn.ConnectionState().DidResume; resumed != (c.ClientSessionCache != nil) {
			b.Fatalf("resumed %v with a session cache %v", resumed, c.ClientSessionCache != nil)
		}
	}
	b.Run("hybrid", func(b *testing.B) {
		c := conf()
		for b.Loop() {
			shake(b, c)
		}
	})
	b.Run("x25519", func(b *testing.B) {
		c := conf()
		c.CurvePreferences = []tls.CurveID{tls.X25519}
		for b.Loop() {
			shake(b, c)
		}
	})
	b.Run("resumed", func(b *testing.B) {
		c := conf()
		c.ClientSessionCache = tls.NewLRUClientSessionCache(1)
		warm := conf()
		warm.ClientSessionCache = c.ClientSessionCache
		conn, err := tls.Dial("tcp", a.grpcAddr, warm)
		if err != nil {
			b.Fatal(err)
		}
		_, err = conn.Read(make([]byte, 64)) // the session ticket comes after the handshake
		conn.Close()
		if err != nil {
			b.Fatal(err)
		}
		for b.Loop() {
			shake(b, c)
		}
	})
}
