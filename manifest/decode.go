package manifest

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"reflect"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// MaxSpecsPerFile bounds how many documents one YAML source may hold.
const MaxSpecsPerFile = 1000

// MaxSpecFileBytes bounds the size of one YAML source.
const MaxSpecFileBytes = 16 << 20

// MaxYAMLTokens bounds the words and indicators of one YAML source, counted
// before it is parsed: the parser builds a node of some 300 bytes for every
// value, so 7 million "1," in 14 MB would otherwise take 2 GB.
const MaxYAMLTokens = 1_000_000

// yamlTokenBound counts runs of non-blank characters once and each flow or
// block indicator ([ ] { } , : - ?) twice. Every node of the parsed
// document starts at a word or is opened by an indicator (an indicator
// opens at most two: a collection and an empty entry, or an empty key and
// its empty value), so this is an upper
// bound on the nodes the parser can build, found in one pass without
// memory. Words inside scalars count too, which only makes the bound
// looser. FuzzYAMLTokenBound checks the claim against the parser.
func yamlTokenBound(data []byte) int {
	n := 2 // the document node and its root
	inWord := false
	for _, c := range data {
		switch c {
		case ' ', '\t', '\n', '\r':
			inWord = false
		case '[', ']', '{', '}', ',', ':', '-', '?':
			n += 2 // an indicator can open a collection and an empty value, or an empty key and value
			inWord = false
		default:
			if !inWord {
				n++
				inWord = true
			}
		}
	}
	return n
}

// DecodeSpecs reads one or more pipe specs from YAML (documents separated by
// "---"), refusing unknown fields, and validates them all. Every problem is
// returned at once as a *ValidationError whose field paths are "[doc].field"
// and whose lines point into data. Empty documents are ignored.
func DecodeSpecs(data []byte) ([]Spec, error) {
	f, err := DecodeSpecFile(data)
	if err != nil {
		return nil, err
	}
	return f.Specs, nil
}

// SpecFile is a decoded YAML source: its specs, in document order (empty
// documents left out), and where their fields are.
type SpecFile struct {
	Specs []Spec
	roots []*yaml.Node // each spec's root node
}

// Line returns the line of a field path ("schedule", "files[1]",
// "limits.memory_mb") in the document of spec i: the line of the deepest
// part of the path that is there (the document's line for none), 0 when i
// is out of range.
func (f *SpecFile) Line(i int, field string) int {
	if i < 0 || i >= len(f.roots) {
		return 0
	}
	return fieldLine(f.roots[i], field)
}

// DecodeSpecFile is DecodeSpecs that also keeps the positions of the
// specs' fields, to point at them in later messages.
func DecodeSpecFile(data []byte) (*SpecFile, error) {
	if len(data) > MaxSpecFileBytes {
		return nil, &ValidationError{Problems: []FieldError{{Message: fmt.Sprintf("%d bytes, at most %d", len(data), MaxSpecFileBytes)}}}
	}
	if n := yamlTokenBound(data); n > MaxYAMLTokens {
		return nil, &ValidationError{Problems: []FieldError{{Message: fmt.Sprintf("more than %s YAML tokens (words and indicators); split the file", groupThousands(MaxYAMLTokens))}}}
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var docs []*yaml.Node
	for {
		var n yaml.Node
		err := dec.Decode(&n)
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, &ValidationError{Problems: []FieldError{yamlError(fmt.Sprintf("[%d]", len(docs)), err)}}
		}
		if isEmptyDoc(&n) {
			continue
		}
		if len(docs) == MaxSpecsPerFile {
			return nil, &ValidationError{Problems: []FieldError{{Message: fmt.Sprintf("more than %d documents; split the file", MaxSpecsPerFile)}}}
		}
		docs = append(docs, &n)
	}
	var p problems
	specs := make([]Spec, len(docs))
	decoded := make([]bool, len(docs))
	roots := make([]*yaml.Node, len(docs))
	for i, doc := range docs {
		at := fmt.Sprintf("[%d]", i)
		root := doc
		if root.Kind == yaml.DocumentNode && len(root.Content) == 1 {
			root = root.Content[0]
		}
		roots[i] = root
		if root.Kind != yaml.MappingNode {
			p.addFE(FieldError{Field: at, Message: "a pipe must be a mapping of fields (name:, schedule:, ...)", Line: root.Line})
			continue
		}
		before := p.count()
		checkKnownFields(&p, root, reflect.TypeOf(Spec{}), at)
		if p.count() > before {
			continue
		}
		if err := root.Decode(&specs[i]); err != nil {
			fe := yamlError(at, err)
			if path := fieldAtLine(root, fe.Line); path != "" {
				fe.Field = join(at, path)
			}
			p.addFE(fe)
			continue
		}
		decoded[i] = true
	}
	if err := p.err(); err != nil {
		return nil, err
	}
	if err := ValidateSpecs(specs); err != nil {
		var ve *ValidationError
		if errors.As(err, &ve) {
			for j := range ve.Problems {
				ve.Problems[j].Line = lineFor(roots, ve.Problems[j].Field)
			}
		}
		return nil, err
	}
	return &SpecFile{Specs: specs, roots: roots}, nil
}

func isEmptyDoc(n *yaml.Node) bool {
	if n.Kind == 0 {
		return true
	}
	if n.Kind == yaml.DocumentNode {
		if len(n.Content) == 0 {
			return true
		}
		c := n.Content[0]
		return c.Kind == yaml.ScalarNode && c.Tag == "!!null"
	}
	return false
}

var yamlLineRE = regexp.MustCompile(`line (\d+): `)

// yamlError turns a yaml.v3 error into a FieldError with the first line it names.
func yamlError(at string, err error) FieldError {
	msg := strings.TrimPrefix(err.Error(), "yaml: ")
	msg = strings.TrimPrefix(msg, "unmarshal errors:\n  ")
	msg = strings.ReplaceAll(msg, "\n  ", "; ")
	fe := FieldError{Field: at, Message: msg}
	if m := yamlLineRE.FindStringSubmatch(msg); m != nil {
		fe.Line, _ = strconv.Atoi(m[1])
		fe.Message = strings.Replace(msg, m[0], "", 1)
	}
	return fe
}

// yamlFields maps the yaml names of a struct's fields to their types.
func yamlFields(t reflect.Type) map[string]reflect.Type {
	out := map[string]reflect.Type{}
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		if name == "" || name == "-" {
			continue
		}
		out[name] = f.Type
	}
	return out
}

// checkKnownFields reports mapping keys that the target struct does not have,
// recursing into nested structs, with their lines.
func checkKnownFields(p *problems, n *yaml.Node, t reflect.Type, at string) {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t.Kind() != reflect.Struct || n.Kind != yaml.MappingNode {
		return
	}
	fields := yamlFields(t)
	seen := map[string]bool{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		ft, ok := fields[k.Value]
		if !ok {
			known := make([]string, 0, len(fields))
			for name := range fields {
				known = append(known, name)
			}
			sort.Strings(known)
			p.addFE(FieldError{Field: join(at, k.Value), Message: "unknown field (known: " + strings.Join(known, ", ") + ")", Line: k.Line})
			continue
		}
		if seen[k.Value] {
			p.addFE(FieldError{Field: join(at, k.Value), Message: "given twice", Line: k.Line})
		}
		seen[k.Value] = true
		checkKnownFields(p, v, ft, join(at, k.Value))
	}
}

// fieldAtLine is the path of the deepest mapping key on line under n
// ("retries", "retries.backoff"), so that a value of the wrong type is
// reported at its field; "" when no key is on that line.
func fieldAtLine(n *yaml.Node, line int) string {
	if line <= 0 || n.Kind != yaml.MappingNode {
		return ""
	}
	found := ""
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		path := ""
		if sub := fieldAtLine(v, line); sub != "" {
			path = join(k.Value, sub)
		} else if k.Line == line {
			path = k.Value
		}
		if path != "" && found != "" {
			return "" // several keys on the line (a flow mapping): the caller's key is the field
		}
		if path != "" {
			found = path
		}
	}
	return found
}

// lineFor finds the line of a field path like "[2].limits.memory_mb" or
// "[0].secrets[1]" in the documents' root nodes; 0 when unknown.
func lineFor(roots []*yaml.Node, field string) int {
	if !strings.HasPrefix(field, "[") {
		return 0
	}
	end := strings.IndexByte(field, ']')
	idx, err := strconv.Atoi(field[1:end])
	if err != nil || idx < 0 || idx >= len(roots) {
		return 0
	}
	return fieldLine(roots[idx], strings.TrimPrefix(field[end+1:], "."))
}

// fieldLine finds the line of a field path ("schedule", "files[1]",
// "limits.memory_mb") under a document's root node n: the line of the
// deepest part of the path that is there.
func fieldLine(n *yaml.Node, field string) int {
	line := n.Line
	rest := field
	for rest != "" {
		if strings.HasPrefix(rest, "[") {
			e := strings.IndexByte(rest, ']')
			if e < 0 {
				break
			}
			i, err := strconv.Atoi(rest[1:e])
			if err != nil || n.Kind != yaml.SequenceNode || i < 0 || i >= len(n.Content) {
				break
			}
			n = n.Content[i]
			line = n.Line
			rest = strings.TrimPrefix(rest[e+1:], ".")
			continue
		}
		seg := rest
		if cut := strings.IndexAny(rest, ".["); cut >= 0 {
			seg, rest = rest[:cut], strings.TrimPrefix(rest[cut:], ".")
		} else {
			rest = ""
		}
		if n.Kind != yaml.MappingNode {
			break
		}
		found := false
		for i := 0; i+1 < len(n.Content); i += 2 {
			if n.Content[i].Value == seg {
				line = n.Content[i].Line
				n = n.Content[i+1]
				found = true
				break
			}
		}
		if !found {
			break
		}
	}
	return line
}
