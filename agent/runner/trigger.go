package runner

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/drover/drover/agent/runreq"
	"github.com/drover/drover/agent/spool"
	"github.com/drover/drover/manifest"
)

// StateFile is the runner's own state in the spool directory (ignored by the
// spool reader): the last fire time it ran for, per schedule, and the last
// API request it consumed.
const StateFile = "state.json"

// LockFile is the lock that keeps two runs of a pipe from overlapping.
const LockFile = "lock"

// state is the content of StateFile.
type state struct {
	// Schedule and Timezone are what LastFire was computed with; after an
	// edit the old fire time says nothing about the new schedule.
	Schedule      string    `json:"schedule,omitempty"`
	Timezone      string    `json:"timezone,omitempty"`
	LastFire      time.Time `json:"last_fire,omitzero"`
	LastRequestID string    `json:"last_request_id,omitempty"`
}

func readState(dir string) state {
	var st state
	b, err := os.ReadFile(filepath.Join(dir, StateFile))
	if err == nil {
		_ = json.Unmarshal(b, &st)
	}
	return st
}

func writeState(dir string, st state) error {
	b, err := json.Marshal(st)
	if err != nil {
		return err
	}
	return spool.WriteFileAtomic(filepath.Join(dir, StateFile), b, spool.FileMode)
}

// lastFireFor returns the last fire time run for this schedule, if known.
func (st state) lastFireFor(spec *manifest.Spec) time.Time {
	if st.Schedule != spec.Schedule || st.Timezone != spec.Timezone {
		return time.Time{}
	}
	return st.LastFire
}

// requestDir is where the daemon leaves run requests for trigger=api.
func (r *runner) requestDir() string {
	switch {
	case r.opts.RequestDir != "":
		return r.opts.RequestDir
	case r.env["DROVER_REQUEST_DIR"] != "":
		return r.env["DROVER_REQUEST_DIR"]
	}
	return runreq.DefaultDir(r.env["XDG_RUNTIME_DIR"])
}

// takeRequest consumes a fresh run request for this pipe and returns its id,
// or "" (see runreq.Take). lastID is the request the previous run consumed.
func (r *runner) takeRequest(lastID string) string {
	id, err := runreq.Take(r.requestDir(), r.opts.Pipe, lastID, r.now())
	if err != nil {
		r.debugf("cannot remove run request %s: %v", runreq.Path(r.requestDir(), r.opts.Pipe), err)
	}
	return id
}

// timerElapse returns when the systemd timer that started this service
// elapsed, if a timer did (systemd 252+ sets TRIGGER_UNIT and
// TRIGGER_TIMER_REALTIME_USEC).
func (r *runner) timerElapse() (time.Time, bool) {
	if r.env["INVOCATION_ID"] == "" || !strings.HasSuffix(r.env["TRIGGER_UNIT"], ".timer") {
		return time.Time{}, false
	}
	now := r.now()
	if usec, err := strconv.ParseInt(r.env["TRIGGER_TIMER_REALTIME_USEC"], 10, 64); err == nil && usec > 0 {
		// systemd 252 passes the timer's previous trigger here, not this
		// one (seen on a real manager: the run at 12:06 got 12:05's
		// elapse, and every run after the first was skipped as "already
		// ran"). A service starts within a second or two of its elapse,
		// so a value much older than that is stale and the start time is
		// the better account of when the timer elapsed.
		if e := time.UnixMicro(usec); now.Sub(e) <= staleElapse && !e.After(now.Add(time.Second)) {
			return e, true
		}
	}
	return now, true
}

// staleElapse is how long before the runner's start a timer elapse can be
// and still be this invocation's (start latency under load).
const staleElapse = 30 * time.Second

// nextFunc is a schedule: the first fire time strictly after t, zero if none.
type nextFunc func(after time.Time) time.Time

// schedule returns the pipe's fire-time function, or nil when fire times
// cannot be computed (an @every interval, or an unparsable schedule).
func (r *runner) schedule() nextFunc {
	if r.opts.Schedule != nil {
		return r.opts.Schedule
	}
	s, err := manifest.ParseSchedule(r.spec.Schedule)
	if err != nil {
		return nil
	}
	if _, every := s.Every(); every {
		return nil
	}
	loc, err := manifest.LoadLocation(r.spec.Timezone)
	if err != nil {
		return nil
	}
	return func(after time.Time) time.Time { return s.Next(after, loc) }
}

// prevFire returns the latest fire time <= t, or zero if none is found
// within 20 years (or the schedule cannot say).
func prevFire(next nextFunc, t time.Time) time.Time {
	for w := time.Hour; w <= 20*365*24*time.Hour; w *= 2 {
		n := next(t.Add(-w))
		if n.IsZero() {
			return time.Time{}
		}
		if n.After(t) {
			continue
		}
		for {
			m := next(n)
			if m.IsZero() || m.After(t) || !m.After(n) {
				return n
			}
			n = m
		}
	}
	return time.Time{}
}

// missedFires returns up to limit fire times in (after, upTo], the most
// recent ones, oldest first.
func missedFires(next nextFunc, after, upTo time.Time, limit int) []time.Time {
	var out []time.Time
	t := upTo
	for len(out) < limit {
		p := prevFire(next, t)
		if p.IsZero() || !p.After(after) {
			break
		}
		out = append(out, p)
		t = p.Add(-time.Nanosecond)
	}
	for i, j := 0, len(out)-1; i < j; i, j = i+1, j-1 {
		out[i], out[j] = out[j], out[i]
	}
	return out
}

// ScheduledFor returns the fire time a timer elapse at elapse stands for
// (the latest fire time not after it) and whether it is a catch-up (later
// than the pipe's jitter plus a minute), as the runner decides them; zero
// when the schedule cannot say (@every, unparsable).
func ScheduledFor(spec *manifest.Spec, elapse time.Time) (time.Time, bool) {
	r := &runner{spec: spec}
	next := r.schedule()
	if next == nil {
		return time.Time{}, false
	}
	prev := prevFire(next, elapse)
	if prev.IsZero() {
		return prev, false
	}
	return prev, elapse.Sub(prev) > spec.Jitter.D()+time.Minute
}
