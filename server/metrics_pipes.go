package server

import (
	"context"
	"maps"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/drover/drover/api"
	"github.com/drover/drover/server/store"
)

// Per-pipe metrics (docs/monitoring.md, "Pipe telemetry"):
//
//	drover_pipe_<name>{pipe,agent,...}                 the latest samples a run of the
//	                                                   pipe on the agent wrote to
//	                                                   $DROVER_METRICS (a pipe's own
//	                                                   labels pipe and agent become
//	                                                   exported_pipe, exported_agent)
//	drover_pipe_last_success_timestamp_seconds{pipe,agent}  gauge: when the last
//	                                                   succeeded run finished
//	drover_pipe_runs_failed_total{pipe}                counter: runs finished failed or
//	                                                   timed_out
//	drover_pipe_runs_missed_total{pipe}                counter: missed runs the server wrote
//	drover_pipe_series_dropped_total                   counter: pipe samples not exported
//	                                                   because of the series cap or a name
//	                                                   clash
//
// The samples of a (pipe, agent) are those of its latest run that wrote
// any. The pipe series live in memory, fed by the runs arriving (after a
// restart they come back with the next runs). Series of pipes and agents
// that are no longer in the store are removed before each scrape, with
// drover_run_duration_seconds{pipe}.
const (
	pipeMetricPrefix = "drover_pipe_"
	// DefaultMaxPipeSeries bounds the drover_pipe_<name> series of all
	// pipes and agents together.
	DefaultMaxPipeSeries = 10000
)

// Names the server exports itself under the pipe prefix: a pipe sample
// that would be exported under one of them is dropped.
var ownPipeMetrics = map[string]bool{
	"drover_pipe_last_success_timestamp_seconds": true,
	"drover_pipe_runs_failed_total":              true,
	"drover_pipe_runs_missed_total":              true,
	"drover_pipe_series_dropped_total":           true,
}

type pipeAgent struct{ pipe, agent string }

type pipeMetrics struct {
	maxSeries int

	mu          sync.Mutex
	latest      map[pipeAgent][]api.MetricSample
	series      int // samples in latest
	lastSuccess map[pipeAgent]time.Time
	failed      map[string]float64
	missed      map[string]float64
	seen        map[string]time.Time // pipe -> when a series of it was last touched
	agentSeen   map[string]time.Time // agent -> idem
	dropped     float64
}

func newPipeMetrics() *pipeMetrics {
	return &pipeMetrics{maxSeries: DefaultMaxPipeSeries, latest: map[pipeAgent][]api.MetricSample{}, lastSuccess: map[pipeAgent]time.Time{},
		failed: map[string]float64{}, missed: map[string]float64{}, seen: map[string]time.Time{}, agentSeen: map[string]time.Time{}}
}

func (p *pipeMetrics) touch(pipe, agent string) {
	now := time.Now()
	p.seen[pipe] = now
	if agent != "" {
		p.agentSeen[agent] = now
	}
}

// runFinished notes a finished run (counted once per run id by the caller).
func (p *pipeMetrics) runFinished(agentID string, run *store.Run) {
	if run.Pipe == "" {
		return
	}
	k := pipeAgent{run.Pipe, agentID}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.touch(run.Pipe, agentID)
	switch run.Status {
	case api.StatusSucceeded:
		at := run.FinishedAt
		if at.IsZero() {
			at = time.Now()
		}
		if at.After(p.lastSuccess[k]) {
			p.lastSuccess[k] = at
		}
	case api.StatusFailed, api.StatusTimedOut:
		p.failed[run.Pipe]++
	}
	if len(run.Metrics) == 0 {
		return // a run that wrote no samples keeps the last ones (as a textfile would)
	}
	p.series -= len(p.latest[k])
	var keep []api.MetricSample
	for _, s := range run.Metrics {
		if ownPipeMetrics[pipeMetricPrefix+s.Name] || p.series+len(keep) >= p.maxSeries {
			p.dropped++
			continue
		}
		keep = append(keep, s)
	}
	if len(keep) == 0 {
		delete(p.latest, k)
	} else {
		p.latest[k] = keep
	}
	p.series += len(keep)
}

func (p *pipeMetrics) runsMissed(runs []*store.Run) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, r := range runs {
		p.touch(r.Pipe, r.AgentID)
		p.missed[r.Pipe]++
	}
}

// prune forgets the series of pipes and agents no longer in the store
// (listed at listed) and returns the pipes forgotten.
func (p *pipeMetrics) prune(pipes, agents map[string]bool, listed time.Time) []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	var gone []string
	goneAgent := map[string]bool{}
	for pipe, at := range p.seen {
		if !pipes[pipe] && at.Before(listed) {
			gone = append(gone, pipe)
			delete(p.seen, pipe)
			delete(p.failed, pipe)
			delete(p.missed, pipe)
		}
	}
	for a, at := range p.agentSeen {
		if !agents[a] && at.Before(listed) {
			goneAgent[a] = true
			delete(p.agentSeen, a)
		}
	}
	goneSet := map[string]bool{}
	for _, g := range gone {
		goneSet[g] = true
	}
	for k, ss := range p.latest {
		if goneSet[k.pipe] || goneAgent[k.agent] {
			p.series -= len(ss)
			delete(p.latest, k)
		}
	}
	for k := range p.lastSuccess {
		if goneSet[k.pipe] || goneAgent[k.agent] {
			delete(p.lastSuccess, k)
		}
	}
	return gone
}

var (
	descLastSuccess = prometheus.NewDesc("drover_pipe_last_success_timestamp_seconds", "When the last succeeded run of the pipe on the agent finished, in seconds since the epoch.", []string{"pipe", "agent"}, nil)
	descPipeFailed  = prometheus.NewDesc("drover_pipe_runs_failed_total", "Runs of the pipe that finished failed or timed out.", []string{"pipe"}, nil)
	descPipeMissed  = prometheus.NewDesc("drover_pipe_runs_missed_total", "Missed runs of the pipe (no run started within grace of a fire time).", []string{"pipe"}, nil)
	descDropped     = prometheus.NewDesc("drover_pipe_series_dropped_total", "Pipe samples not exported: over the series cap, or clashing with the server's own names.", nil, nil)
)

// Describe sends nothing: the pipe families are known only at scrape
// time (an unchecked collector).
func (p *pipeMetrics) Describe(chan<- *prometheus.Desc) {}

func (p *pipeMetrics) Collect(ch chan<- prometheus.Metric) {
	p.mu.Lock()
	defer p.mu.Unlock()
	ch <- prometheus.MustNewConstMetric(descDropped, prometheus.CounterValue, p.dropped)
	for k, at := range p.lastSuccess {
		ch <- prometheus.MustNewConstMetric(descLastSuccess, prometheus.GaugeValue, float64(at.UnixNano())/1e9, k.pipe, k.agent)
	}
	for pipe, n := range p.failed {
		ch <- prometheus.MustNewConstMetric(descPipeFailed, prometheus.CounterValue, n, pipe)
	}
	for pipe, n := range p.missed {
		ch <- prometheus.MustNewConstMetric(descPipeMissed, prometheus.CounterValue, n, pipe)
	}
	p.collectSamples(ch)
}

// collectSamples exports the latest samples. One family per exported name
// needs one type and one help text and one label set per series: the
// first pipe (in name order) sets the family's type; a counter whose name
// lacks _total, or a family whose pipes disagree, is untyped.
func (p *pipeMetrics) collectSamples(ch chan<- prometheus.Metric) {
	type fam struct {
		typ  string
		help string
	}
	keys := make([]pipeAgent, 0, len(p.latest))
	for k := range p.latest {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		if keys[i].pipe != keys[j].pipe {
			return keys[i].pipe < keys[j].pipe
		}
		return keys[i].agent < keys[j].agent
	})
	fams := map[string]*fam{}
	for _, k := range keys {
		for _, s := range p.latest[k] {
			name := pipeMetricPrefix + s.Name
			typ := s.Type
			if typ == "counter" && !strings.HasSuffix(name, "_total") || typ == "gauge" && strings.HasSuffix(name, "_total") {
				typ = "untyped"
			}
			if f := fams[name]; f == nil {
				help := s.Help
				if help == "" {
					help = "Written by pipes to $DROVER_METRICS as " + s.Name + "."
				}
				fams[name] = &fam{typ: typ, help: help}
			} else if f.typ != typ {
				f.typ = "untyped"
			}
		}
	}
	descs := map[string]*prometheus.Desc{}
	seen := map[string]bool{}
	for _, k := range keys {
		for _, s := range p.latest[k] {
			name := pipeMetricPrefix + s.Name
			names := []string{"pipe", "agent"}
			values := []string{k.pipe, k.agent}
			for _, l := range slices.Sorted(maps.Keys(s.Labels)) {
				n := l
				if n == "pipe" || n == "agent" {
					n = "exported_" + n
				}
				names = append(names, n)
				values = append(values, s.Labels[l])
			}
			id := name + "\x00" + strings.Join(names, ",") + "\x00" + strings.Join(values, "\x00")
			if seen[id] {
				continue
			}
			seen[id] = true
			f := fams[name]
			dk := name + "\x00" + strings.Join(names, ",")
			d := descs[dk]
			if d == nil {
				d = prometheus.NewDesc(name, f.help, names, nil)
				descs[dk] = d
			}
			vt := prometheus.UntypedValue
			switch f.typ {
			case "counter":
				vt = prometheus.CounterValue
			case "gauge":
				vt = prometheus.GaugeValue
			}
			m, err := prometheus.NewConstMetric(d, vt, s.Value, values...)
			if err == nil {
				ch <- m
			}
		}
	}
}

// prunePipeSeries removes the series of pipes and agents that are no
// longer in the store, drover_run_duration_seconds{pipe} included.
func (s *Server) prunePipeSeries(ctx context.Context) {
	m := s.metrics
	listed := time.Now()
	pipes, err := s.store.ListPipes(ctx)
	if err != nil {
		return
	}
	agents, err := s.store.ListAgents(ctx)
	if err != nil {
		return
	}
	pipeSet, agentSet := map[string]bool{"unknown": true}, map[string]bool{}
	for _, p := range pipes {
		pipeSet[p.Name] = true
	}
	for _, a := range agents {
		agentSet[a.ID] = true
	}
	for _, pipe := range m.pipes.prune(pipeSet, agentSet, listed) {
		m.runDuration.DeletePartialMatch(prometheus.Labels{"pipe": pipe})
	}
}
