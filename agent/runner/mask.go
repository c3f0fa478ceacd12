package runner

import (
	"bytes"
	"encoding/base64"
	"net/url"
	"sort"
)

// Mask replaces every secret value in a run's output.
const Mask = "***"

// masker replaces secret values in a byte stream that arrives in arbitrary
// pieces. It holds back a tail that could be the start of a secret until the
// next piece (or the end of the stream) decides, so a value split across two
// reads, and so across two log chunks, is still masked. The tail is never
// released on a timer: a writer that pauses in the middle of a secret must
// not leak its first half.
type masker struct {
	secrets [][]byte // longest first
	first   [256]bool
	pending []byte
}

func newMasker(values []string) *masker {
	m := &masker{}
	seen := map[string]bool{}
	add := func(v string) {
		if v == "" || seen[v] {
			return
		}
		seen[v] = true
		m.secrets = append(m.secrets, []byte(v))
		m.first[v[0]] = true
	}
	for _, v := range values {
		if v == "" {
			continue
		}
		add(v)
		for _, d := range encodedForms(v) {
			add(d)
		}
	}
	sort.Slice(m.secrets, func(i, j int) bool { return len(m.secrets[i]) > len(m.secrets[j]) })
	return m
}

// push adds p to the stream and returns the output that is now safe to emit.
func (m *masker) push(p []byte) []byte {
	if len(m.secrets) == 0 {
		return p
	}
	m.pending = append(m.pending, p...)
	return m.scan(false)
}

// flush ends the stream and returns what was held back, masked.
func (m *masker) flush() []byte {
	if len(m.secrets) == 0 {
		return nil
	}
	return m.scan(true)
}

func (m *masker) scan(eof bool) []byte {
	buf := m.pending
	out := make([]byte, 0, len(buf))
	i := 0
scan:
	for i < len(buf) {
		if !m.first[buf[i]] {
			j := i + 1
			for j < len(buf) && !m.first[buf[j]] {
				j++
			}
			out = append(out, buf[i:j]...)
			i = j
			continue
		}
		rest := buf[i:]
		if !eof {
			// Could a secret longer than what is here start at i? Then wait:
			// emitting a shorter match now could leak the longer value's tail.
			for _, s := range m.secrets {
				if len(s) > len(rest) && bytes.HasPrefix(s, rest) {
					break scan
				}
			}
		}
		for _, s := range m.secrets {
			if bytes.HasPrefix(rest, s) {
				out = append(out, Mask...)
				i += len(s)
				continue scan
			}
		}
		out = append(out, buf[i])
		i++
	}
	m.pending = append(m.pending[:0], buf[i:]...)
	return out
}

// minEncodedLen is the shortest encoded form that is masked: shorter ones
// would hide ordinary text by chance (the value itself is always masked).
const minEncodedLen = 6

// encodedForms are the forms of a secret value a job commonly prints by
// accident: base64 (standard and URL alphabets, with and without padding),
// the base64 of the value inside a longer text at each of the three byte
// alignments (only the characters that depend on the value alone), and
// URL encoding (query and path). What masking does not cover is listed in
// docs/threat-model.md.
func encodedForms(v string) []string {
	var out []string
	add := func(s string) {
		if len(s) >= minEncodedLen && s != v {
			out = append(out, s)
		}
	}
	for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.RawStdEncoding, base64.URLEncoding, base64.RawURLEncoding} {
		add(enc.EncodeToString([]byte(v)))
	}
	for _, enc := range []*base64.Encoding{base64.RawStdEncoding, base64.RawURLEncoding} {
		for shift := range 3 {
			add(shiftedBase64(enc, v, shift))
		}
	}
	add(url.QueryEscape(v))
	add(url.PathEscape(v))
	return out
}

// shiftedBase64 is the part of the base64 of x+v (x: shift bytes of
// anything) that depends on v alone: the characters that share bits with
// the bytes before or after v are dropped.
func shiftedBase64(enc *base64.Encoding, v string, shift int) string {
	b := make([]byte, shift+len(v))
	copy(b[shift:], v)
	s := enc.EncodeToString(b)
	drop := [3]int{0, 2, 3}[shift] // characters holding prefix bits
	if (shift+len(v))%3 != 0 {
		s = s[:len(s)-1] // the last character also holds bits of what follows
	}
	if drop >= len(s) {
		return ""
	}
	return s[drop:]
}
