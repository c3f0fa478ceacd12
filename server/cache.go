package server

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/drover/drover/server/store"
)

// maxCached bounds the cache; past it the cache starts over.
const maxCached = 200000

// cachedStore keeps what every agent request reads — the certificate state
// and the published manifest — in memory, so that the hot path (a manifest
// poll answered 304) does not touch the database. It is correct for one
// server process: every write that changes a cached value goes through it
// and invalidates after the write committed. A generation counter stops a
// read that raced with a write from caching the old value. With several
// replicas, share tells the others which agents' entries a write changed
// (the "inv" signal), and while bypass reports true (the signal bus is
// down, so another replica's write could go unheard) nothing is cached.
type cachedStore struct {
	store.Store

	mu        sync.RWMutex
	gen       atomic.Uint64
	certs     map[string]*store.AgentCert
	manifests map[string]*store.StoredManifest
	// onPromote, if set, is called after a renewal's certificate became
	// the agent's current one.
	onPromote func(id, serial string)
	// share, if set, tells the other replicas the agents whose entries a
	// write changed; bypass, if set and true, turns the cache off.
	share  func(ids []string)
	bypass func() bool
}

func newCachedStore(s store.Store) *cachedStore {
	return &cachedStore{Store: s, certs: map[string]*store.AgentCert{}, manifests: map[string]*store.StoredManifest{}}
}

func (c *cachedStore) invalidate(ids ...string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.gen.Add(1)
	for _, id := range ids {
		delete(c.certs, id)
		delete(c.manifests, id)
	}
}

// written invalidates after a committed write and tells the other
// replicas.
func (c *cachedStore) written(ids ...string) {
	c.invalidate(ids...)
	if c.share != nil {
		c.share(ids)
	}
}

// invalidateAll empties the cache.
func (c *cachedStore) invalidateAll() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.gen.Add(1)
	clear(c.certs)
	clear(c.manifests)
}

// cacheGet is the read-through part shared by both maps.
func cacheGet[V any](c *cachedStore, m map[string]*V, id string, load func() (*V, error)) (*V, error) {
	if c.bypass != nil && c.bypass() {
		return load()
	}
	c.mu.RLock()
	v, ok := m[id]
	c.mu.RUnlock()
	if ok {
		return v, nil
	}
	gen := c.gen.Load()
	v, err := load()
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	if c.gen.Load() == gen {
		if len(m) >= maxCached {
			clear(m)
		}
		m[id] = v
	}
	c.mu.Unlock()
	return v, nil
}

func (c *cachedStore) AgentCert(ctx context.Context, id string) (*store.AgentCert, error) {
	return cacheGet(c, c.certs, id, func() (*store.AgentCert, error) { return c.Store.AgentCert(ctx, id) })
}

func (c *cachedStore) GetManifest(ctx context.Context, id string) (*store.StoredManifest, error) {
	return cacheGet(c, c.manifests, id, func() (*store.StoredManifest, error) { return c.Store.GetManifest(ctx, id) })
}

func (c *cachedStore) SetNextCert(ctx context.Context, id, serial string, expires time.Time) error {
	defer c.written(id)
	return c.Store.SetNextCert(ctx, id, serial, expires)
}

func (c *cachedStore) PromoteCert(ctx context.Context, id, serial string) error {
	err := c.Store.PromoteCert(ctx, id, serial)
	c.written(id)
	if err == nil && c.onPromote != nil {
		if ac, err := c.Store.AgentCert(ctx, id); err == nil && ac.Serial == serial {
			c.onPromote(id, serial)
		}
	}
	return err
}

func (c *cachedStore) RevokeAgent(ctx context.Context, id string, now time.Time) error {
	defer c.written(id)
	return c.Store.RevokeAgent(ctx, id, now)
}

func (c *cachedStore) EnrollAgent(ctx context.Context, tokenID string, now time.Time, a *store.Agent) error {
	defer c.written(a.ID)
	return c.Store.EnrollAgent(ctx, tokenID, now, a)
}

func (c *cachedStore) SaveManifests(ctx context.Context, ms []*store.StoredManifest) ([]string, error) {
	ids := make([]string, len(ms))
	for i, m := range ms {
		ids[i] = m.AgentID
	}
	defer c.written(ids...)
	return c.Store.SaveManifests(ctx, ms)
}

func (c *cachedStore) DeleteAgent(ctx context.Context, id string) error {
	defer c.written(id)
	return c.Store.DeleteAgent(ctx, id)
}
