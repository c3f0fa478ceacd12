package server

import (
	"encoding/json"
	"errors"
	"net/http"

	"github.com/drover/drover/api"
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
	{ErrValidation, api.CodeValidationFailed, http.StatusUnprocessableEntity, codes.InvalidArgument},
	{ErrInvalidRequest, api.CodeInvalidRequest, http.StatusBadRequest, codes.InvalidArgument},
	{ErrUnauthenticated, api.CodeUnauthenticated, http.StatusUnauthorized, codes.Unauthenticated},
	{ErrCertRefused, api.CodeCertificateRefused, http.StatusUnauthorized, codes.Unauthenticated},
	{ErrInvalidToken, api.CodeInvalidToken, http.StatusUnauthorized, codes.Unauthenticated},
	{ErrTokenExpired, api.CodeTokenExpired, http.StatusUnauthorized, codes.Unauthenticated},
	{ErrTokenUsed, api.CodeTokenUsed, http.StatusUnauthorized, codes.Unauthenticated},
	{ErrTokenRevoked, api.CodeTokenRevoked, http.StatusUnauthorized, codes.Unauthenticated},
	{ErrAgentRevoked, api.CodeAgentRevoked, http.StatusForbidden, codes.PermissionDenied},
	{ErrPermissionDenied, api.CodePermissionDenied, http.StatusForbidden, codes.PermissionDenied},
	{ErrNotFound, api.CodeNotFound, http.StatusNotFound, codes.NotFound},
	{ErrMethodNotAllowed, api.CodeMethodNotAllowed, http.StatusMethodNotAllowed, codes.Unimplemented},
	{ErrIdentityConflict, api.CodeIdentityConflict, http.StatusConflict, codes.PermissionDenied},
	{ErrConflict, api.CodeConflict, http.StatusConflict, codes.Aborted},
	{ErrTooLarge, api.CodeTooLarge, http.StatusRequestEntityTooLarge, codes.ResourceExhausted},
	{ErrUnsupportedMedia, api.CodeUnsupportedMediaType, http.StatusUnsupportedMediaType, codes.InvalidArgument},
	{ErrRateLimited, api.CodeRateLimited, http.StatusTooManyRequests, codes.ResourceExhausted},
	{ErrUnavailable, api.CodeUnavailable, http.StatusServiceUnavailable, codes.Unavailable},
	{ErrInternal, api.CodeInternal, http.StatusInternalServerError, codes.Internal},
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

// apiError is an error with a public message and details. Its message is
// shown to clients as is, so it must never hold a secret.
type apiError struct {
	kind    error
	msg     string
	details []api.Detail
}

func (e *apiError) Error() string { return e.msg }
func (e *apiError) Unwrap() error { return e.kind }

// newError returns an error of the given kind with a public message.
func newError(kind error, msg string, details ...api.Detail) error {
	return &apiError{kind: kind, msg: msg, details: details}
}

// publicError returns what a client may see of err: its kind, message and
// details. Internal errors get a generic message; their text (which may
// name paths or SQL) stays in the server log.
func publicError(err error) (errorKind, api.ErrorBody) {
	k := kindOf(err)
	var b api.ErrorBody
	b.Error.Code = k.code
	var ae *apiError
	var ve *manifest.ValidationError
	switch {
	case k.err == ErrInternal:
		b.Error.Message = "internal error"
	case errors.As(err, &ve):
		b.Error.Message = "the request has invalid fields"
		for _, p := range ve.Problems {
			b.Error.Details = append(b.Error.Details, api.Detail{Field: p.Field, Message: p.Message, Line: p.Line})
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
