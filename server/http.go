package server

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/drover/drover/api"
	"github.com/drover/drover/server/errs"
	"github.com/drover/drover/server/pki"
	"github.com/drover/drover/server/stream"
)

// apiHandler is a handler that returns its error; serve writes it.
type apiHandler func(w http.ResponseWriter, r *http.Request) error

// serve adapts an apiHandler, logging internal errors (never the request body).
func (s *Server) serve(h apiHandler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := h(w, r); err != nil {
			if k := errs.KindOf(err); k.Err == errs.ErrInternal || k.Err == errs.ErrUnavailable {
				s.log.Error("request failed", "method", r.Method, "path", r.URL.Path, "err", err)
			}
			errs.Write(w, err)
		}
	})
}

// agentHandler is a handler for an authenticated agent.
type agentHandler func(w http.ResponseWriter, r *http.Request, agentID string) error

// agentOnly wraps a handler that needs an agent's client certificate.
func (s *Server) agentOnly(h agentHandler) http.Handler {
	return s.serve(func(w http.ResponseWriter, r *http.Request) error {
		id, err := s.requestAgent(r)
		if err != nil {
			s.auditRefusal(r, err, nil)
			return err
		}
		return h(w, r, id)
	})
}

// requestAgent is the agent named by the request's verified client certificate.
func (s *Server) requestAgent(r *http.Request) (string, error) {
	if r.TLS == nil || len(r.TLS.VerifiedChains) == 0 || len(r.TLS.PeerCertificates) == 0 {
		return "", errs.New(errs.ErrUnauthenticated, "a client certificate issued by this server is required")
	}
	return s.checkAgentCert(r.Context(), r.TLS.PeerCertificates[0])
}

// checkAgentCert maps a verified client certificate to its agent, refusing
// certificates of unknown or revoked agents and any certificate whose serial
// is neither the agent's current nor its next one. The first use of the next
// certificate makes it current, which retires the previous one.
func (s *Server) checkAgentCert(ctx context.Context, cert *x509.Certificate) (string, error) {
	id, serial, err := pki.AgentIdentity(cert)
	if err != nil {
		return "", err
	}
	ac, err := s.store.AgentCert(ctx, id)
	if errors.Is(err, errs.ErrNotFound) {
		return "", errs.New(errs.ErrCertRefused, "the certificate names an unknown agent")
	}
	if err != nil {
		return "", err
	}
	switch {
	case ac.Revoked:
		return "", stream.ErrRevoked
	case serial == ac.Serial:
		return id, nil
	case serial == ac.NextSerial:
		if err := s.store.PromoteCert(ctx, id, serial); err != nil {
			return "", err
		}
		return id, nil
	}
	return "", errs.New(errs.ErrCertRefused, "the certificate was superseded by a renewal")
}

// decodeJSON decodes a JSON object body of at most limit bytes strictly:
// unknown fields, trailing data and a wrong Content-Type are refused.
func decodeJSON(w http.ResponseWriter, r *http.Request, limit int64, v any) error {
	if ct := r.Header.Get("Content-Type"); ct != "" {
		mt, _, err := mime.ParseMediaType(ct)
		if err != nil || mt != "application/json" {
			return errs.New(errs.ErrUnsupportedMedia, "the body must be application/json")
		}
	}
	body, err := readBody(w, r, limit)
	if err != nil {
		return err
	}
	return decodeStrict(body, v, "")
}

// readBody reads a request body of at most limit bytes.
func readBody(w http.ResponseWriter, r *http.Request, limit int64) ([]byte, error) {
	var buf bytes.Buffer
	if r.ContentLength > 0 && r.ContentLength <= limit {
		buf.Grow(int(r.ContentLength) + 1) // one allocation, not a doubling series
	}
	_, err := buf.ReadFrom(http.MaxBytesReader(w, r.Body, limit))
	body := buf.Bytes()
	var mbe *http.MaxBytesError
	if errors.As(err, &mbe) {
		return nil, errs.New(errs.ErrTooLarge, fmt.Sprintf("the body is larger than %s", byteSize(limit)))
	}
	if errors.Is(err, os.ErrDeadlineExceeded) {
		return nil, errs.New(errs.ErrInvalidRequest, "the body did not arrive in time")
	}
	if err != nil {
		return nil, errs.New(errs.ErrInvalidRequest, "cannot read the body")
	}
	return body, nil
}

// Bounds on the shape of a JSON body, checked before it is decoded: a
// decoder (and a validator reporting per element) would otherwise turn a
// few megabytes of "1," into gigabytes.
const (
	maxJSONContainer = 10000  // elements of one array or members of one object (targets.agents may hold 10,000)
	maxJSONValues    = 200000 // values in the whole body
	maxJSONDepth     = 32
)

// checkJSONShape scans a JSON text without decoding it and refuses one
// with an array or object over maxJSONContainer elements, more than
// maxJSONValues values, or nesting deeper than maxJSONDepth. Malformed
// JSON is left for the decoder to report.
func checkJSONShape(b []byte) error {
	var counts [maxJSONDepth + 1]int
	depth, values := 0, 0
	tooBig := func(what string, at int) error {
		return errs.New(errs.ErrTooLarge, fmt.Sprintf("the JSON %s (at byte %d)", what, at))
	}
	element := func(at int) error {
		values++
		if values > maxJSONValues {
			return tooBig(fmt.Sprintf("holds more than %d values", maxJSONValues), at)
		}
		if depth > 0 {
			counts[depth]++
			if counts[depth] > maxJSONContainer {
				return tooBig(fmt.Sprintf("has an array or object of more than %d elements", maxJSONContainer), at)
			}
		}
		return nil
	}
	expectValue := true // at a place where a value starts
	for i := 0; i < len(b); i++ {
		c := b[i]
		switch c {
		case ' ', '\t', '\n', '\r', ',':
			if c == ',' {
				expectValue = true
			}
			continue
		case ':':
			expectValue = true
			continue
		case ']', '}':
			if depth > 0 {
				depth--
			}
			expectValue = false
			continue
		}
		if c == '"' {
			// A key in an object is not a value of its own.
			j := i + 1
			for j < len(b) && b[j] != '"' {
				if b[j] == '\\' {
					j++
				}
				j++
			}
			k := j + 1
			for k < len(b) && (b[k] == ' ' || b[k] == '\t' || b[k] == '\n' || b[k] == '\r') {
				k++
			}
			if isKey := k < len(b) && b[k] == ':'; !isKey && expectValue {
				if err := element(i); err != nil {
					return err
				}
			}
			i = j
			expectValue = false
			continue
		}
		if !expectValue {
			continue // the rest of a number or literal
		}
		expectValue = false
		if c == '[' || c == '{' {
			if err := element(i); err != nil {
				return err
			}
			if depth == maxJSONDepth {
				return tooBig(fmt.Sprintf("nests deeper than %d", maxJSONDepth), i)
			}
			depth++
			counts[depth] = 0
			expectValue = true
			continue
		}
		if err := element(i); err != nil {
			return err
		}
	}
	return nil
}

// decodeStrict decodes one JSON value strictly; field paths in errors are
// prefixed with at.
func decodeStrict(body []byte, v any, at string) error {
	if err := checkJSONShape(body); err != nil {
		return err
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	err := dec.Decode(v)
	if err == nil && dec.More() {
		err = errors.New("trailing data after the JSON value")
	}
	if err == nil {
		if _, terr := dec.Token(); terr != io.EOF {
			err = errors.New("trailing data after the JSON value")
		}
	}
	if err == nil {
		return nil
	}
	var te *json.UnmarshalTypeError
	var se *json.SyntaxError
	switch {
	case errors.Is(err, io.EOF):
		return errs.New(errs.ErrInvalidRequest, "the body is empty")
	case errors.Is(err, io.ErrUnexpectedEOF):
		return errs.New(errs.ErrInvalidRequest, "malformed JSON: the body ends in the middle of a value")
	case errors.As(err, &te):
		f := joinField(at, te.Field)
		return errs.New(errs.ErrInvalidRequest, "a field has the wrong type", api.Detail{Field: f, Message: "must be " + jsonTypeName(te.Type.Kind().String())})
	case errors.As(err, &se):
		return errs.New(errs.ErrInvalidRequest, fmt.Sprintf("malformed JSON at byte %d", se.Offset))
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		name := strings.Trim(strings.TrimPrefix(err.Error(), "json: unknown field "), `"`)
		return errs.New(errs.ErrInvalidRequest, "unknown field "+name, api.Detail{Field: joinField(at, name), Message: "unknown field"})
	}
	// Errors from UnmarshalJSON methods (durations and the like).
	return errs.New(errs.ErrInvalidRequest, "invalid JSON: "+strings.TrimPrefix(err.Error(), "json: "), api.Detail{Field: at, Message: strings.TrimPrefix(err.Error(), "json: ")})
}

func joinField(at, f string) string {
	switch {
	case at == "":
		return f
	case f == "":
		return at
	}
	return at + "." + f
}

func jsonTypeName(kind string) string {
	switch kind {
	case "string":
		return "a string"
	case "map", "struct":
		return "an object"
	case "slice", "array":
		return "an array"
	case "bool":
		return "true or false"
	}
	return "a number"
}

// noContent answers 204 No Content.
func noContent(w http.ResponseWriter) error {
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// writeJSON writes v with status code.
func writeJSON(w http.ResponseWriter, code int, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("encode response: %w", err)
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(code)
	_, _ = w.Write(append(b, '\n'))
	return nil
}

// withErrorsAsJSON makes the mux's own 404 and 405 answers JSON errors.
func withErrorsAsJSON(mux *http.ServeMux) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, pattern := mux.Handler(r); pattern != "" {
			mux.ServeHTTP(w, r)
			return
		}
		rec := &statusRecorder{header: http.Header{}}
		mux.ServeHTTP(rec, r)
		if allow := rec.header.Get("Allow"); allow != "" {
			w.Header().Set("Allow", allow)
		}
		if rec.code == http.StatusMethodNotAllowed {
			errs.Write(w, errs.New(errs.ErrMethodNotAllowed, r.Method+" is not allowed here"))
			return
		}
		errs.Write(w, errs.New(errs.ErrNotFound, "no such endpoint"))
	})
}

// statusRecorder captures the status and headers of the mux's error answers.
type statusRecorder struct {
	header http.Header
	code   int
}

func (s *statusRecorder) Header() http.Header         { return s.header }
func (s *statusRecorder) Write(b []byte) (int, error) { return len(b), nil }
func (s *statusRecorder) WriteHeader(code int)        { s.code = code }

// pool bounds requests in flight; a request that cannot start within a
// second gets 503.
type pool struct{ sem chan struct{} }

func newPool(n int) *pool { return &pool{sem: make(chan struct{}, max(n, 1))} }

// usage is how many of the pool's slots are in use, and how many it has.
func (p *pool) usage() (inUse, slots int) { return len(p.sem), cap(p.sem) }

func (p *pool) serve(w http.ResponseWriter, r *http.Request, next http.Handler) {
	select {
	case p.sem <- struct{}{}:
	default:
		t := time.NewTimer(time.Second)
		select {
		case p.sem <- struct{}{}:
			t.Stop()
		case <-t.C:
			refuseBusy(w, "the server is busy; retry shortly")
			return
		case <-r.Context().Done():
			t.Stop()
			return
		}
	}
	defer func() { <-p.sem }()
	next.ServeHTTP(w, r)
}

// rateLimiter is a token bucket per source address.
type rateLimiter struct {
	mu      sync.Mutex
	rate    float64 // tokens per second
	burst   float64
	buckets map[string]*bucket
}

type bucket struct {
	tokens float64
	last   time.Time
}

func newRateLimiter(perMinute, burst int) *rateLimiter {
	return &rateLimiter{rate: float64(perMinute) / 60, burst: float64(burst), buckets: map[string]*bucket{}}
}

// allow takes a token for key at now.
func (l *rateLimiter) allow(key string, now time.Time) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	b := l.buckets[key]
	if b == nil {
		if len(l.buckets) >= 10000 {
			l.sweep(now)
		}
		b = &bucket{tokens: l.burst, last: now}
		l.buckets[key] = b
	}
	if el := now.Sub(b.last).Seconds(); el > 0 {
		b.tokens = min(l.burst, b.tokens+el*l.rate)
		b.last = now
	}
	if b.tokens < 1 {
		return false
	}
	b.tokens--
	return true
}

// sweep forgets buckets that have refilled.
func (l *rateLimiter) sweep(now time.Time) {
	for k, b := range l.buckets {
		if b.tokens+now.Sub(b.last).Seconds()*l.rate >= l.burst {
			delete(l.buckets, k)
		}
	}
}

// sourceIP is the rate-limiting key of a request: the peer's address (a
// proxy in front must do its own limiting).
func sourceIP(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return host
}
