package sim

import (
	"errors"
	"math"
	"math/bits"
	"net"
	"os"
	"regexp"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"google.golang.org/grpc/status"

	"github.com/drover/drover/api"
)

// Hist is a mergeable latency histogram in microseconds: 16 sub-buckets per
// power of two (about 6% resolution), plus the exact maximum. Workers send
// cumulative histograms to the parent, which subtracts two snapshots to get
// a window.
type Hist struct {
	Buckets []int64 `json:"b,omitempty"`
	Max     int64   `json:"max_us,omitempty"`
	Count   int64   `json:"n,omitempty"`
}

const histSub = 4 // log2 of the sub-buckets per power of two

func bucketOf(us int64) int {
	if us < 1<<histSub {
		return int(max(us, 0))
	}
	e := bits.Len64(uint64(us)) - 1 // us in [2^e, 2^(e+1))
	m := (uint64(us) >> (e - histSub)) & (1<<histSub - 1)
	return (e-histSub+1)<<histSub + int(m)
}

// bucketHigh is the largest value that falls in bucket i.
func bucketHigh(i int) int64 {
	if i < 1<<histSub {
		return int64(i)
	}
	e := i>>histSub + histSub - 1
	m := int64(i & (1<<histSub - 1))
	return (1<<e + (m+1)<<(e-histSub)) - 1
}

func (h *Hist) add(d time.Duration) {
	us := d.Microseconds()
	b := bucketOf(us)
	for len(h.Buckets) <= b {
		h.Buckets = append(h.Buckets, 0)
	}
	h.Buckets[b]++
	h.Count++
	if us > h.Max {
		h.Max = us
	}
}

func (h Hist) clone() Hist {
	return Hist{Buckets: append([]int64(nil), h.Buckets...), Max: h.Max, Count: h.Count}
}

func (h *Hist) merge(o Hist) {
	for len(h.Buckets) < len(o.Buckets) {
		h.Buckets = append(h.Buckets, 0)
	}
	for i, n := range o.Buckets {
		h.Buckets[i] += n
	}
	h.Count += o.Count
	h.Max = max(h.Max, o.Max)
}

// sub returns h minus an earlier snapshot of the same histogram. The
// maximum of a window is not known exactly from two cumulative snapshots:
// it is the upper edge of the highest bucket that gained samples (or the
// exact maximum when that moved).
func (h Hist) sub(o Hist) Hist {
	out := Hist{Buckets: make([]int64, len(h.Buckets))}
	top := -1
	for i, n := range h.Buckets {
		if i < len(o.Buckets) {
			n -= o.Buckets[i]
		}
		out.Buckets[i] = n
		if n > 0 {
			top = i
		}
		out.Count += n
	}
	switch {
	case top < 0:
	case h.Max > o.Max:
		out.Max = h.Max
	default:
		out.Max = min(bucketHigh(top), h.Max)
	}
	return out
}

// Quantile returns the value below which q of the samples lie (the upper
// edge of the bucket that holds it), in microseconds.
func (h Hist) Quantile(q float64) int64 {
	if h.Count == 0 {
		return 0
	}
	rank := int64(math.Ceil(q * float64(h.Count)))
	rank = max(rank, 1)
	var seen int64
	for i, n := range h.Buckets {
		seen += n
		if seen >= rank {
			return min(bucketHigh(i), h.Max)
		}
	}
	return h.Max
}

// Latency is a summary of samples, in milliseconds.
type Latency struct {
	Count int64   `json:"count"`
	P50   float64 `json:"p50_ms"`
	P99   float64 `json:"p99_ms"`
	Max   float64 `json:"max_ms"`
}

func (h Hist) summary() Latency {
	return Latency{Count: h.Count, P50: float64(h.Quantile(0.5)) / 1000, P99: float64(h.Quantile(0.99)) / 1000, Max: float64(h.Max) / 1000}
}

// exactSummary summarises raw samples in microseconds.
func exactSummary(us []int64) Latency {
	if len(us) == 0 {
		return Latency{}
	}
	s := append([]int64(nil), us...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	q := func(p float64) float64 {
		i := int(math.Ceil(p*float64(len(s)))) - 1
		return float64(s[max(i, 0)]) / 1000
	}
	return Latency{Count: int64(len(s)), P50: q(0.5), P99: q(0.99), Max: float64(s[len(s)-1]) / 1000}
}

// Counters are the cumulative counts of one worker (or, merged, of the fleet).
type Counters struct {
	Agents       int64 `json:"agents"`    // agents started
	Enrolled     int64 `json:"enrolled"`  // agents enrolled
	Connected    int64 `json:"connected"` // streams that got past Hello (gauge)
	Polls        int64 `json:"polls"`
	Polls200     int64 `json:"polls_200"`
	Polls304     int64 `json:"polls_304"`
	PollsResumed int64 `json:"polls_tls_resumed"` // polls whose connection's TLS session was resumed
	Verified     int64 `json:"manifests_verified"`
	Payloads     int64 `json:"payloads"`
	PayloadBytes int64 `json:"payload_bytes"`
	// PayloadsDeferred counts payload answers of 429 (the server bounds
	// concurrent downloads) that the agent waited out and retried.
	PayloadsDeferred int64 `json:"payloads_deferred"`
	SyncNows         int64 `json:"sync_nows"`
	// StreamManifests counts SyncNows that carried the manifest;
	// StreamRefused those manifests not used (out of bounds, or not
	// verified: the agent polled).
	StreamManifests int64 `json:"sync_nows_with_manifest"`
	StreamRefused   int64 `json:"stream_manifests_refused"`
	// ChangesStream and ChangesPoll count the changes (--changes) each
	// agent first saw in a manifest from the stream or from a poll.
	ChangesStream   int64 `json:"changes_by_stream"`
	ChangesPoll     int64 `json:"changes_by_poll"`
	Heartbeats      int64 `json:"heartbeats"`
	Probes          int64 `json:"probes"` // liveness probes of the stream (--probe)
	StreamsOpened   int64 `json:"streams_opened"`
	RecordsSent     int64 `json:"records_sent"` // durable records queued (each once)
	RecordsAcked    int64 `json:"records_acked"`
	RunsFinished    int64 `json:"runs_finished"` // RunFinished records queued
	RunsAcked       int64 `json:"runs_acked"`    // RunFinished records acknowledged
	LogChunksAcked  int64 `json:"log_chunks_acked"`
	LogBytesAcked   int64 `json:"log_bytes_acked"`
	StatusesApplied int64 `json:"statuses_applied_acked"`
	AgentsApplied   int64 `json:"agents_applied"`      // agents whose first applied status was acknowledged
	SimRSS          int64 `json:"simulator_rss_bytes"` // the workers' own RSS (gauge)
	SimCPUTicks     int64 `json:"simulator_cpu_ticks"` // the workers' own CPU time, in clock ticks
}

// counters is Counters updated with atomics.
type counters struct {
	agents, enrolled, connected, polls, polls200, polls304, pollsResumed, verified, payloads, payloadBytes, payloadsDeferred,
	syncNows, streamManifests, streamRefused, changesStream, changesPoll, heartbeats, probes, streamsOpened, recordsSent, recordsAcked, runsFinished, runsAcked,
	logChunksAcked, logBytesAcked, statusesApplied, agentsApplied atomic.Int64
}

func (c *counters) snapshot() Counters {
	return Counters{
		Agents: c.agents.Load(), Enrolled: c.enrolled.Load(), Connected: c.connected.Load(),
		Polls: c.polls.Load(), Polls200: c.polls200.Load(), Polls304: c.polls304.Load(), PollsResumed: c.pollsResumed.Load(), Verified: c.verified.Load(),
		Payloads: c.payloads.Load(), PayloadBytes: c.payloadBytes.Load(), PayloadsDeferred: c.payloadsDeferred.Load(), SyncNows: c.syncNows.Load(),
		StreamManifests: c.streamManifests.Load(), StreamRefused: c.streamRefused.Load(), ChangesStream: c.changesStream.Load(), ChangesPoll: c.changesPoll.Load(),
		Heartbeats: c.heartbeats.Load(), Probes: c.probes.Load(), StreamsOpened: c.streamsOpened.Load(), RecordsSent: c.recordsSent.Load(),
		RecordsAcked: c.recordsAcked.Load(), RunsFinished: c.runsFinished.Load(), RunsAcked: c.runsAcked.Load(),
		LogChunksAcked: c.logChunksAcked.Load(), LogBytesAcked: c.logBytesAcked.Load(), StatusesApplied: c.statusesApplied.Load(),
		AgentsApplied: c.agentsApplied.Load(),
	}
}

func (c *Counters) add(o Counters) {
	c.Agents += o.Agents
	c.Enrolled += o.Enrolled
	c.Connected += o.Connected
	c.Polls += o.Polls
	c.Polls200 += o.Polls200
	c.Polls304 += o.Polls304
	c.PollsResumed += o.PollsResumed
	c.Verified += o.Verified
	c.Payloads += o.Payloads
	c.PayloadBytes += o.PayloadBytes
	c.PayloadsDeferred += o.PayloadsDeferred
	c.SyncNows += o.SyncNows
	c.StreamManifests += o.StreamManifests
	c.StreamRefused += o.StreamRefused
	c.ChangesStream += o.ChangesStream
	c.ChangesPoll += o.ChangesPoll
	c.Heartbeats += o.Heartbeats
	c.Probes += o.Probes
	c.StreamsOpened += o.StreamsOpened
	c.RecordsSent += o.RecordsSent
	c.RecordsAcked += o.RecordsAcked
	c.RunsFinished += o.RunsFinished
	c.RunsAcked += o.RunsAcked
	c.LogChunksAcked += o.LogChunksAcked
	c.LogBytesAcked += o.LogBytesAcked
	c.StatusesApplied += o.StatusesApplied
	c.AgentsApplied += o.AgentsApplied
	c.SimRSS += o.SimRSS
	c.SimCPUTicks += o.SimCPUTicks
}

// Stats is what a worker reports: cumulative counters, histograms, errors
// by kind, and the per-agent latencies of the current change.
type Stats struct {
	Counters
	Poll    Hist             `json:"poll"`   // manifest GET, answer received
	Enroll  Hist             `json:"enroll"` // one enrollment request
	Ingest  Hist             `json:"ingest"` // durable record queued -> acknowledged
	Lag     Hist             `json:"lag"`    // how late a worker's 100 ms timer fired: the simulator's own delay
	Errors  map[string]int64 `json:"errors,omitempty"`
	Change  uint64           `json:"change,omitempty"`     // the change the samples below belong to
	Fetched []int64          `json:"fetched_at,omitempty"` // unix ns, one per agent
	Applied []int64          `json:"applied_at,omitempty"`
}

// maxErrorKinds bounds the error map; later new kinds count as "other".
const maxErrorKinds = 64

// recorder collects one worker's statistics.
type recorder struct {
	c      counters
	mu     sync.Mutex
	poll   Hist
	enroll Hist
	ingest Hist
	lag    Hist
	errs   map[string]int64

	change  uint64
	fetched []int64
	applied []int64
}

func newRecorder() *recorder { return &recorder{errs: map[string]int64{}} }

func (r *recorder) observe(h *Hist, d time.Duration) {
	r.mu.Lock()
	h.add(d)
	r.mu.Unlock()
}

// fail counts an error under "<where>: <kind>".
func (r *recorder) fail(where string, err error) {
	r.failKind(where + ": " + errorKind(err))
}

func (r *recorder) failKind(kind string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.errs[kind]; !ok && len(r.errs) >= maxErrorKinds {
		kind = "other"
	}
	r.errs[kind]++
}

// changeSample records when (unix ns) one agent fetched or applied change
// id; the parent subtracts the PUT's start.
func (r *recorder) changeSample(id uint64, applied bool) {
	at := time.Now().UnixNano()
	r.mu.Lock()
	defer r.mu.Unlock()
	if id != r.change {
		return
	}
	if applied {
		r.applied = append(r.applied, at)
	} else {
		r.fetched = append(r.fetched, at)
	}
}

func (r *recorder) startChange(id uint64) {
	r.mu.Lock()
	r.change, r.fetched, r.applied = id, nil, nil
	r.mu.Unlock()
}

func (r *recorder) snapshot() Stats {
	r.mu.Lock()
	defer r.mu.Unlock()
	self, _ := readProc(os.Getpid())
	st := Stats{Counters: r.c.snapshot(), Poll: r.poll.clone(), Enroll: r.enroll.clone(), Ingest: r.ingest.clone(), Lag: r.lag.clone(),
		Errors: map[string]int64{}, Change: r.change,
		Fetched: append([]int64(nil), r.fetched...), Applied: append([]int64(nil), r.applied...)}
	for k, v := range r.errs {
		st.Errors[k] = v
	}
	st.SimRSS, st.SimCPUTicks = self.rssBytes, self.cpuTicks
	return st
}

func (s *Stats) merge(o Stats) {
	s.Counters.add(o.Counters)
	s.Poll.merge(o.Poll)
	s.Enroll.merge(o.Enroll)
	s.Ingest.merge(o.Ingest)
	s.Lag.merge(o.Lag)
	if s.Errors == nil {
		s.Errors = map[string]int64{}
	}
	for k, v := range o.Errors {
		s.Errors[k] += v
	}
	if o.Change == s.Change || s.Change == 0 {
		s.Change = o.Change
		s.Fetched = append(s.Fetched, o.Fetched...)
		s.Applied = append(s.Applied, o.Applied...)
	}
}

var digitsRE = regexp.MustCompile(`[0-9a-f]{8,}|[0-9]+`)

// errorKind names an error by its kind, without addresses, ids or numbers
// that would make every occurrence its own kind.
func errorKind(err error) string {
	var he *api.Error
	switch {
	case err == nil:
		return "none"
	case errors.As(err, &he):
		if he.Code != "" {
			return "http " + itoa(he.Status) + " " + he.Code
		}
		return "http " + itoa(he.Status)
	case errors.Is(err, syscall.EMFILE), errors.Is(err, syscall.ENFILE):
		return "too many open files"
	case errors.Is(err, syscall.ECONNREFUSED):
		return "connection refused"
	case errors.Is(err, syscall.ECONNRESET):
		return "connection reset"
	case errors.Is(err, syscall.EADDRNOTAVAIL):
		return "address not available"
	case errors.Is(err, os.ErrDeadlineExceeded):
		return "timeout"
	}
	if s, ok := status.FromError(err); ok && s.Code() != 0 {
		msg := s.Message()
		if strings.Contains(msg, "too many open files") {
			return "grpc " + s.Code().String() + " too many open files"
		}
		return "grpc " + s.Code().String()
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return "timeout"
	}
	msg := err.Error()
	if strings.Contains(msg, "too many open files") {
		return "too many open files"
	}
	if len(msg) > 80 {
		msg = msg[:80]
	}
	return digitsRE.ReplaceAllString(msg, "N")
}
