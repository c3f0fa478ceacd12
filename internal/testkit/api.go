package testkit

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"testing"
)

// APIClient calls a drover-server's HTTP API with a bearer token.
type APIClient struct {
	HTTP  *http.Client
	Base  string // https://host:port
	Token string
	// Accept, when not empty, is sent as the Accept header (e.g.
	// application/json for a run's log as JSON chunks).
	Accept string
}

// Call sends a request, with body (when not nil) as JSON, and returns the
// status and the response body.
func (c APIClient) Call(method, path string, body any) (int, []byte, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return 0, nil, err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, c.Base+path, rd)
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Authorization", "Bearer "+c.Token)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if c.Accept != "" {
		req.Header.Set("Accept", c.Accept)
	}
	resp, err := c.HTTP.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, b, err
}

// JSON is Call that fails t on an error or a status other than 2xx, and
// decodes the answer into out when out is not nil.
func (c APIClient) JSON(t testing.TB, method, path string, body, out any) {
	t.Helper()
	code, b, err := c.Call(method, path, body)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	if code/100 != 2 {
		t.Fatalf("%s %s: %d %s", method, path, code, b)
	}
	if out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			t.Fatalf("%s %s: decode %s: %v", method, path, b, err)
		}
	}
}
