package server

import (
	"bytes"
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
	name := r.PathValue("name")
	if !manifest.ValidName(name) {
		return "", errs.New(errs.ErrInvalidRequest, "invalid pipe name "+quoteName(name)+" in the path",
			api.Detail{Field: "name", Message: "use 1-63 lowercase letters, digits and '-', starting with a letter or digit"})
	}
	return name, nil
}

func secretName(r *http.Request) (string, error) {
	name := r.PathValue("name")
	if !secretNameRE.MatchString(name) || strings.HasPrefix(name, "DROVER_") {
		return "", errs.New(errs.ErrInvalidRequest, "invalid secret name "+quoteName(name)+" in the path",
			api.Detail{Field: "name", Message: "use 1-128 letters, digits and '_', not starting with a digit or DROVER_"})
	}
	return name, nil
}

// agentIDParam is the {id} of an agent route, checked.
func agentIDParam(r *http.Request) (string, error) {
	id := r.PathValue("id")
	if !manifest.ValidAgentID(id) {
		return "", errs.New(errs.ErrInvalidRequest, "invalid agent id "+quoteName(id)+" in the path",
			api.Detail{Field: "id", Message: "an agent id such as agt-..."})
	}
	return id, nil
}

// tokenIDParam is the {id} of an enrollment-token or API-token route.
func tokenIDParam(r *http.Request, apiToken bool) (string, error) {
	id := r.PathValue("id")
	if tokenIDRE.MatchString(id) || (apiToken && id == bootstrapTokenID) {
		return id, nil
	}
	return "", errs.New(errs.ErrInvalidRequest, "invalid token id "+quoteName(id)+" in the path",
		api.Detail{Field: "id", Message: "16 lowercase letters and digits 2-7, as listed"})
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
