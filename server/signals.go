package server

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/drover/drover/internal/tick"
	"github.com/drover/drover/server/bus"
	"github.com/drover/drover/server/errs"
	"github.com/drover/drover/server/store"
	"github.com/drover/drover/server/stream"
)

// Signals between replicas (docs/postgres.md, "Signals"). fleet is the
// server's liveStreams: it acts on this replica's streams (the hub) and
// tells the other replicas, over the signal bus, what they must act on.
// Payloads carry ids, never bodies; each is at most bus.MaxPayload bytes,
// longer lists are split. The kinds:
//
//	sync    agents whose manifest changed, with its serial: drop them from
//	        the cache, send SyncNow on their live stream (carrying the
//	        manifest as this replica reads it, never older than the serial)
//	inv     agents whose cached certificate or manifest changed
//	close   agents revoked or deleted: end their live stream
//	retire  an agent whose renewal was promoted: end a stream opened with
//	        an older certificate
//	took    agents that opened a stream here: end an older stream of theirs
//	        (left half-open when the agent moved)
//	cmd     RunNow or CancelRun for agents whose stream another replica
//	        holds (addressed to it); ack answers which it queued
//	follow  runs followed live here: tell us when their records commit
//	logs    runs whose records committed: wake their followers
//	join    a replica (re)connected: send it the runs you follow
//
// Which replica holds an agent's stream is in the store (agent_streams):
// each replica claims its streams when they open, refreshes the claims
// every presenceEvery and drops them when they end; a claim not refreshed
// within presenceTTL is stale. A single server (SQLite, a bus of one)
// keeps all of this in memory and publishes nothing.
const (
	presenceEvery = 5 * time.Second
	presenceTTL   = 15 * time.Second
	// presenceFresh is how long the presence list behind Online is reused.
	presenceFresh = time.Second
	// cmdTimeout bounds the wait for another replica's ack of a RunNow or
	// CancelRun; without one the agent counts as not connected.
	cmdTimeout = 2 * time.Second
	// cmdChunk is how many agents one cmd signal names.
	cmdChunk = 150
	// followEvery is how often the runs followed here are announced again;
	// followTTL how long an announcement holds.
	followEvery = 10 * time.Second
	followTTL   = 30 * time.Second
	// followCatchup: a new follower re-reads once after this, in case a
	// commit elsewhere raced with its first announcement.
	followCatchup = time.Second
	// maxOutbox bounds the signals waiting to be published.
	maxOutbox = 100000
	// syncSignalWorkers bounds the sync signals whose SyncNows (each a
	// manifest read for an agent streaming here) are sent at once; more
	// wait, holding the bus's receive loop.
	syncSignalWorkers = 4
)

// sigBody is a signal's payload (JSON, short keys).
type sigBody struct {
	IDs     []string `json:"i,omitempty"`  // agents, or runs (follow, logs)
	Serials []uint64 `json:"s,omitempty"`  // sync: the manifest serial of each of IDs
	Cause   string   `json:"c,omitempty"`  // close: revoked or deleted
	Cert    string   `json:"z,omitempty"`  // retire: the certificate serial now current
	Corr    string   `json:"k,omitempty"`  // cmd, ack: matches an ack to its cmd
	To      string   `json:"t,omitempty"`  // cmd, ack: the replica addressed
	Op      string   `json:"o,omitempty"`  // cmd: run or cancel
	Pipe    string   `json:"p,omitempty"`  // cmd run
	Arg     string   `json:"a,omitempty"`  // cmd run: the request id; cancel: the run id
	At      int64    `json:"at,omitempty"` // took: when the streams opened (Unix ns)
}

// chunks encodes b, split into payloads of at most bus.MaxPayload bytes.
func (b sigBody) chunks() []string {
	j, err := json.Marshal(b)
	if err != nil {
		return nil
	}
	if len(j) <= bus.MaxPayload || len(b.IDs) <= 1 {
		return []string{string(j)}
	}
	h := len(b.IDs) / 2
	l, r := b, b
	l.IDs, r.IDs = b.IDs[:h], b.IDs[h:]
	if len(b.Serials) == len(b.IDs) {
		l.Serials, r.Serials = b.Serials[:h], b.Serials[h:]
	}
	return append(l.chunks(), r.chunks()...)
}

// closeCauses names the causes with which a stream is closed elsewhere.
var closeCauses = map[string]error{"revoked": stream.ErrRevoked, "deleted": errDeleted}

func causeName(err error) string {
	for n, c := range closeCauses {
		if err == c {
			return n
		}
	}
	return "revoked"
}

type outItem struct {
	kind string
	body sigBody
}

// fleet reaches every agent's live stream, on this replica or another.
type fleet struct {
	s    *Server
	hub  *stream.Hub
	bus  bus.Bus
	logs *logWatchers

	outMu   sync.Mutex
	outbox  []outItem
	outKick chan struct{}
	dropped atomic.Int64 // signals not published (outbox full, publish failed)

	presMu   sync.Mutex
	presQ    map[string]bool // agent -> stream open (true) or ended, not yet written
	presKick chan struct{}
	dirty    atomic.Bool // write every local claim at the next refresh

	snapMu sync.Mutex
	snap   map[string]string
	snapAt time.Time

	waitMu  sync.Mutex
	waiting map[string]chan []string // cmd corr -> its ack

	followMu sync.Mutex
	followed map[string]time.Time // runs followed on other replicas -> until

	syncing chan struct{} // sync signals being sent (syncSignalWorkers)
}

func newFleet(s *Server, hub *stream.Hub, b bus.Bus, logs *logWatchers) *fleet {
	f := &fleet{s: s, hub: hub, bus: b, logs: logs, outKick: make(chan struct{}, 1), presQ: map[string]bool{}, presKick: make(chan struct{}, 1),
		waiting: map[string]chan []string{}, followed: map[string]time.Time{}, syncing: make(chan struct{}, syncSignalWorkers)}
	hub.Watch(f.streamChanged)
	return f
}

var _ liveStreams = (*fleet)(nil)

// shared: other replicas may exist.
func (f *fleet) shared() bool { return f.bus.Shared() }

func (f *fleet) Count() int           { return f.hub.Count() }
func (f *fleet) CloseAll(cause error) { f.hub.CloseAll(cause) }
func (f *fleet) Retire(id, cert string) {
	f.hub.Retire(id, cert)
	f.send("retire", sigBody{IDs: []string{id}, Cert: cert})
}

func (f *fleet) Close(id string, cause error) {
	f.hub.Close(id, cause)
	f.send("close", sigBody{IDs: []string{id}, Cause: causeName(cause)})
}

// SyncNow tells the agent's live stream, wherever it is, that manifest
// serial is out.
func (f *fleet) SyncNow(id string, serial uint64) {
	if !f.hub.SyncNow(id, serial) {
		f.send("sync", sigBody{IDs: []string{id}, Serials: []uint64{serial}})
	}
}

// Online reports whether the agent has a live stream here or, by a fresh
// claim, on another replica.
func (f *fleet) Online(id string) bool {
	if f.hub.Online(id) {
		return true
	}
	if !f.shared() {
		return false
	}
	return f.presence()[id] != ""
}

// presence is the list of fresh claims, reread at most every
// presenceFresh; on a store error the last list stays.
func (f *fleet) presence() map[string]string {
	f.snapMu.Lock()
	defer f.snapMu.Unlock()
	now := time.Now()
	if f.snap == nil || now.Sub(f.snapAt) >= presenceFresh {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		m, err := f.s.store.StreamReplicas(ctx, nil, f.s.clock.Now().Add(-presenceTTL))
		cancel()
		if err == nil {
			f.snap = m
		} else if f.snap == nil {
			f.snap = map[string]string{}
		}
		f.snapAt = now
	}
	return f.snap
}

// RunNow queues a RunNow on the live stream of each agent, here or on the
// replica holding it, and returns those queued. An agent on another
// replica counts only once that replica answered within cmdTimeout.
func (f *fleet) RunNow(ctx context.Context, ids []string, pipe, requestID string) map[string]bool {
	sent := map[string]bool{}
	var rest []string
	for _, id := range ids {
		if f.hub.RunNow(id, pipe, requestID) {
			sent[id] = true
		} else {
			rest = append(rest, id)
		}
	}
	for _, id := range f.command(ctx, rest, sigBody{Op: "run", Pipe: pipe, Arg: requestID}) {
		sent[id] = true
	}
	return sent
}

// Cancel queues a CancelRun on the agent's live stream, here or on the
// replica holding it.
func (f *fleet) Cancel(ctx context.Context, id, runID string) bool {
	if f.hub.Cancel(id, runID) {
		return true
	}
	return len(f.command(ctx, []string{id}, sigBody{Op: "cancel", Arg: runID})) > 0
}

// command sends a cmd to the replicas claiming the agents' streams and
// returns the agents whose replica acknowledged queuing it.
func (f *fleet) command(ctx context.Context, ids []string, cmd sigBody) []string {
	if len(ids) == 0 || !f.shared() {
		return nil
	}
	where, err := f.s.store.StreamReplicas(ctx, ids, f.s.clock.Now().Add(-presenceTTL))
	if err != nil {
		f.s.log.Warn("looking up which replica holds the agents' streams", "err", err)
		return nil
	}
	byReplica := map[string][]string{}
	for _, id := range ids {
		if r := where[id]; r != "" && r != f.bus.Replica() {
			byReplica[r] = append(byReplica[r], id)
		}
	}
	var acks []chan []string
	var corrs []string
	defer func() {
		f.waitMu.Lock()
		for _, c := range corrs {
			delete(f.waiting, c)
		}
		f.waitMu.Unlock()
	}()
	for r, group := range byReplica {
		for len(group) > 0 {
			n := min(len(group), cmdChunk)
			b := cmd
			b.IDs, b.To, b.Corr = group[:n], r, strings.ToLower(b32.EncodeToString(randomBytes(10)))
			group = group[n:]
			ch := make(chan []string, 1)
			f.waitMu.Lock()
			f.waiting[b.Corr] = ch
			f.waitMu.Unlock()
			corrs = append(corrs, b.Corr)
			if err := f.publish(ctx, "cmd", b); err != nil {
				f.s.log.Warn("sending a command to another replica", "replica", r, "err", err)
				continue
			}
			acks = append(acks, ch)
		}
	}
	var out []string
	timeout := time.NewTimer(cmdTimeout)
	defer timeout.Stop()
	for _, ch := range acks {
		select {
		case ids := <-ch:
			out = append(out, ids...)
		case <-timeout.C:
			return out
		case <-ctx.Done():
			return out
		}
	}
	return out
}

// publish sends one signal now (cmd, ack: callers wait on them).
func (f *fleet) publish(ctx context.Context, kind string, b sigBody) error {
	for _, p := range b.chunks() {
		if err := f.bus.Publish(ctx, kind, p); err != nil {
			return err
		}
	}
	return nil
}

// send queues a signal for the other replicas; the outbox publishes in
// order, merging runs of the same kind.
func (f *fleet) send(kind string, b sigBody) {
	if !f.shared() {
		return
	}
	f.outMu.Lock()
	if len(f.outbox) >= maxOutbox {
		f.outMu.Unlock()
		f.dropped.Add(1)
		return
	}
	if n := len(f.outbox); n > 0 && mergeable(f.outbox[n-1], kind, b) {
		last := &f.outbox[n-1].body
		last.IDs = append(last.IDs, b.IDs...)
		last.Serials = append(last.Serials, b.Serials...)
	} else {
		f.outbox = append(f.outbox, outItem{kind: kind, body: b})
	}
	f.outMu.Unlock()
	select {
	case f.outKick <- struct{}{}:
	default:
	}
}

func mergeable(last outItem, kind string, b sigBody) bool {
	switch kind {
	case "sync", "inv", "follow", "logs":
		return last.kind == kind
	case "took":
		return last.kind == kind && b.At-last.body.At < int64(time.Second)
	case "close":
		return last.kind == kind && last.body.Cause == b.Cause
	}
	return false
}

// flush publishes the outbox until ctx is done. A signal that cannot be
// published after a few tries is dropped and counted: the database is
// then unreachable, and every replica resyncs when its bus reconnects.
func (f *fleet) flush(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-f.outKick:
		}
		f.outMu.Lock()
		items := f.outbox
		f.outbox = nil
		f.outMu.Unlock()
		for _, it := range items {
			var err error
			for attempt := 0; attempt < 3; attempt++ {
				pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
				err = f.publish(pctx, it.kind, it.body)
				cancel()
				if err == nil || ctx.Err() != nil {
					break
				}
				tick.Sleep(ctx, time.Duration(attempt+1)*200*time.Millisecond)
			}
			if err != nil && ctx.Err() == nil {
				f.dropped.Add(1)
				f.s.log.Warn("a signal to the other replicas was not sent", "kind", it.kind, "err", err)
			}
		}
	}
}

// Signal acts on a signal from another replica (bus.Handler).
func (f *fleet) Signal(sig bus.Signal) {
	var b sigBody
	if err := json.Unmarshal([]byte(sig.Payload), &b); err != nil {
		f.s.log.Warn("an unreadable signal from another replica", "from", sig.From, "kind", sig.Kind, "err", err)
		return
	}
	cs, _ := f.s.store.(*cachedStore)
	switch sig.Kind {
	case "sync":
		if cs != nil {
			cs.invalidate(b.IDs...)
		}
		// The SyncNow carries the manifest read here (the cache was just
		// evicted, so the store's): off the bus's goroutine, a few
		// signals at a time.
		f.syncing <- struct{}{}
		go func() {
			defer func() { <-f.syncing }()
			for i, id := range b.IDs {
				if i < len(b.Serials) {
					f.hub.SyncNow(id, b.Serials[i])
				}
			}
		}()
	case "inv":
		if cs != nil {
			cs.invalidate(b.IDs...)
		}
	case "close":
		if cs != nil {
			cs.invalidate(b.IDs...)
		}
		cause := closeCauses[b.Cause]
		if cause == nil {
			cause = stream.ErrRevoked
		}
		for _, id := range b.IDs {
			f.hub.Close(id, cause)
			if b.Cause == "deleted" {
				f.s.forgetAgent(id)
			}
		}
	case "took":
		at := time.Unix(0, b.At)
		for _, id := range b.IDs {
			f.hub.Replaced(id, at)
		}
	case "retire":
		if cs != nil {
			cs.invalidate(b.IDs...)
		}
		for _, id := range b.IDs {
			f.hub.Retire(id, b.Cert)
		}
	case "cmd":
		if b.To != f.bus.Replica() {
			return
		}
		var queued []string
		for _, id := range b.IDs {
			ok := false
			switch b.Op {
			case "run":
				ok = f.hub.RunNow(id, b.Pipe, b.Arg)
			case "cancel":
				ok = f.hub.Cancel(id, b.Arg)
			}
			if ok {
				queued = append(queued, id)
			}
		}
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), cmdTimeout)
			defer cancel()
			if err := f.publish(ctx, "ack", sigBody{Corr: b.Corr, To: sig.From, IDs: queued}); err != nil {
				f.s.log.Warn("answering another replica's command", "err", err)
			}
		}()
	case "ack":
		if b.To != f.bus.Replica() {
			return
		}
		f.waitMu.Lock()
		ch := f.waiting[b.Corr]
		f.waitMu.Unlock()
		if ch != nil {
			select {
			case ch <- b.IDs:
			default:
			}
		}
	case "follow":
		until := time.Now().Add(followTTL)
		f.followMu.Lock()
		for _, id := range b.IDs {
			f.followed[id] = until
		}
		f.followMu.Unlock()
	case "logs":
		f.logs.wake(b.IDs)
	case "join":
		f.announceFollows()
	}
}

// Resync re-reads what signals missed while the bus was down would have
// said (bus.Handler): the cache starts over, every claim is written again,
// every live-log follower re-reads and the runs followed are announced,
// and every live stream here is checked — closed if its agent was revoked
// or its certificate retired, sent SyncNow if a newer manifest than the
// one it accepted is out.
func (f *fleet) Resync() {
	if cs, ok := f.s.store.(*cachedStore); ok {
		cs.invalidateAll()
	}
	f.dirty.Store(true)
	f.kickPresence()
	f.logs.wakeAll()
	f.announceFollows()
	f.send("join", sigBody{})
	go f.recheckStreams()
}

func (f *fleet) recheckStreams() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	live := f.hub.List()
	if len(live) == 0 {
		return
	}
	agents, err := f.s.store.ListAgents(ctx)
	if err != nil {
		f.s.log.Warn("resync: listing agents; sending SyncNow to every live stream", "err", err)
	}
	accepted := map[string]uint64{}
	for _, a := range agents {
		accepted[a.ID] = a.AcceptedSerial
	}
	synced, closed := 0, 0
	for _, l := range live {
		if err := (streamHost{f.s}).CheckCertSerial(ctx, l.AgentID, l.Serial); errors.Is(err, errs.ErrAgentRevoked) || errors.Is(err, errs.ErrCertRefused) {
			f.hub.Close(l.AgentID, err)
			closed++
			continue
		}
		m, err := f.s.store.GetManifest(ctx, l.AgentID)
		if err != nil && !errors.Is(err, errs.ErrNotFound) {
			continue
		}
		if m != nil && (agents == nil || m.Serial > accepted[l.AgentID]) {
			f.hub.SyncNow(l.AgentID, m.Serial)
			synced++
		}
	}
	f.s.log.Info("resync: live streams checked", "streams", len(live), "sync_now", synced, "closed", closed)
}

// streamChanged queues a claim or its drop (hub.Watch).
func (f *fleet) streamChanged(id string, open bool) {
	if !f.shared() {
		return
	}
	f.presMu.Lock()
	f.presQ[id] = open
	f.presMu.Unlock()
	f.kickPresence()
	if open {
		f.send("took", sigBody{IDs: []string{id}, At: f.s.clock.Now().UnixNano()})
	}
}

func (f *fleet) kickPresence() {
	select {
	case f.presKick <- struct{}{}:
	default:
	}
}

// keepPresence writes the claims of this replica's streams: opens and
// ends as they happen, a refresh every presenceEvery (which also deletes
// stale claims), and every claim again after a failed write or when the
// refresh counts fewer claims than streams.
func (f *fleet) keepPresence(ctx context.Context) {
	tick := time.NewTicker(presenceEvery)
	defer tick.Stop()
	for {
		refresh := false
		select {
		case <-ctx.Done():
			return
		case <-f.presKick:
		case <-tick.C:
			refresh = true
		}
		f.writePresence(ctx, refresh)
	}
}

// writePresence writes the queued claims and drops (and with refresh,
// refreshes every claim).
func (f *fleet) writePresence(ctx context.Context, refresh bool) {
	if !f.shared() {
		return
	}
	replica := f.bus.Replica()
	f.presMu.Lock()
	q := f.presQ
	f.presQ = map[string]bool{}
	f.presMu.Unlock()
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	now := f.s.clock.Now()
	var opened []string
	for id, open := range q {
		if open {
			opened = append(opened, id)
		} else if err := f.s.store.DropStream(wctx, id, replica); err != nil {
			f.dirty.Store(true)
		}
	}
	if f.dirty.Swap(false) {
		opened = opened[:0]
		for _, l := range f.hub.List() {
			opened = append(opened, l.AgentID)
		}
	}
	if err := f.s.store.PutStreams(wctx, replica, opened, now); err != nil {
		f.dirty.Store(true)
		if ctx.Err() == nil {
			f.s.log.Debug("writing stream claims", "err", err)
		}
	}
	if refresh {
		n, err := f.s.store.TouchStreams(wctx, replica, now, now.Add(-presenceTTL))
		if err != nil || n < f.hub.Count() {
			f.dirty.Store(true)
		}
	}
}

// release drops the claims of the streams this replica closed on the way
// down, so that the others stop sending it commands at once.
func (f *fleet) release() {
	f.dirty.Store(false)
	f.writePresence(context.Background(), false)
}

// follow announces a run followed here; the follower re-reads once after
// followCatchup in case a commit elsewhere came before the announcement.
func (f *fleet) follow(runID string, wake chan struct{}) {
	if !f.shared() {
		return
	}
	f.send("follow", sigBody{IDs: []string{runID}})
	time.AfterFunc(followCatchup, func() {
		select {
		case wake <- struct{}{}:
		default:
		}
	})
}

func (f *fleet) announceFollows() {
	if runs := f.logs.runs(); len(runs) > 0 {
		f.send("follow", sigBody{IDs: runs})
	}
}

// committed tells the replicas following the runs of committed records.
func (f *fleet) committed(recs []*store.Record) {
	if !f.shared() {
		return
	}
	now := time.Now()
	f.followMu.Lock()
	if len(f.followed) == 0 {
		f.followMu.Unlock()
		return
	}
	var wake []string
	for _, id := range touchedRuns(recs) {
		if until, ok := f.followed[id]; ok {
			if now.After(until) {
				delete(f.followed, id)
			} else {
				wake = append(wake, id)
			}
		}
	}
	f.followMu.Unlock()
	if len(wake) > 0 {
		f.send("logs", sigBody{IDs: wake})
	}
}

// run receives signals and keeps the claims, the outbox and the follow
// announcements going until ctx is done.
func (f *fleet) run(ctx context.Context) {
	var wg sync.WaitGroup
	wg.Add(3)
	go func() { defer wg.Done(); _ = f.bus.Run(ctx, f) }()
	go func() { defer wg.Done(); f.flush(ctx) }()
	go func() { defer wg.Done(); f.keepPresence(ctx) }()
	if f.shared() {
		f.send("join", sigBody{})
		tick.Every(ctx, followEvery, nil, func() {
			f.announceFollows()
			now := time.Now()
			f.followMu.Lock()
			for id, until := range f.followed {
				if now.After(until) {
					delete(f.followed, id)
				}
			}
			f.followMu.Unlock()
		})
	}
	wg.Wait()
}

// fleetLogs is the server's logNotifier: this replica's followers, woken
// by commits here and, through logs signals, on other replicas.
type fleetLogs struct {
	*logWatchers
	f *fleet
}

func (l fleetLogs) watch(runID string) (chan struct{}, func()) {
	ch, stop := l.logWatchers.watch(runID)
	l.f.follow(runID, ch)
	return ch, stop
}

func (l fleetLogs) notify(recs []*store.Record) {
	l.logWatchers.notify(recs)
	l.f.committed(recs)
}
