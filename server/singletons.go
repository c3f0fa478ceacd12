package server

import (
	"context"
	"time"

	"github.com/drover/drover/server/store"
)

// The state that only one server replica can hold sits behind these
// interfaces, each with its in-memory implementation, so that several
// replicas can replace them one by one (docs/design.md, "Planned"). The
// store (store.Store, with its cache cachedStore in front) and the
// fleet-wide loops (leader) have their own.
type (
	// liveStreams reaches the agents' live streams wherever they are:
	// fleet acts on this process's (a stream.Hub) and signals the other
	// replicas over the bus (signals.go).
	liveStreams interface {
		// SyncNow tells the agent that manifest serial is out.
		SyncNow(agentID string, serial uint64)
		// RunNow asks each agent to run a pipe now and returns those whose
		// live stream took the command.
		RunNow(ctx context.Context, agentIDs []string, pipe, requestID string) map[string]bool
		// Cancel asks the agent to cancel a run; false when no live stream
		// took the command.
		Cancel(ctx context.Context, agentID, runID string) bool
		// Online reports whether the agent has a live stream.
		Online(agentID string) bool
		// Close ends the agent's live stream with cause (revoked, deleted).
		Close(agentID string, cause error)
		// Retire ends the agent's live stream unless it was opened with
		// the certificate serial now current.
		Retire(agentID, serial string)
		// Count is the number of live streams on this replica.
		Count() int
		// CloseAll ends this replica's live streams (shutdown).
		CloseAll(cause error)
	}
	// rateLimit allows an event of key at now, or not; rateLimiter counts
	// in memory.
	rateLimit interface {
		allow(key string, now time.Time) bool
	}
	// logNotifier wakes the live-log followers of a run when its records
	// commit; logWatchers wakes those of this process, fleetLogs also
	// those on other replicas (signals.go).
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
	_ liveStreams = (*fleet)(nil)
	_ rateLimit   = (*rateLimiter)(nil)
	_ logNotifier = (*logWatchers)(nil)
	_ logNotifier = fleetLogs{}
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
