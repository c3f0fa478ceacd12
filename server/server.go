package server

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"github.com/drover/drover/internal/tick"
	"github.com/drover/drover/server/notify"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"runtime/debug"
	rtmetrics "runtime/metrics"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coreos/go-systemd/v22/daemon"
	"github.com/drover/drover/api"
	"github.com/drover/drover/server/bus"
	"github.com/drover/drover/server/compile"
	"github.com/drover/drover/server/errs"
	"github.com/drover/drover/server/pki"
	"github.com/drover/drover/server/store"
	"github.com/drover/drover/server/store/postgres"
	"github.com/drover/drover/server/store/sqlite"
	"github.com/drover/drover/server/stream"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"

	agentpb "github.com/drover/drover/proto"
	"github.com/drover/drover/signing"
)

// Clock tells the time; tests pass one they control.
type Clock interface{ Now() time.Time }

type systemClock struct{}

func (systemClock) Now() time.Time { return time.Now() }

// SystemClock returns the real clock.
func SystemClock() Clock { return systemClock{} }

// maintenanceInterval is how often the server re-signs manifests due for it
// and refreshes the key list.
const maintenanceInterval = time.Minute

// Server is the control plane: the HTTPS API and the gRPC telemetry stream
// over one store. Create it with New, then call Run once.
type Server struct {
	cfg        Config
	log        *slog.Logger
	clock      Clock
	lock       dataDirLock
	ca         *pki.CA
	keys       *pki.Keyring
	admin      *pki.AdminToken
	auth       *authenticator
	sealer     *pki.Sealer
	store      store.Store
	compiler   manifestCompiler
	hub        liveStreams // fleet: this replica's streams and the others' (signals.go)
	fleet      *fleet
	ingest     *stream.Ingester
	monitor    *monitor // missed.go, events.go
	leader     leader
	notifier   *notify.Deliverer // http_notify.go
	streams    *stream.Service
	publicHost string

	elector *lockLeader // the leader lock of replicas on PostgreSQL; nil alone
	kek     *pki.KEK    // set when the keys live in the store
	// singletonHook, if set (tests), is told when each singleton starts
	// and stops running on this replica.
	singletonHook func(name string, running bool)

	metrics        *metrics
	metricsHandler http.Handler
	logWatch       logNotifier
	logStreams     chan struct{} // bounds live log streams
	placeWake      chan struct{} // wakes the leases loop (placement.go)
	quit           chan struct{} // closed when the server starts draining

	enrollLimiter  rateLimit
	enrollRequests atomic.Int64
	enrolls        *enrollQueue    // enroll_batch.go
	refusals       *refusalAuditor // http_audit.go
	guard          *guards         // http_guards.go

	agentsMu    sync.Mutex
	agentStates map[string]*agentMem // per-agent quotas and manifest pipes (limits.go)
	payloadSem  chan struct{}        // bounds payload downloads in all
	payloads    *payloadCache        // bundles by digest (payloadcache.go)
	syncs       *syncSpreader        // paces SyncNow after a recompile (syncspread.go)
	bulk        *bulkWrites          // a fleet's recompile saving (compiler.go)
	agentSlots  *pool                // the agents' request slots (http.agent_max_concurrent)
	handshakes  connsInHandshake     // HTTPS connections accepted and not yet serving a request
	fds         *fdBudget            // the open-files limit shared by both listeners (fdbudget.go)
	publishing  sync.WaitGroup       // recompiles a pipe PUT left running (compiler.go publishAll)

	httpLn  net.Listener
	grpcLn  net.Listener
	httpSrv *http.Server
	// profileLn and profileSrv serve Go's profiles (runtime.profile_addr,
	// profile.go); nil unless configured.
	profileLn  net.Listener
	profileSrv *http.Server
	grpcSrv    *grpc.Server
	// grpcHealth answers the standard gRPC health check.
	grpcHealth *health.Server

	stopping atomic.Bool
	ran      atomic.Bool
}

// New prepares the data dir (creating keys, certificates and tokens on first
// start), opens the store, compiles manifests and binds both listeners (and
// the profile address, when configured), so that HTTPAddr and GRPCAddr are
// known before Run. On error everything
// acquired is released.
func New(cfg Config, logger *slog.Logger, clock Clock) (*Server, error) {
	return newServer(cfg, logger, clock, func(ctx context.Context) (store.Store, error) {
		if cfg.Store.Driver == "postgres" {
			return postgres.Open(ctx, cfg.Store.DSN, postgres.Pool{MaxConns: int32(cfg.Store.MaxConns), MinConns: int32(cfg.Store.MinConns),
				MaxConnLifetime: cfg.Store.MaxConnLifetime, MaxConnIdleTime: cfg.Store.MaxConnIdleTime})
		}
		return sqlite.Open(ctx, filepath.Join(cfg.DataDir, "server.db"), cfg.Store.Synchronous)
	})
}

// NewWithStore is New over a store the caller opened (any store.Store that
// passes storetest); the server owns it from then on and closes it when it
// stops or when NewWithStore fails.
func NewWithStore(cfg Config, st store.Store, logger *slog.Logger, clock Clock) (*Server, error) {
	taken := false
	srv, err := newServer(cfg, logger, clock, func(context.Context) (store.Store, error) { taken = true; return st, nil })
	if err != nil && !taken {
		st.Close()
	}
	return srv, err
}

func newServer(cfg Config, logger *slog.Logger, clock Clock, open func(context.Context) (store.Store, error)) (srv *Server, err error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	if clock == nil {
		clock = SystemClock()
	}
	hub := stream.NewHub()
	logs := newLogWatchers()
	s := &Server{cfg: cfg, log: logger, clock: clock,
		enrollLimiter: newRateLimiter(cfg.Enrollment.RatePerMinute, cfg.Enrollment.Burst),
		logWatch:      logs, logStreams: make(chan struct{}, cfg.LiveLogs.MaxFollowers), quit: make(chan struct{}), placeWake: make(chan struct{}, 1),
		refusals: newRefusalAuditor(), guard: newGuards(cfg),
		agentStates: map[string]*agentMem{}, payloadSem: make(chan struct{}, cfg.Agents.PayloadFetches),
		payloads: newPayloadCache(payloadCacheBytes, payloadCacheMaxEntry)}
	s.agentSlots = newPool(cfg.HTTP.AgentMaxConcurrent)
	if cfg.GRPC.CarryManifestBytes > 0 {
		hub.CarryManifests(s.publishedManifest, cfg.GRPC.CarryManifestBytes)
	}
	// Through the fleet (set below): an agent streaming to another replica
	// is told by a sync signal.
	s.bulk = &bulkWrites{}
	s.syncs = newSyncSpreader(func(id string, serial uint64) { s.fleet.SyncNow(id, serial) },
		hub.Count, func() bool {
			inUse, slots := s.agentSlots.usage()
			return agentsBusy(inUse, slots, s.handshakes.n.Load())
		})
	if cfg.GRPC.CarryManifestBytes == 0 {
		// Every SyncNow sets off a poll: hold them while the fleet's
		// recompile saves (syncspread.go).
		s.syncs.hold = func() bool { return s.bulk.UnderWay() != nil }
	}
	s.syncs.log = logger
	defer func() {
		if err != nil {
			s.release()
		}
	}()
	if l := cfg.ReplicaURLs(); len(l) > 0 {
		if u, err := url.Parse(l[0]); err == nil {
			s.publicHost = u.Hostname()
		}
	}
	if err := ensureDataDir(cfg.DataDir); err != nil {
		return nil, err
	}
	lock, err := lockDataDir(cfg.DataDir)
	if err != nil {
		return nil, err
	}
	s.lock = lock
	now := clock.Now()
	var tlsCert tls.Certificate
	if keysInStore(&cfg) {
		// Read the KEK before connecting: a missing or unreadable file is
		// the first thing to fix.
		if s.kek, err = pki.LoadKEK(cfg.KEKFile); err != nil {
			return nil, err
		}
	} else if tlsCert, err = s.loadKeys(now); err != nil {
		return nil, err
	}
	ctx := context.Background()
	st, err := open(ctx)
	if err != nil {
		return nil, err
	}
	if s.kek != nil {
		if tlsCert, err = s.loadStoredKeys(ctx, st, now); err != nil {
			st.Close()
			return nil, err
		}
	}
	cs := newCachedStore(st)
	// The signal bus: LISTEN/NOTIFY when replicas share a PostgreSQL
	// database, else a bus of one.
	var sigBus bus.Bus = bus.NewNetwork().Join()
	if pg, ok := st.(*postgres.DB); ok {
		sigBus = bus.NewPostgres(pg.ListenConfig(), pg.SQL(), logger)
	}
	s.fleet = newFleet(s, hub, sigBus, logs)
	s.hub, s.logWatch = s.fleet, fleetLogs{logs, s.fleet}
	cs.share = func(ids []string) { s.fleet.send("inv", sigBody{IDs: ids}) }
	cs.bypass = func() bool { return !sigBus.Up() }
	// A promoted renewal retires the previous certificate: a stream opened
	// with it is closed, as revocation closes streams.
	cs.onPromote = func(id, serial string) { s.hub.Retire(id, serial) }
	s.store = cs
	s.auth = newAuthenticator(s.store, clock)
	if err := ensureBootstrapToken(ctx, s.store, s.admin, now); err != nil {
		return nil, err
	}
	comp := &compiler{bulk: s.bulk, store: s.store, keys: s.keys, clock: clock, lifetime: cfg.Signing.ManifestLifetime, log: logger, published: s.published,
		leases: compile.Leases{Lease: cfg.Placement.Lease, SkewMargin: cfg.Placement.SkewMargin}, healthy: s.agentHealthy, holdUntil: now.Add(cfg.GRPC.OfflineAfter),
		leading: func() bool { return s.leader.leading() }}
	if s.kek != nil {
		comp.syncKeys = s.syncKeys
	}
	s.compiler = compilerSeam{comp}
	s.enrolls = s.newEnrollQueue()
	s.ingest = stream.NewIngester(st, cfg.Store.IngestBatch, cfg.Store.IngestDelay, store.IngestLimits{MaxLogBytes: cfg.Runs.MaxLogBytes, Marker: truncationMarker(cfg.Runs.MaxLogBytes)}, logger, s.afterCommit)
	if cfg.Store.Driver == "sqlite" {
		// One writer: the ingester gives way to the fleet's recompiles.
		s.ingest.GiveWayTo(s.bulk)
	}
	s.monitor, s.leader = newMonitor(s), soleLeader{}
	if ls, ok := st.(interface {
		SessionLock(key int64) *postgres.SessionLock
	}); ok {
		s.elector = newLockLeader(ls.SessionLock(postgres.LeaderLock), logger)
		s.leader = s.elector
	}
	s.notifier = notify.NewDeliverer(s.store, s.sealer.Open, clock.Now, logger, cfg.Notify)
	s.streams = stream.NewService(stream.Config{MaxStreams: cfg.GRPC.MaxStreams, PendingStreams: cfg.Agents.PendingStreams,
		HelloTimeout: cfg.Agents.HelloTimeout, MaxChunkBytes: cfg.Runs.MaxChunkBytes, MaxRunningIDs: cfg.Agents.MaxRunningIDs},
		streamHost{s}, hub, s.ingest, clock, logger)
	s.metrics = newMetrics(s)
	s.metricsHandler = newMetricsHandler(s.metrics)
	// Catch up with anything that changed while the server was down (a key
	// rotation done offline, manifests that passed half their lifetime).
	if n, err := s.compiler.Compile(ctx, nil); err != nil {
		return nil, err
	} else if n > 0 {
		logger.Info("manifests recompiled at start", "changed", n)
	}

	s.fds = newFDBudget()
	if cfg.Store.Driver == "postgres" {
		// The pool opens its connections as it needs them; two more are the
		// leader's lock and the signal bus.
		s.fds.base += int64(cfg.Store.MaxConns) + 2
	}
	s.httpSrv = &http.Server{
		Handler:           s.fds.closeWhenPressed(s.routes()),
		ReadHeaderTimeout: cfg.HTTP.ReadHeaderTimeout,
		ReadTimeout:       cfg.HTTP.ReadTimeout,
		WriteTimeout:      cfg.HTTP.WriteTimeout,
		IdleTimeout:       cfg.HTTP.IdleTimeout,
		MaxHeaderBytes:    cfg.HTTP.MaxHeaderBytes,
		ErrorLog:          slog.NewLogLogger(logger.Handler(), slog.LevelDebug),
		ConnState: func(c net.Conn, st http.ConnState) {
			s.handshakes.track(c, st)
			s.fds.closeIdleWhenPressed(c, st)
		},
		TLSConfig: &tls.Config{
			MinVersion:   tls.VersionTLS12,
			CipherSuites: signing.TLSCipherSuites(),
			Certificates: []tls.Certificate{tlsCert},
			ClientAuth:   tls.VerifyClientCertIfGiven,
			ClientCAs:    s.ca.Pool(),
		},
	}
	grpcTLS := &tls.Config{
		MinVersion:   tls.VersionTLS12,
		CipherSuites: signing.TLSCipherSuites(),
		Certificates: []tls.Certificate{tlsCert},
		ClientAuth:   tls.RequireAndVerifyClientCert,
		ClientCAs:    s.ca.Pool(),
	}
	s.grpcSrv = grpc.NewServer(
		grpc.Creds(credentials.NewTLS(grpcTLS)),
		grpc.MaxRecvMsgSize(cfg.GRPC.MaxRecvBytes),
		grpc.MaxConcurrentStreams(16),
		grpc.ConnectionTimeout(cfg.GRPC.ConnectTimeout),
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: cfg.GRPC.KeepaliveTime, Timeout: cfg.GRPC.KeepaliveWait, MaxConnectionIdle: cfg.GRPC.IdleTimeout}),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 5 * time.Second, PermitWithoutStream: true}),
		// Per-connection buffers sized for a fleet of mostly idle streams.
		// No read buffer: gRPC's (32 KiB by default) would be held by every
		// connection for its life, and it would only copy again what the
		// TLS connection already holds decrypted (crypto/tls buffers a
		// whole record), so the HTTP/2 framer reads the TLS connection
		// directly. The write buffer goes back to a shared pool after each
		// flush; a log chunk larger than it takes several writes. The
		// flow-control windows are fixed (agentpb.StreamWindowBytes), which
		// switches off gRPC's bandwidth estimator and its PING per message.
		grpc.ReadBufferSize(0),
		grpc.WriteBufferSize(grpcWriteBufferBytes),
		grpc.StaticStreamWindowSize(agentpb.StreamWindowBytes),
		grpc.StaticConnWindowSize(agentpb.StreamWindowBytes),
	)
	agentpb.RegisterAgentServer(s.grpcSrv, s.streams)
	// The standard gRPC health service, for the agents' liveness probe of
	// an idle stream and for load balancers that hold an agent certificate:
	// SERVING until the server begins to stop.
	s.grpcHealth = health.NewServer()
	healthpb.RegisterHealthServer(s.grpcSrv, s.grpcHealth)

	if s.httpLn, err = net.Listen("tcp", cfg.HTTPAddr); err != nil {
		return nil, fmt.Errorf("listen https: %w", err)
	}
	s.httpLn = newWatchedListener(s.httpLn, "https", s.metrics.acceptErrors, logger).withBudget(s.fds, httpFDReserve)
	if s.grpcLn, err = net.Listen("tcp", cfg.GRPCAddr); err != nil {
		return nil, fmt.Errorf("listen grpc: %w", err)
	}
	s.grpcLn = newWatchedListener(s.grpcLn, "grpc", s.metrics.acceptErrors, logger).withBudget(s.fds, streamFDReserve)
	if s.profileLn, err = listenProfiles(cfg.Runtime.ProfileAddr); err != nil {
		return nil, err
	}
	return s, nil
}

// applyRuntime sets the collector's settings the configuration gives; they
// are the process's, so in a process that runs several servers (tests) the
// last one started sets them. It logs the settings in effect.
func applyRuntime(c RuntimeConfig, log *slog.Logger) {
	if c.GCPercent != 0 {
		debug.SetGCPercent(c.GCPercent)
	}
	if c.MemoryLimitBytes != 0 {
		debug.SetMemoryLimit(c.MemoryLimitBytes)
	}
	samples := []rtmetrics.Sample{{Name: "/gc/gogc:percent"}, {Name: "/gc/gomemlimit:bytes"}}
	rtmetrics.Read(samples)
	if samples[0].Value.Kind() == rtmetrics.KindUint64 && samples[1].Value.Kind() == rtmetrics.KindUint64 {
		log.Info("go runtime", "gc_percent", samples[0].Value.Uint64(), "memory_limit_bytes", samples[1].Value.Uint64())
	}
}

// grpcWriteBufferBytes is the size of an agent connection's gRPC write
// buffer, taken from a shared pool while a write is flushed.
const grpcWriteBufferBytes = 8 << 10

// loadKeys loads (creating on first start) the CA, the keyring, the
// secrets key and the admin token from the data dir, and returns the
// server's TLS certificate.
func (s *Server) loadKeys(now time.Time) (tls.Certificate, error) {
	cfg := &s.cfg
	var err error
	if s.ca, err = pki.LoadOrCreateCA(cfg.DataDir, now); err != nil {
		return tls.Certificate{}, err
	}
	tlsCert, err := pki.LoadOrCreateServerCert(cfg.DataDir, s.ca, serverSANs(cfg), now)
	if err != nil {
		return tls.Certificate{}, err
	}
	if s.keys, err = pki.LoadOrCreateKeyring(cfg.DataDir, signing.Algorithm(cfg.Signing.Algorithm), now, cfg.Signing.KeyListLifetime); err != nil {
		return tls.Certificate{}, err
	}
	if _, err := s.keys.Refresh(now, cfg.Signing.KeyListLifetime); err != nil {
		return tls.Certificate{}, err
	}
	secretsKey, err := pki.LoadOrCreateSecret(cfg.DataDir, "secrets.key")
	if err != nil {
		return tls.Certificate{}, err
	}
	if s.sealer, err = pki.NewSealer(secretsKey); err != nil {
		return tls.Certificate{}, err
	}
	if s.admin, err = pki.LoadOrCreateAdminToken(cfg.DataDir); err != nil {
		return tls.Certificate{}, err
	}
	return tlsCert, nil
}

// keysInStore tells where the server's keys live: sealed in the store with
// the KEK for PostgreSQL (every replica shares them), files in the data
// dir for SQLite.
func keysInStore(cfg *Config) bool { return cfg.Store.Driver == "postgres" }

// loadStoredKeys loads the keys sealed in the store (initialising them on
// the first replica's first start), writes the local copies the host's
// tools read, and returns this replica's own TLS certificate (issued by
// the shared CA, kept in its data dir).
func (s *Server) loadStoredKeys(ctx context.Context, st store.KeyStore, now time.Time) (tls.Certificate, error) {
	cfg := &s.cfg
	m, created, err := pki.OpenStoredKeys(ctx, st, s.kek, cfg.DataDir, signing.Algorithm(cfg.Signing.Algorithm), now, cfg.Signing.KeyListLifetime)
	if errors.Is(err, pki.ErrWrongKEK) {
		return tls.Certificate{}, fmt.Errorf("kek_file %s does not open the server keys stored in the database; every replica must use the KEK file of the replica that first started on this database: %w", cfg.KEKFile, err)
	}
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("server keys in the database: %w", err)
	}
	if created {
		s.log.Info("server keys stored in the database, sealed with the KEK", "kek_id", s.kek.ID(), "ca_pin", m.CA.Pin())
	} else {
		s.log.Info("server keys loaded from the database", "kek_id", s.kek.ID(), "ca_pin", m.CA.Pin())
	}
	s.ca, s.keys, s.admin = m.CA, m.Keys, m.Admin
	if s.sealer, err = pki.NewSealer(m.SecretsKey); err != nil {
		return tls.Certificate{}, err
	}
	if err := pki.WriteLocalCopies(cfg.DataDir, m); err != nil {
		return tls.Certificate{}, err
	}
	if _, err := s.refreshKeyList(ctx, now); err != nil {
		return tls.Certificate{}, err
	}
	return pki.LoadOrCreateServerCert(cfg.DataDir, s.ca, serverSANs(cfg), now)
}

// keySyncInterval is how often a replica with keys in the store looks for
// a key list another replica published (a compilation also looks first).
const keySyncInterval = 2 * time.Second

// syncKeys loads the key list another replica published, if any.
func (s *Server) syncKeys(ctx context.Context) error {
	changed, err := s.keys.Sync(ctx)
	if err != nil {
		return fmt.Errorf("load the key list from the database: %w", err)
	}
	if changed {
		signer, v := s.keys.Signer()
		s.log.Info("key list loaded from the database", "key_id", signer.KeyID(), "key_list_version", v)
	}
	return nil
}

// refreshKeyList re-signs the key list past half its lifetime; a replica
// that did it meanwhile wins, and its list is loaded instead.
func (s *Server) refreshKeyList(ctx context.Context, now time.Time) (bool, error) {
	changed, err := s.keys.Refresh(now, s.cfg.Signing.KeyListLifetime)
	if errors.Is(err, errs.ErrConflict) {
		return true, s.syncKeys(ctx)
	}
	return changed, err
}

// release closes what New acquired, for a server that will not run.
func (s *Server) release() {
	for _, ln := range []net.Listener{s.httpLn, s.grpcLn, s.profileLn} {
		if ln != nil {
			ln.Close()
		}
	}
	if s.store != nil {
		s.store.Close()
	}
	if s.lock != nil {
		s.lock.release()
	}
}

// ReadAdminToken returns the admin token stored in a data dir, for clients
// on the same host (tests, `drover-server keys rotate`).
func ReadAdminToken(dataDir string) (string, error) { return pki.ReadAdminToken(dataDir) }

// HTTPAddr is the bound HTTPS address.
func (s *Server) HTTPAddr() string { return s.httpLn.Addr().String() }

// GRPCAddr is the bound gRPC address.
func (s *Server) GRPCAddr() string { return s.grpcLn.Addr().String() }

// CAPin is the pin that enrollment tokens of this server carry.
func (s *Server) CAPin() string { return s.ca.Pin() }

// CACertPEM is the CA certificate clients trust.
func (s *Server) CACertPEM() []byte { return s.ca.PEM() }

// afterCommit runs after a batch of agent records is committed: metrics,
// the live log streams of the runs it touched, events, and the
// notifications when there are new events to route (at idle a fleet's
// heartbeats commit many batches a second; a routing pass for each, three
// queries and a write, was a sixth of the idle server's CPU).
func (s *Server) afterCommit(recs []*store.Record) {
	s.metrics.committed(recs, s.clock.Now())
	s.logWatch.notify(recs)
	events := s.monitor.observe(recs)
	s.statusCommitted(recs)
	if events {
		s.notifier.Wake()
	}
}

// published tells an agent's live stream that a new manifest is out,
// paced with the other agents of the same recompile.
func (s *Server) published(agentID string, serial uint64) {
	s.syncs.add(agentID, serial)
}

// rotateKeys adds a new manifest key through a new root-signed key list and
// re-signs every manifest with it.
func (s *Server) rotateKeys(ctx context.Context) (*api.RotateResponse, error) {
	if s.kek != nil {
		if err := s.syncKeys(ctx); err != nil {
			return nil, err
		}
	}
	err := s.keys.Rotate(s.clock.Now(), s.cfg.Signing.KeyListLifetime)
	if errors.Is(err, errs.ErrConflict) {
		// Another replica changed the key list since the sync: load it
		// and rotate over it.
		if err := s.syncKeys(ctx); err != nil {
			return nil, err
		}
		err = s.keys.Rotate(s.clock.Now(), s.cfg.Signing.KeyListLifetime)
	}
	if err != nil {
		return nil, err
	}
	signer, v := s.keys.Signer()
	s.log.Info("manifest key rotated", "key_id", signer.KeyID(), "key_list_version", v)
	if _, err := s.compiler.Compile(ctx, nil); err != nil {
		return nil, err
	}
	return &api.RotateResponse{KeyID: signer.KeyID(), KeyListVersion: v}, nil
}

// Run serves until ctx is cancelled, then drains: HTTP requests in flight
// finish, every stream commits and acknowledges what it received, and the
// store is closed. It tells systemd READY=1 once serving and pings the
// watchdog when one is configured.
func (s *Server) Run(ctx context.Context) error {
	if !s.ran.CompareAndSwap(false, true) {
		return errors.New("server: Run called twice")
	}
	applyRuntime(s.cfg.Runtime, s.log)
	go s.ingest.Run()
	errc := make(chan error, 2)
	go func() {
		if err := s.httpSrv.ServeTLS(s.httpLn, "", ""); err != nil && !errors.Is(err, http.ErrServerClosed) {
			errc <- fmt.Errorf("https: %w", err)
		}
	}()
	go func() {
		if err := s.grpcSrv.Serve(s.grpcLn); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			errc <- fmt.Errorf("grpc: %w", err)
		}
	}()
	if s.profileLn != nil {
		s.profileSrv = profileServer()
		go serveProfiles(s.profileSrv, s.profileLn, s.log)
	}
	bg, stopBG := context.WithCancel(context.Background())
	defer stopBG()
	var bgWG sync.WaitGroup
	bgWG.Add(1)
	go func() { defer bgWG.Done(); s.watchdog(bg) }()
	if s.elector != nil {
		bgWG.Add(1)
		go func() { defer bgWG.Done(); s.elector.run(bg) }()
	}
	if s.kek != nil {
		bgWG.Add(1)
		go func() {
			defer bgWG.Done()
			tick.Every(bg, keySyncInterval, nil, func() {
				if err := s.syncKeys(bg); err != nil && bg.Err() == nil {
					s.log.Warn("key list sync", "err", err)
				}
			})
		}()
	}
	// The singletons: fleet-wide loops that one server runs at a time.
	bgWG.Add(1)
	go func() { defer bgWG.Done(); s.fleet.run(bg) }()
	bgWG.Add(1)
	go func() { defer bgWG.Done(); s.leader.lead(bg, "resign", s.singleton("resign", s.resignLoop)) }()
	bgWG.Add(1)
	go func() { defer bgWG.Done(); s.leader.lead(bg, "retention", s.singleton("retention", s.retentionLoop)) }()
	bgWG.Add(1)
	go func() { defer bgWG.Done(); s.leader.lead(bg, "monitor", s.singleton("monitor", s.monitor.run)) }()
	bgWG.Add(1)
	go func() { defer bgWG.Done(); s.leader.lead(bg, "notify", s.singleton("notify", s.notifier.Run)) }()
	bgWG.Add(1)
	go func() { defer bgWG.Done(); s.leader.lead(bg, "leases", s.singleton("leases", s.runLeases)) }()
	if s.cfg.InternalAgent.Enabled {
		bgWG.Add(1)
		go func() { defer bgWG.Done(); s.superviseInternalAgent(bg) }()
	}
	s.log.Info("drover-server ready", "https", s.HTTPAddr(), "grpc", s.GRPCAddr(), "data_dir", s.cfg.DataDir, "ca_pin", s.ca.Pin(), "replica", s.fleet.bus.Replica())
	if _, err := daemon.SdNotify(false, daemon.SdNotifyReady); err != nil {
		s.log.Warn("sd_notify failed", "err", err)
	}

	var runErr error
	select {
	case <-ctx.Done():
	case runErr = <-errc:
	}
	stopBG()
	bgWG.Wait()
	s.shutdown()
	return runErr
}

func (s *Server) shutdown() {
	_, _ = daemon.SdNotify(false, daemon.SdNotifyStopping)
	s.log.Info("draining")
	s.stopping.Store(true)
	close(s.quit)
	tctx, cancel := context.WithTimeout(context.Background(), s.cfg.HTTP.ShutdownTimeout)
	defer cancel()
	grpcDone := make(chan struct{})
	s.grpcHealth.Shutdown()
	if s.profileSrv != nil {
		s.profileSrv.Close()
	}
	go func() { s.grpcSrv.GracefulStop(); close(grpcDone) }()
	if err := s.httpSrv.Shutdown(tctx); err != nil {
		s.httpSrv.Close()
	}
	s.publishing.Wait()
	s.hub.CloseAll(stream.ErrDraining)
	select {
	case <-grpcDone:
	case <-tctx.Done():
		s.grpcSrv.Stop()
		<-grpcDone
	}
	s.fleet.release()
	s.ingest.Stop()
	if err := s.store.Close(); err != nil {
		s.log.Error("closing the store", "err", err)
	}
	if s.lock != nil {
		s.lock.release()
	}
	s.log.Info("stopped")
}

// singleton wraps a singleton's loop so that singletonHook sees it start
// and stop.
func (s *Server) singleton(name string, fn func(context.Context)) func(context.Context) {
	return func(ctx context.Context) {
		if h := s.singletonHook; h != nil {
			h(name, true)
			defer h(name, false)
		}
		fn(ctx)
	}
}

// resignLoop refreshes the key list and re-signs the manifests due for it,
// now and every maintenanceInterval.
func (s *Server) resignLoop(ctx context.Context) {
	tick := time.NewTicker(maintenanceInterval)
	defer tick.Stop()
	for {
		changed, err := s.refreshKeyList(ctx, s.clock.Now())
		if err != nil && ctx.Err() == nil {
			s.log.Error("refreshing the key list", "err", err)
		}
		if changed {
			_, err = s.compiler.Compile(ctx, nil)
		} else {
			_, err = s.compiler.ResignDue(ctx)
		}
		if err != nil && ctx.Err() == nil {
			s.log.Error("re-signing manifests", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// retentionLoop prunes old runs every runs.retention_interval (checked
// every maintenanceInterval).
func (s *Server) retentionLoop(ctx context.Context) {
	tick := time.NewTicker(maintenanceInterval)
	defer tick.Stop()
	lastRetention := time.Time{}
	for {
		now := s.clock.Now()
		if now.Sub(lastRetention) >= s.cfg.Runs.RetentionInterval {
			if n, err := s.store.PruneRuns(ctx, now.Add(-s.cfg.Runs.RetentionAge), s.cfg.Runs.RetentionPerPipe); err != nil {
				if ctx.Err() == nil {
					s.log.Error("pruning runs", "err", err)
				}
			} else if n > 0 {
				s.log.Info("pruned runs", "runs", n)
			}
			lastRetention = now
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// watchdog pings systemd's watchdog at half its interval.
func (s *Server) watchdog(ctx context.Context) {
	interval, err := daemon.SdWatchdogEnabled(false)
	if err != nil || interval <= 0 {
		return
	}
	tick.Every(ctx, interval/2, nil, func() { _, _ = daemon.SdNotify(false, daemon.SdNotifyWatchdog) })
}

// serverSANs lists the names the server certificate must carry.
func serverSANs(cfg *Config) []string {
	sans := []string{"localhost", "127.0.0.1", "::1"}
	if h, err := os.Hostname(); err == nil && h != "" {
		sans = append(sans, h)
	}
	for _, pu := range cfg.ReplicaURLs() {
		if u, err := url.Parse(pu); err == nil && u.Hostname() != "" {
			sans = append(sans, u.Hostname())
		}
	}
	for _, a := range cfg.ReplicaGRPCAddrs() {
		if h, _, err := net.SplitHostPort(a); err == nil && h != "" {
			sans = append(sans, h)
		}
	}
	sans = append(sans, cfg.TLSSANs...)
	slices.Sort(sans)
	return slices.Compact(sans)
}
