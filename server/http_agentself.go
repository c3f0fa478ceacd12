package server

import (
	"bytes"
	"context"
	"crypto/x509"
	"errors"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"unicode"

	"github.com/drover/drover/api"
	"github.com/drover/drover/server/errs"
	"github.com/drover/drover/server/pki"
	"github.com/drover/drover/server/store"
	"github.com/drover/drover/server/stream"

	"github.com/drover/drover/manifest"
)

// Media types of agent endpoints (documented in doc.go).
const (
	ManifestMediaType = "application/vnd.drover.manifest.v1.dsse+json"
	BundleMediaType   = "application/vnd.drover.bundle.v1+gzip"
)

// checkRequestMachine applies api.MachineIDHeader.
func (s *Server) checkRequestMachine(r *http.Request, agentID string) error {
	mid := r.Header.Get(api.MachineIDHeader)
	if mid == "" {
		// Once an identity is bound to a machine, its requests must say
		// which machine they come from: a clone cannot get in by leaving
		// the header out.
		bound, err := s.boundMachine(r.Context(), agentID)
		if err != nil || bound == "" {
			return err
		}
		return s.identityConflict(r.Context(), agentID, "", sourceIP(r))
	}
	if !stream.ValidMachineID(mid) {
		return errs.New(errs.ErrInvalidRequest, api.MachineIDHeader+" must be 32 hex digits")
	}
	bound, err := s.boundMachine(r.Context(), agentID)
	if err != nil || bound == "" || bound == strings.ToLower(mid) {
		return err
	}
	return s.identityConflict(r.Context(), agentID, strings.ToLower(mid), sourceIP(r))
}

func (s *Server) handleEnroll(w http.ResponseWriter, r *http.Request) error {
	s.enrollRequests.Add(1)
	if !s.enrollLimiter.allow(sourceIP(r), s.clock.Now()) {
		w.Header().Set("Retry-After", "60")
		return errs.New(errs.ErrRateLimited, "too many enrollment attempts from this address; retry later")
	}
	var req api.EnrollRequest
	if err := decodeJSON(w, r, s.cfg.HTTP.MaxBodyBytes, &req); err != nil {
		return err
	}
	var details []api.Detail
	check := func(field, v string, required bool, max int) {
		switch {
		case v == "" && required:
			details = append(details, api.Detail{Field: field, Message: "required"})
		case len(v) > max || strings.ContainsFunc(v, func(r rune) bool { return !unicode.IsPrint(r) }):
			details = append(details, api.Detail{Field: field, Message: "at most " + strconv.Itoa(max) + " printable characters"})
		}
	}
	check("hostname", req.Hostname, true, 253)
	check("os", req.OS, false, 64)
	check("arch", req.Arch, false, 64)
	check("agent_version", req.AgentVersion, false, 64)
	if req.Token == "" {
		details = append(details, api.Detail{Field: "token", Message: "required"})
	}
	if req.CSR == "" {
		details = append(details, api.Detail{Field: "csr", Message: "required"})
	}
	if req.MachineID != "" && !stream.ValidMachineID(req.MachineID) {
		details = append(details, api.Detail{Field: "machine_id", Message: "must be 32 hex digits (/etc/machine-id)"})
	}
	if len(details) > 0 {
		return errs.New(errs.ErrInvalidRequest, "the enrollment request has invalid fields", details...)
	}
	pt, err := parseToken(req.Token)
	if err != nil {
		return err
	}
	if pt.pin != s.ca.Pin() {
		return errs.New(errs.ErrInvalidToken, "the enrollment token was made for another server (its CA pin does not match)")
	}
	csr, err := pki.ParseAgentCSR(req.CSR)
	if err != nil {
		return err
	}
	now := s.clock.Now()
	tok, err := checkToken(r.Context(), s.store, pt, now)
	if err != nil {
		return err
	}
	id := newAgentID()
	certPEM, serial, notAfter, err := s.ca.IssueAgentCert(id, csr, now, s.cfg.Enrollment.CertLifetime)
	if err != nil {
		return err
	}
	name := tok.Name
	if name == "" {
		name = req.Hostname
	}
	a := &store.Agent{ID: id, Name: name, Hostname: req.Hostname, OS: req.OS, Arch: req.Arch, AgentVersion: req.AgentVersion,
		Tags: tok.Tags, CreatedAt: now, CertSerial: serial, CertExpiresAt: notAfter, MachineID: strings.ToLower(req.MachineID)}
	setAuditActor(r, &principal{ID: "enrollment-token/" + tok.ID, Name: "enrollment token", Role: rolePublic})
	setAudit(r, "agent/"+id, nil, map[string]any{"id": id, "name": name, "hostname": req.Hostname, "tags": tok.Tags, "cert_serial": serial, "machine_id": a.MachineID})
	// The audit entry is committed with the enrollment, in its batch's
	// transaction (enroll_batch.go).
	var audit *store.AuditEntry
	rec, _ := r.Context().Value(auditKey{}).(*auditRec)
	if rec != nil {
		audit = s.auditEntry(r, actionEnroll, rec)
	}
	if err := s.enrolls.enroll(store.Enrollment{TokenID: tok.ID, Now: now, Agent: a, Audit: audit}); err != nil {
		switch {
		case errors.Is(err, errs.ErrTokenUsed):
			return errs.New(errs.ErrTokenUsed, "the enrollment token was already used")
		case errors.Is(err, errs.ErrTokenExpired):
			return errs.New(errs.ErrTokenExpired, "the enrollment token has expired")
		case errors.Is(err, errs.ErrInvalidToken):
			return errs.New(errs.ErrInvalidToken, "the enrollment token is not valid")
		}
		return err
	}
	if rec != nil {
		rec.committed = true
	}
	if a.MachineID != "" {
		s.rememberMachine(id, a.MachineID) // bound in the enrollment's transaction
	}
	s.log.Info("agent enrolled", "agent", id, "hostname", req.Hostname, "token_id", tok.ID)
	return writeJSON(w, http.StatusOK, api.EnrollResponse{
		AgentID: id, Certificate: string(certPEM), CABundle: string(s.ca.PEM()), TrustRoot: s.keys.TrustRoot(),
		GRPCAddr: s.grpcPublicAddr(r), CertExpiresAt: notAfter,
		ServerURLs: s.cfg.ReplicaURLs(), GRPCAddrs: s.replicaGRPCAddrs(),
	})
}

// replicaGRPCAddrs is the list of stream addresses agents are given: the
// configured ones, else the host of every public URL with this server's
// gRPC port; empty when no public address is configured (the agent then
// keeps the one it was given at enrollment).
func (s *Server) replicaGRPCAddrs() []string {
	if l := s.cfg.ReplicaGRPCAddrs(); len(l) > 0 {
		return l
	}
	_, port, _ := net.SplitHostPort(s.GRPCAddr())
	var out []string
	for _, u := range s.cfg.ReplicaURLs() {
		if pu, err := url.Parse(u); err == nil && pu.Hostname() != "" {
			out = append(out, net.JoinHostPort(pu.Hostname(), port))
		}
	}
	return out
}

// setReplicaHeaders puts the replicas' current addresses on an answer to
// an agent (api.ServerURLsHeader).
func (s *Server) setReplicaHeaders(h http.Header) {
	if l := s.cfg.ReplicaURLs(); len(l) > 0 {
		h.Set(api.ServerURLsHeader, strings.Join(l, ","))
	}
	if l := s.replicaGRPCAddrs(); len(l) > 0 {
		h.Set(api.GRPCAddrsHeader, strings.Join(l, ","))
	}
}

// grpcPublicAddr is the stream address given to agents that know only
// one: the first configured, else derived from the public URL or the
// request's host.
func (s *Server) grpcPublicAddr(r *http.Request) string {
	if l := s.replicaGRPCAddrs(); len(l) > 0 {
		return l[0]
	}
	_, port, _ := net.SplitHostPort(s.GRPCAddr())
	host := ""
	if s.publicHost != "" {
		host = s.publicHost
	} else if h, _, err := net.SplitHostPort(r.Host); err == nil {
		host = h
	} else {
		host = r.Host
	}
	return net.JoinHostPort(host, port)
}

func (s *Server) handleRenew(w http.ResponseWriter, r *http.Request, agentID string) error {
	if err := s.checkRequestMachine(r, agentID); err != nil {
		return err
	}
	if err := s.allowRenewal(w, agentID); err != nil {
		return err
	}
	var req api.RenewRequest
	if err := decodeJSON(w, r, s.cfg.HTTP.MaxBodyBytes, &req); err != nil {
		return err
	}
	csr, err := pki.ParseAgentCSR(req.CSR)
	if err != nil {
		return err
	}
	history, err := s.checkRenewal(r, agentID, csr) // a fresh key, never one held before
	if err != nil {
		return err
	}
	certPEM, serial, notAfter, err := s.ca.IssueAgentCertWith(agentID, csr, s.clock.Now(), s.cfg.Enrollment.CertLifetime, history)
	if err != nil {
		return err
	}
	if err := s.store.SetNextCert(r.Context(), agentID, serial, notAfter); err != nil {
		return err
	}
	s.log.Info("agent certificate renewed", "agent", agentID)
	setAudit(r, "agent/"+agentID, map[string]any{"cert_serial": pki.SerialHex(r.TLS.PeerCertificates[0].SerialNumber)}, map[string]any{"next_cert_serial": serial, "cert_expires_at": notAfter})
	return writeJSON(w, http.StatusOK, api.RenewResponse{Certificate: string(certPEM), CABundle: string(s.ca.PEM()), CertExpiresAt: notAfter,
		ServerURLs: s.cfg.ReplicaURLs(), GRPCAddrs: s.replicaGRPCAddrs()})
}

func (s *Server) handleSelfManifest(w http.ResponseWriter, r *http.Request, agentID string) error {
	if err := s.checkRequestMachine(r, agentID); err != nil {
		return err
	}
	m, err := s.store.GetManifest(r.Context(), agentID)
	if err != nil {
		s.metrics.manifestErr.Inc()
		return err
	}
	etag := manifestETag(m)
	h := w.Header()
	s.setReplicaHeaders(h)
	h.Set("ETag", etag)
	h.Set("Cache-Control", "no-cache")
	if etagMatch(r.Header.Get("If-None-Match"), etag) {
		s.metrics.manifest304.Inc()
		w.WriteHeader(http.StatusNotModified)
		return nil
	}
	s.metrics.manifest200.Inc()
	h.Set("Content-Type", ManifestMediaType)
	h.Set("Content-Length", strconv.Itoa(len(m.Envelope)))
	h.Set("X-Drover-Manifest-Serial", strconv.FormatUint(m.Serial, 10))
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(m.Envelope)
	return nil
}

// manifestETag is the ETag of a stored manifest: its envelope's digest,
// quoted. The manifest GET sends it and a SyncNow carries it.
func manifestETag(m *store.StoredManifest) string { return `"` + m.Digest + `"` }

// publishedManifest is what a SyncNow carries for the agent
// (stream.ManifestSource): the stored envelope the manifest GET answers
// with, from the cache the compiler's saves fill, else the store.
func (s *Server) publishedManifest(ctx context.Context, agentID string) (*stream.Published, error) {
	m, err := s.store.GetManifest(ctx, agentID)
	if err != nil {
		return nil, err
	}
	return &stream.Published{Envelope: m.Envelope, ETag: manifestETag(m), Serial: m.Serial}, nil
}

// etagMatch implements If-None-Match: "*" or any listed tag, weak or strong.
func etagMatch(header, etag string) bool {
	if header == "" {
		return false
	}
	for _, t := range strings.Split(header, ",") {
		t = strings.TrimSpace(t)
		if t == "*" || strings.TrimPrefix(t, "W/") == etag {
			return true
		}
	}
	return false
}

func (s *Server) handleSelfTrust(w http.ResponseWriter, r *http.Request, agentID string) error {
	w.Header().Set("Cache-Control", "no-cache")
	return writeJSON(w, http.StatusOK, s.keys.TrustRoot())
}

func (s *Server) handleSelfPayload(w http.ResponseWriter, r *http.Request, agentID string) error {
	if err := s.checkRequestMachine(r, agentID); err != nil {
		return err
	}
	digest := r.PathValue("digest")
	if !manifest.ValidDigest(digest) {
		return errs.New(errs.ErrNotFound, "payload not found")
	}
	m, err := s.store.GetManifest(r.Context(), agentID)
	if err != nil {
		return err
	}
	if !slices.Contains(m.Payloads, digest) {
		return errs.New(errs.ErrNotFound, "payload not found")
	}
	// A bundle held in memory (or being read into it for another agent)
	// is served without a fetch slot: the slots bound store reads.
	if data, ok, err := s.payloads.lookup(r.Context(), digest); err != nil || ok {
		if err != nil {
			return err
		}
		writePayload(w, digest, data)
		return nil
	}
	release, err := s.acquireFetch(agentID)
	if err != nil {
		w.Header().Set("Retry-After", "5")
		return err
	}
	defer release()
	size, err := s.store.PayloadSize(r.Context(), digest)
	if err != nil {
		return err
	}
	if data, ok, err := s.payloads.get(r.Context(), s.store, digest, size); err != nil || ok {
		if err != nil {
			return err
		}
		writePayload(w, digest, data)
		return nil
	}
	setPayloadHeaders(w, digest, size)
	w.WriteHeader(http.StatusOK)
	// Streamed in slices: a fetch holds one buffer, whatever the size.
	buf := make([]byte, payloadSlice)
	for off := int64(0); off < size; {
		n, err := s.store.ReadPayload(r.Context(), digest, off, buf[:min(int64(len(buf)), size-off)])
		if err != nil || n == 0 {
			s.log.Warn("streaming a payload failed", "agent", agentID, "digest", digest, "err", err)
			return nil // the short body tells the agent; the digest check catches the rest
		}
		if _, err := w.Write(buf[:n]); err != nil {
			return nil
		}
		off += int64(n)
	}
	return nil
}

// writePayload answers with a whole bundle held in memory.
func writePayload(w http.ResponseWriter, digest string, data []byte) {
	setPayloadHeaders(w, digest, int64(len(data)))
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(data)
}

func setPayloadHeaders(w http.ResponseWriter, digest string, size int64) {
	h := w.Header()
	h.Set("Content-Type", BundleMediaType)
	h.Set("Content-Length", strconv.FormatInt(size, 10))
	h.Set("ETag", `"`+digest+`"`)
	h.Set("Cache-Control", "private, max-age=31536000, immutable")
}

// payloadSlice is how much of a payload one read takes from the store.
const payloadSlice = 256 << 10

// acquireFetch takes a payload-download slot for the agent: at most
// agents.payload_fetches_per_agent for it and agents.payload_fetches in all.
func (s *Server) acquireFetch(agentID string) (func(), error) {
	am := s.agentMem(agentID)
	am.mu.Lock()
	if am.fetches >= s.cfg.Agents.PayloadFetchesPerAgent {
		am.mu.Unlock()
		s.metrics.refused.WithLabelValues("payload_fetches").Inc()
		return nil, errs.New(errs.ErrRateLimited, "this agent is already downloading as many payloads as it may; retry shortly")
	}
	am.fetches++
	am.mu.Unlock()
	undo := func() {
		am.mu.Lock()
		am.fetches--
		am.mu.Unlock()
	}
	select {
	case s.payloadSem <- struct{}{}:
	default:
		undo()
		s.metrics.refused.WithLabelValues("payload_fetches").Inc()
		return nil, errs.New(errs.ErrRateLimited, "the server is serving as many payload downloads as it may; retry shortly")
	}
	return func() { <-s.payloadSem; undo() }, nil
}

func (s *Server) handleSelfSecrets(w http.ResponseWriter, r *http.Request, agentID string) error {
	if err := s.checkRequestMachine(r, agentID); err != nil {
		return err
	}
	m, err := s.store.GetManifest(r.Context(), agentID)
	if err != nil {
		return err
	}
	sealed, err := s.store.GetSecrets(r.Context(), m.Secrets)
	if err != nil {
		return err
	}
	out := api.SecretsResponse{Secrets: make(map[string]string, len(sealed))}
	for name, v := range sealed {
		plain, err := s.sealer.Open(name, v)
		if err != nil {
			return err // names the secret, never its value
		}
		out.Secrets[name] = string(plain)
	}
	w.Header().Set("Cache-Control", "no-store")
	return writeJSON(w, http.StatusOK, out)
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
