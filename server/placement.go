package server

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/drover/drover/api"
	"github.com/drover/drover/internal/tick"
	"github.com/drover/drover/manifest"
	"github.com/drover/drover/server/compile"
	"github.com/drover/drover/server/errs"
	"github.com/drover/drover/server/store"
)

// Placement: one (docs/placement.md). Package compile decides who holds
// each such pipe (compile.Place, pure); the compiler feeds it the stored
// holders, the agents' health and the releases they confirmed, stores the
// holders it decided before the manifests that carry them (a manifest
// never names a holder the store does not), and compiles the agents that
// gain, lose or renew a pipe. The leases loop runs it on the leader every
// few seconds, so that leases are renewed and hand-overs happen when due.

// compilerStore is what the compiler reads and writes.
type compilerStore interface {
	store.ManifestStore
	store.PlacementStore
	GetAgent(ctx context.Context, id string) (*store.Agent, error)
	AddEvents(ctx context.Context, evs []*store.Event) error
}

// place plans the holders of comp's placement: one pipes, stores the
// holder states that changed and tells comp who holds what. It returns the
// agents whose manifests it may have changed: those that gain, lose or
// renew a pipe, and every holder (so that a manifest that failed to save
// is made again).
func (c *compiler) place(ctx context.Context, comp *compile.Compilation, pipes []compile.Pipe, agents []*store.CompileAgent, cas []compile.Agent,
	stored []*store.Holder, now time.Time) ([]string, error) {
	if c.leading != nil && !c.leading() {
		return c.follow(comp, pipes, stored)
	}
	byID := make(map[string]int, len(agents))
	for i, a := range agents {
		byID[a.ID] = i
		cas[i].Healthy = c.healthy == nil || c.healthy(a.ID, a.LastSeenAt, now)
	}
	holders := make([]compile.Holder, len(stored))
	pending := map[string][]string{}
	live := map[string]bool{}
	for _, p := range pipes {
		live[p.Name] = compile.IsPlacedOne(&p)
	}
	for i, h := range stored {
		holders[i] = *h
		if live[h.Pipe] && h.Agent == "" && h.Prev != "" && now.Before(h.PrevLeaseUntil.Add(c.leases.SkewMargin)) {
			pending[h.Prev] = append(pending[h.Prev], h.Pipe)
		}
	}
	// A holder that lost a pipe confirms it no longer runs it by applying
	// a manifest issued at or after its release: serials only rise, and no
	// later manifest gives the pipe back without a new holder state.
	next := map[string]bool{}
	for id, ps := range pending {
		i, ok := byID[id]
		if !ok {
			continue // revoked or deleted: only the fence protects
		}
		a, err := c.store.GetAgent(ctx, id)
		if err != nil {
			return nil, fmt.Errorf("compile: %w", err)
		}
		m := agents[i].Prev
		for _, pipe := range ps {
			h := stored[slices.IndexFunc(stored, func(h *store.Holder) bool { return h.Pipe == pipe })]
			if m != nil && a.ManifestState == api.ManifestApplied && a.AppliedSerial >= m.Serial && !m.IssuedAt.Before(h.ReleasedAt.Truncate(time.Second)) {
				cas[i].Released = append(cas[i].Released, pipe)
			} else {
				next[id] = true
			}
		}
	}
	l := c.leases
	l.HoldSilent = now.Before(c.holdUntil)
	plans, remove := compile.Place(pipes, cas, holders, nil, now, l)
	// The pipes that gain a holder carry the latest fire time served, for
	// its catch-up: looked up for them alone.
	var gained []string
	for _, pl := range plans {
		if pl.Gain != "" {
			gained = append(gained, pl.Pipe)
		}
	}
	served, err := c.store.LastFiresServed(ctx, gained)
	if err != nil {
		return nil, fmt.Errorf("compile: %w", err)
	}
	for i := range plans {
		if pl := &plans[i]; pl.Gain != "" && served[pl.Pipe].After(pl.LastFireServed) {
			// Place set the floor of a hand-over (compile.catchupFloor).
			pl.LastFireServed, pl.State.LastFireServed = served[pl.Pipe], served[pl.Pipe]
		}
	}
	var save []*store.Holder
	var extra []string
	for _, pl := range plans {
		if pl.Changed {
			save = append(save, storeHolder(&pl.State, now))
		}
		for _, id := range []string{pl.Gain, pl.Lose, pl.Holder} {
			if id != "" {
				extra = append(extra, id)
			}
		}
		if pl.Lose != "" && pl.Holder == "" {
			next[pl.Lose] = true // it is to confirm the manifest without the pipe
		}
		if pl.Gain != "" || pl.Lose != "" {
			c.log.Info("placement", "pipe", pl.Pipe, "gain", pl.Gain, "lose", pl.Lose, "lease_until", pl.LeaseUntil, "reasons", pl.Reasons)
		}
	}
	if err := c.store.SaveHolders(ctx, save, remove); err != nil {
		return nil, fmt.Errorf("compile: %w", err)
	}
	if evs := movedEvents(plans, now); len(evs) > 0 {
		if err := c.store.AddEvents(ctx, evs); err != nil {
			c.log.Error("recording placement events", "err", err)
		}
	}
	for _, h := range stored {
		if slices.Contains(remove, h.Pipe) && h.Agent != "" {
			extra = append(extra, h.Agent)
		}
	}
	c.pending.Store(&next)
	if err := comp.Hold(plans); err != nil {
		return nil, err
	}
	slices.Sort(extra)
	return slices.Compact(extra), nil
}

// follow is place on a replica that does not lead: with several replicas
// on one database only the leader decides who holds what (two replicas
// judging the agents' health each their own way could otherwise choose two
// holders), so the others carry the stored holders and leases as they are.
// A change they make (a new placement: one pipe, new targets) is placed by
// the leader's leases loop within one of its passes.
func (c *compiler) follow(comp *compile.Compilation, pipes []compile.Pipe, stored []*store.Holder) ([]string, error) {
	live := map[string]bool{}
	for _, p := range pipes {
		live[p.Name] = compile.IsPlacedOne(&p)
	}
	var plans []compile.Placement
	var extra []string
	for _, h := range stored {
		if h.Agent == "" || !live[h.Pipe] {
			continue
		}
		plans = append(plans, compile.Placement{Pipe: h.Pipe, Holder: h.Agent, LeaseUntil: h.LeaseUntil, LastFireServed: h.LastFireServed,
			Reasons: []string{compile.PlaceHeld}, State: *h})
		extra = append(extra, h.Agent)
	}
	if err := comp.Hold(plans); err != nil {
		return nil, err
	}
	slices.Sort(extra)
	return slices.Compact(extra), nil
}

// awaitsRelease reports whether agent id's next manifest status may
// hand a pipe over (it lost one and has not confirmed yet).
func (c *compiler) awaitsRelease(id string) bool {
	p := c.pending.Load()
	return p != nil && (*p)[id]
}

// requestMove asks for pipe to move to agent to, by the lease rules, and
// compiles: the holder loses it now, to gains it once the holder's lease
// ended plus the skew margin or the holder confirmed.
func (c *compiler) requestMove(ctx context.Context, pipe, to string) error {
	c.mu.Lock()
	hs, err := c.store.Holders(ctx)
	if err == nil {
		h := &store.Holder{Pipe: pipe}
		if i := slices.IndexFunc(hs, func(h *store.Holder) bool { return h.Pipe == pipe }); i >= 0 {
			h = hs[i]
		}
		now := c.clock.Now()
		h.MoveTo, h.MoveRequestedAt, h.UpdatedAt = to, now, now
		if h.Agent == to {
			h.MoveTo, h.MoveRequestedAt = "", time.Time{} // already there
		}
		err = c.store.SaveHolders(ctx, []*store.Holder{h}, nil)
	}
	c.mu.Unlock()
	if err != nil {
		return fmt.Errorf("move: %w", err)
	}
	_, err = c.run(ctx, []string{}, false)
	return err
}

// storeHolder is the planned state h to save, updated at now.
func storeHolder(h *compile.Holder, now time.Time) *store.Holder {
	saved := *h
	saved.UpdatedAt = now
	return &saved
}

// agentHealthy: a live stream, or heard from within the offline grace (as
// missed-run detection and agent.offline judge it).
func (s *Server) agentHealthy(id string, lastSeen, now time.Time) bool {
	return s.hub.Online(id) || now.Sub(lastSeen) < s.cfg.GRPC.OfflineAfter
}

// leasesInterval is how often the leases loop runs: a tenth of the lease,
// between 1 s and 30 s.
func leasesInterval(lease time.Duration) time.Duration {
	return min(max(lease/10, time.Second), 30*time.Second)
}

// runLeases renews leases and hands pipes over when due, until ctx ends;
// wakePlacement runs it at once (a holder that lost a pipe reported).
func (s *Server) runLeases(ctx context.Context) {
	tick.Every(ctx, leasesInterval(s.cfg.Placement.Lease), s.placeWake, func() {
		if _, err := s.compiler.Place(ctx); err != nil && ctx.Err() == nil {
			s.log.Error("placement leases", "err", err)
		}
	})
}

// statusCommitted wakes the leases loop when an agent that is to confirm
// a release reported its manifest status.
func (s *Server) statusCommitted(recs []*store.Record) {
	for _, r := range recs {
		if r.Status != nil && s.compiler.AwaitsRelease(r.AgentID) {
			select {
			case s.placeWake <- struct{}{}:
			default:
			}
			return
		}
	}
}

// pipePlacement is what GET pipe and describe pipe show of a placement:
// one pipe: the holder state and what the holder reports of its lease.
func (s *Server) pipePlacement(ctx context.Context, p *store.PipeVersion) (*api.Placement, error) {
	if p.Spec.Placement != manifest.PlacementOne {
		return nil, nil
	}
	hs, err := s.store.Holders(ctx)
	if err != nil {
		return nil, err
	}
	out := &api.Placement{Policy: manifest.PlacementOne}
	i := slices.IndexFunc(hs, func(h *store.Holder) bool { return h.Pipe == p.Name })
	if i < 0 {
		return out, nil
	}
	h := hs[i]
	out.Holder, out.LeaseUntil, out.Since, out.LastFireServed, out.MoveTo = h.Agent, h.LeaseUntil, h.Since, h.LastFireServed, h.MoveTo
	if h.Agent == "" && h.Prev != "" {
		out.Previous, out.PreviousLeaseUntil = h.Prev, h.PrevLeaseUntil
		out.NextAfter = h.PrevLeaseUntil.Add(s.cfg.Placement.SkewMargin)
	}
	if h.Agent != "" {
		a, err := s.store.GetAgent(ctx, h.Agent)
		switch {
		case err == nil:
			for _, ps := range a.Pipes {
				if ps.Name == p.Name {
					out.Reported = &api.LeaseReport{LeaseUntil: ps.LeaseUntil, LeaseEnded: ps.LeaseEnded, At: a.StatusAt}
				}
			}
		case !errors.Is(err, errs.ErrNotFound):
			return nil, err
		}
	}
	return out, nil
}

// handleMovePipe hands a placement: one pipe over to another targeted
// agent by the lease rules: the holder loses it now and the agent gains
// it once the holder's lease ended plus the skew margin, or at once when
// the holder confirms a manifest without it.
func (s *Server) handleMovePipe(w http.ResponseWriter, r *http.Request) error {
	name, req, err := paramBody[api.MovePipeRequest](w, r, pipeName, s.cfg.HTTP.MaxBodyBytes)
	if err != nil {
		return err
	}
	if req.To == "" {
		return errs.New(errs.ErrValidation, "no agent to move to", api.Detail{Field: "to", Message: "required"})
	}
	p, err := s.store.GetPipe(r.Context(), name)
	if err != nil {
		return err
	}
	if p.Spec.Placement != manifest.PlacementOne {
		return errs.New(errs.ErrConflict, fmt.Sprintf("pipe %s runs on every agent it targets (placement: all): only placement: one pipes move", name))
	}
	a, err := s.store.GetAgent(r.Context(), req.To)
	if errors.Is(err, errs.ErrNotFound) {
		return errs.New(errs.ErrNotFound, "agent "+req.To+" not found", api.Detail{Field: "to", Message: "no such agent"})
	} else if err != nil {
		return err
	}
	switch {
	case !a.RevokedAt.IsZero():
		return errs.New(errs.ErrConflict, "agent "+a.ID+" is revoked", api.Detail{Field: "to", Message: "revoked"})
	case !p.Spec.Targets.Selects(a.ID, a.Tags):
		return errs.New(errs.ErrConflict, fmt.Sprintf("pipe %s does not target agent %s", name, a.ID), api.Detail{Field: "to", Message: "not targeted by the pipe"})
	}
	before, err := s.pipePlacement(r.Context(), &p.PipeVersion)
	if err != nil {
		return err
	}
	if err := s.compiler.RequestMove(r.Context(), name, a.ID); err != nil {
		return err
	}
	after, err := s.pipePlacement(r.Context(), &p.PipeVersion)
	if err != nil {
		return err
	}
	s.log.Info("pipe move requested", "pipe", name, "to", a.ID)
	setAudit(r, "pipe/"+name, before, after)
	return writeJSON(w, http.StatusAccepted, after)
}

// dryRunPlacing is what a dry-run of pipe needs to plan its placement.
func (s *Server) dryRunPlacing(ctx context.Context, pipe string, now time.Time) (compile.Placing, error) {
	pl := compile.Placing{Now: now, Leases: compile.Leases{Lease: s.cfg.Placement.Lease, SkewMargin: s.cfg.Placement.SkewMargin}}
	hs, err := s.store.Holders(ctx)
	if err != nil {
		return pl, err
	}
	for _, h := range hs {
		if h.Pipe == pipe {
			pl.Holders = append(pl.Holders, *h)
		}
	}
	if pl.Served, err = s.store.LastFiresServed(ctx, []string{pipe}); err != nil {
		return pl, err
	}
	return pl, nil
}

// movedEvents are the pipe.moved events of a plan: one for each agent
// that lost a pipe (with when the next holder may start) and each that
// gained one.
func movedEvents(plans []compile.Placement, now time.Time) []*store.Event {
	var evs []*store.Event
	at := strconv.FormatInt(now.UnixNano(), 10)
	for _, pl := range plans {
		why := strings.Join(pl.Reasons, "; ")
		if pl.Lose != "" {
			msg := "lost the pipe: " + why
			if pl.Next != "" {
				msg += "; " + pl.Next + " gains it after " + pl.NextAt.UTC().Format(time.RFC3339)
			}
			evs = append(evs, &store.Event{At: now, Kind: EventPipeMoved, Pipe: pl.Pipe, AgentID: pl.Lose, Message: msg,
				Dedupe: EventPipeMoved + "/" + pl.Pipe + "/lose/" + pl.Lose + "/" + at})
		}
		if pl.Gain != "" {
			evs = append(evs, &store.Event{At: now, Kind: EventPipeMoved, Pipe: pl.Pipe, AgentID: pl.Gain,
				Message: "holds the pipe until " + pl.LeaseUntil.UTC().Format(time.RFC3339) + " (renewed while healthy): " + why,
				Dedupe:  EventPipeMoved + "/" + pl.Pipe + "/gain/" + pl.Gain + "/" + at})
		}
	}
	return evs
}
