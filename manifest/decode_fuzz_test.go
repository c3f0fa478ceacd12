package manifest

import (
	"bytes"
	"io"
	"testing"

	"go.yaml.in/yaml/v3"
)

// countNodes counts the nodes of a parsed YAML tree.
func countNodes(n *yaml.Node) int {
	c := 1
	for _, k := range n.Content {
		c += countNodes(k)
	}
	return c
}

// FuzzYAMLTokenBound checks the claim DecodeSpecs relies on: the parser
// never builds more nodes than yamlTokenBound counts, so the bound, checked
// before parsing, bounds the parser's memory. It also runs DecodeSpecs on
// every input (no panics, every problem list capped).
func FuzzYAMLTokenBound(f *testing.F) {
	for _, s := range []string{
		"name: a\nschedule: '@hourly'\nscript: |\n  echo hi\n",
		"[1,1,1,1]", "{a: , b: }", "- \n- \n-\n", "? a\n: b\n", "a: &x [1,2]\nb: *x\n",
		"---\n---\n...\n", "'a b c'", "\"x\\ny\"", "a: >-\n  folded\n  text\n", "[[[[]]]]", "{,}", "!!str a",
		"command: [\"a\",\"b\"]\nenv: {A: '1'}\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		bound := yamlTokenBound(data)
		dec := yaml.NewDecoder(bytes.NewReader(data))
		nodes := 0
		for {
			var n yaml.Node
			err := dec.Decode(&n)
			if err == io.EOF || err != nil {
				break
			}
			nodes += countNodes(&n)
		}
		if nodes > bound {
			t.Fatalf("%d nodes from %q, bound %d", nodes, data, bound)
		}
		if _, err := DecodeSpecs(data); err != nil {
			if ve, ok := err.(*ValidationError); ok && len(ve.Problems) > MaxProblems+1 {
				t.Fatalf("%d problems listed", len(ve.Problems))
			}
		}
	})
}
