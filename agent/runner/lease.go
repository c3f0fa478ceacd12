package runner

import (
	"fmt"
	"github.com/drover/drover/api"
	"time"

	"github.com/drover/drover/agent/lease"
	agentpb "github.com/drover/drover/proto"
)

// ReasonLeaseEnded is the reason of the skipped record of a run the
// runner refused because the pipe's lease had ended.
const ReasonLeaseEnded = api.ReasonLeaseEnded

// fence turns a scheduled or catch-up run of a held pipe whose lease has
// ended into a skipped one (defence in depth: the agent stops the timer
// at the lease's end, but a timer may fire in that very second, and the
// agent may be stopped or down). Runs asked for by a person or the API are
// not fenced: the operator chose this host.
func (r *runner) fence(p *plannedRun) {
	if r.pipe == nil || p.skip != "" || !scheduled(p.trigger) {
		return
	}
	if now := r.now(); lease.Ended(r.pipe, now) {
		p.skip = fmt.Sprintf("the lease of this host on the pipe ended at %s (placement: one); not run",
			r.pipe.LeaseUntil.UTC().Format(time.RFC3339))
		p.skipReason = ReasonLeaseEnded
	}
}

func scheduled(t agentpb.Trigger) bool {
	return t == agentpb.Trigger_TRIGGER_SCHEDULE || t == agentpb.Trigger_TRIGGER_CATCHUP
}

// lastServed is the latest fire time known run: this host's own (the
// runner's state) or, for a held pipe, the latest any holder served (the
// manifest's last_fire_served), whichever is later.
func (r *runner) lastServed(st state) time.Time {
	last := st.lastFireFor(r.spec)
	if r.pipe != nil && r.pipe.Held() && r.pipe.LastFireServed.After(last) {
		last = r.pipe.LastFireServed
	}
	return last
}
