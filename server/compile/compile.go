// Package compile plans which agent gets which manifest (docs/design.md,
// "Manifest" and "Flows", Publish): from the pipes in force, the agents and
// the metadata of their stored manifests it decides, per agent, the pipes the
// agent runs, whether its manifest changes and why, and the exact manifest
// bytes to sign. The pipe-change preview (dry-run) uses the same code, so the
// two cannot disagree. For placement: one pipes it also plans who holds
// each (place.go): the pipe goes into its holder's manifest alone, its
// entry with lease_until and last_fire_served.
//
// It is pure: no store, no clock, no signing keys. The server's compiler
// feeds it, signs the bytes it returns and saves them; any server package
// may import it, and it imports only manifest and the domain types of
// server/store (for Holder, which it reads and returns).
package compile

import (
	"bytes"
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/drover/drover/manifest"
)

// Pipe is the version of a pipe in force.
type Pipe struct {
	Name          string
	Version       uint64
	Spec          manifest.Spec // normalized, with its targets
	PayloadDigest string
	PayloadSize   int64
}

// Agent is what the plan needs about one agent.
type Agent struct {
	ID      string
	Tags    map[string]string
	Revoked bool // a revoked agent gets nothing
	// Healthy: it has a live stream or was heard from within the offline
	// grace (placement: one holds pipes only on healthy agents).
	Healthy bool
	// Released are the placement: one pipes the agent lost and has since
	// confirmed it no longer runs (a manifest status without them, or with
	// their lease ended), which lets another agent gain them at once.
	Released []string
	// Prev is the agent's stored manifest, nil for none.
	Prev *Previous
}

// Previous is the metadata of an agent's stored manifest.
type Previous struct {
	Serial         uint64
	ContentHash    string
	IssuedAt       time.Time
	KeyListVersion uint64
	// Pipes are the name@version references the manifest holds, when known;
	// they only refine the reasons of a change.
	Pipes []string
}

// Input is everything one compilation depends on.
type Input struct {
	Pipes          []Pipe
	Agents         []Agent
	KeyListVersion uint64
	Now            time.Time
	Lifetime       time.Duration
	// Force re-signs every agent's manifest with a higher serial even when
	// its content is unchanged (a secret it references changed).
	Force bool
	// Holders, Served and Leases are what placement: one pipes need (Place).
	Holders []Holder
	Served  map[string]time.Time
	Leases  Leases
}

// Plan is the outcome of one compilation: one Manifest per agent, in the
// order of the agents' ids.
type Plan struct {
	IssuedAt       time.Time
	ExpiresAt      time.Time
	KeyListVersion uint64
	Agents         []Manifest
	// Placements are the plans of the placement: one pipes, by name;
	// RemoveHolders the pipes whose holder state goes.
	Placements    []Placement
	RemoveHolders []string
}

// Manifest is the plan for one agent's manifest.
type Manifest struct {
	AgentID string
	// Changed says whether a new manifest is to be signed and published;
	// Reasons says why, or "unchanged".
	Changed bool
	Reasons []string
	// Pipes are the name@version references of the agent's pipes, by name.
	Pipes       []string
	ContentHash string
	// Serial, Body, Payloads and Secrets are set only when Changed: the new
	// serial, the exact bytes to sign, and the payload digests and secret
	// names (never values) the manifest references, sorted and unique.
	Serial   uint64
	Body     []byte
	Payloads []string
	Secrets  []string
}

// Reasons of a plan.
const (
	ReasonNew       = "new agent"
	ReasonUnchanged = "unchanged"
	ReasonKeys      = "key rotation"
	ReasonExpiring  = "expiring, re-sign"
	ReasonForced    = "forced re-sign"
	ReasonRevoked   = "revoked, gets nothing"
	ReasonContent   = "pipes changed"
)

// Compute plans the manifests of every agent in in.
func Compute(in Input) (*Plan, error) {
	c, err := New(in.Pipes, in.KeyListVersion, in.Now, in.Lifetime)
	if err != nil {
		return nil, err
	}
	agents := slices.Clone(in.Agents)
	slices.SortStableFunc(agents, func(a, b Agent) int { return cmp.Compare(a.ID, b.ID) })
	p := &Plan{IssuedAt: c.now, ExpiresAt: c.expires, KeyListVersion: c.klv, Agents: make([]Manifest, 0, len(agents))}
	if c.placed || len(in.Holders) > 0 {
		p.Placements, p.RemoveHolders = Place(in.Pipes, agents, in.Holders, in.Served, c.now, in.Leases)
		if err := c.Hold(p.Placements); err != nil {
			return nil, err
		}
	}
	for _, a := range agents {
		m, err := c.Agent(a, in.Force)
		if err != nil {
			return nil, err
		}
		p.Agents = append(p.Agents, m)
	}
	return p, nil
}

// Compilation is a set of pipes prepared once, from which each agent's
// manifest is planned. Agent may be called from several goroutines.
type Compilation struct {
	entries  []entry
	byName   map[string]int // entry index by pipe name
	placed   bool           // some entries are placement: one
	held     map[int]*held  // placement: one entries, by index: who holds them (Hold)
	byTags   sync.Map       // tagKey → []int: the entries a tag set selects, computed once per set
	notes    map[string][]string
	byAgent  map[string][]int // entries that name an agent id in their targets
	klv      uint64
	now      time.Time
	expires  time.Time
	lifetime time.Duration
}

// New prepares the pipes for a compilation at now (truncated to the second,
// in UTC) whose manifests live for lifetime.
func New(pipes []Pipe, klv uint64, now time.Time, lifetime time.Duration) (*Compilation, error) {
	pipes = slices.Clone(pipes)
	slices.SortStableFunc(pipes, func(a, b Pipe) int { return cmp.Compare(a.Name, b.Name) })
	now = now.UTC().Truncate(time.Second)
	c := &Compilation{entries: make([]entry, len(pipes)), byAgent: map[string][]int{}, byName: make(map[string]int, len(pipes)), held: map[int]*held{},
		klv: klv, now: now, expires: now.Add(lifetime), lifetime: lifetime}
	for i := range pipes {
		var err error
		if c.entries[i], err = newEntry(&pipes[i]); err != nil {
			return nil, fmt.Errorf("compile: %w", err)
		}
		c.byName[pipes[i].Name] = i
		if IsPlacedOne(&pipes[i]) {
			c.entries[i].one = true
			c.entries[i].pipe = pipes[i]
			c.placed = true
		}
		if t := pipes[i].Spec.Targets; t != nil {
			for _, id := range t.Agents {
				c.byAgent[id] = append(c.byAgent[id], i)
			}
		}
	}
	return c, nil
}

// held is who holds a placement: one entry, and its entry with the lease.
type held struct {
	agent string
	lease time.Time
	json  []byte
	hash  string // what the content hash adds for it
}

// Placed reports whether some of c's pipes are placement: one.
func (c *Compilation) Placed() bool { return c.placed }

// Hold sets the holders of c's placement: one pipes from their plans; an
// entry held by nobody (or whose lease has ended) is in no manifest. Call
// it before Agent; without it no agent gets those pipes.
func (c *Compilation) Hold(ps []Placement) error {
	c.held = map[int]*held{}
	c.notes = map[string][]string{}
	for _, pl := range ps {
		i, ok := c.byName[pl.Pipe]
		if !ok || !c.entries[i].one {
			continue
		}
		if pl.Lose != "" {
			c.notes[pl.Lose] = append(c.notes[pl.Lose], "pipe "+pl.Pipe+" lost: "+pl.Reasons[0]) // the release's
		}
		if pl.Holder == "" {
			continue
		}
		if !pl.LeaseUntil.After(c.now) {
			c.notes[pl.Holder] = append(c.notes[pl.Holder], "pipe "+pl.Pipe+" lease ended")
			continue
		}
		switch {
		case pl.Gain != "":
			c.notes[pl.Gain] = append(c.notes[pl.Gain], "pipe "+pl.Pipe+" gained: "+strings.Join(pl.Reasons, ", "))
		case pl.Renewed:
			c.notes[pl.Holder] = append(c.notes[pl.Holder], "pipe "+pl.Pipe+" "+PlaceRenewed)
		}
		e := &c.entries[i]
		b, err := encodeEntry(&e.pipe, pl.LeaseUntil.UTC(), pl.LastFireServed.UTC())
		if err != nil {
			return fmt.Errorf("compile: %w", err)
		}
		c.held[i] = &held{agent: pl.Holder, lease: pl.LeaseUntil, json: b,
			hash: leaseHash(pl.LeaseUntil, pl.LastFireServed)}
	}
	return nil
}

// leaseHash is what a held entry adds to its reference in the content hash.
func leaseHash(lease, served time.Time) string {
	return " lease " + lease.UTC().Format(time.RFC3339Nano) + " served " + served.UTC().Format(time.RFC3339Nano)
}

// IssuedAt is the issue time of the manifests c plans.
func (c *Compilation) IssuedAt() time.Time { return c.now }

// ExpiresAt is the expiry of the manifests c plans.
func (c *Compilation) ExpiresAt() time.Time { return c.expires }

// KeyListVersion is the key-list version the manifests c plans carry.
func (c *Compilation) KeyListVersion() uint64 { return c.klv }

// selected returns the indexes of the entries that target a, by name
// (manifest.Targets.Selects, with the agent-id targets indexed).
func (c *Compilation) selected(a *Agent) []int {
	key := tagKey(a.Tags)
	var idx []int
	if v, ok := c.byTags.Load(key); ok {
		idx = slices.Clone(v.([]int))
	} else {
		for i := range c.entries {
			if c.entries[i].targets.SelectsTags(a.Tags) {
				idx = append(idx, i)
			}
		}
		c.byTags.Store(key, slices.Clone(idx))
	}
	for _, i := range c.byAgent[a.ID] {
		if !slices.Contains(idx, i) {
			idx = append(idx, i)
		}
	}
	slices.Sort(idx) // entries are sorted by name
	if c.placed {
		idx = slices.DeleteFunc(idx, func(i int) bool {
			if !c.entries[i].one {
				return false
			}
			h := c.held[i]
			return h == nil || h.agent != a.ID
		})
	}
	return idx
}

// Agent plans one agent's manifest. A manifest is unchanged when its content
// (pipe versions, key-list version) is the stored one's and it is younger
// than half its lifetime, unless force.
func (c *Compilation) Agent(a Agent, force bool) (Manifest, error) {
	m := Manifest{AgentID: a.ID}
	if a.Revoked {
		m.Reasons = []string{ReasonRevoked}
		return m, nil
	}
	idx := c.selected(&a)
	m.Pipes = make([]string, len(idx))
	for j, i := range idx {
		m.Pipes[j] = c.entries[i].ref
	}
	m.ContentHash = c.contentHash(a.ID, idx, m.Pipes)
	p := a.Prev
	due := p != nil && !c.now.Before(p.IssuedAt.Add(c.lifetime/2))
	m.Reasons = reasons(p, m.ContentHash, c.klv, m.Pipes, force, due)
	if notes := c.notes[a.ID]; len(notes) > 0 && p != nil && p.ContentHash != m.ContentHash {
		m.Reasons = slices.DeleteFunc(m.Reasons, func(r string) bool { return r == ReasonContent })
		m.Reasons = append(m.Reasons, notes...)
		slices.Sort(m.Reasons)
	}
	if !force && p != nil && p.ContentHash == m.ContentHash && !due {
		return m, nil
	}
	m.Changed = true
	m.Serial = 1
	if p != nil {
		m.Serial = p.Serial + 1
	}
	pipes := make([][]byte, len(idx))
	for j, i := range idx {
		pipes[j] = c.entries[i].json
		if h := c.held[i]; h != nil && c.entries[i].one {
			pipes[j] = h.json
		}
		m.Payloads = append(m.Payloads, c.entries[i].digest)
		m.Secrets = append(m.Secrets, c.entries[i].secrets...)
	}
	body, err := encodeManifest(a.ID, m.Serial, c.now, c.expires, c.klv, pipes)
	if err != nil {
		return Manifest{}, fmt.Errorf("compile %s: %w", a.ID, err)
	}
	m.Body = body
	slices.Sort(m.Payloads)
	slices.Sort(m.Secrets)
	m.Payloads, m.Secrets = slices.Compact(m.Payloads), slices.Compact(m.Secrets)
	return m, nil
}

// reasons says why a manifest changes, or that it does not.
func reasons(p *Previous, hash string, klv uint64, refs []string, force, due bool) []string {
	if p == nil {
		return []string{ReasonNew}
	}
	var out []string
	if p.ContentHash != hash {
		if p.KeyListVersion != klv {
			out = append(out, ReasonKeys)
		}
		if p.Pipes != nil {
			out = append(out, pipeChanges(p.Pipes, refs)...)
		}
		if len(out) == 0 {
			out = append(out, ReasonContent)
		}
		return out
	}
	switch {
	case force:
		return []string{ReasonForced}
	case due:
		return []string{ReasonExpiring}
	}
	return []string{ReasonUnchanged}
}

// pipeChanges compares two lists of name@version references, each sorted
// by name: "pipe x added", "pipe x v3→v4", "pipe x removed".
func pipeChanges(old, new []string) []string {
	split := func(ref string) (string, string) {
		i := strings.LastIndexByte(ref, '@')
		return ref[:i], ref[i+1:]
	}
	was := map[string]string{}
	for _, r := range old {
		n, v := split(r)
		was[n] = v
	}
	var out []string
	seen := map[string]bool{}
	for _, r := range new {
		n, v := split(r)
		seen[n] = true
		switch ov, ok := was[n]; {
		case !ok:
			out = append(out, "pipe "+n+" added")
		case ov != v:
			out = append(out, "pipe "+n+" v"+ov+"→v"+v)
		}
	}
	for _, r := range old {
		if n, _ := split(r); !seen[n] {
			out = append(out, "pipe "+n+" removed")
		}
	}
	slices.Sort(out)
	return out
}

// entry is a pipe prepared once per compilation, with its JSON as it
// appears in every manifest.
type entry struct {
	ref     string // name@version: versions are immutable, so this names the content
	json    []byte
	digest  string
	targets *manifest.Targets
	secrets []string
	// one: placement: one, whose entry is encoded per holder (Hold) from
	// pipe.
	one  bool
	pipe Pipe
}

func newEntry(p *Pipe) (entry, error) {
	b, err := encodeEntry(p, time.Time{}, time.Time{})
	if err != nil {
		return entry{}, err
	}
	return entry{ref: Ref(p.Name, p.Version), json: b, digest: p.PayloadDigest, targets: p.Spec.Targets, secrets: p.Spec.Secrets}, nil
}

// encodeEntry encodes a pipe's manifest entry; lease and served are zero
// but for a placement: one holder's.
func encodeEntry(p *Pipe, lease, served time.Time) ([]byte, error) {
	spec := p.Spec.Clone()
	spec.Targets = nil
	spec.Placement = ""  // the server's alone: the entry carries the lease instead
	spec.Grace = 0       // the server's alone (missed-run detection); agents that predate the field would refuse it
	spec.MaxDuration = 0 // the server's alone too (run.long)
	mp := manifest.Pipe{Name: p.Name, Version: p.Version, Spec: *spec, Payload: manifest.Payload{Digest: p.PayloadDigest, Size: p.PayloadSize},
		LeaseUntil: lease, LastFireServed: served}
	return encodeJSON(mp)
}

// Ref is the name@version reference of a pipe version.
func Ref(name string, version uint64) string {
	return name + "@" + strconv.FormatUint(version, 10)
}

// encodeJSON encodes v as manifest.Manifest.Encode does: compact, no HTML
// escaping, no trailing newline.
func encodeJSON(v any) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
}

// encodeManifest returns the bytes manifest.Manifest.Encode would return for
// a manifest with these fields and pipes, built from the pipes' JSON encoded
// once per compilation (TestEncodeManifestMatches keeps them identical).
func encodeManifest(agentID string, serial uint64, issued, expires time.Time, klv uint64, pipes [][]byte) ([]byte, error) {
	head, err := encodeJSON(manifest.Manifest{AgentID: agentID, Serial: serial, IssuedAt: issued, ExpiresAt: expires, KeyListVersion: klv, Pipes: []manifest.Pipe{}})
	if err != nil {
		return nil, err
	}
	const empty = `"pipes":[]}`
	if !bytes.HasSuffix(head, []byte(empty)) {
		return nil, fmt.Errorf("encode manifest: unexpected layout %s", head)
	}
	n := len(head)
	for _, p := range pipes {
		n += len(p) + 1
	}
	out := make([]byte, 0, n)
	out = append(out, head[:len(head)-2]...) // up to and including "pipes":[
	for i, p := range pipes {
		if i > 0 {
			out = append(out, ',')
		}
		out = append(out, p...)
	}
	return append(out, ']', '}'), nil
}

// contentHash is contentHash for the entries idx of c, with the leases of
// the placement: one entries among them (placement: all manifests hash as
// they always did).
func (c *Compilation) contentHash(agentID string, idx []int, refs []string) string {
	if len(c.held) == 0 {
		return contentHash(agentID, c.klv, refs)
	}
	var lines []string
	for j, i := range idx {
		if h := c.held[i]; h != nil && c.entries[i].one {
			if lines == nil {
				lines = slices.Clone(refs)
			}
			lines[j] += h.hash
		}
	}
	if lines == nil {
		return contentHash(agentID, c.klv, refs)
	}
	return contentHash(agentID, c.klv, lines)
}

// contentHash names what a manifest says apart from its serial and times:
// the agent, the key-list version and the pipe versions in it.
func contentHash(agentID string, klv uint64, refs []string) string {
	h := sha256.New()
	fmt.Fprintf(h, "%s\n%d\n", agentID, klv)
	for _, r := range refs {
		h.Write([]byte(r))
		h.Write([]byte{'\n'})
	}
	return hex.EncodeToString(h.Sum(nil))
}
