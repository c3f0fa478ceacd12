package runner

import (
	"bytes"
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
	for _, v := range values {
		if v == "" || seen[v] {
			continue
		}
		seen[v] = true
		m.secrets = append(m.secrets, []byte(v))
		m.first[v[0]] = true
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
