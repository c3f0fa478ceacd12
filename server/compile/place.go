package compile

import (
	"cmp"
	"encoding/binary"
	"hash/fnv"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/drover/drover/manifest"
	"github.com/drover/drover/server/store"
)

// Placement: one (docs/design.md, "Fleet semantics") is assignment with
// lease fencing: exactly one healthy targeted agent holds the pipe, and its
// manifest entry carries lease_until; the holder runs the pipe only while
// that lease is valid. Place decides, per such pipe, who holds it:
//
//   - a holder stays while it is targeted and not revoked: recompiles and
//     new agents do not move it; while it is healthy its lease is renewed
//     once less than two thirds of it is left;
//   - it loses the pipe at once when it is revoked, deleted or no longer
//     targeted, when a move to another agent was requested, and when it has
//     been silent past its lease plus the skew margin (then only if another
//     agent can take it);
//   - a new holder gains the pipe only after the lease of the one before
//     ended plus the skew margin, unless that agent confirmed a manifest
//     without the pipe (or its lease ended) after it lost it;
//   - the new holder is the requested one if it is healthy and targeted,
//     otherwise the healthy targeted agent that rendezvous hashing of
//     (pipe, agent id) ranks first, so that the choice depends on nothing
//     else.

// Holder is the placement state of one pipe: the store's type, which the
// plan reads and returns (never touching a store). Place leaves UpdatedAt
// as it came; whoever saves a state sets it.
type Holder = store.Holder

// Leases are the placement settings of a compilation.
type Leases struct {
	Lease      time.Duration // how long a holder's lease lasts from its issue
	SkewMargin time.Duration // added to a lease's end before anyone else gains the pipe
	// HoldSilent keeps silent holders in place (neither renewed nor moved):
	// set just after a server start, before the agents had the time to
	// reconnect.
	HoldSilent bool
}

// Placement is the plan for one placement: one pipe.
type Placement struct {
	Pipe string
	// Holder is the agent whose manifest carries the pipe after this plan,
	// until LeaseUntil, with LastFireServed; "" for none.
	Holder         string
	LeaseUntil     time.Time
	LastFireServed time.Time
	// Gain and Lose are the agents that gain and lose the pipe in this plan
	// ("" for none); Renewed says the holder's lease was renewed.
	Gain, Lose string
	Renewed    bool
	// Next is the agent that will gain the pipe at NextAt once the lease of
	// the agent before has ended (set while nobody holds it).
	Next   string
	NextAt time.Time
	// Reasons say what the plan did and why.
	Reasons []string
	// State is the holder state to store; Changed says it differs from the
	// input's.
	State   Holder
	Changed bool
}

// Placement reasons.
const (
	PlaceHeld       = "held"
	PlaceChosen     = "holder chosen"
	PlaceRenewed    = "lease renewed"
	PlaceGone       = "holder revoked or deleted"
	PlaceUntargeted = "holder no longer targeted"
	PlaceSilent     = "holder silent past its lease"
	PlaceMove       = "move requested"
	PlaceMoveDone   = "moved as requested"
	PlaceMoveDrop   = "move request dropped: the agent is not targeted"
	PlaceWaiting    = "waiting for the lease of the holder before to end"
	PlaceConfirmed  = "the holder before confirmed it dropped the pipe"
	PlaceNoAgent    = "no healthy targeted agent"
	PlaceKeptSilent = "holder silent, no healthy targeted agent to move to"
)

// IsPlacedOne reports whether a pipe is placement: one.
func IsPlacedOne(p *Pipe) bool { return p.Spec.Placement == manifest.PlacementOne }

// Place plans the holders of the placement: one pipes among pipes. agents
// are the non-revoked agents with their health (Agent.Healthy) and the
// pipes whose release they confirmed (Agent.Released); holders is the
// stored state, served the latest fire time served per pipe (looked up
// only for pipes that may gain a holder). It returns a placement per
// placement: one pipe, by name, and the pipes whose stored state is to be
// removed (no longer placement: one, or deleted once their fence passed).
func Place(pipes []Pipe, agents []Agent, holders []Holder, served map[string]time.Time, now time.Time, l Leases) ([]Placement, []string) {
	now = now.UTC().Truncate(time.Second)
	byID := make(map[string]*Agent, len(agents))
	groups := map[string][]*Agent{} // agents by tag set: selection is decided once per set
	groupOf := make(map[string]string, len(agents))
	for i := range agents {
		a := &agents[i]
		if a.Revoked {
			continue
		}
		byID[a.ID] = a
		k := tagKey(a.Tags)
		groupOf[a.ID] = k
		groups[k] = append(groups[k], a)
	}
	keys := slices.Sorted(maps.Keys(groups))
	state := make(map[string]Holder, len(holders))
	for _, h := range holders {
		state[h.Pipe] = h
	}
	sorted := slices.Clone(pipes)
	slices.SortStableFunc(sorted, func(a, b Pipe) int { return cmp.Compare(a.Name, b.Name) })
	var out []Placement
	live := map[string]bool{}
	for i := range sorted {
		p := &sorted[i]
		if !IsPlacedOne(p) {
			continue
		}
		live[p.Name] = true
		tg := &targeting{byID: byID, groupOf: groupOf, explicit: map[string]*Agent{}, groups: map[string]bool{}}
		if t := p.Spec.Targets; t != nil {
			for _, id := range t.Agents {
				if a := byID[id]; a != nil {
					tg.explicit[id] = a
				}
			}
			if len(t.Tags) > 0 {
				for _, k := range keys {
					if t.SelectsTags(groups[k][0].Tags) {
						tg.groups[k] = true
						tg.order = append(tg.order, groups[k])
					}
				}
			}
		}
		h, ok := state[p.Name]
		if !ok {
			h = Holder{Pipe: p.Name}
		}
		out = append(out, placeOne(p.Name, h, byID, tg, served, now, l))
	}
	var remove []string
	for _, h := range holders {
		if live[h.Pipe] {
			continue
		}
		// A pipe deleted (or turned placement: all) while held: its state
		// stays as a fence until the last lease ended, in case it comes back
		// as placement: one.
		end := h.LeaseUntil
		if h.Agent == "" {
			end = h.PrevLeaseUntil
		}
		if !now.Before(end.Add(l.SkewMargin)) {
			remove = append(remove, h.Pipe)
		}
	}
	return out, remove
}

// placeOne plans one pipe from its holder state h.
func placeOne(pipe string, h Holder, byID map[string]*Agent, tg *targeting, served map[string]time.Time, now time.Time, l Leases) Placement {
	in := h
	pl := Placement{Pipe: pipe}
	healthy := func(id string) bool { a := tg.get(id); return a != nil && a.Healthy }
	release := func(reason string) {
		pl.Lose = h.Agent
		pl.Reasons = append(pl.Reasons, reason)
		h.Prev, h.PrevSince, h.PrevLeaseUntil, h.ReleasedAt = h.Agent, h.Since, h.LeaseUntil, now
		h.Agent, h.Since, h.LeaseUntil, h.LastFireServed = "", time.Time{}, time.Time{}, time.Time{}
	}
	if h.Agent != "" {
		a, present := byID[h.Agent]
		isTargeted := tg.get(h.Agent) != nil
		switch {
		case !present:
			release(PlaceGone)
		case !isTargeted:
			release(PlaceUntargeted)
		case h.MoveTo != "" && h.MoveTo != h.Agent && healthy(h.MoveTo):
			release(PlaceMove + " to " + h.MoveTo)
		case a.Healthy:
			if h.LeaseUntil.Sub(now) < l.Lease*2/3 {
				h.LeaseUntil = now.Add(l.Lease)
				pl.Renewed = true
				pl.Reasons = append(pl.Reasons, PlaceRenewed)
			} else {
				pl.Reasons = append(pl.Reasons, PlaceHeld)
			}
		case l.HoldSilent || now.Before(h.LeaseUntil.Add(l.SkewMargin)):
			pl.Reasons = append(pl.Reasons, PlaceHeld)
		case tg.choose(pipe) == "":
			pl.Reasons = append(pl.Reasons, PlaceKeptSilent)
		default:
			release(PlaceSilent)
		}
		if h.MoveTo == h.Agent && h.MoveTo != "" {
			h.MoveTo, h.MoveRequestedAt = "", time.Time{}
		}
	}
	if h.Agent == "" {
		if h.MoveTo != "" && tg.get(h.MoveTo) == nil {
			h.MoveTo, h.MoveRequestedAt = "", time.Time{}
			pl.Reasons = append(pl.Reasons, PlaceMoveDrop)
		}
		next := ""
		if healthy(h.MoveTo) {
			next = h.MoveTo
		} else {
			next = tg.choose(pipe)
		}
		fence := h.PrevLeaseUntil.Add(l.SkewMargin)
		switch {
		case next == "":
			pl.Reasons = append(pl.Reasons, PlaceNoAgent)
		case h.Prev != "" && next != h.Prev && now.Before(fence) && !released(byID[h.Prev], pipe):
			pl.Next, pl.NextAt = next, fence
			pl.Reasons = append(pl.Reasons, PlaceWaiting+" ("+h.Prev+", "+h.PrevLeaseUntil.UTC().Format(time.RFC3339)+" + "+l.SkewMargin.String()+")")
		default:
			if h.Prev != "" && next != h.Prev && now.Before(fence) {
				pl.Reasons = append(pl.Reasons, PlaceConfirmed)
			}
			if next == h.MoveTo {
				pl.Reasons = append(pl.Reasons, PlaceMoveDone)
				h.MoveTo, h.MoveRequestedAt = "", time.Time{}
			} else {
				pl.Reasons = append(pl.Reasons, PlaceChosen)
			}
			h.Agent, h.Since, h.LeaseUntil, h.LastFireServed = next, now, now.Add(l.Lease), served[pipe]
			if h.Prev != "" && next != h.Prev {
				h.LastFireServed = later(h.LastFireServed, catchupFloor(h.PrevLeaseUntil, now))
			}
			pl.Gain = next
		}
	}
	if pl.Gain != "" && pl.Gain == pl.Lose { // handed back in one plan: a renewal
		pl.Gain, pl.Lose, pl.Renewed = "", "", true
		h.Prev, h.PrevSince, h.PrevLeaseUntil, h.ReleasedAt = in.Prev, in.PrevSince, in.PrevLeaseUntil, in.ReleasedAt
		h.Since = in.Since
	}
	pl.Holder, pl.LeaseUntil, pl.LastFireServed = h.Agent, h.LeaseUntil, h.LastFireServed
	pl.State, pl.Changed = h, h != in
	return pl
}

// catchupFloor is the latest fire time a holder whose lease ended (or
// ends) at leaseUntil may have served when another agent gains the pipe at
// now: the agent gaining it catches up only the fire times after it.
// The holder before serves no fire time at or after leaseUntil -
// manifest.LeaseLead by its own clock (a fire time's scheduled_at is on
// that clock, whatever its skew), and none after now if it confirmed
// sooner; but its run records may not have reached the server (a
// partitioned or stopped host runs on, and reports later), so the
// server's last fire served alone would let the new holder run them
// again. Fire times fall on whole seconds: the floor is the last whole
// second before the lease's stop, or now.
func catchupFloor(leaseUntil, now time.Time) time.Time {
	stop := leaseUntil.Add(-manifest.LeaseLead)
	if now.Before(stop) {
		return now
	}
	return stop.Add(-time.Nanosecond).Truncate(time.Second)
}

// later returns the later of a and b.
func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// released reports whether agent a confirmed it no longer runs pipe.
func released(a *Agent, pipe string) bool {
	return a != nil && slices.Contains(a.Released, pipe)
}

// targeting is the agents one pipe targets: those it names, and the tag
// groups it selects (kept as groups: a fleet of one tag set is one entry).
type targeting struct {
	byID     map[string]*Agent
	groupOf  map[string]string
	explicit map[string]*Agent
	groups   map[string]bool
	order    [][]*Agent // the selected groups' agents, in key order
}

// get returns the targeted agent id, nil if it is not targeted.
func (t *targeting) get(id string) *Agent {
	if a := t.explicit[id]; a != nil {
		return a
	}
	if a := t.byID[id]; a != nil && t.groups[t.groupOf[id]] {
		return a
	}
	return nil
}

// choose returns the healthy targeted agent that rendezvous hashing
// ranks first for pipe, "" for none.
func (t *targeting) choose(pipe string) string {
	best, bestScore := "", uint64(0)
	try := func(a *Agent) {
		if !a.Healthy {
			return
		}
		s := RendezvousScore(pipe, a.ID)
		if best == "" || s > bestScore || (s == bestScore && a.ID < best) {
			best, bestScore = a.ID, s
		}
	}
	for _, a := range t.explicit {
		try(a)
	}
	for _, g := range t.order {
		for _, a := range g {
			try(a)
		}
	}
	return best
}

// RendezvousScore ranks agent id for pipe: FNV-1a of both, mixed by the
// SplitMix64 finaliser so that close names spread.
func RendezvousScore(pipe, id string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(pipe))
	h.Write([]byte{0})
	h.Write([]byte(id))
	x := h.Sum64()
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

// tagKey names a tag set.
func tagKey(tags map[string]string) string {
	if len(tags) == 0 {
		return ""
	}
	var b strings.Builder
	var n [4]byte
	for _, k := range slices.Sorted(maps.Keys(tags)) {
		binary.BigEndian.PutUint32(n[:], uint32(len(k)))
		b.Write(n[:])
		b.WriteString(k)
		binary.BigEndian.PutUint32(n[:], uint32(len(tags[k])))
		b.Write(n[:])
		b.WriteString(tags[k])
	}
	return b.String()
}
