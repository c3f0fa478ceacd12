package server

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"hash/maphash"
	"slices"
	"sync"
	"time"

	"github.com/drover/drover/internal/tick"
	"github.com/drover/drover/manifest"
	"github.com/drover/drover/server/stream"
)

// AgentLimits bounds what one agent can make the server store and serve
// (the `agents:` section of server.yaml, DROVER_AGENTS_*). The stream
// quotas throttle rather than refuse: a record over quota waits for its
// token before it is handed to the store, so an agent replaying a long
// outbox after an outage loses nothing, while a hostile agent cannot store
// runs or log bytes faster than the rates below.
type AgentLimits struct {
	// RunRecordsPerSecond and RunRecordsBurst bound the RunStarted and
	// RunFinished records (and log chunks of runs not seen before) one
	// agent stores.
	RunRecordsPerSecond int `yaml:"run_records_per_second"`
	RunRecordsBurst     int `yaml:"run_records_burst"`
	// PipeRunRecordsPerSecond and PipeRunRecordsBurst do the same per pipe
	// of one agent.
	PipeRunRecordsPerSecond int `yaml:"pipe_run_records_per_second"`
	PipeRunRecordsBurst     int `yaml:"pipe_run_records_burst"`
	// LogBytesPerSecond and LogBytesBurst bound one agent's log chunks.
	LogBytesPerSecond int64 `yaml:"log_bytes_per_second"`
	LogBytesBurst     int64 `yaml:"log_bytes_burst"`
	// HelloTimeout is how long a new stream may take to send its Hello.
	HelloTimeout time.Duration `yaml:"hello_timeout"`
	// PendingStreams bounds the streams of one identity that are open but
	// not yet past Hello (one of them then replaces the live one).
	PendingStreams int `yaml:"pending_streams"`
	// PayloadFetches bounds concurrent payload downloads in all;
	// PayloadFetchesPerAgent for one agent.
	PayloadFetches         int `yaml:"payload_fetches"`
	PayloadFetchesPerAgent int `yaml:"payload_fetches_per_agent"`
	// MaxRunningIDs bounds the running run ids one Heartbeat may list.
	MaxRunningIDs int `yaml:"max_running_ids"`
}

// defaultAgentLimits returns the defaults (documented in doc.go).
func defaultAgentLimits() AgentLimits {
	return AgentLimits{
		RunRecordsPerSecond:     100,
		RunRecordsBurst:         1000,
		PipeRunRecordsPerSecond: 20,
		PipeRunRecordsBurst:     500,
		LogBytesPerSecond:       8 << 20,
		LogBytesBurst:           64 << 20,
		HelloTimeout:            10 * time.Second,
		PendingStreams:          4,
		PayloadFetches:          32,
		PayloadFetchesPerAgent:  2,
		MaxRunningIDs:           4096,
	}
}

func (l *AgentLimits) validate(atLeast func(field string, v, min int64)) {
	atLeast("agents.run_records_per_second", int64(l.RunRecordsPerSecond), 1)
	atLeast("agents.run_records_burst", int64(l.RunRecordsBurst), 1)
	atLeast("agents.pipe_run_records_per_second", int64(l.PipeRunRecordsPerSecond), 1)
	atLeast("agents.pipe_run_records_burst", int64(l.PipeRunRecordsBurst), 1)
	atLeast("agents.log_bytes_per_second", l.LogBytesPerSecond, 1024)
	atLeast("agents.log_bytes_burst", l.LogBytesBurst, 1024)
	atLeast("agents.hello_timeout", int64(l.HelloTimeout), int64(100*time.Millisecond))
	atLeast("agents.pending_streams", int64(l.PendingStreams), 1)
	atLeast("agents.payload_fetches", int64(l.PayloadFetches), 1)
	atLeast("agents.payload_fetches_per_agent", int64(l.PayloadFetchesPerAgent), 1)
	atLeast("agents.max_running_ids", int64(l.MaxRunningIDs), 1)
}

// tokenBucket is a rate limiter whose take waits for its tokens.
type tokenBucket struct {
	mu     sync.Mutex
	rate   float64 // tokens per second
	burst  float64
	tokens float64
	last   time.Time
}

func newBucket(rate, burst float64) *tokenBucket {
	return &tokenBucket{rate: rate, burst: burst, tokens: burst, last: time.Now()}
}

// reserve takes n tokens (at most a burst's worth) and says how long the
// caller must wait before using them.
func (b *tokenBucket) reserve(n float64) time.Duration {
	b.mu.Lock()
	defer b.mu.Unlock()
	now := time.Now()
	b.tokens = min(b.burst, b.tokens+now.Sub(b.last).Seconds()*b.rate)
	b.last = now
	b.tokens -= min(n, b.burst)
	if b.tokens >= 0 {
		return 0
	}
	return time.Duration(-b.tokens / b.rate * float64(time.Second))
}

// wait sleeps d unless ctx ends first.
func wait(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return nil
	}
	if !tick.Sleep(ctx, d) {
		return ctx.Err()
	}
	return nil
}

// knownRunsMemory is how many recent run ids an agent's quota remembers, so
// that the log chunks of a known run do not count as new runs.
const knownRunsMemory = 1024

// runIDSeed hashes the run ids agents' quotas remember.
var runIDSeed = maphash.MakeSeed()

// agentMem is the server's in-memory state of one agent: its quotas
// (kept across reconnects), the pipes its manifests name, and when
// refusals were last audited.
type agentMem struct {
	mu       sync.Mutex
	runs     *tokenBucket
	logBytes *tokenBucket
	pipes    map[string]*tokenBucket

	manifestDigest string
	current, prev  map[string]bool // pipe names of the manifest and its predecessor

	// The recent run ids, as 64-bit hashes under a seed of this process
	// (an agent cannot aim for a collision), newest at ringNext-1: 8 bytes
	// each instead of the ~110 of the string in a map, and the newest is
	// looked at first (a log chunk is nearly always of the latest run). It grows to
	// knownRunsMemory: an agent that runs nothing holds none.
	ring     []uint64
	ringNext int

	audited map[string]time.Time // refusal reason -> last audit

	machineID string // the bound machine id, once known (it never changes)

	fetches int // payload downloads in progress
}

func (s *Server) agentMem(id string) *agentMem {
	s.agentsMu.Lock()
	defer s.agentsMu.Unlock()
	st := s.agentStates[id]
	if st == nil {
		l := s.cfg.Agents
		st = &agentMem{runs: newBucket(float64(l.RunRecordsPerSecond), float64(l.RunRecordsBurst)),
			logBytes: newBucket(float64(l.LogBytesPerSecond), float64(l.LogBytesBurst)),
			pipes:    map[string]*tokenBucket{},
			audited:  map[string]time.Time{}}
		s.agentStates[id] = st
	}
	return st
}

// forgetAgent drops the in-memory state of a deleted agent.
func (s *Server) forgetAgent(id string) {
	s.agentsMu.Lock()
	delete(s.agentStates, id)
	s.agentsMu.Unlock()
}

// pipeBucket returns the per-pipe bucket; pipe is one of the agent's
// manifest pipes, so the map is bounded by the manifest.
func (a *agentMem) pipeBucket(pipe string, l AgentLimits) *tokenBucket {
	a.mu.Lock()
	defer a.mu.Unlock()
	b := a.pipes[pipe]
	if b == nil {
		if len(a.pipes) >= 4*stream.MaxManifestPipes {
			clear(a.pipes)
		}
		b = newBucket(float64(l.PipeRunRecordsPerSecond), float64(l.PipeRunRecordsBurst))
		a.pipes[pipe] = b
	}
	return b
}

// noteRun remembers a run id and reports whether it was new.
func (a *agentMem) noteRun(id string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	h := maphash.String(runIDSeed, id)
	n := len(a.ring)
	if n > 0 && a.ring[(a.ringNext+n-1)%n] == h || slices.Contains(a.ring, h) {
		return false
	}
	if n < knownRunsMemory {
		a.ring = append(a.ring, h)
		a.ringNext = len(a.ring) % knownRunsMemory
	} else {
		a.ring[a.ringNext] = h
		a.ringNext = (a.ringNext + 1) % knownRunsMemory
	}
	return true
}

// shouldAudit reports whether a refusal for reason may be audited now (at
// most one entry per agent and reason per auditEvery).
func (a *agentMem) shouldAudit(reason string, now time.Time, every time.Duration) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	if last, ok := a.audited[reason]; ok && now.Sub(last) < every {
		return false
	}
	a.audited[reason] = now
	return true
}

// pipeSet returns a predicate for the pipes an agent may report: those of
// its current manifest and of the one before it (a run in flight when its
// pipe left the manifest still reports its end).
func (s *Server) pipeSet(ctx context.Context, agentID string) func(string) bool {
	st := s.agentMem(agentID)
	m, err := s.store.GetManifest(ctx, agentID)
	st.mu.Lock()
	defer st.mu.Unlock()
	if err == nil && m.Digest != st.manifestDigest {
		if names, err := manifestPipeNames(m.Envelope); err == nil {
			st.prev, st.current, st.manifestDigest = st.current, names, m.Digest
		} else {
			s.log.Error("reading the pipes of a stored manifest", "agent", agentID, "err", err)
		}
	}
	cur, prev := st.current, st.prev
	return func(name string) bool { return cur[name] || prev[name] || s.mayHaveHeld(ctx, agentID, name) }
}

// mayHaveHeld reports whether the agent may report runs of a pipe its
// last two manifests do not name: a placement: one pipe that targets it,
// which it may have held. A holder that was partitioned or stopped
// reports the runs of its lease only when it is heard again, after the
// pipe left its manifest (perhaps several manifests ago, or before a
// server restart that forgot the manifests before), and those runs must
// count. Only looked up for a name the manifests do not have.
func (s *Server) mayHaveHeld(ctx context.Context, agentID, pipe string) bool {
	p, err := s.store.GetPipe(ctx, pipe)
	if err != nil || p.Spec.Placement != manifest.PlacementOne {
		return false
	}
	a, err := s.store.GetAgent(ctx, agentID)
	return err == nil && a.RevokedAt.IsZero() && p.Spec.Targets.Selects(a.ID, a.Tags)
}

// manifestPipeNames reads the pipe names from a stored (server-signed) DSSE
// envelope.
func manifestPipeNames(env []byte) (map[string]bool, error) {
	var e struct {
		Payload string `json:"payload"`
	}
	if err := json.Unmarshal(env, &e); err != nil {
		return nil, err
	}
	body, err := base64.StdEncoding.DecodeString(e.Payload)
	if err != nil {
		if body, err = base64.RawURLEncoding.DecodeString(e.Payload); err != nil {
			return nil, err
		}
	}
	var m struct {
		Pipes []struct {
			Name string `json:"name"`
		} `json:"pipes"`
	}
	if err := json.Unmarshal(body, &m); err != nil {
		return nil, err
	}
	out := make(map[string]bool, len(m.Pipes))
	for i, p := range m.Pipes {
		if i == stream.MaxManifestPipes {
			break
		}
		out[p.Name] = true
	}
	return out, nil
}
