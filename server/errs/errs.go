// Package errs holds the server's error kinds and THE table from each kind to
// its JSON error code (api.Code*), HTTP status and gRPC code.
// Every error a store, handler or stream returns wraps one of the kinds (or
// is a *manifest.ValidationError); anything else is internal. Any server
// package may import it; it imports only the wire contract.
package errs

import (
	"encoding/json"
	"errors"
	"net/http"

	"github.com/drover/drover/api"
	"github.com/drover/drover/manifest"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// The error kinds, declared here and nowhere else.
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

// Kind is one row of the error table.
type Kind struct {
	Err  error
	Code string // snake_case, the "code" of a JSON error
	HTTP int
	GRPC codes.Code
}

// kinds is THE table from error kinds to wire codes. Order matters only
// for errors wrapping several kinds: the first match wins.
var kinds = []Kind{
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

// KindOf finds the table row for err; unknown errors are internal.
func KindOf(err error) Kind {
	var ve *manifest.ValidationError
	if errors.As(err, &ve) {
		return kinds[0]
	}
	for _, k := range kinds {
		if errors.Is(err, k.Err) {
			return k
		}
	}
	return kinds[len(kinds)-1]
}

// Error is an error with a public message and details. Its message is
// shown to clients as is, so it must never hold a secret.
type Error struct {
	kind    error
	msg     string
	details []api.Detail
}

func (e *Error) Error() string { return e.msg }
func (e *Error) Unwrap() error { return e.kind }

// New returns an error of the given kind with a public message.
func New(kind error, msg string, details ...api.Detail) error {
	return &Error{kind: kind, msg: msg, details: details}
}

// NotFound is the ErrNotFound error "<what> not found".
func NotFound(what string) error { return New(ErrNotFound, what+" not found") }

// Details returns the details of an *Error that err wraps, if any.
func Details(err error) []api.Detail {
	var e *Error
	if errors.As(err, &e) {
		return e.details
	}
	return nil
}

// Public returns what a client may see of err: its kind, message and
// details. Internal errors get a generic message; their text (which may
// name paths or SQL) stays in the server log.
func Public(err error) (Kind, api.ErrorBody) {
	k := KindOf(err)
	var b api.ErrorBody
	b.Error.Code = k.Code
	var ae *Error
	var ve *manifest.ValidationError
	switch {
	case k.Err == ErrInternal:
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
		b.Error.Message = k.Err.Error()
	}
	return k, b
}

// Write writes err as a JSON error response.
func Write(w http.ResponseWriter, err error) {
	k, body := Public(err)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(k.HTTP)
	_ = json.NewEncoder(w).Encode(body)
}

// GRPC converts err to a gRPC status with the table's code.
func GRPC(err error) error {
	k, body := Public(err)
	return status.Error(k.GRPC, body.Error.Message)
}
