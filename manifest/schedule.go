package manifest

import (
	"errors"
	"time"
)

// STUB: replaced by the schedule implementation.

// Schedule is a parsed schedule expression (DESIGN.md, "Schedule semantics").
type Schedule struct {
	expr string
}

// ParseSchedule parses a five-field cron expression or a descriptor.
func ParseSchedule(expr string) (*Schedule, error) {
	if expr == "" {
		return nil, errors.New("empty schedule")
	}
	return &Schedule{expr: expr}, nil
}

// String returns the expression as given, trimmed.
func (s *Schedule) String() string { return s.expr }

// Every returns the interval of an "@every" schedule.
func (s *Schedule) Every() (time.Duration, bool) { return 0, false }

// Next returns the first fire time strictly after `after`, evaluated in loc.
func (s *Schedule) Next(after time.Time, loc *time.Location) time.Time { return time.Time{} }
