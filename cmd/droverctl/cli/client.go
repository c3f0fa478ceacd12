package cli

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/drover/drover/api"
	"github.com/drover/drover/signing"
)

// maxResponseBytes caps a JSON response; logs are streamed, not buffered.
const maxResponseBytes = 256 << 20

// client talks to the admin API.
type client struct {
	base   string
	token  string
	http   *http.Client // with a timeout, for ordinary requests
	stream *http.Client // without one, for following logs
}

// apiClient builds the client on first use.
func (a *app) apiClient() (*client, error) {
	if a.client != nil {
		return a.client, nil
	}
	c, err := a.resolveConn()
	if err != nil {
		return nil, err
	}
	cl, err := newClient(c)
	if err != nil {
		return nil, err
	}
	a.client = cl
	return cl, nil
}

func newClient(c *conn) (*client, error) {
	tlsCfg := &tls.Config{MinVersion: tls.VersionTLS12, CipherSuites: signing.TLSCipherSuites()}
	if c.ca != "" {
		pem, err := os.ReadFile(c.ca)
		if err != nil {
			return nil, fmt.Errorf("CA file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("CA file %s holds no PEM certificate", c.ca)
		}
		tlsCfg.RootCAs = pool
	}
	tr := &http.Transport{
		Proxy:                 http.ProxyFromEnvironment,
		DialContext:           (&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		TLSClientConfig:       tlsCfg,
		TLSHandshakeTimeout:   10 * time.Second,
		ResponseHeaderTimeout: 2 * time.Minute,
		IdleConnTimeout:       30 * time.Second,
		MaxIdleConnsPerHost:   8,
		ForceAttemptHTTP2:     true,
	}
	return &client{
		base:   c.server,
		token:  c.token,
		http:   &http.Client{Transport: tr, Timeout: 5 * time.Minute},
		stream: &http.Client{Transport: tr},
	}, nil
}

func (c *client) close() { c.http.CloseIdleConnections() }

// apiError is an error answer of the API (an *api.Error, which errors.As
// finds) with the request it answered; it adds a hint for a refused token
// and prints nothing the terminal would interpret.
type apiError struct {
	err          *api.Error
	method, path string
}

func (e *apiError) Error() string {
	s := e.err.Error()
	switch e.err.Code {
	case api.CodeUnauthenticated, api.CodeInvalidToken, api.CodeTokenExpired, api.CodeTokenRevoked:
		s += "\n  (check --token, DROVER_TOKEN or droverctl login)"
	}
	return sanitizeText(s)
}

func (e *apiError) Unwrap() error { return e.err }

// missingEndpoint reports whether err says the server has no such route
// (an older server): the mux's own 404 or 405.
func missingEndpoint(err error) bool {
	var ae *api.Error
	if !errors.As(err, &ae) {
		return false
	}
	return (ae.Status == http.StatusNotFound && ae.Message == "no such endpoint") ||
		ae.Status == http.StatusMethodNotAllowed || ae.Status == http.StatusNotImplemented
}

// isNotFound reports a 404 for a missing object (not a missing route).
func isNotFound(err error) bool {
	var ae *api.Error
	return errors.As(err, &ae) && ae.Status == http.StatusNotFound && !missingEndpoint(err)
}

// request is one API call.
type request struct {
	method string
	path   string // under base, with query
	body   any    // JSON-encoded unless []byte
	accept string
}

// do sends req and returns the response, turning non-2xx answers into
// *apiError. The caller closes the body.
func (c *client) do(ctx context.Context, hc *http.Client, req request) (*http.Response, error) {
	var rd io.Reader
	var raw []byte
	if req.body != nil {
		switch b := req.body.(type) {
		case []byte:
			raw = b
		default:
			j, err := json.Marshal(b)
			if err != nil {
				return nil, fmt.Errorf("encode request: %w", err)
			}
			raw = j
		}
	}
	for attempt := 0; ; attempt++ {
		if raw != nil {
			rd = bytes.NewReader(raw)
		}
		accept := req.accept
		if accept == "" {
			accept = "application/json"
		}
		hr, err := c.newRequest(ctx, req.method, req.path, rd, accept)
		if err != nil {
			return nil, err
		}
		if raw != nil {
			hr.Header.Set("Content-Type", "application/json")
		}
		resp, err := hc.Do(hr)
		if err != nil {
			return nil, connError(c.base, err)
		}
		if resp.StatusCode/100 == 2 {
			return resp, nil
		}
		ae := readAPIError(resp, req.method, req.path)
		// Reads are retried briefly when the server is busy.
		if req.method == http.MethodGet && attempt < 3 && (resp.StatusCode == http.StatusServiceUnavailable || resp.StatusCode == http.StatusTooManyRequests) {
			wait := time.Second
			if s, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil && s > 0 && s <= 30 {
				wait = time.Duration(s) * time.Second
			}
			select {
			case <-time.After(wait):
				continue
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		return nil, ae
	}
}

// newRequest is a request to path under the base URL that accepts accept,
// with droverctl's User-Agent and the token.
func (c *client) newRequest(ctx context.Context, method, path string, body io.Reader, accept string) (*http.Request, error) {
	hr, err := http.NewRequestWithContext(ctx, method, c.base+path, body)
	if err != nil {
		return nil, err
	}
	hr.Header.Set("Accept", accept)
	hr.Header.Set("User-Agent", "droverctl/"+Version)
	if c.token != "" {
		hr.Header.Set("Authorization", "Bearer "+c.token)
	}
	return hr, nil
}

// readAPIError decodes the error answer to method path and closes its
// body. A body that is not an error body becomes the message, shortened,
// with the code "http_<status>".
func readAPIError(resp *http.Response, method, path string) *apiError {
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	var body struct {
		Error *api.ErrorInfo `json:"error"`
	}
	e := &api.Error{Status: resp.StatusCode}
	if json.Unmarshal(b, &body) == nil && body.Error != nil {
		e.ErrorInfo = *body.Error
	} else {
		e.Code = "http_" + strconv.Itoa(resp.StatusCode)
		e.Message = strings.TrimSpace(string(b))
		if len(e.Message) > 200 {
			e.Message = e.Message[:200] + "…"
		}
	}
	return &apiError{err: e, method: method, path: path}
}

// connError explains a failed connection.
func connError(base string, err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		err = ue.Err
	}
	var uae x509.UnknownAuthorityError
	var hne x509.HostnameError
	var cie x509.CertificateInvalidError
	switch {
	case errors.As(err, &uae):
		return fmt.Errorf("cannot verify the certificate of %s: it is not signed by a trusted CA; pass the server's ca.crt with --ca (or DROVER_CA)", base)
	case errors.As(err, &hne):
		return fmt.Errorf("the certificate of %s does not name this host: %v (connect by a name in the certificate, or add it to the server's tls_sans)", base, hne)
	case errors.As(err, &cie):
		return fmt.Errorf("the certificate of %s is not valid: %v", base, cie)
	case errors.Is(err, context.Canceled):
		return err
	}
	return fmt.Errorf("cannot reach %s: %v", base, err)
}

// getJSON fetches path and decodes its JSON body into out; it also returns
// the raw body for -o json.
func (c *client) call(ctx context.Context, method, path string, body, out any) (json.RawMessage, error) {
	resp, err := c.do(ctx, c.http, request{method: method, path: path, body: body})
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxResponseBytes+1))
	if err != nil {
		return nil, fmt.Errorf("%s %s: read response: %w", method, path, err)
	}
	if len(b) > maxResponseBytes {
		return nil, fmt.Errorf("%s %s: response larger than %d bytes", method, path, maxResponseBytes)
	}
	if resp.StatusCode == http.StatusNoContent || len(bytes.TrimSpace(b)) == 0 {
		return nil, nil
	}
	if out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			return nil, fmt.Errorf("%s %s: unexpected response: %w", method, path, err)
		}
	}
	return json.RawMessage(b), nil
}

func (c *client) get(ctx context.Context, path string, out any) (json.RawMessage, error) {
	return c.call(ctx, http.MethodGet, path, nil, out)
}

// list fetches every page of a list endpoint whose answer is
// {"<key>": [...], "next_cursor": "..."} and returns the items, at most
// limit[0] of them when given.
func (c *client) list(ctx context.Context, path, key string, q url.Values, limit ...int) ([]json.RawMessage, error) {
	items, _, err := c.listHead(ctx, path, key, q, limit...)
	return items, err
}

// listHead is list that also returns the first page's other fields (a
// pipe history's name and deleted, say), without key and next_cursor.
func (c *client) listHead(ctx context.Context, path, key string, q url.Values, limit ...int) ([]json.RawMessage, map[string]json.RawMessage, error) {
	var items []json.RawMessage
	var head map[string]json.RawMessage
	seen := map[string]bool{}
	for {
		p := path
		if enc := q.Encode(); enc != "" {
			p += "?" + enc
		}
		var page map[string]json.RawMessage
		if _, err := c.get(ctx, p, &page); err != nil {
			return nil, nil, err
		}
		if head == nil {
			head = map[string]json.RawMessage{}
			for k, v := range page {
				if k != key && k != "next_cursor" {
					head[k] = v
				}
			}
		}
		var got []json.RawMessage
		if raw, ok := page[key]; ok && string(raw) != "null" {
			if err := json.Unmarshal(raw, &got); err != nil {
				return nil, nil, fmt.Errorf("GET %s: %q is not a list: %w", path, key, err)
			}
		}
		items = append(items, got...)
		var next string
		if raw, ok := page["next_cursor"]; ok {
			_ = json.Unmarshal(raw, &next)
		}
		if len(limit) > 0 && limit[0] > 0 && len(items) >= limit[0] {
			return items[:limit[0]], head, nil
		}
		if next == "" || seen[next] || len(got) == 0 {
			return items, head, nil
		}
		seen[next] = true
		if q == nil {
			q = url.Values{}
		}
		q.Set("cursor", next)
	}
}

// pathEscape escapes one path segment.
func pathEscape(s string) string { return url.PathEscape(s) }
