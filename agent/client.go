package agent

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"log/slog"
	"net/url"
	"strings"
	"time"

	"github.com/drover/drover/api"
	"github.com/go-resty/resty/v2"

	"github.com/drover/drover/signing"
)

// API paths (server/doc.go).
const (
	pathEnroll   = "/api/v1/agents/enroll"
	pathRenew    = "/api/v1/agents/self/renew"
	pathManifest = "/api/v1/agents/self/manifest"
	pathTrust    = "/api/v1/agents/self/trust"
	pathPayloads = "/api/v1/agents/self/payloads/"
	pathSecrets  = "/api/v1/agents/self/secrets"
)

// maxJSONBytes caps JSON responses (enrollment, renewal, trust, secrets).
const maxJSONBytes = 4 << 20

// checkResponse turns a non-2xx (and non-304) response into an *api.Error.
func checkResponse(resp *resty.Response, err error) error {
	if err != nil {
		return err
	}
	if resp.StatusCode() >= 200 && resp.StatusCode() < 300 || resp.StatusCode() == 304 {
		return nil
	}
	e := &api.Error{Status: resp.StatusCode()}
	if eb, ok := resp.Error().(*api.ErrorBody); ok && eb != nil {
		e.ErrorInfo = eb.Error
	}
	return fmt.Errorf("server: %w", e)
}

// serverHost returns the host name the server certificate must carry.
func serverHost(server string) (string, error) {
	u, err := url.Parse(server)
	if err != nil || u.Host == "" {
		return "", fmt.Errorf("server URL %q: no host", server)
	}
	return u.Hostname(), nil
}

// newHTTPClient returns a resty client for base with the given TLS config.
func newHTTPClient(base string, tlsConf *tls.Config, timeout time.Duration, log *slog.Logger) *resty.Client {
	return newClient(base, timeout, log).SetTLSClientConfig(tlsConf)
}

// newReplicaClient returns the mTLS client of an enrolled agent: every
// request goes to the replica in use and fails over along rs
// (failoverTransport); learn receives the replica lists the server sends.
func newReplicaClient(rs *replicas, tlsConf *tls.Config, timeout time.Duration, log *slog.Logger, learn func(urls, addrs []string)) *resty.Client {
	_, first := rs.httpURL()
	return newClient(first, timeout, log).
		SetTransport(&failoverTransport{rs: rs, base: newBaseTransport(tlsConf, timeout), learn: learn})
}

// newClient holds the settings every agent client shares: base URL,
// timeout, no retries, API error bodies, the JSON size cap, the logger
// and the User-Agent.
func newClient(base string, timeout time.Duration, log *slog.Logger) *resty.Client {
	return resty.New().
		SetBaseURL(strings.TrimSuffix(base, "/")).
		SetTimeout(timeout).
		SetRetryCount(0).
		SetError(&api.ErrorBody{}).
		SetResponseBodyLimit(maxJSONBytes).
		SetLogger(restyLogger{log}).
		SetHeader("User-Agent", "drover-agent/"+Version)
}

// mtlsConfig is the TLS configuration of every request after enrollment:
// the server must present a certificate of the enrolled CA for host, and the
// agent presents cert (read through get, so renewal takes effect at once).
// An empty host checks each replica against the host it is dialled as.
//
// Each configuration has its own TLS session cache: the poll connection
// closes when idle (pollIdleTimeout), and the next poll resumes the session
// (an abbreviated handshake, no certificate checks on either side). A
// resumed session carries the client certificate of the handshake that
// created it, so a cache must not outlive its certificate: once a renewal
// is promoted the server refuses the old one. The agent builds a new
// configuration, and so a new cache, whenever its identity changes
// (setIdentity: enrollment, renewal, re-enrollment).
func mtlsConfig(host string, pool *x509.CertPool, get func() *tls.Certificate) *tls.Config {
	return &tls.Config{
		MinVersion:         tls.VersionTLS12,
		CipherSuites:       signing.TLSCipherSuites(),
		ServerName:         host,
		RootCAs:            pool,
		ClientSessionCache: tls.NewLRUClientSessionCache(sessionCacheSize),
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			return get(), nil
		},
	}
}

// sessionCacheSize is how many TLS sessions an agent keeps: one per replica
// it talks to (at most api.MaxReplicaAddrs).
const sessionCacheSize = api.MaxReplicaAddrs

// pollIdleTimeout closes the poll connection after it has been idle this
// long: shorter than any streaming poll interval, so that between polls
// the server holds only the agent's stream, and long enough that the
// requests of one sync (manifest, payloads, secrets) share a connection.
const pollIdleTimeout = 5 * time.Second

// restyLogger sends resty's own messages to the agent's log at debug level.
type restyLogger struct{ log *slog.Logger }

func (l restyLogger) Errorf(format string, v ...any) {
	l.log.Debug("http: " + fmt.Sprintf(format, v...))
}
func (l restyLogger) Warnf(format string, v ...any) {
	l.log.Debug("http: " + fmt.Sprintf(format, v...))
}
func (l restyLogger) Debugf(format string, v ...any) {
	l.log.Debug("http: " + fmt.Sprintf(format, v...))
}
