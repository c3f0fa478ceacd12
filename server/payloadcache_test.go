package server

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/drover/drover/manifest"
	"github.com/drover/drover/server/store"
	"github.com/drover/drover/server/store/sqlite"
)

// countingReader counts the reads that reach a real SQLite store.
type countingReader struct {
	*sqlite.DB
	reads atomic.Int64
}

func (c *countingReader) ReadPayload(ctx context.Context, digest string, off int64, buf []byte) (int, error) {
	c.reads.Add(1)
	return c.DB.ReadPayload(ctx, digest, off, buf)
}

func TestPayloadCacheReadsOnceAndBounds(t *testing.T) {
	ctx := context.Background()
	db, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "server.db"), "normal")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	st := &countingReader{DB: db}
	put := func(name string, size int) (string, []byte) {
		data := make([]byte, size)
		rand.Read(data)
		d := manifest.Digest(data)
		p := &store.PipeVersion{Name: name, SpecJSON: []byte(`{"name":"` + name + `"}`), PayloadDigest: d, PayloadSize: int64(size)}
		if _, _, err := db.PutPipe(ctx, p, data, time.Now()); err != nil {
			t.Fatal(err)
		}
		return d, data
	}
	// Three slices' worth: one read fills it for every concurrent request.
	d1, b1 := put("a", 2*payloadSlice+100)
	c := newPayloadCache(4*payloadSlice, 3*payloadSlice)
	var wg sync.WaitGroup
	errs := make(chan error, 50)
	for range 50 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			data, ok, err := c.lookup(ctx, d1)
			if err == nil && !ok {
				data, ok, err = c.get(ctx, st, d1, int64(len(b1)))
			}
			if err != nil || !ok || !bytes.Equal(data, b1) {
				errs <- fmt.Errorf("get: ok=%v err=%v equal=%v", ok, err, bytes.Equal(data, b1))
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if n := st.reads.Load(); n != 3 {
		t.Fatalf("%d slice reads for 50 concurrent requests, want 3 (one whole read)", n)
	}
	// Too large to hold: not cached, the caller streams it.
	d2, b2 := put("b", 3*payloadSlice+1)
	if _, ok, err := c.get(ctx, st, d2, int64(len(b2))); ok || err != nil {
		t.Fatalf("oversized bundle: ok=%v err=%v", ok, err)
	}
	// A second bundle that does not fit beside the first evicts it.
	d3, b3 := put("c", 2*payloadSlice)
	if data, ok, err := c.get(ctx, st, d3, int64(len(b3))); !ok || err != nil || !bytes.Equal(data, b3) {
		t.Fatalf("third bundle: ok=%v err=%v", ok, err)
	}
	if _, ok, _ := c.lookup(ctx, d1); ok {
		t.Fatal("the least recently used bundle was kept over the bound")
	}
	if c.bytes > c.limit {
		t.Fatalf("%d bytes held, limit %d", c.bytes, c.limit)
	}
	// A digest that is not stored is an error, and nothing is held.
	if _, ok, err := c.get(ctx, st, manifest.Digest([]byte("none")), 10); ok || err == nil {
		t.Fatalf("missing bundle: ok=%v err=%v", ok, err)
	}
}
