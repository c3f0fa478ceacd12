package compile

import (
	"fmt"
	"testing"
	"time"

	"github.com/drover/drover/manifest"
)

// BenchmarkPlacementSilentAgent: 10,000 agents in 20 tag groups, 1,000
// placement: one pipes each targeting one group, every pipe held; one
// holder goes silent past its lease plus the margin and the whole fleet is
// recompiled: its pipes move, the new holders' manifests are encoded, the
// rest stay unchanged. The README quotes its figure:
//
//	go test ./server/compile -run '^$' -bench PlacementSilentAgent -benchtime 5x
func BenchmarkPlacementSilentAgent(b *testing.B) {
	const nAgents, nPipes, groups = 10000, 1000, 20
	now := time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)
	lease, margin := 5*time.Minute, time.Minute
	var pipes []Pipe
	for i := range nPipes {
		spec := manifest.Spec{Name: fmt.Sprintf("pipe-%04d", i), Schedule: "@hourly", Script: "true\n", Placement: manifest.PlacementOne,
			Targets: &manifest.Targets{Tags: map[string]string{"group": fmt.Sprint(i % groups)}}}
		spec.Normalize()
		pipes = append(pipes, Pipe{Name: spec.Name, Version: 1, Spec: spec, PayloadDigest: manifest.Digest([]byte(spec.Name)), PayloadSize: 10})
	}
	agents := make([]Agent, nAgents)
	for i := range agents {
		agents[i] = Agent{ID: fmt.Sprintf("agt-%05d", i), Tags: map[string]string{"group": fmt.Sprint(i % groups), "zone": fmt.Sprint(i % 3)}, Healthy: true}
	}
	// A first compilation chooses every holder; its output is the stored
	// state of the second.
	first, err := Compute(Input{Pipes: pipes, Agents: agents, Now: now.Add(-4 * lease), Lifetime: manifest.DefaultLifetime, Leases: Leases{Lease: lease, SkewMargin: margin}})
	if err != nil {
		b.Fatal(err)
	}
	var holders []Holder
	for _, pl := range first.Placements {
		holders = append(holders, pl.State)
	}
	prev := map[string]*Previous{}
	for _, m := range first.Agents {
		prev[m.AgentID] = &Previous{Serial: m.Serial, ContentHash: m.ContentHash, IssuedAt: now.Add(-time.Minute), Pipes: m.Pipes}
	}
	// Every lease is fresh but that of the silent agent's pipes.
	silent := holders[0].Agent
	for i := range holders {
		if holders[i].Agent != silent {
			holders[i].LeaseUntil = now.Add(lease)
		}
	}
	for i := range agents {
		agents[i].Prev = prev[agents[i].ID]
		agents[i].Prev.ContentHash = "" // recomputed below from the fresh leases
		if agents[i].ID == silent {
			agents[i].Healthy = false
		}
	}
	// The stored content hashes match the stored leases: only the silent
	// agent's pipes change.
	c, err := New(pipes, 0, now, manifest.DefaultLifetime)
	if err != nil {
		b.Fatal(err)
	}
	var pls []Placement
	for _, h := range holders {
		pls = append(pls, Placement{Pipe: h.Pipe, Holder: h.Agent, LeaseUntil: h.LeaseUntil, LastFireServed: h.LastFireServed})
	}
	if err := c.Hold(pls); err != nil {
		b.Fatal(err)
	}
	for i := range agents {
		a := &agents[i]
		a.Prev.ContentHash = c.contentHash(a.ID, c.selected(a), a.Prev.Pipes)
	}
	in := Input{Pipes: pipes, Agents: agents, Holders: holders, Now: now, Lifetime: manifest.DefaultLifetime, Leases: Leases{Lease: lease, SkewMargin: margin}}
	b.ResetTimer()
	for b.Loop() {
		plan, err := Compute(in)
		if err != nil {
			b.Fatal(err)
		}
		moved, changed := 0, 0
		for _, pl := range plan.Placements {
			if pl.Gain != "" {
				moved++
			}
		}
		for _, m := range plan.Agents {
			if m.Changed {
				changed++
			}
		}
		if moved == 0 || changed > 2*moved+1 {
			b.Fatalf("moved %d pipes, %d manifests changed", moved, changed)
		}
		b.ReportMetric(float64(moved), "moved")
		b.ReportMetric(float64(changed), "changed")
	}
}
