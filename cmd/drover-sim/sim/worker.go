package sim

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// WorkerConfig is what the parent hands a worker process, on its stdin
// (never in its arguments or environment: it holds the admin token).
type WorkerConfig struct {
	Index      int    `json:"index"`
	First      int    `json:"first"` // fleet-wide index of the worker's first agent
	Server     string `json:"server"`
	Host       string `json:"host"`
	CAPEM      []byte `json:"ca_pem"`
	AdminToken string `json:"admin_token"`
	Fleet      string `json:"fleet"`
	// SpreadSources binds each agent to a loopback source address shared
	// by PerSource agents.
	SpreadSources     bool        `json:"spread_sources"`
	PerSource         int         `json:"per_source"`
	EnrollConcurrency int         `json:"enroll_concurrency"`
	AllowRemote       bool        `json:"allow_remote"`
	Agent             AgentParams `json:"agent"`
	DrainTimeout      Duration    `json:"drain_timeout"`
}

// Duration is a time.Duration that travels as a string.
type Duration time.Duration

func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(time.Duration(d).String()) }

func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return err
	}
	v, err := time.ParseDuration(s)
	*d = Duration(v)
	return err
}

// changeTarget is a change the workers watch for: the fleet's pipe at
// MinVersion or later. The parent announces it before its PUT.
type changeTarget struct {
	ID         uint64 `json:"id"`
	Pipe       string `json:"pipe"`
	MinVersion uint64 `json:"min_version"`
}

// command is one line from the parent.
type command struct {
	Op     string        `json:"op"` // init, grow, change, stats, stop
	Init   *WorkerConfig `json:"init,omitempty"`
	To     int           `json:"to,omitempty"` // grow: the worker's agent count
	Change *changeTarget `json:"change,omitempty"`
}

// reply is one line to the parent.
type reply struct {
	Op    string `json:"op"` // grown, stats, stopped, error
	Stats *Stats `json:"stats,omitempty"`
	Err   string `json:"err,omitempty"`
	// EnrollFrom and EnrollUntil (unix ns) bound a grow's enrollment phase.
	EnrollFrom  int64 `json:"enroll_from,omitempty"`
	EnrollUntil int64 `json:"enroll_until,omitempty"`
}

type worker struct {
	cfg    WorkerConfig
	rec    *recorder
	admin  *admin
	change atomic.Pointer[changeTarget]

	runCtx      context.Context // polls and runs
	stopRuns    context.CancelFunc
	streamCtx   context.Context // streams, which outlive runs to drain the outboxes
	stopStreams context.CancelFunc
	wg          sync.WaitGroup
	mu          sync.Mutex
	agents      []*simAgent
	started     int // agents attempted
	growing     sync.Mutex
	growWG      sync.WaitGroup
	outMu       sync.Mutex
	out         *json.Encoder
}

// runWorker serves the parent's commands on in until "stop" or EOF.
func runWorker(in io.Reader, out io.Writer) error {
	w := &worker{rec: newRecorder(), out: json.NewEncoder(out)}
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	for sc.Scan() {
		var cmd command
		if err := json.Unmarshal(sc.Bytes(), &cmd); err != nil {
			return fmt.Errorf("worker: command: %w", err)
		}
		switch cmd.Op {
		case "init":
			if cmd.Init == nil {
				return errors.New("worker: init without a config")
			}
			if err := w.init(*cmd.Init); err != nil {
				w.send(reply{Op: "error", Err: err.Error()})
				return err
			}
			w.send(reply{Op: "ready"})
		case "grow":
			w.growWG.Add(1)
			go func(to int) {
				defer w.growWG.Done()
				from, until := w.grow(to)
				st := w.rec.snapshot()
				w.send(reply{Op: "grown", Stats: &st, EnrollFrom: from.UnixNano(), EnrollUntil: until.UnixNano()})
			}(cmd.To)
		case "change":
			if cmd.Change != nil {
				w.rec.startChange(cmd.Change.ID)
				w.change.Store(cmd.Change)
			}
			w.send(reply{Op: "change"})
		case "stats":
			st := w.rec.snapshot()
			w.send(reply{Op: "stats", Stats: &st})
		case "stop":
			w.stop()
			st := w.rec.snapshot()
			w.send(reply{Op: "stopped", Stats: &st})
			return nil
		default:
			return fmt.Errorf("worker: unknown command %q", cmd.Op)
		}
	}
	if w.stopRuns != nil {
		w.stop()
	}
	return sc.Err()
}

func (w *worker) send(r reply) {
	w.outMu.Lock()
	defer w.outMu.Unlock()
	_ = w.out.Encode(r)
}

func (w *worker) init(cfg WorkerConfig) error {
	w.cfg = cfg
	a, err := newAdmin(cfg.Server, cfg.AdminToken, cfg.CAPEM)
	if err != nil {
		return err
	}
	w.admin = a
	w.runCtx, w.stopRuns = context.WithCancel(context.Background())
	w.streamCtx, w.stopStreams = context.WithCancel(context.Background())
	w.wg.Add(1)
	go func() { defer w.wg.Done(); w.measureLag(w.runCtx) }()
	return nil
}

// measureLag records how late a 100 ms timer fires in this process: when
// the simulator itself is starved of CPU (it runs at nice 19 beside the
// server), its latencies include that delay, and this says how much.
func (w *worker) measureLag(ctx context.Context) {
	const tick = 100 * time.Millisecond
	for {
		start := time.Now()
		if sleep(ctx, tick) != nil {
			return
		}
		w.rec.observe(&w.rec.lag, time.Since(start)-tick)
	}
}

// grow enrolls and starts agents until the worker has tried to members.
func (w *worker) grow(to int) (from, until time.Time) {
	w.growing.Lock()
	defer w.growing.Unlock()
	n := max(to-w.started, 0)
	// The tokens first, as an operator would hand them out, and each
	// agent's key and CSR, as every host makes its own on its own CPU: the
	// enrollment phase that follows is what the server's rate is timed on.
	toks := make([]string, n)
	keys := make([]*keyCSR, n)
	tags := map[string]string{fleetTag: w.cfg.Fleet}
	first := w.started
	w.parallel(n, func(k int) {
		tok, err := w.admin.createToken(w.runCtx, tags)
		if err != nil && w.runCtx.Err() == nil {
			w.rec.fail("token", err)
		}
		toks[k] = tok
		keys[k], _ = newKeyCSR(w.hostname(w.cfg.First + first + k)) // nil on failure: enroll makes one
	})
	from = time.Now()
	w.parallel(n, func(k int) { w.startAgent(w.cfg.First+first+k, toks[k], keys[k]) })
	w.started += n
	return from, time.Now()
}

// parallel runs f(0..n-1), EnrollConcurrency at a time, until runCtx ends.
func (w *worker) parallel(n int, f func(int)) {
	sem := make(chan struct{}, max(w.cfg.EnrollConcurrency, 1))
	var wg sync.WaitGroup
	for k := 0; k < n && w.runCtx.Err() == nil; k++ {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			f(k)
		}()
	}
	wg.Wait()
}

// hostname is agent i's host name.
func (w *worker) hostname(i int) string { return fmt.Sprintf("sim-%s-%d", w.cfg.Fleet, i) }

// machineID is agent i's machine id (32 hex digits, as /etc/machine-id),
// sent at enrollment and on every stream and request, as drover-agent does.
func (w *worker) machineID(i int) string {
	mid := sha256.Sum256([]byte(w.cfg.Fleet + "/" + itoa(i)))
	return hex.EncodeToString(mid[:16])
}

// startAgent enrolls agent i with tok and kc (bounded retries, each with a
// new token and key) and starts its loops.
func (w *worker) startAgent(i int, tok string, kc *keyCSR) {
	w.rec.c.agents.Add(1)
	var src net.IP
	if w.cfg.SpreadSources {
		src = sourceAddr(i, w.cfg.PerSource)
	}
	ctx := w.runCtx
	tags := map[string]string{fleetTag: w.cfg.Fleet}
	hostname := w.hostname(i)
	var id *identity
	bo := 500 * time.Millisecond
	for attempt := 1; ; attempt++ {
		var err error
		if tok == "" {
			tok, err = w.admin.createToken(ctx, tags)
		}
		if err == nil {
			start := time.Now()
			id, err = enroll(ctx, w.cfg.Server, w.cfg.Host, tok, hostname, w.machineID(i), kc, src, w.cfg.Agent.Timeout)
			w.rec.observe(&w.rec.enroll, time.Since(start))
			if err == nil {
				break
			}
		}
		if ctx.Err() != nil {
			return // stopping: not an error of the server
		}
		if tok == "" {
			w.rec.fail("token", err)
		} else {
			w.rec.fail("enroll", err)
		}
		tok, kc = "", nil // a retry takes a new token (the failed attempt may have used this one) and key
		if attempt == 5 {
			w.rec.failKind("enroll: gave up after retries")
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(jitter(bo, 0.5)):
		}
		bo = min(2*bo, 8*time.Second)
	}
	a, err := newSimAgent(w, i, src, id)
	if err != nil {
		w.rec.fail("agent", err)
		return
	}
	w.rec.c.enrolled.Add(1)
	w.mu.Lock()
	w.agents = append(w.agents, a)
	w.mu.Unlock()
	w.wg.Add(3)
	go func() { defer w.wg.Done(); a.streamLoop(w.streamCtx) }()
	go func() { defer w.wg.Done(); a.pollLoop(w.runCtx) }()
	go func() { defer w.wg.Done(); a.runLoop(w.runCtx) }()
}

// stop ends polls and runs, waits (bounded) for every outbox to be
// acknowledged, then closes the streams.
func (w *worker) stop() {
	w.stopRuns()
	w.growWG.Wait() // no agent starts after this
	deadline := time.Now().Add(max(time.Duration(w.cfg.DrainTimeout), time.Second))
	for {
		w.mu.Lock()
		left := 0
		for _, a := range w.agents {
			left += a.outboxLen()
		}
		w.mu.Unlock()
		if left == 0 {
			break
		}
		if time.Now().After(deadline) {
			w.rec.mu.Lock()
			w.rec.errs["records unacknowledged at stop"] += int64(left)
			w.rec.mu.Unlock()
			break
		}
		time.Sleep(time.Duration(50+rand.IntN(50)) * time.Millisecond)
	}
	w.stopStreams()
	done := make(chan struct{})
	go func() { w.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(15 * time.Second):
		w.rec.failKind("worker: loops did not end within 15s")
	}
}
