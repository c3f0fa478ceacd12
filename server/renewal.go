package server

import (
	"bytes"
	"crypto/x509"
	"net"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strconv"

	"github.com/drover/drover/api"
	"github.com/drover/drover/server/errs"
	"github.com/drover/drover/server/pki"
)

// serverSANs lists the names the server certificate must carry.
func serverSANs(cfg *Config) []string {
	sans := []string{"localhost", "127.0.0.1", "::1"}
	if h, err := os.Hostname(); err == nil && h != "" {
		sans = append(sans, h)
	}
	if cfg.PublicURL != "" {
		if u, err := url.Parse(cfg.PublicURL); err == nil && u.Hostname() != "" {
			sans = append(sans, u.Hostname())
		}
	}
	if cfg.GRPCPublicAddr != "" {
		if h, _, err := net.SplitHostPort(cfg.GRPCPublicAddr); err == nil && h != "" {
			sans = append(sans, h)
		}
	}
	sans = append(sans, cfg.TLSSANs...)
	slices.Sort(sans)
	return slices.Compact(sans)
}

// checkRenewal applies the renewal rules to an agent's request: at most
// enrollment.renew_burst renewals at once and then one per
// enrollment.renew_interval per agent, and a fresh key: neither the key of
// the certificate in use nor any key it lists as held before. It returns the
// key history for the new certificate.
func (s *Server) checkRenewal(r *http.Request, _ string, csr *x509.CertificateRequest) ([][]byte, error) {
	cur := r.TLS.PeerCertificates[0]
	curHash, err := pki.SPKIHash(cur.PublicKey)
	if err != nil {
		return nil, err
	}
	newHash, err := pki.SPKIHash(csr.PublicKey)
	if err != nil {
		return nil, errs.New(errs.ErrInvalidRequest, "the CSR's key cannot be read", api.Detail{Field: "csr", Message: "unreadable public key"})
	}
	if bytes.Equal(curHash, newHash) {
		return nil, errs.New(errs.ErrInvalidRequest, "renewal needs a fresh key", api.Detail{Field: "csr", Message: "the key is the one of the current certificate"})
	}
	prev := pki.KeyHistory(cur)
	for _, h := range prev {
		if bytes.Equal(h, newHash) {
			return nil, errs.New(errs.ErrInvalidRequest, "renewal needs a fresh key", api.Detail{Field: "csr", Message: "the key is one this agent held before (a retired certificate's)"})
		}
	}
	history := append([][]byte{curHash}, prev...)
	if len(history) > pki.MaxKeyHistory {
		history = history[:pki.MaxKeyHistory]
	}
	return history, nil
}

// allowRenewal takes a renewal from the agent's budget.
func (s *Server) allowRenewal(w http.ResponseWriter, agentID string) error {
	if !s.guard.renew.allow(agentID, s.clock.Now()) {
		w.Header().Set("Retry-After", strconv.Itoa(int(s.cfg.Enrollment.RenewInterval.Seconds())))
		return errs.New(errs.ErrRateLimited, "too many certificate renewals for this agent; retry later")
	}
	return nil
}
