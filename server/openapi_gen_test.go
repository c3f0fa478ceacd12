package server

import (
	"encoding/json"
	"net/http"
	"reflect"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode"

	"github.com/drover/drover/api"

	"github.com/drover/drover/manifest"
)

// The generator of openapi.json from the route table.

var (
	timeType     = reflect.TypeOf(time.Time{})
	durType      = reflect.TypeOf(manifest.Duration(0))
	rawType      = reflect.TypeOf(json.RawMessage{})
	anyMapType   = reflect.TypeOf(map[string]any{})
	errorRef     = map[string]any{"$ref": "#/components/responses/Error"}
	errorSummary = map[string]string{
		"400": "invalid_request: malformed JSON or YAML, an unknown field, a bad parameter",
		"401": "unauthenticated, token_expired or token_revoked (or, for agents, certificate_refused)",
		"403": "permission_denied: the token's role is too weak (or agent_revoked)",
		"404": "not_found",
		"409": "conflict",
		"413": "too_large: the body or the bundle is over its cap",
		"415": "unsupported_media_type",
		"422": "validation_failed: every problem, with field paths (and YAML lines)",
	}
)

type schemaGen struct{ comps map[string]any }

func (g *schemaGen) schema(t reflect.Type) map[string]any {
	switch {
	case t == timeType:
		return map[string]any{"type": "string", "format": "date-time"}
	case t == durType:
		return map[string]any{"type": "string", "description": "a duration such as 90s, 30m or 1h30m"}
	case t == rawType:
		return map[string]any{}
	case t == anyMapType:
		return map[string]any{"type": "object"}
	}
	switch t.Kind() {
	case reflect.Pointer:
		return g.schema(t.Elem())
	case reflect.Slice, reflect.Array:
		if t.Elem().Kind() == reflect.Uint8 {
			return map[string]any{"type": "string", "format": "byte", "description": "base64"}
		}
		return map[string]any{"type": "array", "items": g.schema(t.Elem())}
	case reflect.Map:
		return map[string]any{"type": "object", "additionalProperties": g.schema(t.Elem())}
	case reflect.String:
		return map[string]any{"type": "string"}
	case reflect.Bool:
		return map[string]any{"type": "boolean"}
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return map[string]any{"type": "integer"}
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return map[string]any{"type": "integer", "minimum": 0}
	case reflect.Float32, reflect.Float64:
		return map[string]any{"type": "number"}
	case reflect.Interface:
		return map[string]any{}
	case reflect.Struct:
		name := t.Name()
		ref := map[string]any{"$ref": "#/components/schemas/" + name}
		if _, done := g.comps[name]; done {
			return ref
		}
		g.comps[name] = nil // breaks cycles
		props := map[string]any{}
		var required []string
		g.fields(t, props, &required)
		obj := map[string]any{"type": "object", "properties": props, "additionalProperties": false}
		if len(required) > 0 {
			sort.Strings(required)
			obj["required"] = required
		}
		g.comps[name] = obj
		return ref
	}
	panic("openapi: unsupported type " + t.String())
}

func (g *schemaGen) fields(t reflect.Type, props map[string]any, required *[]string) {
	for i := range t.NumField() {
		f := t.Field(i)
		tag := f.Tag.Get("json")
		name, opts, _ := strings.Cut(tag, ",")
		if f.Anonymous && tag == "" {
			g.fields(f.Type, props, required)
			continue
		}
		if !f.IsExported() || name == "-" {
			continue
		}
		if name == "" {
			name = f.Name
		}
		props[name] = g.schema(f.Type)
		if !strings.Contains(opts, "omitempty") && !strings.Contains(opts, "omitzero") && f.Type.Kind() != reflect.Pointer {
			*required = append(*required, name)
		}
	}
}

func operationID(method, path string) string {
	var b strings.Builder
	b.WriteString(strings.ToLower(method))
	for _, seg := range strings.FieldsFunc(path, func(r rune) bool { return r == '/' || r == '{' || r == '}' || r == '-' || r == '.' || r == '_' }) {
		b.WriteString(strings.ToUpper(seg[:1]) + seg[1:])
	}
	return b.String()
}

func buildOpenAPI(routes []route) map[string]any {
	g := &schemaGen{comps: map[string]any{}}
	errSchema := g.schema(reflect.TypeOf(api.ErrorBody{}))
	paths := map[string]any{}
	for _, rt := range routes {
		op := map[string]any{
			"operationId":   operationID(rt.method, rt.path),
			"summary":       rt.summary,
			"x-drover-role": rt.role.String(),
		}
		if rt.action != "" {
			op["x-drover-audit-action"] = rt.action
		}
		switch rt.role {
		case rolePublic:
			op["security"] = []any{}
		case roleAgent:
			op["security"] = []any{map[string]any{"mutualTLS": []any{}}}
		default:
			op["security"] = []any{map[string]any{"bearerAuth": []any{}}}
		}
		var params []any
		for _, p := range pathParams(rt.path) {
			params = append(params, map[string]any{"name": p, "in": "path", "required": true, "schema": map[string]any{"type": "string"}})
		}
		for _, p := range rt.query {
			sch := map[string]any{"type": p.typ}
			if p.repeat {
				sch = map[string]any{"type": "array", "items": map[string]any{"type": p.typ}}
			}
			pm := map[string]any{"name": p.name, "in": "query", "schema": sch}
			if p.desc != "" {
				pm["description"] = p.desc
			}
			if p.repeat {
				pm["explode"] = true
			}
			params = append(params, pm)
		}
		if rt.method == "GET" && rt.path == "/api/v1/runs/{id}/logs/stream" {
			params = append(params, map[string]any{"name": "Last-Event-ID", "in": "header", "schema": map[string]any{"type": "string"},
				"description": "resume after this chunk seq"})
		}
		if params != nil {
			op["parameters"] = params
		}
		if rt.body != nil {
			content := map[string]any{"application/json": map[string]any{"schema": g.schema(reflect.TypeOf(rt.body))}}
			if rt.method == "PUT" && rt.path == "/api/v1/pipes/{name}" {
				content["application/yaml"] = map[string]any{"schema": map[string]any{"type": "string", "description": "one pipe spec document (script pipes)"}}
			}
			op["requestBody"] = map[string]any{"required": rt.method != "POST" || rt.path != "/api/v1/pipes/{name}/run", "content": content}
		}
		resp := map[string]any{"description": http.StatusText(rt.status)}
		switch {
		case rt.media != "":
			resp["content"] = map[string]any{rt.media: map[string]any{"schema": map[string]any{"type": "string"}}}
		case rt.resp != nil:
			content := map[string]any{"application/json": map[string]any{"schema": g.schema(reflect.TypeOf(rt.resp))}}
			if rt.path == "/api/v1/runs/{id}/logs" {
				content["text/plain"] = map[string]any{"schema": map[string]any{"type": "string"}}
			}
			resp["content"] = content
		}
		responses := map[string]any{strconv.Itoa(rt.status): resp, "default": errorRef}
		if rt.path == "/api/v1/pipes/{name}" && rt.method == "PUT" {
			responses["200"] = map[string]any{"description": "unchanged: the current version already has this spec and payload", "content": resp["content"]}
		}
		if rt.method == "GET" && (!rt.raw || rt.path == "/api/v1/agents/self/manifest") {
			responses["304"] = map[string]any{"description": "Not Modified: If-None-Match matched the ETag"}
		}
		codes := []string{}
		if rt.role >= roleAgent {
			codes = append(codes, "401", "403")
		}
		if rt.body != nil {
			codes = append(codes, "400", "413", "415", "422")
		}
		if len(rt.query) > 0 {
			codes = append(codes, "400")
		}
		if len(pathParams(rt.path)) > 0 {
			codes = append(codes, "400", "404")
		}
		if rt.path == "/api/v1/runs/{id}/cancel" {
			codes = append(codes, "409")
		}
		slices.Sort(codes)
		for _, c := range slices.Compact(codes) {
			responses[c] = map[string]any{"$ref": "#/components/responses/Error" + c}
		}
		op["responses"] = responses
		ops, _ := paths[rt.path].(map[string]any)
		if ops == nil {
			ops = map[string]any{}
			paths[rt.path] = ops
		}
		ops[strings.ToLower(rt.method)] = op
	}
	for name, v := range g.comps {
		if v == nil {
			panic("openapi: incomplete schema " + name)
		}
		if !unicode.IsUpper(rune(name[0])) {
			panic("openapi: unnamed struct")
		}
	}
	errResponses := map[string]any{
		"Error": map[string]any{"description": "an error", "content": map[string]any{"application/json": map[string]any{"schema": errSchema}}},
	}
	for c, d := range errorSummary {
		errResponses["Error"+c] = map[string]any{"description": d, "content": map[string]any{"application/json": map[string]any{"schema": errSchema}}}
	}
	return map[string]any{
		"openapi": "3.1.0",
		"info": map[string]any{
			"title":   "Drover control plane API",
			"version": "v1",
			"description": "The HTTPS API of drover-server (port 8443). JSON bodies, decoded strictly (unknown fields and trailing data are refused), " +
				"size-limited (1 MiB; pipe uploads also the base64 of a 10 MiB bundle). Every error is " +
				`{"error": {"code", "message", "details": [{"field", "message", "line"}]}}. ` +
				"Lists take limit (1-1000, default 100) and cursor, and return next_cursor while more remain. " +
				"A 200 to a GET carries an ETag (sha256 of the body); If-None-Match answers 304. " +
				"Operators authenticate with Authorization: Bearer <API token>; x-drover-role names the least role a route needs " +
				"(viewer < operator < admin). Agents use their client certificate (mTLS). Every successful call of a route with " +
				"x-drover-audit-action writes one audit entry (GET /api/v1/audit).",
		},
		"paths": paths,
		"components": map[string]any{
			"schemas":   g.comps,
			"responses": errResponses,
			"securitySchemes": map[string]any{
				"bearerAuth": map[string]any{"type": "http", "scheme": "bearer", "description": "an API token (drvt1.<id>.<secret>) or the bootstrap admin.token"},
				"mutualTLS":  map[string]any{"type": "mutualTLS", "description": "the agent's client certificate from enrollment"},
			},
		},
	}
}
