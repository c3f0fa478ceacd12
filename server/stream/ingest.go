package stream

import (
	"context"
	"log/slog"
	"time"

	"github.com/drover/drover/server/errs"
	"github.com/drover/drover/server/store"
)

// heartbeatDelay is how long a batch of heartbeats alone gathers. It only
// delays last_seen and the lost-run check, which count in tens of seconds.
const heartbeatDelay = 250 * time.Millisecond

// commitGap is the least time from one commit's start to the next while
// records keep coming: a batch that somebody waits for gathers for delay,
// or until commitGap after the last commit began if that is later. Most of
// a small commit's cost is fixed (every page it dirties is written whole
// to the WAL, however few of its rows changed), and at 19,500 agents at
// rest commits came one per delay plus commit time; now at most ten a
// second. BenchmarkIngesterAtRest offers that load: the ingester took
// 5.8-6.2% of a core without the gap and 3.8-4.8% with it. A quiet server
// still commits a lone record after delay.
const commitGap = 100 * time.Millisecond

// maxGiveWay bounds how long a batch waits for a bulk write to end (see
// Yield): its records are acknowledged that much later at the most.
const maxGiveWay = 500 * time.Millisecond

// Yield is what the ingester gives way to: a bulk write that holds the
// store's one writer again and again for seconds (a fleet-wide recompile
// saving its manifests chunk after chunk). Were the ingester to commit
// between its chunks, each chunk would wait for an ingest commit to end.
// UnderWay returns nil when no bulk write is under way, else a channel
// closed when it ends.
type Yield interface {
	UnderWay() <-chan struct{}
}

// ingestItem is one record on its way to the database. A nil rec is a
// record that was refused as invalid: it is acknowledged in order with the
// others so that the agent does not resend it forever.
type ingestItem struct {
	rec  *store.Record
	conn *streamConn
	seq  uint64 // 0: nothing to acknowledge
}

// waited says whether someone waits for the item's commit: an ack, or a
// Hello (a new stream's agent details).
func (it ingestItem) waited() bool { return it.seq > 0 || it.rec == nil || it.rec.Hello != nil }

// anyWaited says whether an item of the batch is waited for.
func anyWaited(items []ingestItem) bool {
	for _, it := range items {
		if it.waited() {
			return true
		}
	}
	return false
}

// Ingester commits records from every stream in batched transactions
// (group commit): a batch gathers for up to delay after its first record,
// or until it is full, and while one transaction commits the next batch
// gathers, so one fsync'd commit serves the records of many agents and the
// commit rate adapts to the load, up to one commit per commitGap. Acks are
// sent only after the commit, in seq order per stream. A batch of
// heartbeats alone, which nobody waits for, gathers for up to
// heartbeatDelay: an idle fleet's heartbeats then take a few commits a
// second instead of one per delay.
type Ingester struct {
	store    store.IngestStore
	in       chan ingestItem
	batch    int
	delay    time.Duration
	hbDelay  time.Duration // heartbeatDelay (tests set another)
	gap      time.Duration // commitGap (tests set another)
	last     time.Time     // when the last commit began (Run's goroutine only)
	lim      store.IngestLimits
	log      *slog.Logger
	quit     chan struct{}
	done     chan struct{}
	onCommit func([]*store.Record)
	yield    Yield // nil: never give way
	maxGive  time.Duration
	gaveWay  int // batches that waited for a bulk write (Run's goroutine only)
}

// NewIngester returns an ingester committing to st in batches of up to
// batch records, gathered for up to delay, within lim; onCommit, if set,
// is called with every committed batch.
func NewIngester(st store.IngestStore, batch int, delay time.Duration, lim store.IngestLimits, log *slog.Logger, onCommit func([]*store.Record)) *Ingester {
	return &Ingester{store: st, onCommit: onCommit, in: make(chan ingestItem, 4*batch), batch: batch, delay: delay, hbDelay: heartbeatDelay, gap: commitGap, lim: lim, log: log,
		maxGive: maxGiveWay, quit: make(chan struct{}), done: make(chan struct{})}
}

// GiveWayTo makes the ingester hold a batch that is not full while y
// reports a bulk write under way, for up to maxGiveWay after the batch's
// first record (a store with one writer: SQLite). Call it before Run.
func (g *Ingester) GiveWayTo(y Yield) { g.yield = y }

// Run commits batches until stop is called, then commits what is queued.
func (g *Ingester) Run() {
	defer close(g.done)
	items := make([]ingestItem, 0, g.batch)
	for {
		select {
		case it := <-g.in:
			first := time.Now()
			batch := g.gather(append(items[:0], it))
			if len(batch) < g.batch && g.delay > 0 {
				urgent := anyWaited(batch)
				d := g.urgentDelay()
				if !urgent {
					d = max(d, g.hbDelay)
				}
				batch = g.wait(batch, d, urgent, nil)
			}
			if g.yield != nil && len(batch) < g.batch {
				batch = g.giveWay(batch, first)
			}
			g.commit(batch)
		case <-g.quit:
			for {
				batch := g.gather(items[:0])
				if len(batch) == 0 {
					return
				}
				g.commit(batch)
			}
		}
	}
}

// urgentDelay is how long a batch somebody waits for gathers from now:
// delay, or longer while the last commit began less than gap ago.
func (g *Ingester) urgentDelay() time.Duration {
	return max(g.delay, g.gap-time.Since(g.last))
}

// wait adds records as they come until the batch is full, d has passed,
// end closes (a nil end never does) or the ingester is stopping. The first
// waited-for record to join a batch of heartbeats brings its end to
// urgentDelay from then.
//
// Each wait makes its own timer rather than resetting one: a stopped timer
// stays in the runtime's timer heap until that heap is next cleaned, and
// resetting it there makes the runtime walk the whole heap when its new
// time comes. With a gRPC connection's three keepalive timers per agent
// in those heaps, a reset at every commit cost several percent of a core
// at rest with 19,500 agents; a new timer only joins the heap.
func (g *Ingester) wait(items []ingestItem, d time.Duration, urgent bool, end <-chan struct{}) []ingestItem {
	timer := time.NewTimer(d)
	defer func() { timer.Stop() }()
	for len(items) < g.batch {
		select {
		case it := <-g.in:
			items = append(items, it)
			if !urgent && it.waited() {
				urgent = true
				if !timer.Stop() {
					return items // it fired meanwhile
				}
				timer = time.NewTimer(g.urgentDelay())
			}
		case <-end:
			return items
		case <-timer.C:
			return items
		case <-g.quit:
			return items
		}
	}
	return items
}

// giveWay holds the batch while a bulk write is under way, adding records
// as they come, until it ends, the batch is full, its first record is
// maxGive old or the ingester is stopping.
func (g *Ingester) giveWay(items []ingestItem, first time.Time) []ingestItem {
	end := g.yield.UnderWay()
	if end == nil {
		return items
	}
	left := g.maxGive - time.Since(first)
	if left <= 0 {
		return items
	}
	g.gaveWay++
	return g.wait(items, left, true, end)
}

// Stop ends Run after the queued records are committed.
func (g *Ingester) Stop() {
	close(g.quit)
	<-g.done
}

// gather adds whatever is queued, up to a batch, without waiting.
func (g *Ingester) gather(items []ingestItem) []ingestItem {
	for len(items) < g.batch {
		select {
		case it := <-g.in:
			items = append(items, it)
		default:
			return items
		}
	}
	return items
}

func (g *Ingester) commit(items []ingestItem) {
	g.last = time.Now()
	recs := make([]*store.Record, 0, len(items))
	for _, it := range items {
		if it.rec != nil {
			recs = append(recs, it.rec)
		}
	}
	err := g.store.ApplyRecords(context.Background(), recs, g.lim)
	if err != nil {
		// Nothing of the batch is acknowledged; the streams are closed so
		// that their agents reconnect and replay.
		g.log.Error("committing agent records failed", "records", len(recs), "err", err)
	} else if g.onCommit != nil {
		g.onCommit(recs)
	}
	for _, it := range items {
		if err != nil {
			it.conn.cancel(errs.New(errs.ErrUnavailable, "the server could not store records; reconnect and resend"))
		} else if it.seq > 0 {
			it.conn.acked(it.seq)
		}
		it.conn.inflight.Add(-1)
	}
}
