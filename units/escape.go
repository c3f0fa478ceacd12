package units

import (
	"fmt"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"
)

// Escaping follows systemd.syntax(7) and the parsers systemd 252 uses for the
// options the renderer writes. Every value passes through exactly one of the
// functions below before it is placed after "Key=", and writeUnit checks the
// finished lines once more. The rules:
//
//   - A value never contains a line break: control characters (C0, DEL, C1,
//     U+2028, U+2029) and invalid UTF-8 are rejected with an error, never
//     escaped. So no value can start a line of its own (a section header, an
//     option or a comment).
//   - A line never ends in '\', so no value continues onto the next line.
//     Literal values (no C unescaping, e.g. Description=) that end in '\' get
//     one trailing blank: systemd decides continuation on the raw line (the
//     blank is the last byte) and strips the blank afterwards, so the value
//     keeps its backslash. Words in Exec and Environment lines that contain
//     '\' are double-quoted, so their line ends in '"'.
//   - '%' becomes "%%" in every text value (all the options that carry text
//     expand specifiers). Numbers such as CPUQuota=50% are not expanded by
//     systemd and are written as they are.
//   - '$' becomes "$$" in ExecStart= words, which expand $VAR and ${VAR}.
//   - The first ExecStart= word may not begin with one of the prefix
//     characters "@-:+!|" (they change how systemd runs the command); it must
//     be an absolute path anyway.
//   - A lone ";" is rejected as an ExecStart= word: systemd reads it as a
//     command separator.
//   - Literal values that systemd would trim (leading or trailing white space,
//     including Unicode spaces) are rejected, except Description, whose
//     surrounding space the renderer drops itself.
//   - Paths and names that the renderer builds option values from (pipe name,
//     secret names, run_as, agent paths, data dir) are validated against
//     conservative character sets, so they never need escaping: no blanks,
//     quotes, ':', '%', '$' or '\'.
//
// Values the renderer writes are short; a line longer than maxLine is an
// error (systemd accepts 1 MiB, but go-systemd's parser stops at 2048 bytes).
//
// TestSystemdReadsEscapedValues checks these rules against systemd itself:
// a user manager loads units with hostile values and must hand them back
// unchanged.

// maxLine bounds every rendered line.
const maxLine = 2000

// checkText rejects what may never reach a unit file: invalid UTF-8 and
// control characters (including the Unicode line and paragraph separators).
func checkText(field, s string) error {
	if !utf8.ValidString(s) {
		return fmt.Errorf("units: %s: not valid UTF-8", field)
	}
	for _, r := range s {
		if isControl(r) {
			return fmt.Errorf("units: %s: control character %U not allowed", field, r)
		}
	}
	return nil
}

func isControl(r rune) bool {
	return unicode.IsControl(r) || r == '\u2028' || r == '\u2029'
}

// escapeSpecifiers doubles every '%', so systemd's specifier expansion
// yields the original text.
func escapeSpecifiers(s string) string {
	return strings.ReplaceAll(s, "%", "%%")
}

// literalValue escapes a value for an option that systemd takes verbatim
// after specifier expansion (Description=, User=, OnCalendar=,
// SyslogIdentifier=, ...).
func literalValue(field, s string) (string, error) {
	if err := checkText(field, s); err != nil {
		return "", err
	}
	if s == "" {
		// An empty assignment resets list options: never write one by accident.
		return "", fmt.Errorf("units: %s: empty value", field)
	}
	if trimSpace(s) != s {
		return "", fmt.Errorf("units: %s: %q has leading or trailing white space, which systemd would drop", field, s)
	}
	v := escapeSpecifiers(s)
	if strings.HasSuffix(v, `\`) {
		// systemd joins a line ending in an odd number of '\' with the next
		// one, deciding on the raw line: a blank after the last '\' stops that,
		// and is stripped from the value afterwards.
		v += " "
	}
	return v, nil
}

// trimSpace trims Unicode white space, the superset of what systemd (ASCII
// blanks) and go-systemd's parser (unicode.IsSpace) strip around values.
func trimSpace(s string) string {
	return strings.TrimFunc(s, unicode.IsSpace)
}

// execWord escapes one word of an ExecStart= command line. first marks the
// program path, which systemd inspects for prefix characters.
func execWord(field, s string, first bool) (string, error) {
	if err := checkText(field, s); err != nil {
		return "", err
	}
	switch {
	case s == "":
		return "", fmt.Errorf("units: %s: empty command-line word", field)
	case s == ";":
		return "", fmt.Errorf("units: %s: a lone ';' separates commands in ExecStart=", field)
	case first && strings.ContainsAny(s[:1], "@-:+!|"):
		return "", fmt.Errorf("units: %s: %q must not start with one of @-:+!| (ExecStart= prefixes)", field, s)
	case first && !strings.HasPrefix(s, "/"):
		return "", fmt.Errorf("units: %s: %q is not an absolute path", field, s)
	}
	return quoteWord(s, `"'\;`, true), nil
}

// quoteWord renders s as one word of a unit file line: double-quoted when
// it holds white space or one of quoteIf, with backslash and double quote
// escaped by a backslash, '%' doubled (specifiers) and, with dollar, '$'
// doubled (ExecStart= expands variables; Environment= does not).
func quoteWord(s, quoteIf string, dollar bool) string {
	var b strings.Builder
	quote := strings.IndexFunc(s, func(r rune) bool { return unicode.IsSpace(r) || strings.ContainsRune(quoteIf, r) }) >= 0
	if quote {
		b.WriteByte('"')
	}
	for _, r := range s {
		switch {
		case r == '\\' || r == '"':
			b.WriteByte('\\')
			b.WriteRune(r)
		case r == '%':
			b.WriteString("%%")
		case r == '$' && dollar:
			b.WriteString("$$")
		default:
			b.WriteRune(r)
		}
	}
	if quote {
		b.WriteByte('"')
	}
	return b.String()
}

// envAssignment renders one Environment= assignment KEY=VALUE. systemd
// splits the value into words, unquotes and C-unescapes each, then expands
// specifiers; it does not expand '$'.
func envAssignment(key, value string) (string, error) {
	if !envNameOK(key) {
		return "", fmt.Errorf("units: environment name %q is not valid", key)
	}
	if err := checkText("environment "+key, value); err != nil {
		return "", err
	}
	return quoteWord(key+"="+value, `"'\`, false), nil
}

func envNameOK(s string) bool {
	if s == "" || len(s) > 128 {
		return false
	}
	for i, r := range s {
		ok := r == '_' || ('A' <= r && r <= 'Z') || ('a' <= r && r <= 'z') || (i > 0 && '0' <= r && r <= '9')
		if !ok {
			return false
		}
	}
	return true
}

// pathChars are the bytes allowed in paths the renderer writes into options
// (AgentPath, DataDir, RunArgs paths): none of them is special in any
// option (no blank, quote, ':', '%', '$', '\', '*', '?', '[').
func pathCharOK(r rune) bool {
	return ('a' <= r && r <= 'z') || ('A' <= r && r <= 'Z') || ('0' <= r && r <= '9') ||
		r == '/' || r == '.' || r == '_' || r == '-' || r == '+' || r == '@'
}

// checkPath accepts a clean absolute path made of pathChars.
func checkPath(field, p string) error {
	if !strings.HasPrefix(p, "/") {
		return fmt.Errorf("units: %s: %q is not an absolute path", field, p)
	}
	if len(p) > 1024 {
		return fmt.Errorf("units: %s: path longer than 1024 bytes", field)
	}
	for _, r := range p {
		if !pathCharOK(r) {
			return fmt.Errorf("units: %s: %q may contain only letters, digits and / . _ - + @", field, p)
		}
	}
	if cleanPath(p) != p {
		return fmt.Errorf("units: %s: %q is not a clean path (no //, /./, /../ or trailing /)", field, p)
	}
	return nil
}

func cleanPath(p string) string {
	if p == "/" {
		return p
	}
	for _, part := range strings.Split(p[1:], "/") {
		if part == "" || part == "." || part == ".." {
			return ""
		}
	}
	return p
}

// checkRunArg accepts an extra agent argument: a clean absolute path, or a
// flag "-x" / "--name" optionally followed by "=value" with value made of
// pathChars plus ',' and ':' (e.g. --config=/etc/drover/agent.yaml).
func checkRunArg(field, a string) error {
	if strings.HasPrefix(a, "/") {
		return checkPath(field, a)
	}
	bad := fmt.Errorf("units: %s: %q is neither an absolute path nor a flag like --name or --name=value", field, a)
	if len(a) > 1024 || !strings.HasPrefix(a, "-") {
		return bad
	}
	name, value, hasValue := strings.Cut(strings.TrimLeft(a, "-"), "=")
	if len(a)-len(strings.TrimLeft(a, "-")) > 2 || name == "" {
		return bad
	}
	for i, r := range name {
		alnum := ('a' <= r && r <= 'z') || ('A' <= r && r <= 'Z') || ('0' <= r && r <= '9')
		if !alnum && (i == 0 || (r != '-' && r != '_' && r != '.')) {
			return bad
		}
	}
	if hasValue {
		for _, r := range value {
			if !pathCharOK(r) && r != ',' && r != ':' {
				return bad
			}
		}
	}
	return nil
}

// formatSpan writes a duration as a systemd time span: plain seconds when
// whole (TimeoutStartSec=3600), else milliseconds or microseconds, rounded
// up to systemd's microsecond resolution so that a limit never shrinks.
func formatSpan(d time.Duration) string {
	switch {
	case d%time.Second == 0:
		return fmt.Sprintf("%d", d/time.Second)
	case d%time.Millisecond == 0:
		return fmt.Sprintf("%dms", d/time.Millisecond)
	default:
		return fmt.Sprintf("%dus", (d+time.Microsecond-1)/time.Microsecond)
	}
}
