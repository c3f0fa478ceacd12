package apply

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/drover/drover/agent/lease"
	"github.com/drover/drover/manifest"
	"github.com/drover/drover/units"
)

// Lease fencing (placement: one). A pipe the server placed on this agent
// carries lease_until in its manifest entry; Apply and Check judge it on
// the agent's clock (agent/lease): a pipe whose lease ended is planned like
// a disabled one (its timer stopped and disabled, its cron entry removed)
// until a fresher manifest renews the lease. Fence is the fast path the
// daemon takes at the instant a lease ends, without rendering anything:
// the full plan would agree with it, so a later Apply or Check never
// starts the timer again while the lease stays ended.

// Fencer is implemented by the backends: Fence stops the schedules of held
// pipes whose lease has just ended, given by name with the lease_until the
// caller saw end, and returns the steps it took. A pipe whose last applied
// entry has another lease_until (a renewal applied meanwhile) is left
// alone. A run in progress is not stopped: it started within the lease.
type Fencer interface {
	Fence(ctx context.Context, leases map[string]time.Time) ([]Step, error)
}

var (
	_ Fencer = (*Systemd)(nil)
	_ Fencer = (*Cron)(nil)
)

// Fence implements Fencer: a stop job for each timer, then its
// timers.target.wants link removed, so that neither a reboot nor a
// restart of timers.target starts it again. No daemon-reload is needed.
func (b *Systemd) Fence(ctx context.Context, leases map[string]time.Time) ([]Step, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	applied := map[string]time.Time{}
	if m := b.lastManifest(); m != nil {
		for _, p := range m.Pipes {
			applied[p.Name] = p.LeaseUntil
		}
	}
	var timers []string
	var steps []Step
	for p, until := range leases {
		if !manifest.ValidName(p) || !b.managed(p) {
			continue
		}
		if got, ok := applied[p]; ok && !got.Equal(until) {
			continue // renewed (or no longer held) since
		}
		tm := units.TimerName(p)
		timers = append(timers, tm)
		steps = append(steps, Step{Action: ActionStop, Pipe: p, File: tm, Reason: ReasonLeaseEnded})
	}
	sort.Slice(steps, func(i, j int) bool { return steps[i].Pipe < steps[j].Pipe })
	res := &Result{}
	b.runJobs(ctx, "stop", timers, res)
	errs := []error{disableLinks(b.cfg.UnitDir, timers)}
	for p, e := range res.Errors {
		errs = append(errs, fmt.Errorf("%s: %s", p, e))
	}
	return steps, errors.Join(errs...)
}

// Fence implements Fencer: the pipes' cron entries are removed (fire
// checks the lease too, for a fire that races the fence).
func (b *Cron) Fence(ctx context.Context, leases map[string]time.Time) ([]Step, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	now := b.cfg.Now()
	var steps []Step
	for name, until := range leases {
		p := b.pipes[name]
		if p == nil || p.entry == 0 || !p.pipe.LeaseUntil.Equal(until) || !lease.Ended(&p.pipe, now) {
			continue
		}
		b.sched.Remove(p.entry)
		p.entry = 0
		p.key = entryKey(p.stateKey, &p.pipe, false)
		steps = append(steps, Step{Action: ActionStop, Pipe: name, File: "cron:" + name, Reason: ReasonLeaseEnded})
	}
	sort.Slice(steps, func(i, j int) bool { return steps[i].Pipe < steps[j].Pipe })
	return steps, nil
}
