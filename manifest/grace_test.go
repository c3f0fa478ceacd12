package manifest

import (
	"testing"
	"time"
)

// grace is optional, between one minute and a day, and defaults to ten
// minutes.
func TestSpecGrace(t *testing.T) {
	for g, ok := range map[Duration]bool{0: true, Duration(time.Minute): true, Duration(24 * time.Hour): true,
		Duration(59 * time.Second): false, Duration(25 * time.Hour): false, Duration(-time.Minute): false} {
		s := validSpec()
		s.Grace = g
		ps := problemsOf(t, s.Validate())
		if ok != (len(ps) == 0) {
			t.Errorf("grace %s: problems %v, want ok=%v", g, ps, ok)
		}
		if !ok && (len(ps) != 1 || ps[0].Field != "grace") {
			t.Errorf("grace %s: problems %v, want one at grace", g, ps)
		}
	}
	s := validSpec()
	if s.GraceOrDefault() != 10*time.Minute {
		t.Errorf("default grace %s", s.GraceOrDefault())
	}
	s.Grace = Duration(3 * time.Minute)
	if s.GraceOrDefault() != 3*time.Minute {
		t.Errorf("grace %s", s.GraceOrDefault())
	}
}
