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

// problems collects field errors under a path prefix.
type problems struct {
	list []FieldError
}

func (p *problems) add(field, format string, args ...any) {
	p.list = append(p.list, FieldError{Field: field, Message: fmt.Sprintf(format, args...)})
}

func (p *problems) err() error {
	if len(p.list) == 0 {
		return nil
	}
	return &ValidationError{Problems: p.list}
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
