package agent

import (
	"context"
	"slices"
	"strings"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/drover/drover/agent/apply"
	"github.com/drover/drover/agent/lease"
	"github.com/drover/drover/manifest"
	agentpb "github.com/drover/drover/proto"
)

// Lease fencing on the daemon's side (placement: one; agent/lease has the
// rule). Every apply and drift check plans a held pipe whose lease ended
// as stopped; leaseLoop makes the end happen on time whether or not a sync
// comes: it wakes at the earliest lease end of the manifest in force (a
// precise timer, re-armed after every apply), stops those pipes through the
// backend's fast path (apply.Fencer), and reports the new lease state in a
// ManifestStatus. It needs no server and reads the leases from the manifest
// in force, so it holds with the server down, with an expired (frozen)
// manifest and across restarts.

// leaseRecheck bounds one sleep of the lease loop while a pipe is held:
// the timer runs on the monotonic clock, a lease on the wall clock, which
// may be stepped (NTP) or stand still (suspend).
const leaseRecheck = 10 * time.Second

// kickLeases makes the lease loop look at the manifest in force again.
func (a *Agent) kickLeases() {
	select {
	case a.leaseCh <- struct{}{}:
	default:
	}
}

// leaseLoop fences held pipes at the end of their lease until ctx is done.
func (a *Agent) leaseLoop(ctx context.Context) {
	fenced := map[string]time.Time{} // pipe -> the lease_until it was fenced for
	for {
		next := a.fenceDue(ctx, fenced, time.Now())
		var wake <-chan time.Time
		var t *time.Timer
		if !next.IsZero() {
			t = time.NewTimer(min(time.Until(next), leaseRecheck))
			wake = t.C
		}
		select {
		case <-ctx.Done():
		case <-a.leaseCh:
		case <-wake:
		}
		if t != nil {
			t.Stop()
		}
		if ctx.Err() != nil {
			return
		}
	}
}

// fenceDue fences the held pipes of the manifest in force whose lease has
// ended at now and that were not fenced for that lease yet, reports the
// lease state when it changed, and returns the next lease end to wake for
// (zero: none).
func (a *Agent) fenceDue(ctx context.Context, fenced map[string]time.Time, now time.Time) time.Time {
	a.mu.Lock()
	m := a.current
	a.mu.Unlock()
	if m == nil {
		return time.Time{}
	}
	due, next := leaseWork(m, fenced, now)
	for name := range fenced {
		if !slices.ContainsFunc(m.Pipes, func(p manifest.Pipe) bool { return p.Name == name && lease.Ended(&p, now) }) {
			delete(fenced, name) // renewed, no longer held, or gone
		}
	}
	if len(due) > 0 {
		leases := map[string]time.Time{}
		for _, name := range due {
			i := slices.IndexFunc(m.Pipes, func(p manifest.Pipe) bool { return p.Name == name })
			leases[name] = m.Pipes[i].LeaseUntil
		}
		if f, ok := a.backend.(apply.Fencer); ok {
			steps, err := f.Fence(ctx, leases)
			if err != nil {
				// Tried again in a few seconds; the runner refuses meanwhile.
				a.log.Error("stop pipes at the end of their lease", "pipes", strings.Join(due, ","), "err", err)
				a.reportLeases(now)
				if retry := now.Add(5 * time.Second); next.IsZero() || retry.Before(next) {
					next = retry
				}
				return next
			}
			for _, s := range steps {
				a.log.Warn("lease ended unrenewed: pipe stopped on this host", "pipe", s.Pipe, "step", s.String())
			}
		} else {
			a.log.Warn("the backend cannot fence; the next apply stops the pipes", "pipes", strings.Join(due, ","))
		}
		for name, until := range leases {
			fenced[name] = until
		}
	}
	a.reportLeases(now)
	return next
}

// leaseWork returns the held pipes of m whose lease ended at now and that
// fenced does not list for that lease, and the earliest lease end after
// now (zero: none). Pure.
func leaseWork(m *manifest.Manifest, fenced map[string]time.Time, now time.Time) (due []string, next time.Time) {
	for i := range m.Pipes {
		p := &m.Pipes[i]
		if !p.Held() {
			continue
		}
		if lease.Ended(p, now) {
			if until, ok := fenced[p.Name]; !ok || !until.Equal(p.LeaseUntil) {
				due = append(due, p.Name)
			}
			continue
		}
		if end := lease.End(p); next.IsZero() || end.Before(next) {
			next = end
		}
	}
	slices.Sort(due)
	return due, next
}

// setLeases fills in the lease fields of results from m at now.
func setLeases(results []PipeResult, m *manifest.Manifest, now time.Time) {
	by := map[string]*manifest.Pipe{}
	for i := range m.Pipes {
		by[m.Pipes[i].Name] = &m.Pipes[i]
	}
	for i := range results {
		r := &results[i]
		r.LeaseUntil, r.LeaseEnded = time.Time{}, false
		if p := by[r.Name]; p != nil && p.Held() {
			r.LeaseUntil, r.LeaseEnded = p.LeaseUntil, lease.Ended(p, now)
			if r.LeaseEnded {
				r.NextFireTimes = nil
			} else {
				end := lease.End(p)
				r.NextFireTimes = slices.DeleteFunc(r.NextFireTimes, func(t time.Time) bool { return !t.Before(end) })
			}
		}
	}
}

// leaseState is a comparable summary of the lease fields of results.
func leaseState(results []PipeResult) string {
	var b strings.Builder
	for _, r := range results {
		if r.LeaseUntil.IsZero() {
			continue
		}
		b.WriteString(r.Name + " " + r.LeaseUntil.UTC().Format(time.RFC3339Nano))
		if r.LeaseEnded {
			b.WriteString(" ended")
		}
		b.WriteByte('\n')
	}
	return b.String()
}

// reportLeases brings the lease fields of the last results up to date at
// now and, when they changed since the last ManifestStatus, sends one
// (for a manifest in force that was applied).
func (a *Agent) reportLeases(now time.Time) {
	a.mu.Lock()
	m, digest := a.current, a.currentDigest
	results := slices.Clone(a.results)
	for _, p := range m.Pipes {
		if !slices.ContainsFunc(results, func(r PipeResult) bool { return r.Name == p.Name }) {
			results = append(results, PipeResult{Name: p.Name, Version: p.Version})
		}
	}
	setLeases(results, m, now)
	a.results = results
	key := leaseState(results)
	changed := key != a.reportedLeases
	a.mu.Unlock()
	if !changed {
		return
	}
	ms, err := a.manifestState()
	if err != nil || ms.AppliedSerial != m.Serial {
		return // the next apply reports it
	}
	a.mu.Lock()
	a.reportedLeases = key
	a.mu.Unlock()
	st := &agentpb.ManifestStatus{Serial: m.Serial, Digest: digest, At: timestamppb.New(now), Pipes: pipeStatuses(results),
		State: agentpb.ManifestStatus_STATE_APPLIED, AppliedSerial: m.Serial}
	if !m.ExpiresAt.IsZero() {
		st.ExpiresAt = timestamppb.New(m.ExpiresAt)
		st.ManifestExpired = !now.Before(m.ExpiresAt)
	}
	a.enqueueStatus(m.AgentID, st)
}
