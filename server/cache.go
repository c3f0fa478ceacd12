package server

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/drover/drover/server/store"
)

// maxCached bounds each of the cache's maps; past it that map starts over.
const maxCached = 200000

// cachedStore keeps what every agent request reads — the certificate state
// and the published manifest — in memory, so that the hot path (a manifest
// poll answered 304) does not touch the database. It is correct for one
// server process: every write that changes a cached value goes through it.
// The two kinds are kept apart: a certificate write evicts the agent's
// certificate entry, a manifest save puts the saved manifests in place of
// the old entries (the compiler's result is what the database now holds,
// so the fetches a change sets off never read it back). Each kind has a
// generation counter that stops a read that raced with a write of that
// kind from caching the old value. With several replicas, share tells the
// others which agents' entries a write changed (the "inv" signal; they
// evict both kinds), and while bypass reports true (the signal bus is
// down, so another replica's write could go unheard) nothing is cached.
type cachedStore struct {
	store.Store

	mu        sync.RWMutex
	certs     cacheMap[store.AgentCert]
	manifests cacheMap[store.StoredManifest]
	// onPromote, if set, is called after a renewal's certificate became
	// the agent's current one.
	onPromote func(id, serial string)
	// share, if set, tells the other replicas the agents whose entries a
	// write changed; bypass, if set and true, turns the cache off.
	share  func(ids []string)
	bypass func() bool
}

// cacheMap is one kind of cached value, guarded by cachedStore.mu.
type cacheMap[V any] struct {
	gen atomic.Uint64
	m   map[string]*V
}

func newCachedStore(s store.Store) *cachedStore {
	c := &cachedStore{Store: s}
	c.certs.m = map[string]*store.AgentCert{}
	c.manifests.m = map[string]*store.StoredManifest{}
	return c
}

// evict drops ids from m; the caller holds c.mu.
func evict[V any](m *cacheMap[V], ids ...string) {
	m.gen.Add(1)
	for _, id := range ids {
		delete(m.m, id)
	}
}

// invalidate drops both kinds of entry of ids.
func (c *cachedStore) invalidate(ids ...string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	evict(&c.certs, ids...)
	evict(&c.manifests, ids...)
}

// written drops both kinds of entry of ids after a committed write and
// tells the other replicas.
func (c *cachedStore) written(ids ...string) {
	c.invalidate(ids...)
	c.shared(ids)
}

// certsWritten drops the certificate entries of ids after a committed
// write and tells the other replicas.
func (c *cachedStore) certsWritten(ids ...string) {
	c.mu.Lock()
	evict(&c.certs, ids...)
	c.mu.Unlock()
	c.shared(ids)
}

func (c *cachedStore) shared(ids []string) {
	if c.share != nil && len(ids) > 0 {
		c.share(ids)
	}
}

// invalidateAll empties the cache.
func (c *cachedStore) invalidateAll() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.certs.gen.Add(1)
	c.manifests.gen.Add(1)
	clear(c.certs.m)
	clear(c.manifests.m)
}

// cacheGet is the read-through part shared by both maps.
func cacheGet[V any](c *cachedStore, m *cacheMap[V], id string, load func() (*V, error)) (*V, error) {
	if c.bypass != nil && c.bypass() {
		return load()
	}
	c.mu.RLock()
	v, ok := m.m[id]
	c.mu.RUnlock()
	if ok {
		return v, nil
	}
	gen := m.gen.Load()
	v, err := load()
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	if m.gen.Load() == gen {
		if len(m.m) >= maxCached {
			clear(m.m)
		}
		m.m[id] = v
	}
	c.mu.Unlock()
	return v, nil
}

func (c *cachedStore) AgentCert(ctx context.Context, id string) (*store.AgentCert, error) {
	return cacheGet(c, &c.certs, id, func() (*store.AgentCert, error) { return c.Store.AgentCert(ctx, id) })
}

func (c *cachedStore) GetManifest(ctx context.Context, id string) (*store.StoredManifest, error) {
	return cacheGet(c, &c.manifests, id, func() (*store.StoredManifest, error) { return c.Store.GetManifest(ctx, id) })
}

func (c *cachedStore) SetNextCert(ctx context.Context, id, serial string, expires time.Time) error {
	defer c.certsWritten(id)
	return c.Store.SetNextCert(ctx, id, serial, expires)
}

func (c *cachedStore) PromoteCert(ctx context.Context, id, serial string) error {
	err := c.Store.PromoteCert(ctx, id, serial)
	c.certsWritten(id)
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

// EnrollAgents enrolls es and caches the certificate state of each agent
// it enrolled — a new row holds exactly the issued serial, no renewal, not
// revoked — so that the new agents' first stream and poll do not read it
// back. The generation counter keeps a write that raced with the
// enrollment (a revocation of an agent listed meanwhile) from being
// covered up: then the entries are only evicted.
func (c *cachedStore) EnrollAgents(ctx context.Context, es []store.Enrollment) ([]error, error) {
	gen := c.certs.gen.Load()
	failed, err := c.Store.EnrollAgents(ctx, es)
	ids := make([]string, len(es))
	for i, e := range es {
		ids[i] = e.Agent.ID
	}
	c.mu.Lock()
	fill := err == nil && len(failed) == len(es) && c.certs.gen.Load() == gen && (c.bypass == nil || !c.bypass())
	evict(&c.certs, ids...)
	evict(&c.manifests, ids...)
	if fill {
		for i, e := range es {
			if failed[i] != nil {
				continue
			}
			if len(c.certs.m) >= maxCached {
				clear(c.certs.m)
			}
			c.certs.m[e.Agent.ID] = &store.AgentCert{Serial: e.Agent.CertSerial}
		}
	}
	c.mu.Unlock()
	c.shared(ids)
	return failed, err
}

// SaveManifests saves ms and, once committed, caches the ones saved: they
// are what a read would now return. Those another replica saved over
// meanwhile (stale, refused) and all of them when the save failed (the
// transaction may or may not have committed) are evicted instead. The
// cache keeps the higher of a cached and a saved serial, and the other
// replicas are told of every saved agent.
func (c *cachedStore) SaveManifests(ctx context.Context, ms []*store.StoredManifest) ([]string, error) {
	stale, err := c.Store.SaveManifests(ctx, ms)
	saved := make([]string, 0, len(ms))
	c.mu.Lock()
	c.manifests.gen.Add(1)
	for _, m := range ms {
		if err != nil || slices.Contains(stale, m.AgentID) || (c.bypass != nil && c.bypass()) {
			delete(c.manifests.m, m.AgentID)
			continue
		}
		saved = append(saved, m.AgentID)
		if old, ok := c.manifests.m[m.AgentID]; ok && old.Serial > m.Serial {
			continue
		}
		if len(c.manifests.m) >= maxCached {
			clear(c.manifests.m)
		}
		c.manifests.m[m.AgentID] = m
	}
	c.mu.Unlock()
	if err != nil {
		saved = saved[:0]
		for _, m := range ms {
			saved = append(saved, m.AgentID)
		}
	}
	c.shared(saved)
	return stale, err
}

func (c *cachedStore) DeleteAgent(ctx context.Context, id string) error {
	defer c.written(id)
	return c.Store.DeleteAgent(ctx, id)
}
