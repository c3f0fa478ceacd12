package apply

import (
	"fmt"
	"time"

	"github.com/drover/drover/manifest"
)

// ElapseMismatch compares the next elapse the scheduler reports for a pipe
// (systemd's NextElapseUSecRealtime, or the cron backend's next fire) with
// the evaluator's next fire time, and describes a disagreement; "" means
// they agree or there is nothing to compare.
//
// The evaluator's next fire time is counted from the timer's last trigger
// (systemd computes the next elapse from it) or, equally acceptable, from
// now (a timer started or reloaded since computes from its activation).
//
// Jitter: with RandomizedDelaySec= and FixedRandomDelay=yes, systemd adds
// the timer's delay, a fixed value in [0, jitter) derived from the machine
// and unit names, to the elapse it computed and reports the sum as
// NextElapseUSecRealtime; the cron backend adds its own stable offset in the
// same range. So the reported elapse must lie in [want, want+jitter), to the
// second; without jitter it must equal want.
//
// Not compared: disabled or unscheduled pipes, "@every" intervals (counted
// from activation, which the agent does not see), and a reported elapse not
// after now (a Persistent= catch-up that is due). A scheduled timer with no
// next elapse at all while the evaluator has one is a mismatch: systemd
// could not compute any of its lines.
func ElapseMismatch(spec *manifest.Spec, st PipeState, now time.Time) string {
	if spec == nil || !spec.IsEnabled() || !st.Scheduled {
		return ""
	}
	s, err := manifest.ParseSchedule(spec.Schedule)
	if err != nil {
		return ""
	}
	if _, every := s.Every(); every {
		return ""
	}
	loc, err := manifest.LoadLocation(spec.Timezone)
	if err != nil {
		return ""
	}
	jitter := spec.Jitter.D()
	got := st.Next.Truncate(time.Second)
	var wants []time.Time
	if !st.LastTrigger.IsZero() && st.LastTrigger.Before(now) {
		wants = append(wants, s.Next(st.LastTrigger, loc))
	}
	wants = append(wants, s.Next(now.Add(-jitter), loc), s.Next(now, loc))
	want := wants[len(wants)-1]
	if want.IsZero() {
		return ""
	}
	if st.Next.IsZero() {
		return fmt.Sprintf("the scheduler reports no next elapse; the schedule's next fire time is %s",
			want.UTC().Format(time.RFC3339))
	}
	if !got.After(now) {
		return "" // a catch-up run is due now
	}
	for _, w := range wants {
		if w.IsZero() {
			continue
		}
		d := got.Sub(w)
		if d == 0 || jitter > 0 && d >= 0 && d < jitter {
			return ""
		}
	}
	msg := fmt.Sprintf("the scheduler's next elapse %s differs from the schedule's next fire time %s",
		got.UTC().Format(time.RFC3339), want.UTC().Format(time.RFC3339))
	if jitter > 0 {
		msg += fmt.Sprintf(" (jitter up to %s)", manifest.Duration(jitter))
	}
	return msg
}
