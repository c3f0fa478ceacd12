package manifest

import (
	"encoding/json"
	"math"
	"reflect"
	"strings"
	"testing"
	"time"
)

// withRetries is validSpec with a retry policy, normalised as the server
// stores it.
func withRetries(r *Retries) Spec {
	s := validSpec()
	s.Retries = r
	s.Normalize()
	return s
}

// Every bad retry field is reported at its own path with its bound, after
// Normalize (the order the server and droverctl use): nothing invalid is
// dropped on the way.
func TestRetriesValidation(t *testing.T) {
	sec := func(n float64) Duration { return Duration(n * float64(time.Second)) }
	for _, tc := range []struct {
		name string
		r    Retries
		want map[string]string // field -> message; empty: valid
	}{
		{"two attempts with defaults", Retries{Attempts: 2}, nil},
		{"all fields at their bounds", Retries{Attempts: MaxAttempts, Delay: MinRetryDelay, Backoff: MaxRetryBackoff, MaxDelay: MaxRetryDelay}, nil},
		{"backoff 1 is a constant delay", Retries{Attempts: 3, Delay: sec(5), Backoff: 1}, nil},
		{"one attempt", Retries{Attempts: 1}, nil},
		{"attempts missing", Retries{Delay: sec(10)}, map[string]string{"retries.attempts": "0 out of range 1-10"}},
		{"attempts negative", Retries{Attempts: -2}, map[string]string{"retries.attempts": "-2 out of range 1-10"}},
		{"too many attempts", Retries{Attempts: 11}, map[string]string{"retries.attempts": "11 out of range 1-10"}},
		{"delay too short", Retries{Attempts: 3, Delay: Duration(500 * time.Millisecond)}, map[string]string{"retries.delay": "500ms out of range 1s-24h"}},
		{"delay negative", Retries{Attempts: 3, Delay: sec(-1)}, map[string]string{"retries.delay": "-1s out of range 1s-24h"}},
		{"delay too long", Retries{Attempts: 3, Delay: Duration(25 * time.Hour), MaxDelay: Duration(25 * time.Hour)},
			map[string]string{"retries.delay": "25h out of range 1s-24h", "retries.max_delay": "25h out of range 1s-24h"}},
		{"backoff below 1", Retries{Attempts: 3, Backoff: 0.5}, map[string]string{"retries.backoff": "0.5 out of range 1-10"}},
		{"backoff too large", Retries{Attempts: 3, Backoff: 11}, map[string]string{"retries.backoff": "11 out of range 1-10"}},
		{"backoff NaN", Retries{Attempts: 3, Backoff: math.NaN()}, map[string]string{"retries.backoff": "NaN out of range 1-10"}},
		{"backoff infinite", Retries{Attempts: 3, Backoff: math.Inf(1)}, map[string]string{"retries.backoff": "+Inf out of range 1-10"}},
		{"max_delay below delay", Retries{Attempts: 3, Delay: sec(60), MaxDelay: sec(10)}, map[string]string{"retries.max_delay": "10s is less than delay 1m"}},
		{"max_delay below the default delay", Retries{Attempts: 3, MaxDelay: sec(10)}, map[string]string{"retries.max_delay": "10s is less than delay 30s"}},
		{"one attempt with a bad backoff is still reported", Retries{Attempts: 1, Backoff: 50}, map[string]string{"retries.backoff": "50 out of range 1-10"}},
		{"every problem at once", Retries{Attempts: 0, Delay: Duration(time.Millisecond), Backoff: -1, MaxDelay: Duration(48 * time.Hour)},
			map[string]string{"retries.attempts": "0 out of range 1-10", "retries.delay": "1ms out of range 1s-24h",
				"retries.backoff": "-1 out of range 1-10", "retries.max_delay": "48h out of range 1s-24h"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := tc.r
			s := withRetries(&r)
			got := map[string]string{}
			for _, p := range problemsOf(t, s.Validate()) {
				got[p.Field] = p.Message
			}
			if len(got) == 0 {
				got = nil
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("problems %v, want %v", got, tc.want)
			}
		})
	}
}

// A manifest's pipe gets the same checks, under its path.
func TestRetriesValidationInManifest(t *testing.T) {
	m := testManifest()
	m.Pipes[0].Spec.Retries = &Retries{Attempts: 3, Backoff: 20}
	ps := problemsOf(t, m.Validate())
	if len(ps) != 1 || ps[0].Field != "pipes[0].spec.retries.backoff" || ps[0].Message != "20 out of range 1-10" {
		t.Fatalf("problems %v", ps)
	}
}

func TestRetriesNormalize(t *testing.T) {
	d := func(x time.Duration) Duration { return Duration(x) }
	for _, tc := range []struct {
		name string
		in   *Retries
		want *Retries
	}{
		{"none", nil, nil},
		{"one attempt is no retries", &Retries{Attempts: 1, Delay: d(time.Minute)}, nil},
		{"defaults", &Retries{Attempts: 3}, &Retries{Attempts: 3, Delay: DefaultRetryDelay, Backoff: DefaultRetryBackoff, MaxDelay: DefaultRetryMaxDelay}},
		{"max_delay follows a long delay", &Retries{Attempts: 2, Delay: d(time.Hour)}, &Retries{Attempts: 2, Delay: d(time.Hour), Backoff: 2, MaxDelay: d(time.Hour)}},
		{"given fields kept", &Retries{Attempts: 4, Delay: d(5 * time.Second), Backoff: 1.5, MaxDelay: d(time.Minute)},
			&Retries{Attempts: 4, Delay: d(5 * time.Second), Backoff: 1.5, MaxDelay: d(time.Minute)}},
		{"invalid attempts kept for Validate", &Retries{Attempts: 0, Delay: d(time.Second)}, &Retries{Attempts: 0, Delay: d(time.Second)}},
		{"one attempt with a bad field kept for Validate", &Retries{Attempts: 1, Backoff: 50}, &Retries{Attempts: 1, Backoff: 50}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := validSpec()
			var in Retries
			if tc.in != nil {
				in = *tc.in
				s.Retries = &in
			}
			s.Normalize()
			if tc.in != nil && in != *tc.in {
				t.Fatalf("Normalize changed the caller's policy: %+v", in)
			}
			if !reflect.DeepEqual(s.Retries, tc.want) {
				t.Fatalf("normalised to %+v, want %+v", s.Retries, tc.want)
			}
			a, _ := json.Marshal(s)
			s.Normalize()
			if b, _ := json.Marshal(s); string(a) != string(b) {
				t.Fatalf("Normalize not idempotent:\n%s\n%s", a, b)
			}
		})
	}
	// Clone copies the policy.
	s := withRetries(&Retries{Attempts: 3})
	c := s.Clone()
	c.Retries.Attempts = 5
	if s.Retries.Attempts != 3 {
		t.Fatal("Clone shares the retry policy")
	}
}

func TestRetriesDelayBefore(t *testing.T) {
	sec := func(n float64) time.Duration { return time.Duration(n * float64(time.Second)) }
	for _, tc := range []struct {
		name string
		r    *Retries
		want []time.Duration // before attempts 2, 3, ...
	}{
		{"doubling", &Retries{Attempts: 5, Delay: Duration(sec(1)), Backoff: 2, MaxDelay: Duration(time.Minute)}, []time.Duration{sec(1), sec(2), sec(4), sec(8)}},
		{"capped", &Retries{Attempts: 6, Delay: Duration(sec(10)), Backoff: 3, MaxDelay: Duration(sec(60))}, []time.Duration{sec(10), sec(30), sec(60), sec(60), sec(60)}},
		{"cap equal to delay", &Retries{Attempts: 3, Delay: Duration(time.Hour), Backoff: 2, MaxDelay: Duration(time.Hour)}, []time.Duration{time.Hour, time.Hour}},
		{"constant", &Retries{Attempts: 4, Delay: Duration(sec(7)), Backoff: 1, MaxDelay: Duration(time.Minute)}, []time.Duration{sec(7), sec(7), sec(7)}},
		{"fractional backoff", &Retries{Attempts: 4, Delay: Duration(sec(2)), Backoff: 1.5, MaxDelay: Duration(time.Minute)}, []time.Duration{sec(2), sec(3), sec(4.5)}},
		{"unnormalised zero fields count as defaults", &Retries{Attempts: 4}, []time.Duration{30 * time.Second, time.Minute, 2 * time.Minute}},
		{"unnormalised: no cap given means the default cap", &Retries{Attempts: 10, Delay: Duration(time.Minute), Backoff: 10},
			[]time.Duration{time.Minute, 10 * time.Minute, 10 * time.Minute}},
		{"largest policy stays capped", &Retries{Attempts: MaxAttempts, Delay: MaxRetryDelay, Backoff: MaxRetryBackoff, MaxDelay: MaxRetryDelay},
			[]time.Duration{24 * time.Hour, 24 * time.Hour, 24 * time.Hour}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for i, want := range tc.want {
				if got := tc.r.DelayBefore(i + 2); got != want {
					t.Errorf("before attempt %d: %s, want %s", i+2, got, want)
				}
			}
		})
	}
	r := &Retries{Attempts: 3, Delay: Duration(sec(5)), Backoff: 2, MaxDelay: Duration(time.Minute)}
	if r.DelayBefore(1) != 0 || r.DelayBefore(0) != 0 || (*Retries)(nil).DelayBefore(2) != 0 {
		t.Error("no delay before the first attempt, nor without retries")
	}
}

func TestRetriesAttemptsAndBudget(t *testing.T) {
	s := validSpec()
	s.Normalize()
	if s.AttemptsOrOne() != 1 || s.RunBudget() != time.Hour {
		t.Fatalf("no retries: %d attempts, budget %s", s.AttemptsOrOne(), s.RunBudget())
	}
	s = withRetries(&Retries{Attempts: 3, Delay: Duration(10 * time.Second), Backoff: 2})
	s.Timeout = Duration(time.Minute)
	// 3 × 1m + 10s + 20s.
	if s.AttemptsOrOne() != 3 || s.RunBudget() != 3*time.Minute+30*time.Second {
		t.Fatalf("%d attempts, budget %s", s.AttemptsOrOne(), s.RunBudget())
	}
	// The largest policy with the longest timeout still fits a Duration.
	s = withRetries(&Retries{Attempts: MaxAttempts, Delay: MaxRetryDelay, Backoff: MaxRetryBackoff, MaxDelay: MaxRetryDelay})
	s.Timeout = MaxTimeout
	if want := 10*MaxTimeout.D() + 9*24*time.Hour; s.RunBudget() != want {
		t.Fatalf("budget %s, want %s", s.RunBudget(), want)
	}
}

// The YAML an operator writes decodes into the policy; a misspelt field is
// refused at its path.
func TestRetriesDecode(t *testing.T) {
	specs, err := DecodeSpecs([]byte("name: job\nschedule: '@hourly'\nscript: 'true'\nretries:\n  attempts: 3\n  delay: 45s\n  backoff: 1.5\n  max_delay: 5m\n"))
	if err != nil {
		t.Fatal(err)
	}
	want := &Retries{Attempts: 3, Delay: Duration(45 * time.Second), Backoff: 1.5, MaxDelay: Duration(5 * time.Minute)}
	if len(specs) != 1 || !reflect.DeepEqual(specs[0].Retries, want) {
		t.Fatalf("decoded %+v", specs[0].Retries)
	}
	_, err = DecodeSpecs([]byte("name: job\nschedule: '@hourly'\nscript: 'true'\nretries:\n  attempt: 3\n"))
	ps := problemsOf(t, err)
	if len(ps) == 0 || !strings.Contains(ps[0].Field, "retries.attempt") {
		t.Fatalf("misspelt field: %v", err)
	}
}

// A value of the wrong type is reported at its field and line.
func TestRetriesDecodeWrongType(t *testing.T) {
	for doc, field := range map[string]string{
		"retries: 3\n":                       "[0].retries",
		"retries:\n  attempts: three\n":      "[0].retries.attempts",
		"retries: {attempts: 2, delay: x}\n": "[0].retries", // a flow mapping: the key on the line
	} {
		_, err := DecodeSpecs([]byte("name: job\nschedule: '@hourly'\nscript: 'true'\n" + doc))
		ps := problemsOf(t, err)
		if len(ps) != 1 || ps[0].Field != field || ps[0].Line < 4 {
			t.Errorf("%q: problems %+v, want one at %s", doc, ps, field)
		}
	}
}
