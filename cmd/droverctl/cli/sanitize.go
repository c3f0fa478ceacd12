package cli

import (
	"fmt"
	"io"
	"unicode/utf8"
)

// A run's log is whatever its job printed, and so whatever an agent (or a
// job on it) chose to send: escape sequences that clear the screen, move
// the cursor, retitle the window, write to the clipboard (OSC 52) or hide
// text. `droverctl logs` passes it to a terminal through termWriter, which
// keeps printable text, newlines and tabs and shows every other control
// character as an escape (ESC as \x1b, a C1 control as \u009b, an invalid
// UTF-8 byte as \xff), as do the bidirectional overrides that reorder what
// is shown. --raw prints the bytes as they are.

// termWriter escapes control characters on their way to w. A UTF-8
// sequence split between two writes is held back until the next write (or
// Flush).
type termWriter struct {
	w       io.Writer
	pending []byte
}

func newTermWriter(w io.Writer) *termWriter { return &termWriter{w: w} }

// Write escapes p; it reports len(p) on success.
func (t *termWriter) Write(p []byte) (int, error) {
	buf := append(t.pending, p...)
	out := make([]byte, 0, len(buf)+16)
	i := 0
	for i < len(buf) {
		c := buf[i]
		if c < utf8.RuneSelf {
			switch {
			case c == '\n' || c == '\t' || (c >= 0x20 && c < 0x7f):
				out = append(out, c)
			default:
				out = fmt.Appendf(out, `\x%02x`, c)
			}
			i++
			continue
		}
		if !utf8.FullRune(buf[i:]) && len(buf)-i < utf8.UTFMax {
			break // the rest of this character comes with the next write
		}
		r, n := utf8.DecodeRune(buf[i:])
		switch {
		case r == utf8.RuneError && n == 1:
			out = fmt.Appendf(out, `\x%02x`, buf[i])
		case unsafeRune(r):
			out = fmt.Appendf(out, `\u%04x`, r)
		default:
			out = append(out, buf[i:i+n]...)
		}
		i += n
	}
	t.pending = append(t.pending[:0], buf[i:]...)
	if _, err := t.w.Write(out); err != nil {
		return 0, err
	}
	return len(p), nil
}

// Flush writes what was held back (an incomplete character), escaped.
func (t *termWriter) Flush() error {
	var out []byte
	for _, c := range t.pending {
		out = fmt.Appendf(out, `\x%02x`, c)
	}
	t.pending = t.pending[:0]
	if len(out) == 0 {
		return nil
	}
	_, err := t.w.Write(out)
	return err
}

// unsafeRune reports C1 controls, the line and paragraph separators and the
// bidirectional embeddings, overrides and isolates.
func unsafeRune(r rune) bool {
	return (r >= 0x80 && r <= 0x9f) || r == 0x2028 || r == 0x2029 ||
		(r >= 0x202a && r <= 0x202e) || (r >= 0x2066 && r <= 0x2069) || r == 0x200e || r == 0x200f || r == 0x061c
}

// logOut is where a log's text goes: stdout through the escaper, or as is
// with --raw.
func (a *app) logOut() io.Writer {
	if a.rawLogs {
		return a.stdout()
	}
	if a.logw == nil || a.logw.w != a.stdout() {
		a.logw = newTermWriter(a.stdout())
	}
	return a.logw
}

// flushLog ends a log's text.
func (a *app) flushLog() error {
	if a.logw == nil {
		return nil
	}
	return a.logw.Flush()
}
