package manifest

import (
	"fmt"
	"strings"
)

// FieldError is one validation problem, located by a field path such as
// "pipes[3].schedule" or "limits.memory_mb".
type FieldError struct {
	Field   string `json:"field"`
	Message string `json:"message"`
	// Line is the 1-based line in the YAML source the field came from, when known.
	Line int `json:"line,omitempty"`
}

func (e FieldError) Error() string {
	msg := e.Message
	if e.Field != "" {
		msg = e.Field + ": " + msg
	}
	if e.Line > 0 {
		msg = fmt.Sprintf("line %d: %s", e.Line, msg)
	}
	return msg
}

// ValidationError carries every problem found in one value, in field order.
// It is returned by the Validate methods and by the decoders.
type ValidationError struct {
	Problems []FieldError
}

func (e *ValidationError) Error() string {
	msgs := make([]string, len(e.Problems))
	for i, p := range e.Problems {
		msgs[i] = p.Error()
	}
	if len(msgs) == 1 {
		return "invalid: " + msgs[0]
	}
	return fmt.Sprintf("%d problems: %s", len(msgs), strings.Join(msgs, "; "))
}

// MaxProblems caps the problems one ValidationError lists; the rest are
// counted in a last entry ("… and 999,990 more problems"), so that a value
// with a million bad elements cannot make a million-line answer.
const MaxProblems = 100

// problems collects field errors under a path prefix.
type problems struct {
	list []FieldError
	more int // problems past MaxProblems, not kept
}

func (p *problems) add(field, format string, args ...any) {
	if len(p.list) >= MaxProblems {
		p.more++
		return
	}
	p.list = append(p.list, FieldError{Field: field, Message: fmt.Sprintf(format, args...)})
}

// addFE adds a problem that is already a FieldError.
func (p *problems) addFE(fe FieldError) {
	if len(p.list) >= MaxProblems {
		p.more++
		return
	}
	p.list = append(p.list, fe)
}

// count is the number of problems found, kept or not.
func (p *problems) count() int { return len(p.list) + p.more }

func (p *problems) err() error {
	if len(p.list) == 0 {
		return nil
	}
	list := p.list
	if p.more > 0 {
		list = append(list[:len(list):len(list)], FieldError{Message: fmt.Sprintf("… and %s more problems", groupThousands(p.more))})
	}
	return &ValidationError{Problems: list}
}

// groupThousands formats n as 999,990.
func groupThousands(n int) string {
	s := fmt.Sprint(n)
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}

// join builds a field path: join("pipes[3]", "schedule") = "pipes[3].schedule".
func join(prefix, field string) string {
	if prefix == "" {
		return field
	}
	if field == "" {
		return prefix
	}
	if strings.HasPrefix(field, "[") {
		return prefix + field
	}
	return prefix + "." + field
}
