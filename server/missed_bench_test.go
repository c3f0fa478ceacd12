package server

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"github.com/drover/drover/server/bus"
	"log/slog"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/drover/drover/api"
	"github.com/drover/drover/server/store/sqlite"
	"github.com/drover/drover/server/stream"
)

// fixedClock is a clock the benchmark sets.
type fixedClock struct{ t time.Time }

func (c *fixedClock) Now() time.Time { return c.t }

// seedFleet stores agents agents and pipes every-5-minutes pipes that
// target all of them, each agent reporting next fire time fire for every
// pipe, and one run per (agent, pipe) for fire except for every
// hundredth agent (its fire times are missed).
func seedFleet(tb testing.TB, st *sqlite.DB, agents, pipes int, fire time.Time) {
	tb.Helper()
	ctx := context.Background()
	created := fire.Add(-24 * time.Hour)
	err := st.InTx(ctx, func(tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, `INSERT INTO payloads(digest, size, data, created_at) VALUES('sha256:bench', 0, x'', ?)`, created.UnixNano()); err != nil {
			return err
		}
		status := make([]api.PipeStatus, pipes)
		for p := range pipes {
			name := fmt.Sprintf("pipe-%02d", p)
			spec := fmt.Sprintf(`{"name":%q,"schedule":"*/5 * * * *","timezone":"UTC","script":"true","interpreter":"/bin/sh","timeout":"1h","catchup":"once","hardening":"default","targets":{"tags":{"fleet":"bench"}},"enabled":true}`, name)
			if _, err := tx.ExecContext(ctx, `INSERT INTO pipe_versions(name, version, spec, payload_digest, payload_size, created_at) VALUES(?,1,?,'sha256:bench',0,?)`, name, spec, created.UnixNano()); err != nil {
				return err
			}
			if _, err := tx.ExecContext(ctx, `INSERT INTO pipes(name, current_version, deleted_at, created_at, updated_at) VALUES(?,1,0,?,?)`, name, created.UnixNano(), created.UnixNano()); err != nil {
				return err
			}
			status[p] = api.PipeStatus{Name: name, Version: 1, NextFireTimes: []time.Time{fire}}
		}
		agentSt, err := tx.PrepareContext(ctx, `INSERT INTO agents(id, tags, created_at, updated_at, cert_serial, last_seen_at, pipe_status, status_at) VALUES(?,?,?,?,'x',?,?,?)`)
		if err != nil {
			return err
		}
		defer agentSt.Close()
		runSt, err := tx.PrepareContext(ctx, `INSERT INTO runs(id, agent_id, pipe, pipe_version, trigger, status, scheduled_at, started_at, finished_at, created_at, updated_at)
			VALUES(?,?,?,1,'schedule','succeeded',?,?,?,?,?)`)
		if err != nil {
			return err
		}
		defer runSt.Close()
		psJSON, err := json.Marshal(status)
		if err != nil {
			return err
		}
		ps := string(psJSON)
		for a := range agents {
			id := fmt.Sprintf("agt-bench-%05d", a)
			if _, err := agentSt.ExecContext(ctx, id, `{"fleet":"bench"}`, created.UnixNano(), created.UnixNano(), fire.Add(11*time.Minute).UnixNano(), ps, fire.Add(-time.Minute).UnixNano()); err != nil {
				return err
			}
			if a%100 == 0 {
				continue
			}
			for p := range pipes {
				at := fire.Add(5 * time.Second).UnixNano()
				if _, err := runSt.ExecContext(ctx, fmt.Sprintf("run-%05d-%02d", a, p), id, fmt.Sprintf("pipe-%02d", p), fire.UnixNano(), at, at, at, at); err != nil {
					return err
				}
			}
		}
		return nil
	})
	if err != nil {
		tb.Fatalf("seed: %v", err)
	}
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkMissedDetection measures detection passes over 10,000 agents
// holding 20 every-5-minutes pipes: "fire" is a pass whose window holds a
// fire time of every pipe (200,000 expected runs checked), "quiet" one
// whose window holds none. With a pass every 30s, a 5-minute period has
// one fire pass and nine quiet ones; the %core metric is that period's CPU
// over its length. Run it with
//
//	go test -run '^$' -bench BenchmarkMissedDetection -benchtime 5x ./server
func BenchmarkMissedDetection(b *testing.B) {
	const agents, pipes = 10000, 20
	st, err := sqlite.Open(context.Background(), filepath.Join(b.TempDir(), "server.db"), "normal")
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	fire := time.Date(2026, 6, 1, 2, 30, 0, 0, time.UTC)
	seedFleet(b, st, agents, pipes, fire)
	clock := &fixedClock{}
	s := &Server{cfg: DefaultConfig(), log: slog.New(slog.DiscardHandler), clock: clock, store: st}
	s.hub = newFleet(s, stream.NewHub(), bus.NewNetwork().Join(), newLogWatchers())
	m := newMonitor(s)
	deadline := fire.Add(10 * time.Minute) // default grace, no jitter
	ctx := context.Background()
	pass := func(b *testing.B, from, to time.Time) passStats {
		m.stateMu.Lock()
		if m.state == nil {
			m.state = map[string]string{}
		}
		m.state[stateWatermark] = fmt.Sprint(from.UnixNano())
		m.stateMu.Unlock()
		clock.t = to
		stats, err := m.pass(ctx)
		if err != nil {
			b.Fatal(err)
		}
		return stats
	}
	var fireCPU, quietCPU time.Duration
	b.Run("fire", func(b *testing.B) {
		var cpu time.Duration
		for i := 0; i < b.N; i++ {
			c0 := cpuTime()
			stats := pass(b, deadline.Add(-15*time.Second), deadline.Add(15*time.Second))
			cpu += cpuTime() - c0
			if stats.Expected != agents*pipes {
				b.Fatalf("expected %d, want %d (%+v)", stats.Expected, agents*pipes, stats)
			}
			if i == 0 && stats.Missed != agents/100*pipes && stats.Missed != 0 {
				b.Fatalf("missed %d (%+v)", stats.Missed, stats)
			}
		}
		fireCPU = cpu / time.Duration(b.N)
		b.ReportMetric(float64(fireCPU.Milliseconds()), "cpu-ms/pass")
	})
	b.Run("quiet", func(b *testing.B) {
		var cpu time.Duration
		for i := 0; i < b.N; i++ {
			c0 := cpuTime()
			stats := pass(b, deadline.Add(15*time.Second), deadline.Add(45*time.Second))
			cpu += cpuTime() - c0
			if stats.Expected != 0 {
				b.Fatalf("quiet pass expected %d", stats.Expected)
			}
		}
		quietCPU = cpu / time.Duration(b.N)
		b.ReportMetric(float64(quietCPU.Milliseconds()), "cpu-ms/pass")
	})
	period := 5 * time.Minute
	passes := int(period / missedInterval)
	share := float64(fireCPU+time.Duration(passes-1)*quietCPU) / float64(period) * 100
	b.Logf("fire pass %s CPU, quiet pass %s CPU; one pass every %s: %.2f%% of one core", fireCPU, quietCPU, missedInterval, share)
}
