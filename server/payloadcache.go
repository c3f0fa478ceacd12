package server

import (
	"container/list"
	"context"
	"fmt"
	"sync"
)

// Payload bundles are content-addressed: the bytes stored under a digest
// never change, so a copy held in memory is never stale. When a change
// reaches a fleet every agent fetches the same few bundles within seconds;
// payloadCache reads each from the store once and serves the rest from
// memory, without taking one of the agents.payload_fetches slots (those
// bound the store reads and buffers of streamed downloads).
const (
	// payloadCacheBytes bounds the bytes held; the least recently used
	// bundles go first.
	payloadCacheBytes = 64 << 20
	// payloadCacheMaxEntry is the largest bundle held; larger ones are
	// streamed from the store in slices as before.
	payloadCacheMaxEntry = 8 << 20
)

// payloadReader is the part of the store the cache reads through.
type payloadReader interface {
	PayloadSize(ctx context.Context, digest string) (int64, error)
	ReadPayload(ctx context.Context, digest string, offset int64, buf []byte) (int, error)
}

// payloadCache is a bounded LRU of whole bundles by digest, with one store
// read per digest however many requests miss at once.
type payloadCache struct {
	limit, maxEntry int64

	mu      sync.Mutex
	bytes   int64
	lru     *list.List // of *payloadEntry, most recent first
	entries map[string]*list.Element
	loading map[string]*payloadLoad
}

type payloadEntry struct {
	digest string
	data   []byte
}

// payloadLoad is one read in flight that other requests wait for.
type payloadLoad struct {
	done chan struct{}
	data []byte
	err  error
}

func newPayloadCache(limit, maxEntry int64) *payloadCache {
	return &payloadCache{limit: limit, maxEntry: min(maxEntry, limit), lru: list.New(),
		entries: map[string]*list.Element{}, loading: map[string]*payloadLoad{}}
}

// lookup returns the bundle's bytes if they are held or being read (then
// it waits for the read); ok=false if neither.
func (c *payloadCache) lookup(ctx context.Context, digest string) (data []byte, ok bool, err error) {
	c.mu.Lock()
	if el, hit := c.entries[digest]; hit {
		c.lru.MoveToFront(el)
		c.mu.Unlock()
		return el.Value.(*payloadEntry).data, true, nil
	}
	l := c.loading[digest]
	c.mu.Unlock()
	if l == nil {
		return nil, false, nil
	}
	select {
	case <-l.done:
		return l.data, l.err == nil, l.err
	case <-ctx.Done():
		return nil, false, ctx.Err()
	}
}

// get returns the bundle's bytes, reading them from st on a miss, or
// ok=false when the bundle (of the given size) is too large to hold.
func (c *payloadCache) get(ctx context.Context, st payloadReader, digest string, size int64) (data []byte, ok bool, err error) {
	if size > c.maxEntry {
		return nil, false, nil
	}
	c.mu.Lock()
	if el, hit := c.entries[digest]; hit {
		c.lru.MoveToFront(el)
		c.mu.Unlock()
		return el.Value.(*payloadEntry).data, true, nil
	}
	if l, busy := c.loading[digest]; busy {
		c.mu.Unlock()
		select {
		case <-l.done:
			return l.data, l.err == nil, l.err
		case <-ctx.Done():
			return nil, false, ctx.Err()
		}
	}
	l := &payloadLoad{done: make(chan struct{})}
	c.loading[digest] = l
	c.mu.Unlock()

	// The read is not tied to the first requester's context: the others
	// wait for it too.
	l.data, l.err = readPayload(context.WithoutCancel(ctx), st, digest, size)
	c.mu.Lock()
	delete(c.loading, digest)
	if l.err == nil {
		c.add(digest, l.data)
	}
	c.mu.Unlock()
	close(l.done)
	return l.data, l.err == nil, l.err
}

// add holds data under digest, evicting the least recently used; the
// caller holds c.mu.
func (c *payloadCache) add(digest string, data []byte) {
	if _, ok := c.entries[digest]; ok {
		return
	}
	for c.bytes+int64(len(data)) > c.limit && c.lru.Len() > 0 {
		old := c.lru.Remove(c.lru.Back()).(*payloadEntry)
		delete(c.entries, old.digest)
		c.bytes -= int64(len(old.data))
	}
	c.entries[digest] = c.lru.PushFront(&payloadEntry{digest: digest, data: data})
	c.bytes += int64(len(data))
}

// readPayload reads a whole bundle of the given size.
func readPayload(ctx context.Context, st payloadReader, digest string, size int64) ([]byte, error) {
	data := make([]byte, size)
	for off := int64(0); off < size; {
		n, err := st.ReadPayload(ctx, digest, off, data[off:min(off+payloadSlice, size)])
		if err != nil {
			return nil, fmt.Errorf("read payload %s: %w", digest, err)
		}
		if n == 0 {
			return nil, fmt.Errorf("read payload %s: short read at %d of %d bytes", digest, off, size)
		}
		off += int64(n)
	}
	return data, nil
}
