package agent

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/drover/drover/api"
	"github.com/drover/drover/internal/tick"
	"github.com/go-resty/resty/v2"

	"github.com/drover/drover/agent/apply"
	"github.com/drover/drover/manifest"
)

// Version is the agent's version, reported at enrollment and in Hello. The
// CLI sets it from the build.
var Version = "dev"

// Agent is the drover-agent daemon: enrollment, renewal, the sync loop, the
// stream, the spool collector and the control socket. Create it with New
// and run it with Run; tests run it in-process.
type Agent struct {
	cfg       Config
	log       *slog.Logger
	store     Store
	backend   apply.Backend
	host      HostInfo
	envToken  string
	notify    func(string) // sd_notify; nil: none
	watchdog  time.Duration
	sdVersion string

	enrolled chan struct{} // closed once an identity is loaded
	syncReq  chan chan SyncResult
	enrollCh chan enrollCall
	outboxCh chan struct{} // a record was enqueued (buffered 1)
	// streamChanged: the stream came up or went down (buffered 1).
	streamChanged chan struct{}
	// reconnectCh cuts the stream's reconnect wait short (re-enrolled).
	reconnectCh chan struct{}
	spoolCh     chan struct{} // collect spools now (buffered 1)
	accountCh   chan struct{} // settle ended invocations now (buffered 1)
	leaseCh     chan struct{} // the manifest in force changed: look at its leases (buffered 1)
	accountMu   sync.Mutex    // one accounting pass at a time
	collectMu   sync.Mutex    // one spool pass at a time
	statusMu    sync.Mutex    // a ManifestStatus enqueued against an identity switch (reenroll.go)
	loadAvg     string        // host load file (default /proc/loadavg)

	alive atomic.Int64 // unix nanos of the last main-loop turn, for the watchdog
	// streamManifests counts the syncs that took the manifest a SyncNow
	// carried; streamRefused those carried manifests not used (out of
	// bounds, or not verified: the agent polled instead).
	streamManifests, streamRefused atomic.Uint64

	mu            sync.Mutex
	id            *Identity
	http          *resty.Client
	replicas      *replicas // the server's replicas and the ones in use (replicas.go)
	etag          string
	pushed        *pushedManifest    // came with a SyncNow, for the next sync (sync.go)
	current       *manifest.Manifest // manifest in force (accepted and applied)
	currentEnv    []byte
	currentDigest string
	payloads      map[string][]byte // verified payloads of current, by digest
	secrets       map[string]string
	applyOK       bool
	lastReject    string // digest of the last envelope reported as rejected
	// reportedExpired: the last ManifestStatus said manifest_expired.
	reportedExpired bool
	// reportedLeases: the lease state (leaseState) the last ManifestStatus said.
	reportedLeases string
	results        []PipeResult
	lastRuns       map[string]RunSummary
	lastSync       time.Time
	lastSyncErr    string
	streamUp       bool
	enrollErr      string
	authLost       string            // why the server refuses the identity (reenroll.go); "" when it does not
	runPipes       map[string]string // run id -> pipe, from RunStarted records
	spoolRoots     []string
	// onHandshake, when set (tests), sees the TLS state of every new
	// connection of the HTTP client.
	onHandshake func(tls.ConnectionState)
}

// Option configures an Agent.
type Option func(*Agent)

// WithStore sets the durable store. Required.
func WithStore(s Store) Option { return func(a *Agent) { a.store = s } }

// WithBackend sets the backend pipes run on. Required.
func WithBackend(b apply.Backend) Option { return func(a *Agent) { a.backend = b } }

// WithEnrollToken passes a token value (DROVER_ENROLL_TOKEN, or
// `drover-agent --token`); it is used when the agent is not enrolled.
func WithEnrollToken(tok string) Option {
	return func(a *Agent) { a.envToken = strings.TrimSpace(tok) }
}

// WithNotify sets the sd_notify function (state strings such as
// "READY=1") and the watchdog interval (0: no watchdog).
func WithNotify(notify func(state string), watchdog time.Duration) Option {
	return func(a *Agent) { a.notify, a.watchdog = notify, watchdog }
}

// WithSystemdVersion sets the systemd version Hello reports when the
// backend does not tell it itself.
func WithSystemdVersion(v string) Option { return func(a *Agent) { a.sdVersion = v } }

// New returns an agent for cfg. cfg is validated here.
func New(cfg Config, logger *slog.Logger, opts ...Option) (*Agent, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if err := cfg.ResolveAgentPath(); err != nil {
		return nil, err
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	a := &Agent{
		cfg:           cfg,
		log:           logger,
		host:          DefaultHostInfo(),
		enrolled:      make(chan struct{}),
		syncReq:       make(chan chan SyncResult, 16),
		enrollCh:      make(chan enrollCall),
		outboxCh:      make(chan struct{}, 1),
		spoolCh:       make(chan struct{}, 1),
		accountCh:     make(chan struct{}, 1),
		leaseCh:       make(chan struct{}, 1),
		reconnectCh:   make(chan struct{}, 1),
		streamChanged: make(chan struct{}, 1),
		lastRuns:      map[string]RunSummary{},
		runPipes:      map[string]string{},
	}
	for _, o := range opts {
		o(a)
	}
	if a.host.MachineID == "" || cfg.MachineIDFile != DefaultMachineIDFile {
		a.host.MachineID = ReadMachineID(cfg.MachineIDFile)
	}
	if a.spoolRoots == nil {
		a.spoolRoots = DefaultSpoolRoots(cfg)
	}
	if a.store == nil {
		return nil, errors.New("agent: no store")
	}
	if a.backend == nil {
		return nil, errors.New("agent: no backend")
	}
	return a, nil
}

// Run runs the daemon until ctx is canceled. It returns nil then, or an
// error that prevents the agent from working at all.
func (a *Agent) Run(ctx context.Context) error {
	if err := ensureDataDir(a.cfg.DataDir); err != nil {
		return err
	}
	// A daemon killed mid-write (identity files, payload cache) left these.
	removeStaleTemps(a.cfg.DataDir)
	removeStaleTemps(filepath.Join(a.cfg.DataDir, payloadDir))
	ln, err := listenControl(a.cfg.SocketPath())
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	defer wg.Wait()
	defer ln.Close()
	wg.Go(func() { a.serveControl(ctx, ln) })

	a.log.Info("agent starting", "version", Version, "backend", a.backend.Name(), "scope", a.cfg.Scope,
		"systemd", a.systemdVersion(), "data_dir", a.cfg.DataDir, "control", a.cfg.SocketPath())
	a.alive.Store(time.Now().UnixNano())
	a.sdNotify("READY=1")
	defer a.log.Info("agent stopped")
	defer a.sdNotify("STOPPING=1")
	if a.watchdog > 0 {
		wg.Go(func() { a.watchdogLoop(ctx) })
	}
	wg.Go(func() { a.collectLoop(ctx) })

	if err := a.waitEnrolled(ctx); err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	a.sdNotify("STATUS=enrolled as " + a.identity().AgentID)
	a.applyStored(ctx)
	wg.Go(func() { a.leaseLoop(ctx) })
	wg.Go(func() { a.accountLoop(ctx) })
	wg.Go(func() { a.renewLoop(ctx) })
	wg.Go(func() { a.streamLoop(ctx) })
	wg.Go(func() { a.reenrollLoop(ctx) })
	a.syncLoop(ctx)
	return nil
}

func (a *Agent) sdNotify(state string) {
	if a.notify != nil {
		a.notify(state)
	}
}

// watchdogLoop pings systemd's watchdog while the daemon's loops turn.
func (a *Agent) watchdogLoop(ctx context.Context) {
	tick.Every(ctx, a.watchdog/2, nil, func() {
		// The sync loop marks itself alive before each poll and every
		// aliveEvery while it waits (the enrollment wait every second); a
		// poll wedged longer than its bound stops the pings and systemd
		// restarts the agent.
		last := time.Unix(0, a.alive.Load())
		if time.Since(last) < aliveEvery*11/10+a.cfg.MaxBackoff+a.cfg.RequestTimeout*4 {
			a.sdNotify("WATCHDOG=1")
		}
	})
}

func (a *Agent) markAlive() { a.alive.Store(time.Now().UnixNano()) }

// identity returns the loaded identity (nil before enrollment).
func (a *Agent) identity() *Identity {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.id
}

// setIdentity installs id and rebuilds the HTTP client around it.
func (a *Agent) setIdentity(id *Identity) {
	urls, addrs, paired := replicaLists(a.cfg, id)
	a.mu.Lock()
	first := a.id == nil
	a.id = id
	if a.replicas == nil {
		a.replicas = newReplicas(urls, addrs, paired)
	} else {
		a.replicas.set(urls, addrs, paired)
	}
	old := a.http
	// A new TLS configuration: its session cache starts empty, so no
	// session resumed with the previous certificate (mtlsConfig).
	conf := mtlsConfig("", id.caPool, a.currentCert)
	if h := a.onHandshake; h != nil {
		conf.VerifyConnection = func(cs tls.ConnectionState) error { h(cs); return nil }
	}
	a.http = newReplicaClient(a.replicas, conf, a.cfg.RequestTimeout, a.log, a.learnReplicas)
	if a.host.MachineID != "" {
		// The server binds the identity to this machine and refuses the
		// same certificate from another one (identity_conflict).
		a.http.SetHeader(api.MachineIDHeader, a.host.MachineID)
	}
	a.mu.Unlock()
	if old != nil {
		// Requests in flight finish on their connections; idle ones close.
		old.GetClient().CloseIdleConnections()
	}
	if first {
		close(a.enrolled)
	}
}

// replicaLists are the lists of replica addresses the agent uses with id:
// those of agent.yaml when set, else the server's, followed by the
// configured server URL when it is not among them (an identity from
// before replicas: the configured URL replaces the enrolled one). paired:
// entry i of both lists is the same replica.
func replicaLists(cfg Config, id *Identity) (urls, addrs []string, paired bool) {
	switch {
	case len(cfg.ServerURLs) > 0:
		urls = cfg.ServerURLs
	case len(id.ServerURLs) > 0:
		urls = id.ServerURLs
		if cfg.Server != "" && indexOf(urls, cfg.Server, sameURL) < 0 {
			urls = append(append([]string(nil), urls...), cfg.Server)
		}
	case cfg.Server != "":
		urls = []string{cfg.Server}
	default:
		urls = id.serverURLs()
	}
	addrs = id.grpcAddrs()
	if len(cfg.GRPCAddrs) > 0 {
		addrs = cfg.GRPCAddrs
	}
	paired = len(cfg.ServerURLs) == 0 && len(cfg.GRPCAddrs) == 0 && len(urls) == len(addrs)
	return urls, addrs, paired
}

// learnReplicas takes the replica lists a server sent: when they differ
// from the identity's and check out, they are stored in identity.json and
// used from now on (the replicas in use stay while they are listed).
func (a *Agent) learnReplicas(urls, addrs []string) {
	urls, addrs, err := checkReplicaLists(urls, addrs)
	if err != nil {
		a.log.Warn("ignoring the replica list the server sent", "err", err)
		return
	}
	if len(urls) == 0 {
		return
	}
	if len(addrs) == 0 {
		addrs = nil
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	id := a.id
	if id == nil || slices.Equal(id.ServerURLs, urls) && slices.Equal(id.GRPCAddrs, addrs) {
		return
	}
	next := id.withReplicas(urls, addrs)
	if len(addrs) == 0 {
		next.GRPCAddrs, next.GRPCAddr = nil, id.GRPCAddr
	}
	if err := saveIdentity(a.cfg.DataDir, next); err != nil {
		a.log.Error("save the server's replica list", "err", err)
		return
	}
	a.id = next
	u, g, paired := replicaLists(a.cfg, next)
	a.replicas.set(u, g, paired)
	a.log.Info("the server's replicas", "server_urls", urls, "grpc_addrs", next.grpcAddrs())
}

func (a *Agent) currentCert() *tls.Certificate {
	a.mu.Lock()
	defer a.mu.Unlock()
	c := a.id.cert
	return &c
}

func (a *Agent) httpClient() *resty.Client {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.http
}

// enrollCall is an enrollment requested over the control socket.
type enrollCall struct {
	token string
	reply chan error
}

// waitEnrolled loads the identity or enrolls with a token from the control
// socket, the environment or the token file, retrying with backoff.
func (a *Agent) waitEnrolled(ctx context.Context) error {
	id, err := loadIdentity(a.cfg.DataDir)
	if err == nil {
		if _, serr := os.Stat(a.cfg.TokenFile); a.cfg.TokenFile != "" && serr == nil {
			a.log.Info("already enrolled; the token file is used only if this identity stops working (revoked, expired)", "agent_id", id.AgentID, "token_file", a.cfg.TokenFile)
		}
		a.switchIdentity(id, false)
		return nil
	}
	if !errors.Is(err, errNotEnrolled) {
		return fmt.Errorf("load identity: %w", err)
	}
	a.log.Info("not enrolled; waiting for an enrollment token", "token_file", a.cfg.TokenFile)
	tries := newTokenAttempts(a.cfg.MaxBackoff)
	poll := time.NewTicker(time.Second)
	defer poll.Stop()
	for {
		a.markAlive()
		tokStr, fromFile := a.envToken, false
		if fileTok, ok := a.readTokenFile(); ok {
			tokStr, fromFile = fileTok, true
		}
		if tries.due(tokStr, fromFile, time.Now()) {
			id, err := a.tryEnroll(ctx, tokStr)
			if err == nil {
				if fromFile {
					a.removeTokenFile()
				}
				a.switchIdentity(id, false)
				return nil
			}
			if ctx.Err() != nil {
				return ctx.Err()
			}
			d := tries.failed(tokStr, fromFile, time.Now())
			a.log.Error("enrollment failed; retrying", "err", err, "retry_in", d.Round(time.Millisecond))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case call := <-a.enrollCh:
			id, err := a.tryEnroll(ctx, call.token)
			if err == nil {
				a.switchIdentity(id, false)
				call.reply <- nil
				return nil
			}
			call.reply <- err
		case <-poll.C:
		}
	}
}

func (a *Agent) readTokenFile() (string, bool) {
	if a.cfg.TokenFile == "" {
		return "", false
	}
	b, err := os.ReadFile(a.cfg.TokenFile)
	if err != nil {
		if !errors.Is(err, fs.ErrNotExist) {
			a.log.Warn("read token file", "err", err)
		}
		return "", false
	}
	s := strings.TrimSpace(string(b))
	return s, s != ""
}

func (a *Agent) removeTokenFile() {
	if err := os.Remove(a.cfg.TokenFile); err != nil && !errors.Is(err, fs.ErrNotExist) {
		a.log.Warn("remove token file", "err", err)
	}
}

func (a *Agent) tryEnroll(ctx context.Context, tokStr string) (*Identity, error) {
	tok, err := ParseToken(tokStr)
	if err != nil {
		a.setEnrollErr(err)
		return nil, err
	}
	servers := enrollServers(a.cfg)
	if old := a.identity(); old != nil {
		// Re-enrollment: any replica the old identity knew will do.
		for _, u := range old.serverURLs() {
			if indexOf(servers, u, sameURL) < 0 {
				servers = append(servers, u)
			}
		}
	}
	a.log.Info("enrolling", "server", strings.Join(servers, ","), "token", tok.String())
	id, err := enroll(ctx, servers, tok, a.host, a.cfg.DataDir, a.store, a.cfg.RequestTimeout, time.Now, a.log)
	if err != nil {
		a.setEnrollErr(err)
		return nil, err
	}
	a.setEnrollErr(nil)
	a.log.Info("enrolled", "agent_id", id.AgentID, "grpc", id.GRPCAddr, "cert_expires", id.NotAfter())
	return id, nil
}

func (a *Agent) setEnrollErr(err error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.enrollErr = ""
	if err != nil {
		a.enrollErr = err.Error()
	}
}
