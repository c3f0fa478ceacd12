package server

import (
	"context"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/drover/drover/api"
	"github.com/drover/drover/server/store"
	"github.com/drover/drover/server/stream"
)

// Metrics, served at GET /metrics on the HTTPS port in the Prometheus text
// format. By default a viewer token is required (Prometheus:
// authorization: {credentials_file: ...}); with metrics_public: true in the
// config (DROVER_METRICS_PUBLIC=true) no authentication is. Each server has
// its own registry (tests run several servers in one process).
//
//	drover_agents{state="online|offline|revoked"}           gauge, at scrape
//	drover_agent_apply_errors{kind="pipe|manifest"}         gauge, at scrape: pipes whose
//	                                                        last apply failed, agents whose
//	                                                        last manifest was rejected or failed
//	drover_manifest_requests_total{code="200|304|error"}    counter: agents' manifest GETs
//	drover_stream_connections                               gauge: live agent streams
//	drover_sync_now_total{carried}                          counter: SyncNows sent here, by what they
//	                                                        carried (manifest; too_large, behind,
//	                                                        unavailable: announced alone, the agent polls)
//	drover_stream_records_total{type}                       counter: records committed
//	                                                        (hello, heartbeat, manifest_status,
//	                                                        run_started, log_chunk, run_finished,
//	                                                        invalid)
//	drover_stream_ack_latency_seconds                       histogram: record received -> committed
//	                                                        (its Ack follows at once)
//	drover_runs{status}                                     gauge, at scrape: stored runs by status
//	drover_runs_finished_total{status}                      counter: RunFinished records (a replay
//	                                                        seen recently is not counted twice)
//	drover_run_duration_seconds{pipe}                       histogram of finished runs' durations
//	                                                        (pipe: only pipes of the agent's manifest;
//	                                                        a deleted pipe's series go)
//	drover_runs_lost_total                                  counter: runs settled failed, reason lost
//	drover_agent_records_refused_total{reason}              counter: agent records acknowledged and
//	                                                        dropped (invalid, unknown_pipe, too_large)
//	                                                        and streams refused (pending_streams)
//	drover_agent_records_throttled_total{reason}            counter: records that waited for a quota
//	                                                        (run_records, pipe_run_records, log_bytes)
//	drover_identity_conflicts_total                         counter: streams refused because another
//	                                                        machine presented an agent's certificate
//	drover_agents_manifest_expired                          gauge, at scrape: agents whose manifest in
//	                                                        force has expired (they keep running it)
//	drover_pipe_*                                           see metrics_pipes.go
//	drover_api_requests_total{route,code}                   counter: API requests by route pattern
//	drover_api_request_duration_seconds{route}              histogram
//	drover_audit_write_failures_total                       counter
//	drover_listener_accept_errors_total{listener,reason}    counter
//	go_*, process_*                                         the standard collectors
type metrics struct {
	reg *prometheus.Registry

	manifest200, manifest304, manifestErr prometheus.Counter
	records                               *prometheus.CounterVec
	ackLatency                            prometheus.Histogram
	runsFinished                          *prometheus.CounterVec
	runDuration                           *prometheus.HistogramVec
	apiRequests                           *prometheus.CounterVec
	apiDuration                           *prometheus.HistogramVec
	auditFailures                         prometheus.Counter
	runsLost                              prometheus.Counter
	refused, throttled                    *prometheus.CounterVec
	identityConflicts                     prometheus.Counter
	acceptErrors                          *prometheus.CounterVec
	pipes                                 *pipeMetrics

	mu       sync.Mutex
	finished map[string]struct{} // recently counted run ids
	ring     []string
	next     int
}

const finishedMemory = 16384

func newMetrics(s *Server) *metrics {
	m := &metrics{reg: prometheus.NewRegistry(), finished: map[string]struct{}{}, ring: make([]string, finishedMemory), pipes: newPipeMetrics()}
	mr := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "drover_manifest_requests_total", Help: "Manifest requests from agents by answer."}, []string{"code"})
	m.manifest200, m.manifest304, m.manifestErr = mr.WithLabelValues("200"), mr.WithLabelValues("304"), mr.WithLabelValues("error")
	m.records = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "drover_stream_records_total", Help: "Agent stream records committed, by type."}, []string{"type"})
	m.ackLatency = prometheus.NewHistogram(prometheus.HistogramOpts{Name: "drover_stream_ack_latency_seconds", Help: "Time from receiving an agent record to committing (and acknowledging) it.",
		Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5}})
	m.runsFinished = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "drover_runs_finished_total", Help: "Runs reported finished, by status."}, []string{"status"})
	m.runDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "drover_run_duration_seconds", Help: "Duration of finished runs, by pipe.",
		Buckets: []float64{.1, .5, 1, 5, 15, 30, 60, 300, 900, 1800, 3600, 3 * 3600, 12 * 3600}}, []string{"pipe"})
	m.apiRequests = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "drover_api_requests_total", Help: "API requests by route and status."}, []string{"route", "code"})
	m.apiDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "drover_api_request_duration_seconds", Help: "API request duration by route.",
		Buckets: []float64{.001, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 10}}, []string{"route"})
	m.auditFailures = prometheus.NewCounter(prometheus.CounterOpts{Name: "drover_audit_write_failures_total", Help: "Audit entries that could not be written."})
	m.runsLost = prometheus.NewCounter(prometheus.CounterOpts{Name: "drover_runs_lost_total", Help: "Runs settled failed with reason lost: their agent no longer ran them once its records were drained."})
	m.refused = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "drover_agent_records_refused_total", Help: "Agent records acknowledged and dropped, and agent streams refused, by reason."}, []string{"reason"})
	m.throttled = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "drover_agent_records_throttled_total", Help: "Agent records that waited for a quota, by quota."}, []string{"reason"})
	m.identityConflicts = prometheus.NewCounter(prometheus.CounterOpts{Name: "drover_identity_conflicts_total", Help: "Streams refused because another machine presented an agent's certificate."})
	m.acceptErrors = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "drover_listener_accept_errors_total", Help: "Failed accepts of new connections, by listener and reason (fd_limit: the process is out of file descriptors; fd_reserve: refused to keep descriptors for the operator API and the store)."}, []string{"listener", "reason"})
	for _, l := range []string{"https", "grpc"} {
		for _, r := range []string{"fd_limit", "fd_reserve", "other"} {
			m.acceptErrors.WithLabelValues(l, r)
		}
	}
	for _, r := range append(stream.RefusalReasons(), "pending_streams", "payload_fetches") {
		m.refused.WithLabelValues(r)
	}
	for _, r := range []string{"run_records", "pipe_run_records", "log_bytes"} {
		m.throttled.WithLabelValues(r)
	}
	streams := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "drover_stream_connections", Help: "Live agent streams."},
		func() float64 { return float64(s.streams.Streams()) })
	nudges := prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "drover_stream_nudges_total",
		Help: "SyncNows sent because an agent's heartbeats showed it behind its published manifest for two heartbeats: changes whose announcement the stream lost."},
		func() float64 { return float64(s.streams.Nudges()) })
	busUp := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "drover_signal_bus_up", Help: "1 while this replica receives the other replicas' signals."},
		func() float64 {
			if s.fleet.bus.Up() {
				return 1
			}
			return 0
		})
	leaderGauge := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "drover_leader",
		Help: "1 while this server runs the singletons (retention, re-signing, missed-run detection, notifications): always with SQLite, on one replica at a time with PostgreSQL."},
		func() float64 {
			if s.leader != nil && s.leader.leading() {
				return 1
			}
			return 0
		})
	dropped := prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "drover_signals_dropped_total", Help: "Signals to the other replicas that could not be sent."},
		func() float64 { return float64(s.fleet.dropped.Load()) })
	m.reg.MustRegister(busUp, dropped, leaderGauge)
	for _, c := range []struct {
		label string
		n     func(stream.SyncNowCounts) uint64
	}{
		{"manifest", func(c stream.SyncNowCounts) uint64 { return c.Manifest }},
		{"too_large", func(c stream.SyncNowCounts) uint64 { return c.TooLarge }},
		{"behind", func(c stream.SyncNowCounts) uint64 { return c.Behind }},
		{"unavailable", func(c stream.SyncNowCounts) uint64 { return c.Unavailable }},
	} {
		m.reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "drover_sync_now_total",
			Help: "SyncNows sent on this replica's streams, by what they carried (manifest: the signed manifest; else the agent polls).", ConstLabels: prometheus.Labels{"carried": c.label}},
			func() float64 { return float64(c.n(s.fleet.hub.SyncNowCounts())) }))
	}
	m.reg.MustRegister(m.runsLost, m.acceptErrors, m.refused, m.throttled, m.identityConflicts, m.pipes)
	m.reg.MustRegister(mr, m.records, m.ackLatency, m.runsFinished, m.runDuration, m.apiRequests, m.apiDuration, m.auditFailures, streams, nudges,
		&stateCollector{s: s}, collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

func (m *metrics) observeAPI(route string, code int, d time.Duration) {
	m.apiRequests.WithLabelValues(route, strconv.Itoa(code)).Inc()
	m.apiDuration.WithLabelValues(route).Observe(d.Seconds())
}

// committed records a committed batch.
func (m *metrics) committed(recs []*store.Record, now time.Time) {
	for _, r := range recs {
		typ := "heartbeat"
		switch {
		case r.Hello != nil:
			typ = "hello"
		case r.Status != nil:
			typ = "manifest_status"
		case r.RunStarted != nil:
			typ = "run_started"
		case r.Chunk != nil:
			typ = "log_chunk"
		case r.RunFinished != nil:
			typ = "run_finished"
			m.runFinished(r.AgentID, r.RunFinished)
		case r.Settle != nil:
			m.runsLost.Add(float64(len(r.Settle.Settled)))
		}
		m.records.WithLabelValues(typ).Inc()
		m.ackLatency.Observe(max(0, now.Sub(r.Received).Seconds()))
	}
}

// runFinished counts a finished run once, even when its record is replayed.
func (m *metrics) runFinished(agentID string, run *store.Run) {
	key := agentID + "/" + run.ID
	m.mu.Lock()
	_, seen := m.finished[key]
	if !seen {
		if old := m.ring[m.next]; old != "" {
			delete(m.finished, old)
		}
		m.ring[m.next] = key
		m.next = (m.next + 1) % len(m.ring)
		m.finished[key] = struct{}{}
	}
	m.mu.Unlock()
	if seen {
		return
	}
	m.runsFinished.WithLabelValues(run.Status).Inc()
	pipe := run.Pipe
	if pipe == "" {
		pipe = "unknown"
	}
	m.runDuration.WithLabelValues(pipe).Observe(float64(run.DurationMS) / 1000)
	m.pipes.runFinished(agentID, run)
}

// stateCollector reads agent and run state from the store at scrape time.
type stateCollector struct{ s *Server }

var (
	descAgents      = prometheus.NewDesc("drover_agents", "Agents by state.", []string{"state"}, nil)
	descApplyErrors = prometheus.NewDesc("drover_agent_apply_errors", "Current apply errors: pipes whose last apply failed, agents whose last manifest failed.", []string{"kind"}, nil)
	descRuns        = prometheus.NewDesc("drover_runs", "Stored runs by status.", []string{"status"}, nil)
	descElapse      = prometheus.NewDesc("drover_agent_elapse_mismatches", "Pipes whose scheduler's next elapse (systemd's NextElapseUSecRealtime) disagrees with the evaluator's next fire time.", nil, nil)
	descExpired     = prometheus.NewDesc("drover_agents_manifest_expired", "Agents whose manifest in force has expired (its pipes keep running).", nil, nil)
)

func (c *stateCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- descAgents
	ch <- descApplyErrors
	ch <- descRuns
	ch <- descExpired
	ch <- descElapse
}

func (c *stateCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.s
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if agents, err := s.store.ListAgents(ctx); err == nil {
		var online, offline, revoked, pipeErrs, manifestErrs, expired, elapse float64
		for _, a := range agents {
			switch {
			case !a.RevokedAt.IsZero():
				revoked++
				continue
			case s.isOnline(a):
				online++
			default:
				offline++
			}
			if a.ManifestError != "" {
				manifestErrs++
			}
			if a.ManifestExpired {
				expired++
			}
			for _, p := range a.Pipes {
				if p.ApplyError != "" {
					pipeErrs++
				}
				if p.ElapseMismatch != "" {
					elapse++
				}
			}
		}
		ch <- prometheus.MustNewConstMetric(descAgents, prometheus.GaugeValue, online, "online")
		ch <- prometheus.MustNewConstMetric(descAgents, prometheus.GaugeValue, offline, "offline")
		ch <- prometheus.MustNewConstMetric(descAgents, prometheus.GaugeValue, revoked, "revoked")
		ch <- prometheus.MustNewConstMetric(descApplyErrors, prometheus.GaugeValue, pipeErrs, "pipe")
		ch <- prometheus.MustNewConstMetric(descApplyErrors, prometheus.GaugeValue, manifestErrs, "manifest")
		ch <- prometheus.MustNewConstMetric(descExpired, prometheus.GaugeValue, expired)
		ch <- prometheus.MustNewConstMetric(descElapse, prometheus.GaugeValue, elapse)
	} else {
		s.log.Warn("metrics: listing agents", "err", err)
	}
	if counts, err := s.store.RunCounts(ctx); err == nil {
		for _, st := range api.RunStatuses {
			ch <- prometheus.MustNewConstMetric(descRuns, prometheus.GaugeValue, float64(counts[st]), st)
		}
	} else {
		s.log.Warn("metrics: counting runs", "err", err)
	}
}

func (s *Server) handleMetrics(w http.ResponseWriter, r *http.Request) error {
	s.prunePipeSeries(r.Context())
	s.metricsHandler.ServeHTTP(w, r)
	return nil
}

func newMetricsHandler(m *metrics) http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{MaxRequestsInFlight: 4, Timeout: 30 * time.Second})
}
