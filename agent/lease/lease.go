// Package lease is the agent's one rule for placement: one leases, shared
// by the backends (agent/apply), the runner and the daemon so that they
// never disagree about whether a held pipe may run.
//
// A manifest entry with lease_until is held by this agent until then, on
// the agent's own clock. The agent stops scheduling it Lead before
// lease_until, so that a timer due exactly at the lease's end cannot fire
// while the agent is still stopping it; a lease that ended stays ended
// until a fresher manifest moves lease_until on.
package lease

import (
	"time"

	"github.com/drover/drover/manifest"
)

// Lead is how long before lease_until the agent stops a held pipe's
// schedule: enough for its wake-up and a stop job on a loaded host. A fire
// time within it is left to the next holder's catch-up.
const Lead = manifest.LeaseLead

// End returns the instant the agent stops p's schedule (lease_until minus
// Lead); zero when p is not held.
func End(p *manifest.Pipe) time.Time {
	if !p.Held() {
		return time.Time{}
	}
	return p.LeaseUntil.Add(-Lead)
}

// Active reports whether p may be scheduled at now: it is not held, or its
// lease has not ended.
func Active(p *manifest.Pipe, now time.Time) bool {
	return !p.Held() || now.Before(End(p))
}

// Ended reports whether p is held and its lease has ended at now.
func Ended(p *manifest.Pipe, now time.Time) bool { return p.Held() && !Active(p, now) }

// CatchupFrom returns the fire time after which a pipe that becomes held
// by this agent catches up (the latest fire time any holder served), or
// zero when it must not: not held, its lease ended, no fire time known
// served, or catchup: skip.
func CatchupFrom(p *manifest.Pipe, now time.Time) time.Time {
	if !Active(p, now) || !p.Held() || p.LastFireServed.IsZero() || p.Spec.Catchup == manifest.CatchupSkip {
		return time.Time{}
	}
	if !p.LastFireServed.Before(now) {
		return time.Time{}
	}
	return p.LastFireServed
}
