package server

import (
	"time"

	"github.com/drover/drover/server/store"
	"github.com/drover/drover/server/stream"
)

// The state that only one server replica can hold sits behind these
// interfaces, each with its in-memory implementation, so that several
// replicas can replace them one by one (docs/design.md, "Planned"). The
// store (store.Store, with its cache cachedStore in front) and the
// fleet-wide loops (leader) have their own.
type (
	// liveStreams reaches the agents' live streams; stream.Hub holds the
	// streams of this process.
	liveStreams interface {
		stream.Notifier
		Count() int
		CloseAll(cause error)
	}
	// rateLimit allows an event of key at now, or not; rateLimiter counts
	// in memory.
	rateLimit interface {
		allow(key string, now time.Time) bool
	}
	// logNotifier wakes the live-log followers of a run when its records
	// commit; logWatchers wakes those of this process.
	logNotifier interface {
		watch(runID string) (wake chan struct{}, stop func())
		notify(recs []*store.Record)
	}
	// dataDirLock is held while a server uses its data dir; dirLock is an
	// flock on server.lock.
	dataDirLock interface {
		release()
	}
)

var (
	_ liveStreams = (*stream.Hub)(nil)
	_ rateLimit   = (*rateLimiter)(nil)
	_ logNotifier = (*logWatchers)(nil)
	_ dataDirLock = (*dirLock)(nil)
)
