package server

import (
	"bytes"
	"context"
	_ "embed"
	"fmt"
	"mime"
	"net/http"
	"sort"
	"strconv"
	"strings"

	"github.com/drover/drover/api"
	"github.com/drover/drover/server/errs"

	"github.com/drover/drover/manifest"
)

// pipeName is the {name} of a pipe route, checked: a bad name is a 400
// naming the problem, never a lookup.
func pipeName(r *http.Request) (string, error) {
	return pathParam(r, "name", "pipe name", manifest.ValidName,
		"use 1-63 lowercase letters, digits and '-', starting with a letter or digit")
}

func secretName(r *http.Request) (string, error) {
	return pathParam(r, "name", "secret name", func(name string) bool {
		return secretNameRE.MatchString(name) && !strings.HasPrefix(name, "DROVER_")
	}, "use 1-128 letters, digits and '_', not starting with a digit or DROVER_")
}

// agentIDParam is the {id} of an agent route, checked.
func agentIDParam(r *http.Request) (string, error) {
	return pathParam(r, "id", "agent id", manifest.ValidAgentID, "an agent id such as agt-...")
}

// pathParam is the path value key of r when valid accepts it, else a 400
// "invalid <what> ... in the path" whose detail, on field key, is hint.
func pathParam(r *http.Request, key, what string, valid func(string) bool, hint string) (string, error) {
	v := r.PathValue(key)
	if !valid(v) {
		return "", errs.New(errs.ErrInvalidRequest, "invalid "+what+" "+quoteName(v)+" in the path", api.Detail{Field: key, Message: hint})
	}
	return v, nil
}

const tokenIDHint = "16 lowercase letters and digits 2-7, as listed"

// enrollmentTokenID is the {id} of an enrollment-token route.
func enrollmentTokenID(r *http.Request) (string, error) {
	return pathParam(r, "id", "token id", tokenIDRE.MatchString, tokenIDHint)
}

// apiTokenID is the {id} of an API-token route; the bootstrap token's id
// is one too.
func apiTokenID(r *http.Request) (string, error) {
	return pathParam(r, "id", "token id", func(id string) bool {
		return tokenIDRE.MatchString(id) || id == bootstrapTokenID
	}, tokenIDHint)
}

// fetchParam reads the checked path parameter of r and loads what it
// names: a bad parameter is a 400 before any lookup.
func fetchParam[T any](r *http.Request, param func(*http.Request) (string, error), get func(context.Context, string) (T, error)) (string, T, error) {
	var zero T
	key, err := param(r)
	if err != nil {
		return "", zero, err
	}
	v, err := get(r.Context(), key)
	if err != nil {
		return "", zero, err
	}
	return key, v, nil
}

// paramBody reads the checked path parameter of r, then decodes its JSON
// body (at most limit bytes) into a new T.
func paramBody[T any](w http.ResponseWriter, r *http.Request, param func(*http.Request) (string, error), limit int64) (string, *T, error) {
	key, err := param(r)
	if err != nil {
		return "", nil, err
	}
	req := new(T)
	if err := decodeJSON(w, r, limit, req); err != nil {
		return "", nil, err
	}
	return key, req, nil
}

// decodeOptionalJSON decodes a JSON body like decodeJSON; an empty body
// leaves v as it is.
func decodeOptionalJSON(w http.ResponseWriter, r *http.Request, limit int64, v any) error {
	if r.ContentLength == 0 {
		return nil
	}
	body, err := readBody(w, r, limit)
	if err != nil || len(bytes.TrimSpace(body)) == 0 {
		return err
	}
	if ct := r.Header.Get("Content-Type"); ct != "" {
		if mt, _, err := mime.ParseMediaType(ct); err != nil || mt != "application/json" {
			return errs.New(errs.ErrUnsupportedMedia, "the body must be application/json")
		}
	}
	return decodeStrict(body, v, "")
}

// quoteName quotes a name from a request for a message: escaped, and cut
// at 80 bytes.
func quoteName(s string) string {
	if len(s) > 80 {
		s = s[:80] + "..."
	}
	return strconv.QuoteToASCII(s)
}

// queryTags parses repeated ?tag=key=value parameters.
func queryTags(r *http.Request) (map[string]string, error) {
	vals := r.URL.Query()["tag"]
	if len(vals) == 0 {
		return nil, nil
	}
	sel := map[string]string{}
	for _, kv := range vals {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || !manifest.ValidTagKey(k) || !manifest.ValidTagValue(v) {
			return nil, errs.New(errs.ErrInvalidRequest, "invalid tag filter", api.Detail{Field: "tag", Message: fmt.Sprintf("%s is not key=value with a valid key and value", quoteName(kv))})
		}
		sel[k] = v
	}
	return sel, nil
}

// hasTags reports whether have holds every tag of want (an empty want
// matches everything).
func hasTags(have, want map[string]string) bool {
	for k, v := range want {
		if got, ok := have[k]; !ok || got != v {
			return false
		}
	}
	return true
}

func formatTags(tags map[string]string) string {
	keys := make([]string, 0, len(tags))
	for k, v := range tags {
		keys = append(keys, k+"="+v)
	}
	sort.Strings(keys)
	return strings.Join(keys, ",")
}
