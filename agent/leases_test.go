package agent

import (
	"slices"
	"testing"
	"time"

	"github.com/drover/drover/agent/lease"
	"github.com/drover/drover/manifest"
)

// TestLeaseWork: the lease loop's plan, pure: which held pipes to fence
// now (once per lease) and when to wake next.
func TestLeaseWork(t *testing.T) {
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	m := &manifest.Manifest{Pipes: []manifest.Pipe{
		{Name: "free"},
		{Name: "ended", LeaseUntil: now.Add(time.Second)}, // within Lead: ended
		{Name: "long-ended", LeaseUntil: now.Add(-time.Hour)},
		{Name: "soon", LeaseUntil: now.Add(30 * time.Second)},
		{Name: "later", LeaseUntil: now.Add(time.Hour)},
	}}
	due, next := leaseWork(m, map[string]time.Time{}, now)
	if !slices.Equal(due, []string{"ended", "long-ended"}) || !next.Equal(now.Add(30*time.Second-lease.Lead)) {
		t.Fatalf("due %v next %s", due, next)
	}
	fenced := map[string]time.Time{"ended": now.Add(time.Second), "long-ended": now.Add(-2 * time.Hour)}
	if due, _ := leaseWork(m, fenced, now); !slices.Equal(due, []string{"long-ended"}) {
		t.Fatalf("fenced for another lease_until: due %v", due)
	}
	if due, next := leaseWork(&manifest.Manifest{Pipes: []manifest.Pipe{{Name: "free"}}}, nil, now); due != nil || !next.IsZero() {
		t.Fatalf("nothing held: %v %s", due, next)
	}

	results := []PipeResult{{Name: "soon", NextFireTimes: []time.Time{now.Add(10 * time.Second), now.Add(29 * time.Second), now.Add(time.Minute)}}, {Name: "ended", NextFireTimes: []time.Time{now}}, {Name: "free"}}
	setLeases(results, m, now)
	if r := results[0]; r.LeaseEnded || !r.LeaseUntil.Equal(now.Add(30*time.Second)) || len(r.NextFireTimes) != 1 {
		t.Fatalf("soon: %+v", r)
	}
	if r := results[1]; !r.LeaseEnded || r.NextFireTimes != nil {
		t.Fatalf("ended: %+v", r)
	}
	if r := results[2]; !r.LeaseUntil.IsZero() || r.LeaseEnded {
		t.Fatalf("free: %+v", r)
	}
	if leaseState(results) == leaseState(results[:1]) {
		t.Fatal("the lease state does not tell an ended lease")
	}
}
