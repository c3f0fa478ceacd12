package api

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
)

// Error codes: the "code" of an error body. The server maps each of its
// error kinds to one of them (and to an HTTP status and a gRPC code).
const (
	CodeValidationFailed     = "validation_failed"
	CodeInvalidRequest       = "invalid_request"
	CodeUnauthenticated      = "unauthenticated"
	CodeCertificateRefused   = "certificate_refused"
	CodeInvalidToken         = "invalid_token"
	CodeTokenExpired         = "token_expired"
	CodeTokenUsed            = "token_used"
	CodeTokenRevoked         = "token_revoked"
	CodeAgentRevoked         = "agent_revoked"
	CodePermissionDenied     = "permission_denied"
	CodeNotFound             = "not_found"
	CodeMethodNotAllowed     = "method_not_allowed"
	CodeIdentityConflict     = "identity_conflict"
	CodeConflict             = "conflict"
	CodeTooLarge             = "too_large"
	CodeUnsupportedMediaType = "unsupported_media_type"
	CodeRateLimited          = "rate_limited"
	CodeUnavailable          = "unavailable"
	CodeInternal             = "internal"
)

// ErrorBody is the JSON shape of every error answer.
type ErrorBody struct {
	Error ErrorInfo `json:"error"`
}

// ErrorInfo is what an error answer says.
type ErrorInfo struct {
	Code    string   `json:"code"`
	Message string   `json:"message"`
	Details []Detail `json:"details,omitempty"`
}

// Detail is one field-level problem in an error answer.
type Detail struct {
	Field   string `json:"field"`
	Message string `json:"message"`
	Line    int    `json:"line,omitempty"`
}

// Error is an error answer as a client sees it: the HTTP status and the body.
type Error struct {
	Status int
	ErrorInfo
}

// Error formats the answer as "message (code, HTTP status)", then one line
// per detail.
func (e *Error) Error() string {
	var b strings.Builder
	msg := e.Message
	if msg == "" {
		msg = http.StatusText(e.Status)
	}
	if e.Code != "" {
		fmt.Fprintf(&b, "%s (%s, HTTP %d)", msg, e.Code, e.Status)
	} else {
		fmt.Fprintf(&b, "%s (HTTP %d)", msg, e.Status)
	}
	for _, d := range e.Details {
		b.WriteString("\n  ")
		if d.Field != "" {
			b.WriteString(d.Field + ": ")
		}
		b.WriteString(d.Message)
	}
	return b.String()
}

// maxErrorBody bounds how much of an error answer a client reads.
const maxErrorBody = 64 << 10

// DecodeError builds the *Error of an answer with the given status from its
// body; a body that is not an error body leaves code and message empty.
func DecodeError(status int, body []byte) *Error {
	e := &Error{Status: status}
	var eb ErrorBody
	if json.Unmarshal(body, &eb) == nil {
		e.ErrorInfo = eb.Error
	}
	return e
}

// ReadError reads (up to 64 KiB of) resp's body as an error answer. It does
// not close the body.
func ReadError(resp *http.Response) *Error {
	b, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
	return DecodeError(resp.StatusCode, b)
}
