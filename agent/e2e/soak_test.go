package e2e

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/drover/drover/api"
	"github.com/drover/drover/internal/testkit"
	"github.com/drover/drover/server/store/postgres/pgtest"
)

// soakWindow is how long the soak test's fleet runs (from the first
// scheduled fire on): DROVER_SOAK (a Go duration, e.g. 10m) or 150 s, which
// keeps the whole test at about 3–4 minutes. Give `go test` a -timeout
// above the window plus 5 minutes for long soaks.
func soakWindow(t *testing.T) time.Duration {
	v := os.Getenv("DROVER_SOAK")
	if v == "" {
		return 150 * time.Second
	}
	d, err := time.ParseDuration(v)
	if err != nil || d < 2*time.Minute {
		t.Fatalf("DROVER_SOAK=%q: want a duration of at least 2m", v)
	}
	return d
}

// soakHomes is the replica each agent prefers (the first of its pinned
// lists): three on A, two on B, one on C, so that one replica holds the
// most streams.
var soakHomes = []int{0, 0, 0, 1, 1, 2}

const soakBurst = 20 // run-now requests issued just before the kill

// TestSoakReplicas: three drover-server replicas on one PostgreSQL and six
// cron-backend agents spread over them, each running an every-minute pipe
// while a pipe is changed every few seconds through whichever replica is
// up. Just after a minute's fire, 20 run-nows go out through all three
// replicas, then the replica holding the most streams is SIGKILLed: every
// agent's stream and polls are on another replica within 10 s (measured
// per agent). Over the next minute boundary PostgreSQL is stopped for 18 s
// (the fires of that minute finish while it is down and wait in the
// agents' outboxes) and started again; then the killed replica comes
// back. At the end every scheduled fire time of every agent has exactly
// one run, every run-now request exactly one run, no run id appears twice,
// the serials each agent accepted and each replica served never went
// backwards, and no two replicas ran the singletons at once (their
// leadership terms, read from their logs, do not overlap, and /healthz,
// sampled on all replicas at once, never shows two leaders).
func TestSoakReplicas(t *testing.T) {
	t.Parallel()
	window := soakWindow(t)
	pg := pgtest.Start(t)
	dsn := pg.NewDatabase(t)
	names := []string{"A", "B", "C"}
	var httpAddrs, grpcAddrs, urls []string
	for range names {
		h, g := replicaAddr(t), replicaAddr(t)
		httpAddrs, grpcAddrs, urls = append(httpAddrs, h), append(grpcAddrs, g), append(urls, "https://"+h)
	}
	env := replicaEnv(t, dsn, urls, grpcAddrs)
	reps := make([]*serverProc, len(names))
	for i, n := range names {
		reps[i] = startReplica(t, n, httpAddrs[i], grpcAddrs[i], env)
	}
	var alive [3]atomic.Bool
	for i := range alive {
		alive[i].Store(true)
	}
	// up is a replica that is running (the lowest from i on).
	up := func(i int) *serverProc {
		for k := range names {
			if j := (i + k) % len(names); alive[j].Load() {
				return reps[j]
			}
		}
		t.Fatal("no replica is up")
		return nil
	}

	tags := map[string]string{"e2e": "soak"}
	rotate := func(l []string, by int) []string { return append(append([]string{}, l[by:]...), l[:by]...) }
	ags := make([]*agentProc, len(soakHomes))
	ids := make([]string, len(soakHomes))
	for i, home := range soakHomes {
		var tok api.EnrollmentTokenCreated
		reps[home].api("POST", "/api/v1/enrollment-tokens", api.EnrollmentTokenRequest{Tags: tags}, &tok)
		ags[i] = newAgent(t, reps[home], agentOpts{name: fmt.Sprintf("agent-soak-%d", i), backend: "cron", tags: tags,
			serverURL: urls[home], syncInterval: 2 * time.Second, token: tok.Token,
			serverURLs: rotate(urls, home), grpcAddrs: rotate(grpcAddrs, home)})
		ags[i].start()
	}
	for i, ag := range ags {
		ids[i] = ag.waitEnrolled()
	}

	const tick = "soak-tick"
	burstPipes := []string{"burst-0", "burst-1", "burst-2", "burst-3"}
	pipes := append([]string{tick, "soak-churn"}, burstPipes...)
	reps[0].putPipe(tick, pipeSpec{Schedule: "* * * * *", Script: "echo tick\n", Targets: byTags(tags)})
	reps[1].putPipe("soak-churn", pipeSpec{Schedule: far, Script: "echo churn 0\n", Targets: byTags(tags)})
	for i, p := range burstPipes {
		reps[i%3].putPipe(p, pipeSpec{Schedule: far, Script: "sleep 2; echo burst\n", Targets: byTags(tags)})
	}
	first := make([]time.Time, len(ags)) // each agent's first scheduled fire of the tick
	for i, ag := range ags {
		st := ag.waitPipes(90*time.Second, pipes...)
		for _, p := range st.Pipes {
			if p.Name == tick {
				first[i] = p.NextRun.UTC()
			}
		}
	}

	// The observers: agents' accepted serials, each replica's view of the
	// agents' serials and its /healthz, every half second; a pipe change
	// every 7 s through a replica that is up.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	obs := &soakObserver{t: t, agentSerial: make([]uint64, len(ags)), applied: make([]uint64, len(ags)), servedMax: map[string]uint64{}}
	wg.Add(3)
	go func() {
		defer wg.Done()
		every(stop, 500*time.Millisecond, func() {
			for i, ag := range ags {
				if st := ag.status(); st != nil {
					obs.agent(i, st.Serial, st.AppliedSerial)
				}
			}
		})
	}()
	go func() {
		defer wg.Done()
		every(stop, 500*time.Millisecond, func() {
			var swg sync.WaitGroup
			leaders := make([]bool, len(reps))
			for i, r := range reps {
				if !alive[i].Load() {
					continue
				}
				swg.Add(1)
				go func() {
					defer swg.Done()
					var h api.Health
					if quickGet(r, "/healthz", &h) == nil {
						leaders[i] = h.Leader
					}
					var list api.AgentList
					if quickGet(r, "/api/v1/agents", &list) == nil {
						obs.served(names[i], list)
					}
				}()
			}
			swg.Wait()
			obs.leaders(names, leaders)
		})
	}()
	var churned atomic.Int64
	go func() {
		defer wg.Done()
		n := 0
		every(stop, 7*time.Second, func() {
			n++
			spec := pipeSpec{Schedule: far, Script: fmt.Sprintf("echo churn %d\n", n), Targets: byTags(tags)}
			r := up(n)
			code, _, err := testkit.APIClient{HTTP: quickClient(r), Base: r.base, Token: r.admin}.Call("PUT", "/api/v1/pipes/soak-churn", map[string]any{"spec": spec})
			if err == nil && code/100 == 2 {
				churned.Add(1)
			}
		})
	}()
	defer func() {
		select {
		case <-stop:
		default:
			close(stop)
		}
		wg.Wait()
	}()

	// The burst and the kill, one second after a minute's fire.
	f1 := time.Now().Truncate(time.Minute).Add(time.Minute)
	if time.Until(f1) < 5*time.Second {
		f1 = f1.Add(time.Minute)
	}
	windowStart := f1
	sleepUntil(f1.Add(time.Second))
	streams := make([]int, len(reps))
	for _, ag := range ags {
		if st := ag.status(); st != nil && st.StreamConnected {
			for j, g := range grpcAddrs {
				if st.GRPCAddr == g {
					streams[j]++
				}
			}
		}
	}
	victim := 0
	for j := range streams {
		if streams[j] > streams[victim] {
			victim = j
		}
	}
	t.Logf("streams per replica before the kill: A %d, B %d, C %d; killing %s", streams[0], streams[1], streams[2], names[victim])
	type burstReq struct{ agent, pipe, request string }
	var burst []burstReq
	for n := range soakBurst {
		i, p := n%len(ags), burstPipes[n/len(ags)]
		req := reps[n%3].runNow(p, ids[i])
		burst = append(burst, burstReq{ids[i], p, req.RequestID})
	}
	killedAt := time.Now()
	reps[victim].proc.kill()
	alive[victim].Store(false)

	// Every agent back on another replica: stream and polls, per agent.
	streamTook := make([]time.Duration, len(ags))
	pollTook := make([]time.Duration, len(ags))
	for i := range ags {
		streamTook[i], pollTook[i] = -1, -1
	}
	testkit.WaitFor(t, 60*time.Second, "every agent's stream and polls on a live replica", func() bool {
		done := true
		for i, ag := range ags {
			st := ag.status()
			if st == nil {
				done = false
				continue
			}
			if streamTook[i] < 0 && st.StreamConnected && st.GRPCAddr != grpcAddrs[victim] {
				streamTook[i] = time.Since(killedAt)
			}
			if pollTook[i] < 0 && st.Server != urls[victim] {
				pollTook[i] = time.Since(killedAt)
			}
			done = done && streamTook[i] >= 0 && pollTook[i] >= 0
		}
		return done
	})
	for i := range ags {
		moved := soakHomes[i] == victim
		t.Logf("agent %d (home %s): stream on a live replica after %s, polls after %s (moved: %v)",
			i, names[soakHomes[i]], streamTook[i].Round(time.Millisecond), pollTook[i].Round(time.Millisecond), moved)
		if streamTook[i] > failoverBudget || pollTook[i] > failoverBudget {
			t.Errorf("agent %d: failover took %s (stream), %s (polls); the budget is %s", i, streamTook[i], pollTook[i], failoverBudget)
		}
	}

	// PostgreSQL down over the next minute boundary: that minute's runs
	// finish while it is down and wait in the outboxes.
	f2 := time.Now().Add(12 * time.Second).Truncate(time.Minute).Add(time.Minute)
	sleepUntil(f2.Add(-8 * time.Second))
	pg.Stop(t)
	downAt := time.Now()
	sleepUntil(f2.Add(10 * time.Second))
	held := make([]uint64, len(ags))
	for i, ag := range ags {
		if st := ag.status(); st != nil {
			held[i] = st.OutboxRecords
		}
	}
	pg.StartAgain(t)
	t.Logf("PostgreSQL down %s (over the fire at %s); records held in the outboxes at the end: %v",
		time.Since(downAt).Round(time.Millisecond), f2.Format("15:04:05"), held)
	for i, n := range held {
		if n == 0 {
			t.Errorf("agent %d held no records while PostgreSQL was down: its run at %s was acknowledged without a commit?", i, f2.Format("15:04:05"))
		}
	}
	backAt := time.Now()
	testkit.WaitFor(t, 90*time.Second, "the outboxes emptied after PostgreSQL is back", func() bool {
		for _, ag := range ags {
			if st := ag.status(); st == nil || st.OutboxRecords != 0 {
				return false
			}
		}
		return true
	})
	t.Logf("ingest resumed: every outbox empty %s after PostgreSQL was back", time.Since(backAt).Round(time.Millisecond))

	// The killed replica comes back (it joins; it may take the lock).
	sleepUntil(f2.Add(25 * time.Second))
	reps[victim].start(httpAddrs[victim], grpcAddrs[victim])
	alive[victim].Store(true)

	windowEnd := windowStart.Add(window)
	if least := f2.Add(45 * time.Second); windowEnd.Before(least) {
		windowEnd = least
	}
	sleepUntil(windowEnd)
	close(stop)
	wg.Wait()
	last := windowEnd.Add(-3 * time.Second).Truncate(time.Minute)

	// Everything settles: the outboxes empty, every expected run final.
	final := func(r api.Run) bool {
		return r.Status != "running" && r.Status != "pending"
	}
	testkit.WaitFor(t, 120*time.Second, "every outbox empty and the fires and requests final", func() bool {
		for i, ag := range ags {
			if st := ag.status(); st == nil || st.OutboxRecords != 0 {
				return false
			}
			finals := 0
			for _, r := range reps[0].runs(tick, ids[i]) {
				if r.ScheduledAt != nil && !r.ScheduledAt.After(last) && final(r) {
					finals++
				}
			}
			if finals < int(last.Sub(first[i])/time.Minute)+1 {
				return false
			}
		}
		return true
	})

	// Exactly once: run ids, scheduled fire times, run-now requests.
	seen := map[string]bool{}
	fires := 0
	for i, id := range ids {
		var all []api.Run
		for _, p := range pipes {
			all = append(all, reps[0].runs(p, id)...)
		}
		for _, r := range all {
			if seen[r.ID] {
				t.Errorf("run id %s twice", r.ID)
			}
			seen[r.ID] = true
		}
		byFire := map[time.Time][]api.Run{}
		for _, r := range reps[0].runs(tick, id) {
			if r.Trigger != "schedule" || r.ScheduledAt == nil {
				t.Errorf("agent %d: a %s run of %s without a fire time: %+v", i, r.Trigger, tick, r)
				continue
			}
			byFire[r.ScheduledAt.UTC()] = append(byFire[r.ScheduledAt.UTC()], r)
		}
		for at, rs := range byFire {
			if len(rs) > 1 {
				t.Errorf("agent %d: fire %s has %d runs: %+v", i, at.Format(time.RFC3339), len(rs), rs)
			}
			// first is the next fire the agent reported once it had the
			// pipe; the fire of the minute before may have happened just
			// before it looked, none earlier.
			if at.Before(first[i].Add(-time.Minute)) || at.Truncate(time.Minute) != at {
				t.Errorf("agent %d: a run scheduled at %s (first fire %s)", i, at.Format(time.RFC3339Nano), first[i].Format(time.RFC3339))
			}
		}
		for at := first[i]; !at.After(last); at = at.Add(time.Minute) {
			rs := byFire[at]
			if len(rs) != 1 {
				t.Errorf("agent %d: fire %s has %d runs, want 1", i, at.Format(time.RFC3339), len(rs))
				continue
			}
			if rs[0].Status != "succeeded" {
				t.Errorf("agent %d: fire %s: %+v", i, at.Format(time.RFC3339), rs[0])
			}
			fires++
		}
	}
	for _, b := range burst {
		var page api.RunList
		reps[0].api("GET", "/api/v1/runs?request_id="+url.QueryEscape(b.request), nil, &page)
		if len(page.Runs) != 1 || page.Runs[0].AgentID != b.agent || page.Runs[0].Pipe != b.pipe || page.Runs[0].Status != "succeeded" {
			t.Errorf("run-now %s (%s on %s): %d runs %+v, want one succeeded", b.request, b.pipe, b.agent, len(page.Runs), page.Runs)
		}
	}
	t.Logf("%d scheduled fires (%s to %s) and %d run-now requests over %d agents, each exactly once; %d runs in all; %d pipe changes applied",
		fires, windowStart.Format("15:04"), last.Format("15:04"), len(burst), len(ags), len(seen), churned.Load())

	// Serials: never backwards (checked as sampled); every agent ends on
	// the serial the replicas serve.
	testkit.WaitFor(t, 60*time.Second, "every agent on the served serial", func() bool {
		for i, ag := range ags {
			st, v := ag.status(), reps[0].agentView(ids[i])
			if st == nil || v.Manifest == nil || st.AppliedSerial != v.Manifest.Serial {
				return false
			}
		}
		return true
	})
	obs.report()
	if churned.Load() < 3 {
		t.Errorf("only %d pipe changes went through: the serials barely moved", churned.Load())
	}

	// Singletons: the leadership terms from the replicas' logs.
	var terms []leaderTerm
	for i, r := range reps {
		var killed time.Time
		if i == victim {
			killed = killedAt
		}
		terms = append(terms, leaderTerms(t, names[i], r.log.path, killed)...)
	}
	sort.Slice(terms, func(i, j int) bool { return terms[i].from.Before(terms[j].from) })
	var desc []string
	for k, tm := range terms {
		desc = append(desc, fmt.Sprintf("%s %s–%s", tm.replica, tm.from.Format("15:04:05.000"), tm.to.Format("15:04:05.000")))
		if k > 0 && tm.from.Before(terms[k-1].to) {
			t.Errorf("%s ran the singletons from %s while %s still did (until %s)", tm.replica, tm.from.Format(time.RFC3339Nano), terms[k-1].replica, terms[k-1].to.Format(time.RFC3339Nano))
		}
	}
	t.Logf("singleton terms: %s", strings.Join(desc, ", "))
	if len(terms) < 2 {
		t.Errorf("%d leadership terms: neither the kill nor the PostgreSQL restart moved the singletons", len(terms))
	}
}

// soakObserver checks what the samplers see as they see it.
type soakObserver struct {
	t  *testing.T
	mu sync.Mutex
	// agentSerial and applied: the highest each agent reported.
	agentSerial, applied []uint64
	// served: the highest manifest serial each replica listed per agent.
	servedMax    map[string]uint64
	samples      int
	leaderRounds int
	twoLeaders   int
}

func (o *soakObserver) agent(i int, serial, applied uint64) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.samples++
	if serial < o.agentSerial[i] {
		o.t.Errorf("agent %d accepted serial %d after %d", i, serial, o.agentSerial[i])
	}
	if applied < o.applied[i] {
		o.t.Errorf("agent %d applied serial %d after %d", i, applied, o.applied[i])
	}
	o.agentSerial[i], o.applied[i] = max(o.agentSerial[i], serial), max(o.applied[i], applied)
}

func (o *soakObserver) served(replica string, list api.AgentList) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, a := range list.Agents {
		if a.Manifest == nil {
			continue
		}
		k := replica + "/" + a.ID
		if a.Manifest.Serial < o.servedMax[k] {
			o.t.Errorf("replica %s listed agent %s's serial %d after %d", replica, a.ID, a.Manifest.Serial, o.servedMax[k])
		}
		o.servedMax[k] = max(o.servedMax[k], a.Manifest.Serial)
	}
}

func (o *soakObserver) leaders(names []string, leading []bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.leaderRounds++
	var who []string
	for i, l := range leading {
		if l {
			who = append(who, names[i])
		}
	}
	if len(who) > 1 {
		o.twoLeaders++
		o.t.Errorf("/healthz: %v all say leader at %s", who, time.Now().Format(time.RFC3339Nano))
	}
}

func (o *soakObserver) report() {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.t.Logf("serials: %d agent samples, none backwards; last accepted %v; %d /healthz rounds over the live replicas, %d with two leaders",
		o.samples, o.agentSerial, o.leaderRounds, o.twoLeaders)
}

// leaderTerm is a stretch during which a replica ran the singletons.
type leaderTerm struct {
	replica  string
	from, to time.Time
}

// leaderTerms reads a replica's leadership terms from its JSON log: from
// "this replica runs the singletons" to "stopped the singletons"; a term
// open when the process was SIGKILLed (killed) ends then, one still open
// at the end of the log ends now.
func leaderTerms(t *testing.T, replica, path string, killed time.Time) []leaderTerm {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var terms []leaderTerm
	var open *leaderTerm
	end := func(at time.Time) {
		open.to = at
		terms = append(terms, *open)
		open = nil
	}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		var l struct {
			Time time.Time
			Msg  string
		}
		if json.Unmarshal(sc.Bytes(), &l) != nil {
			continue
		}
		if open != nil && !killed.IsZero() && open.from.Before(killed) && l.Time.After(killed) {
			end(killed)
		}
		switch l.Msg {
		case "leader: this replica runs the singletons":
			if open != nil {
				t.Errorf("%s: a second term began at %s without the first ending", replica, l.Time)
				end(l.Time)
			}
			open = &leaderTerm{replica: replica, from: l.Time}
		case "leader: this replica stopped the singletons":
			if open != nil {
				end(l.Time)
			}
		}
	}
	if open != nil {
		if !killed.IsZero() && open.from.Before(killed) {
			end(killed)
		} else {
			end(time.Now())
		}
	}
	return terms
}

// quickClient is the replica's admin client with a short timeout, for the
// samplers (a dead replica or a database outage must not hold them up).
func quickClient(s *serverProc) *http.Client {
	return &http.Client{Timeout: 3 * time.Second, Transport: s.client.Transport}
}

// quickGet is an admin GET that returns an error instead of failing the
// test.
func quickGet(s *serverProc, path string, out any) error {
	code, b, err := testkit.APIClient{HTTP: quickClient(s), Base: s.base, Token: s.admin}.Call("GET", path, nil)
	if err != nil {
		return err
	}
	if code != 200 {
		return fmt.Errorf("GET %s: %d", path, code)
	}
	return json.Unmarshal(b, out)
}

// every calls fn every d until stop is closed.
func every(stop <-chan struct{}, d time.Duration, fn func()) {
	tk := time.NewTicker(d)
	defer tk.Stop()
	for {
		select {
		case <-stop:
			return
		case <-tk.C:
			fn()
		}
	}
}
