package runner

import (
	"io"
	"sync"
	"time"

	agentpb "github.com/drover/drover/proto"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// piece is masked output from one stream.
type piece struct {
	stream agentpb.LogStream
	data   []byte
}

// chunkSink receives finished chunks (the runner writes them to the spool).
type chunkSink func(*agentpb.LogChunk)

// chunker cuts the masked output of a run into numbered chunks: a stream's
// buffer is flushed when it reaches maxBytes or flushEvery after its first
// unflushed byte, and everything is flushed at the end. Chunk numbers are
// shared by all streams of a run: 0, 1, 2 ...
type chunker struct {
	runID      string
	maxBytes   int
	flushEvery time.Duration
	sink       chunkSink
	now        func() time.Time

	in   chan piece
	done chan struct{}

	seq     uint64 // next chunk number; read after done is closed
	bufs    map[agentpb.LogStream]*streamBuf
	closing bool
	final   []*agentpb.LogChunk // the chunks flushed by close, not sunk
}

type streamBuf struct {
	data     []byte
	since    time.Time // when the oldest unflushed byte arrived
	deadline time.Time
}

func newChunker(runID string, maxBytes int, flushEvery time.Duration, now func() time.Time, sink chunkSink) *chunker {
	c := &chunker{
		runID: runID, maxBytes: maxBytes, flushEvery: flushEvery, sink: sink, now: now,
		in: make(chan piece, 64), done: make(chan struct{}),
		bufs: map[agentpb.LogStream]*streamBuf{},
	}
	go c.loop()
	return c
}

// close flushes everything and waits. It returns the number of chunks made
// and the last ones, which it does not hand to the sink: the runner writes
// them in one batch with RunFinished.
func (c *chunker) close() (uint64, []*agentpb.LogChunk) {
	close(c.in)
	<-c.done
	return c.seq, c.final
}

func (c *chunker) loop() {
	defer close(c.done)
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	armed := false
	for {
		select {
		case p, ok := <-c.in:
			if !ok {
				c.closing = true
				for _, s := range []agentpb.LogStream{agentpb.LogStream_LOG_STREAM_STDOUT, agentpb.LogStream_LOG_STREAM_STDERR, agentpb.LogStream_LOG_STREAM_SYSTEM} {
					c.flush(s)
				}
				timer.Stop()
				return
			}
			c.add(p)
		case <-timer.C:
			armed = false
			now := c.now()
			for s, b := range c.bufs {
				if len(b.data) > 0 && !now.Before(b.deadline) {
					c.flush(s)
				}
			}
		}
		// Re-arm for the earliest deadline still pending.
		var next time.Time
		for _, b := range c.bufs {
			if len(b.data) > 0 && (next.IsZero() || b.deadline.Before(next)) {
				next = b.deadline
			}
		}
		if armed {
			if !timer.Stop() {
				select {
				case <-timer.C:
				default:
				}
			}
			armed = false
		}
		if !next.IsZero() {
			timer.Reset(max(time.Until(next), 0))
			armed = true
		}
	}
}

func (c *chunker) add(p piece) {
	b := c.bufs[p.stream]
	if b == nil {
		b = &streamBuf{}
		c.bufs[p.stream] = b
	}
	if p.stream == agentpb.LogStream_LOG_STREAM_SYSTEM {
		// A runner note (an attempt's marker line) comes after the output
		// that arrived before it: the pending output gets the lower numbers.
		c.flush(agentpb.LogStream_LOG_STREAM_STDOUT)
		c.flush(agentpb.LogStream_LOG_STREAM_STDERR)
	}
	data := p.data
	for len(data) > 0 {
		if len(b.data) == 0 {
			b.since = c.now()
			b.deadline = b.since.Add(c.flushEvery)
		}
		n := min(len(data), c.maxBytes-len(b.data))
		b.data = append(b.data, data[:n]...)
		data = data[n:]
		if len(b.data) >= c.maxBytes {
			c.flush(p.stream)
		}
	}
	if p.stream == agentpb.LogStream_LOG_STREAM_SYSTEM {
		c.flush(p.stream) // runner notes go out at once
	}
}

func (c *chunker) flush(s agentpb.LogStream) {
	b := c.bufs[s]
	if b == nil || len(b.data) == 0 {
		return
	}
	ch := &agentpb.LogChunk{
		RunId:    c.runID,
		ChunkSeq: c.seq,
		Stream:   s,
		Data:     b.data,
		At:       timestamppb.New(b.since),
	}
	if c.closing {
		c.final = append(c.final, ch)
	} else {
		c.sink(ch)
	}
	c.seq++
	b.data = nil
}

// pump copies one stream of the payload: masks it, tees it to w (the
// runner's own stdout or stderr, i.e. the journal) and hands it to the
// chunker. It returns at EOF or when src is closed.
func pump(wg *sync.WaitGroup, src io.Reader, stream agentpb.LogStream, m *masker, w io.Writer, out chan<- piece) {
	defer wg.Done()
	buf := make([]byte, 32<<10)
	emit := func(b []byte) {
		if len(b) == 0 {
			return
		}
		b = append([]byte(nil), b...)
		if w != nil {
			_, _ = w.Write(b)
		}
		out <- piece{stream: stream, data: b}
	}
	for {
		n, err := src.Read(buf)
		if n > 0 {
			emit(m.push(buf[:n]))
		}
		if err != nil {
			emit(m.flush())
			return
		}
	}
}
