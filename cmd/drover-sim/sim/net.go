package sim

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/drover/drover/api"
)

func itoa(n int) string { return strconv.Itoa(n) }

// checkLoopback refuses a host:port or host whose addresses are not all
// loopback. A name is resolved; every address must be loopback.
func checkLoopback(ctx context.Context, host string) error {
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	if ip := net.ParseIP(host); ip != nil {
		if !ip.IsLoopback() {
			return fmt.Errorf("%s is not a loopback address (use --allow-remote to load a remote server)", host)
		}
		return nil
	}
	ips, err := net.DefaultResolver.LookupIP(ctx, "ip", host)
	if err != nil {
		return fmt.Errorf("resolve %s: %w", host, err)
	}
	for _, ip := range ips {
		if !ip.IsLoopback() {
			return fmt.Errorf("%s resolves to %s, not a loopback address (use --allow-remote to load a remote server)", host, ip)
		}
	}
	return nil
}

// sourceAddr is the loopback source address of agent i when enrollments are
// spread: perSource agents share one address, so that the server's
// per-address enrollment limit (a burst of 100 by default) is not what is
// measured. Addresses come from 127.10.0.0/16 upwards (all of 127/8 is
// local on Linux), so each also has its own ephemeral port range.
func sourceAddr(i, perSource int) net.IP {
	b := i / max(perSource, 1)
	return net.IPv4(127, byte(10+b/62500), byte(b/250%250+1), byte(b%250+1))
}

// dialer returns a dial function bound to src (nil: the system's choice).
func dialer(src net.IP, timeout time.Duration) func(ctx context.Context, network, addr string) (net.Conn, error) {
	d := &net.Dialer{Timeout: timeout, KeepAlive: 30 * time.Second}
	if src != nil {
		d.LocalAddr = &net.TCPAddr{IP: src}
	}
	return d.DialContext
}

// admin calls the operator API with an API token.
type admin struct {
	base   string
	token  string
	client *http.Client
}

func newAdmin(base, token string, caPEM []byte) (*admin, error) {
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return nil, errors.New("ca: no certificate in the CA PEM")
	}
	u, err := url.Parse(base)
	if err != nil {
		return nil, fmt.Errorf("server: %w", err)
	}
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, ServerName: u.Hostname(), MinVersion: tls.VersionTLS12},
		MaxIdleConnsPerHost: 16, IdleConnTimeout: 30 * time.Second}
	return &admin{base: base, token: token, client: &http.Client{Timeout: 120 * time.Second, Transport: tr}}, nil
}

// call sends body as JSON and decodes a 2xx answer into out.
func (a *admin) call(ctx context.Context, method, path string, body, out any) error {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, a.base+path, rd)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+a.token)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := a.client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return api.ReadError(resp)
	}
	if out == nil {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
		return nil
	}
	return json.NewDecoder(io.LimitReader(resp.Body, 64<<20)).Decode(out)
}

// tokenAttempts bounds the tries of one token creation.
const tokenAttempts = 20

// createToken creates an enrollment token. A 503 (the admin token's
// requests in flight are capped: http.max_concurrent_per_token, shared by
// every worker, each with --enroll-concurrency in flight) is refused before
// the body is read, so it is retried after a growing, jittered pause (at
// most 2 s), at most tokenAttempts times: five workers at 16 each ask for
// 80 at once against a cap of 32, and five quick retries were not always
// enough at 19,500 agents.
func (a *admin) createToken(ctx context.Context, tags map[string]string) (string, error) {
	var out api.EnrollmentTokenCreated
	var err error
	for attempt := 1; ; attempt++ {
		err = a.call(ctx, "POST", "/api/v1/enrollment-tokens", api.EnrollmentTokenRequest{TTL: "1h", Tags: tags}, &out)
		var ae *api.Error
		if err == nil || attempt == tokenAttempts || !errors.As(err, &ae) || ae.Status != http.StatusServiceUnavailable {
			break
		}
		pause := min(time.Duration(attempt)*200*time.Millisecond, 2*time.Second)
		if sleep(ctx, pause/2+rand.N(pause/2)) != nil {
			break
		}
	}
	if err != nil {
		return "", fmt.Errorf("create enrollment token: %w", err)
	}
	return out.Token, nil
}

// putPipe creates or updates the fleet's pipe and returns its version;
// step goes into its script (ChangeScript: a new payload) or an env value
// (ChangeEnv: the same payload).
func (a *admin) putPipe(ctx context.Context, name, fleet, kind string, step int) (uint64, error) {
	spec := map[string]any{
		"schedule": "17 3 * * *",
		"script":   fmt.Sprintf("echo drover-sim fleet %s step %d", fleet, step),
		"targets":  map[string]any{"tags": map[string]string{fleetTag: fleet}},
	}
	if kind == ChangeEnv {
		spec["script"] = "echo drover-sim fleet " + fleet
		spec["env"] = map[string]string{"SIM_STEP": fmt.Sprint(step)}
	}
	var out api.PutPipeResponse
	if err := a.call(ctx, "PUT", "/api/v1/pipes/"+url.PathEscape(name), map[string]any{"spec": spec}, &out); err != nil {
		return 0, fmt.Errorf("put pipe %s: %w", name, err)
	}
	return out.Version, nil
}
