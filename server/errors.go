package server

import (
	"encoding/json"
	"errors"
	"net/http"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/drover/drover/manifest"
)

// Sentinel error kinds. Every error a handler returns wraps one of them (or
// is a *manifest.ValidationError); errorKinds maps each to its JSON code, its
// HTTP status and its gRPC code. They are declared here and nowhere else.
var (
	ErrInvalidRequest   = errors.New("invalid request")
	ErrValidation       = errors.New("validation failed")
	ErrUnauthenticated  = errors.New("unauthenticated")
	ErrPermissionDenied = errors.New("permission denied")
	ErrCertRefused      = errors.New("certificate refused")
	ErrAgentRevoked     = errors.New("agent revoked")
	ErrInvalidToken     = errors.New("invalid enrollment token")
	ErrTokenExpired     = errors.New("enrollment token expired")
	ErrTokenUsed        = errors.New("enrollment token already used")
	ErrTokenRevoked     = errors.New("token revoked")
	ErrNotFound         = errors.New("not found")
	ErrMethodNotAllowed = errors.New("method not allowed")
	ErrConflict         = errors.New("conflict")
	ErrIdentityConflict = errors.New("identity conflict")
	ErrTooLarge         = errors.New("request too large")
	ErrUnsupportedMedia = errors.New("unsupported media type")
	ErrRateLimited      = errors.New("rate limited")
	ErrUnavailable      = errors.New("unavailable")
	ErrInternal         = errors.New("internal error")
)

// errorKind is one row of the error table.
type errorKind struct {
	err  error
	code string // snake_case, the "code" of a JSON error
	http int
	grpc codes.Code
}

// errorKinds is THE table from error kinds to wire codes. Order matters only
// for errors wrapping several kinds: the first match wins.
var errorKinds = []errorKind{
	{ErrValidation, "validation_failed", http.StatusUnprocessableEntity, codes.InvalidArgument},
	{ErrInvalidRequest, "invalid_request", http.StatusBadRequest, codes.InvalidArgument},
	{ErrUnauthenticated, "unauthenticated", http.StatusUnauthorized, codes.Unauthenticated},
	{ErrCertRefused, "certificate_refused", http.StatusUnauthorized, codes.Unauthenticated},
	{ErrInvalidToken, "invalid_token", http.StatusUnauthorized, codes.Unauthenticated},
	{ErrTokenExpired, "token_expired", http.StatusUnauthorized, codes.Unauthenticated},
	{ErrTokenUsed, "token_used", http.StatusUnauthorized, codes.Unauthenticated},
	{ErrTokenRevoked, "token_revoked", http.StatusUnauthorized, codes.Unauthenticated},
	{ErrAgentRevoked, "agent_revoked", http.StatusForbidden, codes.PermissionDenied},
	{ErrPermissionDenied, "permission_denied", http.StatusForbidden, codes.PermissionDenied},
	{ErrNotFound, "not_found", http.StatusNotFound, codes.NotFound},
	{ErrMethodNotAllowed, "method_not_allowed", http.StatusMethodNotAllowed, codes.Unimplemented},
	{ErrIdentityConflict, "identity_conflict", http.StatusConflict, codes.PermissionDenied},
	{ErrConflict, "conflict", http.StatusConflict, codes.Aborted},
	{ErrTooLarge, "too_large", http.StatusRequestEntityTooLarge, codes.ResourceExhausted},
	{ErrUnsupportedMedia, "unsupported_media_type", http.StatusUnsupportedMediaType, codes.InvalidArgument},
	{ErrRateLimited, "rate_limited", http.StatusTooManyRequests, codes.ResourceExhausted},
	{ErrUnavailable, "unavailable", http.StatusServiceUnavailable, codes.Unavailable},
	{ErrInternal, "internal", http.StatusInternalServerError, codes.Internal},
}

// kindOf finds the table row for err; unknown errors are internal.
func kindOf(err error) errorKind {
	var ve *manifest.ValidationError
	if errors.As(err, &ve) {
		return errorKinds[0]
	}
	for _, k := range errorKinds {
		if errors.Is(err, k.err) {
			return k
		}
	}
	return errorKinds[len(errorKinds)-1]
}

// Detail is one field-level problem in an error response.
type Detail struct {
	Field   string `json:"field"`
	Message string `json:"message"`
	Line    int    `json:"line,omitempty"`
}

// apiError is an error with a public message and details. Its message is
// shown to clients as is, so it must never hold a secret.
type apiError struct {
	kind    error
	msg     string
	details []Detail
}

func (e *apiError) Error() string { return e.msg }
func (e *apiError) Unwrap() error { return e.kind }

// newError returns an error of the given kind with a public message.
func newError(kind error, msg string, details ...Detail) error {
	return &apiError{kind: kind, msg: msg, details: details}
}

// ErrorBody is the JSON shape of every error response.
type ErrorBody struct {
	Error ErrorInfo `json:"error"`
}

// ErrorInfo is what an error response says.
type ErrorInfo struct {
	Code    string   `json:"code"`
	Message string   `json:"message"`
	Details []Detail `json:"details,omitempty"`
}

type errorBody = ErrorBody

// publicError returns what a client may see of err: its kind, message and
// details. Internal errors get a generic message; their text (which may
// name paths or SQL) stays in the server log.
func publicError(err error) (errorKind, errorBody) {
	k := kindOf(err)
	var b errorBody
	b.Error.Code = k.code
	var ae *apiError
	var ve *manifest.ValidationError
	switch {
	case k.err == ErrInternal:
		b.Error.Message = "internal error"
	case errors.As(err, &ve):
		b.Error.Message = "the request has invalid fields"
		for _, p := range ve.Problems {
			b.Error.Details = append(b.Error.Details, Detail{Field: p.Field, Message: p.Message, Line: p.Line})
		}
	case errors.As(err, &ae):
		b.Error.Message = ae.msg
		b.Error.Details = ae.details
	default:
		b.Error.Message = k.err.Error()
	}
	return k, b
}

// writeError writes err as a JSON error response.
func writeError(w http.ResponseWriter, err error) {
	k, body := publicError(err)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(k.http)
	_ = json.NewEncoder(w).Encode(body)
}

// grpcError converts err to a gRPC status with the table's code.
func grpcError(err error) error {
	k, body := publicError(err)
	return status.Error(k.grpc, body.Error.Message)
}
