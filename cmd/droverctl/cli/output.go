package cli

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"

	"go.yaml.in/yaml/v3"
)

// printData writes v as JSON or YAML (the -o format). JSON keeps the field
// names of v's JSON encoding; YAML is converted from that JSON, so both use
// the API's names and order.
func (a *app) printData(v any) error {
	var raw []byte
	switch x := v.(type) {
	case json.RawMessage:
		raw = x
	case []byte:
		raw = x
	default:
		b, err := json.Marshal(v)
		if err != nil {
			return fmt.Errorf("encode output: %w", err)
		}
		raw = b
	}
	if a.output == "name" {
		return a.printNames(raw)
	}
	return writeFormatted(a.stdout(), a.format(), raw)
}

// writeFormatted writes raw JSON as indented JSON or as YAML.
func writeFormatted(w io.Writer, format string, raw []byte) error {
	if format == "yaml" {
		b, err := jsonToYAML(raw)
		if err != nil {
			return err
		}
		_, err = w.Write(b)
		return err
	}
	var buf bytes.Buffer
	if err := json.Indent(&buf, bytes.TrimSpace(raw), "", "  "); err != nil {
		return fmt.Errorf("the server sent malformed JSON: %w", err)
	}
	buf.WriteByte('\n')
	_, err := w.Write(buf.Bytes())
	return err
}

// jsonToYAML re-encodes JSON as block-style YAML, keeping the key order.
func jsonToYAML(raw []byte) ([]byte, error) {
	var n yaml.Node
	if err := yaml.Unmarshal(raw, &n); err != nil {
		return nil, fmt.Errorf("convert to YAML: %w", err)
	}
	var restyle func(*yaml.Node)
	restyle = func(n *yaml.Node) {
		n.Style = 0
		if n.Kind == yaml.ScalarNode && n.Tag == "!!str" && strings.Contains(n.Value, "\n") {
			n.Style = yaml.LiteralStyle
		}
		for _, c := range n.Content {
			restyle(c)
		}
	}
	restyle(&n)
	var buf bytes.Buffer
	enc := yaml.NewEncoder(&buf)
	enc.SetIndent(2)
	if err := enc.Encode(&n); err != nil {
		return nil, fmt.Errorf("convert to YAML: %w", err)
	}
	if err := enc.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// table writes aligned columns. Cells are made safe for a terminal.
type table struct {
	tw *tabwriter.Writer
}

// tableOf prints items, decoded as T, as a table under header: one row
// each.
func tableOf[T any](w io.Writer, items []json.RawMessage, header []string, row func(*T) []string) error {
	objs, err := decodeAll[T](items)
	if err != nil {
		return err
	}
	t := newTable(w, header...)
	for i := range objs {
		t.row(row(&objs[i])...)
	}
	return t.flush()
}

func newTable(w io.Writer, header ...string) *table {
	t := &table{tw: tabwriter.NewWriter(w, 0, 0, 3, ' ', 0)}
	t.row(header...)
	return t
}

func (t *table) row(cells ...string) {
	for i, c := range cells {
		if i > 0 {
			io.WriteString(t.tw, "\t")
		}
		c = sanitizeLine(c)
		if c == "" {
			c = "-"
		}
		io.WriteString(t.tw, c)
	}
	io.WriteString(t.tw, "\n")
}

func (t *table) flush() error { return t.tw.Flush() }

// sanitizeLine makes s safe to print on one line of a terminal: control
// characters (tabs, newlines, escape sequences) are shown escaped.
func sanitizeLine(s string) string {
	clean := true
	for _, r := range s {
		if unicode.IsControl(r) || r == '\u2028' || r == '\u2029' || r == unicode.ReplacementChar {
			clean = false
			break
		}
	}
	if clean {
		return s
	}
	var b strings.Builder
	for _, r := range s {
		if unicode.IsControl(r) || r == '\u2028' || r == '\u2029' || r == unicode.ReplacementChar {
			q := strconv.QuoteRune(r)
			b.WriteString(q[1 : len(q)-1])
			continue
		}
		b.WriteRune(r)
	}
	return b.String()
}

// sanitizeText keeps newlines but escapes other control characters.
func sanitizeText(s string) string {
	lines := strings.Split(s, "\n")
	for i, l := range lines {
		lines[i] = sanitizeLine(l)
	}
	return strings.Join(lines, "\n")
}

// fmtTime shows a time in UTC to the second; "" for none.
func fmtTime(t *time.Time) string {
	if t == nil || t.IsZero() {
		return ""
	}
	return t.UTC().Format(time.RFC3339)
}

func fmtTimeV(t time.Time) string { return fmtTime(&t) }

// fmtTags shows tags as sorted k=v pairs.
func fmtTags(tags map[string]string) string {
	keys := make([]string, 0, len(tags))
	for k := range tags {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = k + "=" + tags[k]
	}
	return strings.Join(parts, ",")
}

// fmtDuration shows milliseconds compactly (1.5s, 2m3s).
func fmtDuration(ms int64) string {
	d := time.Duration(ms) * time.Millisecond
	switch {
	case d < time.Second:
		return fmt.Sprintf("%dms", ms)
	case d < time.Minute:
		return strconv.FormatFloat(d.Seconds(), 'f', -1, 64) + "s"
	}
	return d.Round(time.Second).String()
}

// shortDigest shortens "sha256:<hex>" for tables.
func shortDigest(d string) string {
	if h, ok := strings.CutPrefix(d, "sha256:"); ok && len(h) > 12 {
		return "sha256:" + h[:12]
	}
	return d
}

// kv writes "Key:  value" lines aligned.
type kvWriter struct {
	tw *tabwriter.Writer
}

func newKV(w io.Writer) *kvWriter { return &kvWriter{tw: tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)} }

func (k *kvWriter) add(key, value string) {
	if value == "" {
		value = "-"
	}
	fmt.Fprintf(k.tw, "%s:\t%s\n", key, sanitizeLine(value))
}

func (k *kvWriter) flush() error { return k.tw.Flush() }
