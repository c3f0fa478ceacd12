package server

import (
	"context"
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

// manifestCompiler compiles, signs and stores the agents' manifests; it
// holds the compile lock (one compilation at a time keeps serials rising).
// compilerSeam puts compiler.go behind it.
type manifestCompiler interface {
	// Compile recompiles the manifests of agentIDs (nil: every agent) and
	// publishes those that changed.
	Compile(ctx context.Context, agentIDs []string) (changed int, err error)
	// ResignDue re-signs the manifests past half their lifetime.
	ResignDue(ctx context.Context) (resigned int, err error)
	// SecretChanged re-signs the manifests of the agents using a secret.
	SecretChanged(ctx context.Context, name string) error
	// Place renews leases and hands placement: one pipes over when due
	// (placement.go); RequestMove asks for a pipe to move to an agent;
	// AwaitsRelease says an agent's next status may hand a pipe over.
	Place(ctx context.Context) (changed int, err error)
	RequestMove(ctx context.Context, pipe, to string) error
	AwaitsRelease(agentID string) bool
}

type compilerSeam struct{ c *compiler }

func (s compilerSeam) Compile(ctx context.Context, ids []string) (int, error) {
	return s.c.compile(ctx, ids)
}
func (s compilerSeam) ResignDue(ctx context.Context) (int, error) { return s.c.resignDue(ctx) }
func (s compilerSeam) SecretChanged(ctx context.Context, name string) error {
	return s.c.secretChanged(ctx, name)
}
func (s compilerSeam) Place(ctx context.Context) (int, error) { return s.c.run(ctx, []string{}, false) }
func (s compilerSeam) RequestMove(ctx context.Context, pipe, to string) error {
	return s.c.requestMove(ctx, pipe, to)
}
func (s compilerSeam) AwaitsRelease(id string) bool { return s.c.awaitsRelease(id) }
