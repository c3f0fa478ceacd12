package compile

import (
	"bytes"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"
	"golang.org/x/tools/txtar"

	"github.com/drover/drover/manifest"
)

// TestGolden runs each testdata/golden/*.txtar as one case. The archive's
// comment describes the case. input.yaml holds what a compilation reads:
// pipes in force, agents and their stored manifests, existing secrets, the
// key-list version, the time; dryrun.yaml, when present, proposes a change
// to one pipe. The rest is expected output: plan.txt, dryrun.txt, and
// manifest/<agent>.json with the exact bytes to sign for each changed
// agent. After a deliberate change, rewrite the outputs with
//
//	go test ./server/compile -run Golden -update
//
// and review the diff.
var update = flag.Bool("update", false, "rewrite the expected files in testdata/golden")

type goldenInput struct {
	Now            time.Time         `yaml:"now"`
	Lifetime       manifest.Duration `yaml:"lifetime"`
	KeyListVersion uint64            `yaml:"key_list_version"`
	Force          bool              `yaml:"force"`
	// Secrets are the secrets that exist, with their values: the plan never
	// reads them, and no value may appear in what it returns.
	Secrets map[string]string `yaml:"secrets"`
	Pipes   []goldenPipe      `yaml:"pipes"`
	Agents  []goldenAgent     `yaml:"agents"`
	// Placement: one: the stored holders, the latest fire times served,
	// the lease and skew margin (defaults 5m and 1m).
	Holders    []goldenHolder       `yaml:"holders"`
	Served     map[string]time.Time `yaml:"served"`
	Lease      manifest.Duration    `yaml:"lease"`
	SkewMargin manifest.Duration    `yaml:"skew_margin"`
	HoldSilent bool                 `yaml:"hold_silent"`
}

type goldenHolder struct {
	Pipe           string    `yaml:"pipe"`
	Agent          string    `yaml:"agent"`
	LeaseUntil     time.Time `yaml:"lease_until"`
	Since          time.Time `yaml:"since"`
	LastFireServed time.Time `yaml:"last_fire_served"`
	Prev           string    `yaml:"prev"`
	PrevSince      time.Time `yaml:"prev_since"`
	PrevLeaseUntil time.Time `yaml:"prev_lease_until"`
	ReleasedAt     time.Time `yaml:"released_at"`
	MoveTo         string    `yaml:"move_to"`
}

type goldenPipe struct {
	Version uint64           `yaml:"version"`
	Payload manifest.Payload `yaml:"payload"`
	Spec    manifest.Spec    `yaml:"spec"`
}

type goldenAgent struct {
	ID      string            `yaml:"id"`
	Tags    map[string]string `yaml:"tags"`
	Revoked bool              `yaml:"revoked"`
	// Silent: no live stream and not heard from within the offline grace.
	Silent bool `yaml:"silent"`
	// Released: placement: one pipes it confirmed it dropped.
	Released []string `yaml:"released"`
	Previous *struct {
		Serial         uint64    `yaml:"serial"`
		IssuedAt       time.Time `yaml:"issued_at"`
		KeyListVersion uint64    `yaml:"key_list_version"`
		// Pipes are the name@version references it held; its content hash
		// is computed from them unless ContentHash is given.
		Pipes       []string `yaml:"pipes"`
		ContentHash string   `yaml:"content_hash"`
	} `yaml:"previous"`
}

type goldenDryRun struct {
	Pipe   string      `yaml:"pipe"`
	Delete bool        `yaml:"delete"`
	Spec   *goldenPipe `yaml:"next"`
}

func (p *goldenPipe) pipe() Pipe {
	spec := p.Spec
	spec.Normalize()
	d := p.Payload
	if d.Digest == "" {
		d = manifest.Payload{Digest: manifest.Digest([]byte(spec.Name)), Size: 100} // one bundle per pipe
	}
	return Pipe{Name: spec.Name, Version: p.Version, Spec: spec, PayloadDigest: d.Digest, PayloadSize: d.Size}
}

func (g *goldenInput) input() Input {
	in := Input{KeyListVersion: g.KeyListVersion, Now: g.Now, Lifetime: g.Lifetime.D(), Force: g.Force, Served: g.Served,
		Leases: Leases{Lease: g.Lease.D(), SkewMargin: g.SkewMargin.D(), HoldSilent: g.HoldSilent}}
	if in.Lifetime == 0 {
		in.Lifetime = manifest.DefaultLifetime
	}
	if in.Leases.Lease == 0 {
		in.Leases.Lease = 5 * time.Minute
	}
	if in.Leases.SkewMargin == 0 {
		in.Leases.SkewMargin = time.Minute
	}
	for _, h := range g.Holders {
		in.Holders = append(in.Holders, Holder{Pipe: h.Pipe, Agent: h.Agent, LeaseUntil: h.LeaseUntil, Since: h.Since, LastFireServed: h.LastFireServed,
			Prev: h.Prev, PrevSince: h.PrevSince, PrevLeaseUntil: h.PrevLeaseUntil, ReleasedAt: h.ReleasedAt, MoveTo: h.MoveTo})
	}
	for i := range g.Pipes {
		in.Pipes = append(in.Pipes, g.Pipes[i].pipe())
	}
	for _, a := range g.Agents {
		ca := Agent{ID: a.ID, Tags: a.Tags, Revoked: a.Revoked, Healthy: !a.Silent, Released: a.Released}
		if p := a.Previous; p != nil {
			ca.Prev = &Previous{Serial: p.Serial, IssuedAt: p.IssuedAt, KeyListVersion: p.KeyListVersion, Pipes: p.Pipes, ContentHash: p.ContentHash}
			if ca.Prev.ContentHash == "" {
				// A held pipe's reference hashes with the stored lease.
				lines := slices.Clone(p.Pipes)
				for j, r := range lines {
					for _, h := range in.Holders {
						if h.Agent == a.ID && strings.HasPrefix(r, h.Pipe+"@") {
							lines[j] += leaseHash(h.LeaseUntil, h.LastFireServed)
						}
					}
				}
				ca.Prev.ContentHash = contentHash(a.ID, p.KeyListVersion, lines)
			}
		}
		in.Agents = append(in.Agents, ca)
	}
	return in
}

func decodeStrict(data []byte, v any) error {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	return dec.Decode(v)
}

func archiveFile(ar *txtar.Archive, name string) ([]byte, bool) {
	for _, f := range ar.Files {
		if f.Name == name {
			return f.Data, true
		}
	}
	return nil, false
}

// list joins a list for plan.txt, "-" for none.
func list(s []string) string {
	if len(s) == 0 {
		return "-"
	}
	return strings.Join(s, " ")
}

// formatPlan writes a plan as plan.txt shows it.
func formatPlan(p *Plan) []byte {
	var b bytes.Buffer
	fmt.Fprintf(&b, "issued_at: %s\nexpires_at: %s\nkey_list_version: %d\n", p.IssuedAt.Format(time.RFC3339), p.ExpiresAt.Format(time.RFC3339), p.KeyListVersion)
	for _, m := range p.Agents {
		state := "unchanged"
		if m.Changed {
			state = fmt.Sprintf("changed, serial %d", m.Serial)
		}
		fmt.Fprintf(&b, "\nagent %s: %s\n", m.AgentID, state)
		fmt.Fprintf(&b, "  reasons: %s\n", strings.Join(m.Reasons, "; "))
		fmt.Fprintf(&b, "  pipes: %s\n", list(m.Pipes))
		if m.ContentHash != "" {
			fmt.Fprintf(&b, "  content_hash: %s\n", m.ContentHash)
		}
		if m.Changed {
			fmt.Fprintf(&b, "  payloads: %s\n", list(m.Payloads))
			fmt.Fprintf(&b, "  secrets: %s\n", list(m.Secrets))
		}
	}
	for _, pl := range p.Placements {
		fmt.Fprintf(&b, "\nplacement %s: holder %s\n", pl.Pipe, orDash(pl.Holder))
		if pl.Holder != "" {
			fmt.Fprintf(&b, "  lease_until: %s\n", stamp(pl.LeaseUntil))
			fmt.Fprintf(&b, "  last_fire_served: %s\n", stamp(pl.LastFireServed))
		}
		if pl.Gain != "" || pl.Lose != "" {
			fmt.Fprintf(&b, "  gain: %s\n  lose: %s\n", orDash(pl.Gain), orDash(pl.Lose))
		}
		if pl.Renewed {
			b.WriteString("  renewed\n")
		}
		if pl.Next != "" {
			fmt.Fprintf(&b, "  next: %s at %s\n", pl.Next, stamp(pl.NextAt))
		}
		fmt.Fprintf(&b, "  reasons: %s\n", strings.Join(pl.Reasons, "; "))
		if pl.Changed {
			h := pl.State
			fmt.Fprintf(&b, "  state: agent=%s since=%s prev=%s prev_lease_until=%s released_at=%s move_to=%s\n", orDash(h.Agent), stamp(h.Since),
				orDash(h.Prev), stamp(h.PrevLeaseUntil), stamp(h.ReleasedAt), orDash(h.MoveTo))
		}
	}
	if len(p.RemoveHolders) > 0 {
		fmt.Fprintf(&b, "\nremove holders: %s\n", list(p.RemoveHolders))
	}
	return b.Bytes()
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func stamp(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format(time.RFC3339)
}

func formatChanges(cs []Change) []byte {
	var b bytes.Buffer
	if len(cs) == 0 {
		b.WriteString("no agent changes\n")
	}
	for _, c := range cs {
		fmt.Fprintf(&b, "agent %s: %s\n", c.AgentID, c.Action)
		if c.Reason != "" {
			fmt.Fprintf(&b, "  (%s)\n", c.Reason)
		}
		if !c.After.IsZero() {
			fmt.Fprintf(&b, "  (after %s)\n", stamp(c.After))
		}
		for _, l := range strings.SplitAfter(strings.TrimSuffix(c.Diff, "\n"), "\n") {
			fmt.Fprintf(&b, "  %s", strings.TrimSuffix(l, "\n")+"\n")
		}
	}
	return b.Bytes()
}

// goldenOutputs computes a case's expected files.
func goldenOutputs(t *testing.T, path string, ar *txtar.Archive) []txtar.File {
	t.Helper()
	data, ok := archiveFile(ar, "input.yaml")
	if !ok {
		t.Fatalf("%s: no input.yaml", path)
	}
	var g goldenInput
	if err := decodeStrict(data, &g); err != nil {
		t.Fatalf("%s: input.yaml: %v", path, err)
	}
	in := g.input()
	plan, err := Compute(in)
	if err != nil {
		t.Fatal(err)
	}
	checkPlan(t, in, plan)
	files := []txtar.File{{Name: "plan.txt", Data: formatPlan(plan)}}
	for _, m := range plan.Agents {
		if m.Changed {
			files = append(files, txtar.File{Name: "manifest/" + m.AgentID + ".json", Data: append(slices.Clone(m.Body), '\n')})
		}
	}
	if data, ok := archiveFile(ar, "dryrun.yaml"); ok {
		var d goldenDryRun
		if err := decodeStrict(data, &d); err != nil {
			t.Fatalf("%s: dryrun.yaml: %v", path, err)
		}
		files = append(files, txtar.File{Name: "dryrun.txt", Data: formatChanges(checkDryRun(t, in, d))})
	}
	for _, f := range files {
		for name, v := range g.Secrets {
			if bytes.Contains(f.Data, []byte(v)) {
				t.Errorf("%s: the value of secret %s appears in %s", path, name, f.Name)
			}
		}
	}
	return files
}

// checkPlan holds every plan to what the manifest contract asks of it.
func checkPlan(t *testing.T, in Input, plan *Plan) {
	t.Helper()
	// Deterministic, whatever the order of the input.
	shuffled := in
	shuffled.Pipes, shuffled.Agents = slices.Clone(in.Pipes), slices.Clone(in.Agents)
	rand.Shuffle(len(shuffled.Pipes), func(i, j int) { shuffled.Pipes[i], shuffled.Pipes[j] = shuffled.Pipes[j], shuffled.Pipes[i] })
	rand.Shuffle(len(shuffled.Agents), func(i, j int) { shuffled.Agents[i], shuffled.Agents[j] = shuffled.Agents[j], shuffled.Agents[i] })
	again, err := Compute(shuffled)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(formatPlan(again), formatPlan(plan)) {
		t.Errorf("the plan depends on the order of its input")
	}
	for i, m := range plan.Agents {
		if !bytes.Equal(again.Agents[i].Body, m.Body) {
			t.Errorf("%s: the manifest depends on the order of the input", m.AgentID)
		}
		if !m.Changed {
			if m.Body != nil {
				t.Errorf("%s: unchanged, with a body", m.AgentID)
			}
			continue
		}
		dec, err := manifest.DecodeManifest(m.Body)
		if err != nil {
			t.Errorf("%s: %v", m.AgentID, err)
			continue
		}
		if enc, err := dec.Encode(); err != nil || !bytes.Equal(enc, m.Body) {
			t.Errorf("%s: the body is not what manifest.Encode makes of it (%v)\n got %s\nwant %s", m.AgentID, err, m.Body, enc)
		}
		if dec.AgentID != m.AgentID || dec.Serial != m.Serial || dec.KeyListVersion != plan.KeyListVersion ||
			!dec.IssuedAt.Equal(plan.IssuedAt) || !dec.ExpiresAt.Equal(plan.ExpiresAt) {
			t.Errorf("%s: body says %s serial %d, key list %d, %s..%s", m.AgentID, dec.AgentID, dec.Serial, dec.KeyListVersion, dec.IssuedAt, dec.ExpiresAt)
		}
		var refs []string
		for _, p := range dec.Pipes {
			refs = append(refs, Ref(p.Name, p.Version))
			if p.Spec.Placement != "" {
				t.Errorf("%s: pipe %s carries its placement", m.AgentID, p.Name)
			}
			if pl := placementOf(plan, p.Name); pl != nil {
				if pl.Holder != m.AgentID || !p.LeaseUntil.Equal(pl.LeaseUntil) || !p.LastFireServed.Equal(pl.LastFireServed) {
					t.Errorf("%s: held pipe %s with lease %s, the plan says holder %s lease %s", m.AgentID, p.Name, p.LeaseUntil, pl.Holder, pl.LeaseUntil)
				}
			} else if p.Held() {
				t.Errorf("%s: placement: all pipe %s carries a lease", m.AgentID, p.Name)
			}
			if p.Spec.Targets != nil || p.Spec.Grace != 0 {
				t.Errorf("%s: pipe %s carries targets or grace", m.AgentID, p.Name)
			}
		}
		if !slices.Equal(refs, m.Pipes) {
			t.Errorf("%s: body has pipes %v, plan %v", m.AgentID, refs, m.Pipes)
		}
	}
	// At most one holder: a placement: one pipe is in one agent's pipes.
	for _, pl := range plan.Placements {
		var in []string
		for _, m := range plan.Agents {
			for _, r := range m.Pipes {
				if strings.HasPrefix(r, pl.Pipe+"@") {
					in = append(in, m.AgentID)
				}
			}
		}
		if len(in) > 1 || (len(in) == 1 && in[0] != pl.Holder) {
			t.Errorf("placement: one pipe %s is in the manifests of %v, the holder is %q", pl.Pipe, in, pl.Holder)
		}
	}
	for _, a := range in.Agents {
		for _, m := range plan.Agents {
			if m.AgentID == a.ID && !a.Revoked && a.Prev != nil && !m.Changed && m.ContentHash != a.Prev.ContentHash {
				t.Errorf("%s: unchanged with another content hash", a.ID)
			}
		}
	}
}

func placementOf(p *Plan, pipe string) *Placement {
	for i := range p.Placements {
		if p.Placements[i].Pipe == pipe {
			return &p.Placements[i]
		}
	}
	return nil
}

// checkDryRun runs a case's dry-run and checks it against the plans
// before and after the change: the two can never disagree.
func checkDryRun(t *testing.T, in Input, d goldenDryRun) []Change {
	t.Helper()
	var cur, next *Pipe
	after := in
	after.Pipes = nil
	for i := range in.Pipes {
		if in.Pipes[i].Name == d.Pipe {
			cur = &in.Pipes[i]
		} else {
			after.Pipes = append(after.Pipes, in.Pipes[i])
		}
	}
	if !d.Delete {
		if d.Spec == nil {
			t.Fatalf("dryrun.yaml: neither next nor delete")
		}
		p := d.Spec.pipe()
		next = &p
		after.Pipes = append(after.Pipes, p)
	}
	changes, err := DryRunPlaced(in.Agents, cur, next, Placing{Holders: in.Holders, Served: in.Served, Now: in.Now, Leases: in.Leases})
	if err != nil {
		t.Fatal(err)
	}
	before, err := Compute(in)
	if err != nil {
		t.Fatal(err)
	}
	planned, err := Compute(after)
	if err != nil {
		t.Fatal(err)
	}
	has := func(p *Plan, id string) (string, bool) {
		for _, m := range p.Agents {
			if m.AgentID == id {
				for _, r := range m.Pipes {
					if strings.HasPrefix(r, d.Pipe+"@") {
						return r, true
					}
				}
			}
		}
		return "", false
	}
	var want []string
	for _, a := range before.Agents {
		r0, was := has(before, a.AgentID)
		r1, will := has(planned, a.AgentID)
		switch {
		case was && !will:
			want = append(want, a.AgentID+" "+ActionRemove)
		case !was && will:
			want = append(want, a.AgentID+" "+ActionAdd)
		case was && will && r0 != r1:
			want = append(want, a.AgentID+" "+ActionUpdate)
		}
	}
	var got []string
	for _, c := range changes {
		if c.After.IsZero() { // a later gain is in neither plan
			got = append(got, c.AgentID+" "+c.Action)
		}
	}
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Errorf("dry-run says %v, the plans %v", got, want)
	}
	return changes
}

func TestGolden(t *testing.T) {
	paths, err := filepath.Glob(filepath.Join("testdata", "golden", "*.txtar"))
	if err != nil {
		t.Fatal(err)
	}
	if len(paths) < 12 {
		t.Fatalf("only %d golden cases in testdata/golden, want at least 12", len(paths))
	}
	for _, path := range paths {
		t.Run(strings.TrimSuffix(filepath.Base(path), ".txtar"), func(t *testing.T) {
			ar, err := txtar.ParseFile(path)
			if err != nil {
				t.Fatal(err)
			}
			files := goldenOutputs(t, path, ar)
			if *update {
				kept := []txtar.File{}
				for _, f := range ar.Files {
					if f.Name == "input.yaml" || f.Name == "dryrun.yaml" {
						kept = append(kept, f)
					}
				}
				ar.Files = append(kept, files...)
				if err := os.WriteFile(path, txtar.Format(ar), 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			want := map[string]bool{"input.yaml": true, "dryrun.yaml": true}
			for _, f := range files {
				want[f.Name] = true
				data, ok := archiveFile(ar, f.Name)
				if !ok {
					t.Errorf("%s: no expected %s (run with -update)", path, f.Name)
					continue
				}
				if !bytes.Equal(f.Data, data) {
					t.Errorf("%s: %s differs from the golden file (run with -update and review the diff)\n--- got\n%s--- want\n%s", path, f.Name, f.Data, data)
				}
			}
			for _, f := range ar.Files {
				if !want[f.Name] {
					t.Errorf("%s: unexpected %s (run with -update)", path, f.Name)
				}
			}
		})
	}
}
