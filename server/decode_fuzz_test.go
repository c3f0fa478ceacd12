package server

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"testing"

	"github.com/drover/drover/api"

	"github.com/drover/drover/manifest"
)

// jsonShape measures a valid JSON text exactly: values, the largest array
// or object, and the deepest nesting.
func jsonShape(b []byte) (values, widest, depth int, err error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	type frame struct {
		obj   bool
		count int
		key   bool // an object's next token is a key
	}
	var stack []frame
	value := func() {
		values++
		if len(stack) > 0 {
			f := &stack[len(stack)-1]
			f.count++
			widest = max(widest, f.count)
			if f.obj {
				f.key = true
			}
		}
	}
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			return values, widest, depth, nil
		}
		if err != nil {
			return 0, 0, 0, err
		}
		if d, ok := tok.(json.Delim); ok {
			switch d {
			case '[', '{':
				value()
				stack = append(stack, frame{obj: d == '{', key: d == '{'})
				depth = max(depth, len(stack))
			default:
				stack = stack[:len(stack)-1]
			}
			continue
		}
		if len(stack) > 0 && stack[len(stack)-1].obj && stack[len(stack)-1].key {
			stack[len(stack)-1].key = false // a key is not a value
			continue
		}
		value()
	}
}

// FuzzDecodeRequest feeds the HTTP API's body decoders: checkJSONShape must
// refuse exactly the JSON texts over its limits (measured here with
// encoding/json), and no decoder may panic.
func FuzzDecodeRequest(f *testing.F) {
	for _, s := range []string{
		`{"spec":{"name":"a","schedule":"@hourly","script":"echo"}}`,
		`{"spec":{"command":["a","b"],"env":{"K":"v"}},"bundle":"H4sI"}`,
		`[[[[[[]]]]]]`, `{"a":{"b":{"c":[1,2,3]}}}`, `"str\"ing"`, `{"k" : "v" , "l":[true,false,null]}`,
		`{"delete":true}`, `[1,2,3`, `{"a":"\\"}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		shapeErr := checkJSONShape(b)
		if json.Valid(b) {
			values, widest, depth, err := jsonShape(b)
			if err == nil {
				over := values > maxJSONValues || widest > maxJSONContainer || depth > maxJSONDepth
				if over != (shapeErr != nil) {
					t.Fatalf("%q: %d values, widest %d, depth %d; checkJSONShape: %v", b, values, widest, depth, shapeErr)
				}
			}
		}
		var put api.PutPipeRequest
		if err := decodeStrict(b, &put, ""); err == nil && len(put.Spec) > 0 {
			var spec manifest.Spec
			if err := decodeStrict(put.Spec, &spec, "spec"); err == nil {
				spec.Normalize()
				if err := spec.Validate(); err != nil {
					var ve *manifest.ValidationError
					if !errors.As(err, &ve) || len(ve.Problems) > manifest.MaxProblems+1 {
						t.Fatalf("validation: %v", err)
					}
				}
			}
		}
		var dry api.DryRunRequest
		_ = decodeStrict(b, &dry, "")
		_, _ = manifest.DecodeSpecs(b)
	})
}
