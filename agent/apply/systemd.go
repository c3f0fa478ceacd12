package apply

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	sddbus "github.com/coreos/go-systemd/v22/dbus"
	godbus "github.com/godbus/dbus/v5"

	"github.com/drover/drover/agent/runreq"
	"github.com/drover/drover/internal/atomicfile"
	"github.com/drover/drover/manifest"
	"github.com/drover/drover/units"
)

// Systemd is the systemd backend: units in the unit dir, loaded and driven
// over D-Bus (go-systemd), system or user manager.
type Systemd struct {
	cfg            Config
	runtimeUnitDir string
	conn           *sddbus.Conn

	mu   sync.Mutex // serialises Apply and Check
	last *Input     // last applied input, for Check

	// Run accounting (account_systemd.go).
	changes notifier
	done    chan struct{}
	amu     sync.Mutex
	settled map[string]string     // pipe -> the invocation key last forgotten
	reqs    map[string]*runNowReq // pipe -> its last RunNow
}

// NewSystemd connects to the manager of cfg.Scope.
func NewSystemd(ctx context.Context, cfg Config) (*Systemd, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	conn, err := connect(ctx, cfg.Scope, cfg.BusAddress)
	if err != nil {
		return nil, err
	}
	b := &Systemd{cfg: cfg, conn: conn, runtimeUnitDir: "/run/systemd/system",
		changes: newNotifier(), done: make(chan struct{}), settled: map[string]string{}, reqs: map[string]*runNowReq{}}
	if cfg.Scope == units.ScopeUser {
		b.runtimeUnitDir = filepath.Join(filepath.Dir(cfg.RuntimeDir), "systemd", "user")
	}
	b.watch()
	return b, nil
}

func connect(ctx context.Context, scope units.Scope, address string) (*sddbus.Conn, error) {
	// go-systemd ties the connection to the context it was made with: it
	// must outlive this call.
	life := context.WithoutCancel(ctx)
	var conn *sddbus.Conn
	var err error
	switch {
	case address != "":
		conn, err = sddbus.NewConnection(func() (*godbus.Conn, error) {
			c, err := godbus.Dial(address, godbus.WithContext(life))
			if err != nil {
				return nil, err
			}
			if err := c.Auth(nil); err != nil {
				c.Close()
				return nil, err
			}
			if err := c.Hello(); err != nil {
				c.Close()
				return nil, err
			}
			return c, nil
		})
	case scope == units.ScopeUser:
		conn, err = sddbus.NewUserConnectionContext(life)
	default:
		// The private socket needs no dbus-daemon; fall back to the bus.
		conn, err = sddbus.NewSystemdConnectionContext(life)
		if err != nil {
			conn, err = sddbus.NewSystemConnectionContext(life)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("systemd %s manager: %w", scope, err)
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if _, err := conn.SystemStateContext(ctx); err != nil {
		conn.Close()
		return nil, fmt.Errorf("systemd %s manager does not answer: %w", scope, err)
	}
	return conn, nil
}

func (b *Systemd) Name() string { return "systemd" }

func (b *Systemd) Close() error {
	select {
	case <-b.done:
	default:
		close(b.done)
	}
	b.conn.Close()
	return nil
}

// readState reads the unit dir, the pipe dirs and the timers' runtime state.
func (b *Systemd) readState(ctx context.Context) (State, map[string]bool, error) {
	st := State{Units: map[string]FileState{}, Timers: map[string]TimerState{}}
	ents, err := os.ReadDir(b.cfg.UnitDir)
	if err != nil && !os.IsNotExist(err) {
		return st, nil, err
	}
	for _, e := range ents {
		if _, ok := pipeOfUnit(e.Name()); !ok || e.IsDir() {
			continue
		}
		data, err := os.ReadFile(filepath.Join(b.cfg.UnitDir, e.Name()))
		if err != nil {
			// Unreadable (a dangling link): not ours to touch.
			st.Units[e.Name()] = FileState{}
			continue
		}
		st.Units[e.Name()] = FileState{Managed: units.IsManaged(data), Data: data}
	}
	if st.PipeDirs, err = readPipeDirs(b.cfg.DataDir); err != nil {
		return st, nil, err
	}
	loaded := map[string]bool{}
	list, err := b.conn.ListUnitsByPatternsContext(ctx, nil, []string{"drover-pipe-*.timer"})
	if err != nil {
		return st, nil, fmt.Errorf("list timers: %w", err)
	}
	active := map[string]bool{}
	for _, u := range list {
		// Any unit object in memory counts, even one whose file is gone:
		// it keeps its timestamps when the file comes back.
		loaded[u.Name] = true
		active[u.Name] = u.ActiveState == "active" || u.ActiveState == "activating"
	}
	for name := range st.Units {
		if !strings.HasSuffix(name, ".timer") {
			continue
		}
		_, lerr := os.Lstat(filepath.Join(b.cfg.UnitDir, "timers.target.wants", name))
		st.Timers[name] = TimerState{Active: active[name], Enabled: lerr == nil}
	}
	return st, loaded, nil
}

// Apply implements Backend.
func (b *Systemd) Apply(ctx context.Context, in Input) (*Result, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	res, err := b.apply(ctx, in)
	if err == nil {
		cp := in
		b.last = &cp
	}
	return res, err
}

// Check implements Backend.
func (b *Systemd) Check(ctx context.Context) ([]Step, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.last == nil {
		return nil, nil
	}
	res, err := b.apply(ctx, *b.last)
	if err != nil {
		return nil, err
	}
	return res.changes(), nil
}

func (b *Systemd) apply(ctx context.Context, in Input) (*Result, error) {
	t0 := time.Now()
	lap := phaseTimer(b.cfg.Logger, "apply")
	res := &Result{}
	now := b.cfg.Now()
	preps, err := prepare(in.Manifest, b.cfg.renderOptions(), true, now, b.lastManifest())
	if err != nil {
		return nil, err
	}
	lap("render")
	if err := ensureDir(b.cfg.UnitDir, 0o755); err != nil {
		return nil, err
	}
	removeTemps(b.cfg.UnitDir)
	removeStaleGuards(b.runtimeUnitDir)
	b.removeStaleBatch(ctx)

	cur, loaded, err := b.readState(ctx)
	if err != nil {
		return nil, err
	}
	steps := planSteps(preps, cur, res)
	lap("read state and plan")
	// Drop-ins beside managed units change what runs behind the
	// manifest's back: drift, removed before the reload.
	dropIns := removeDropIns(b.cfg.UnitDir, preps)
	res.Steps = append(res.Steps, dropIns...)
	res.Drift = append(res.Drift, dropIns...)
	failed := materialise(b.cfg.DataDir, preps, steps, in, res)
	lap("pipe dirs and secrets")

	jobs := sortSteps(steps, failed, loaded, catchupFrom(preps))
	writes := b.writeTempUnits(preps, &jobs, res)
	lap("write temp units")
	// Before the reload: stop what must not run on the new files.
	b.runJobs(ctx, "stop", jobs.stop, res)
	lap("stop jobs")
	if err := disableLinks(b.cfg.UnitDir, jobs.disable); err != nil {
		b.cfg.Logger.Warn("disable timers", "err", err)
	}
	if err := commitFiles(writes); err != nil {
		return res, fmt.Errorf("write units: %w", err)
	}
	lap("write units")
	b.removeUnits(jobs.removes, res)
	for _, tm := range jobs.start {
		if _, ok := jobs.catchup[tm]; !loaded[tm] && !ok {
			_ = removeStamp(b.cfg.StampDir, tm)
		}
	}
	for _, tm := range jobs.guarded {
		// A timer of a pipe that becomes held starts from the last fire
		// time served: systemd's Persistent= catch-up then fires it at
		// once when fire times passed since, and the runner makes the
		// catch-up runs the pipe's policy asks for (guard.go).
		from, ok := jobs.catchup[tm]
		if !ok {
			from = now
		}
		if err := armGuard(b.runtimeUnitDir, b.cfg.StampDir, tm, from); err != nil {
			return res, fmt.Errorf("guard %s: %w", tm, err)
		}
	}
	lap("remove units, guard")
	if err := enableLinks(b.cfg.UnitDir, jobs.enable); err != nil {
		return res, fmt.Errorf("enable timers: %w", err)
	}
	lap("enable")
	changed := len(writes) > 0 || len(dropIns) > 0
	if err := b.reloadAndStart(ctx, jobs, changed, res, lap); err != nil {
		return res, err
	}

	keep := map[string]bool{}
	for _, p := range preps {
		keep[p.pipe.Name] = true
	}
	if err := gcPipeDirs(b.cfg.DataDir, keep, b.busy(ctx)); err != nil {
		b.cfg.Logger.Warn("clean pipe dirs", "err", err)
	}
	lap("gc")
	res.Duration = time.Since(t0)
	return res, nil
}

// unitJobs is what one apply does to units, by kind, in the order of the
// plan's steps.
type unitJobs struct {
	stop, disable, start, enable []string // unit names
	removes                      []string // unit files to delete
	guarded                      []string // loaded timers started again: guarded against an unplanned run
	toWrite                      []Step   // unit files to create, update or restore
	// catchup holds the timers (also in guarded) whose start catches up
	// from a last fire time served rather than from now.
	catchup map[string]time.Time
}

// catchupFrom maps the timers of preps to their Desired.CatchupFrom.
func catchupFrom(preps []prepared) map[string]time.Time {
	out := map[string]time.Time{}
	for _, p := range preps {
		if !p.desired.CatchupFrom.IsZero() {
			out[units.TimerName(p.pipe.Name)] = p.desired.CatchupFrom
		}
	}
	return out
}

// lastManifest is the manifest of the last apply (nil before the first).
func (b *Systemd) lastManifest() *manifest.Manifest {
	if b.last == nil {
		return nil
	}
	return b.last.Manifest
}

// sortSteps sorts the plan's steps into unit jobs, leaving out the pipes
// that failed (except their removals). Pipe directories ("pipes/...") are
// materialise's and gcPipeDirs' business. catchup maps timers to the fire
// time their start catches up from; it applies to starts only (a new or a
// stopped timer), not to a restart for a schedule change, which counts
// from now like any other.
func sortSteps(steps []Step, failed, loaded map[string]bool, catchup map[string]time.Time) unitJobs {
	j := unitJobs{catchup: map[string]time.Time{}}
	for _, s := range steps {
		if failed[s.Pipe] && s.Action != ActionRemove {
			continue
		}
		switch {
		case s.Action == ActionRemove && strings.HasPrefix(s.File, "pipes/"):
			// gcPipeDirs removes it at the end.
		case s.Action == ActionRemove:
			j.stop = append(j.stop, s.File)
			if strings.HasSuffix(s.File, ".timer") {
				j.disable = append(j.disable, s.File)
			}
			j.removes = append(j.removes, s.File)
		case s.Action == ActionCreate || s.Action == ActionUpdate || s.Action == ActionRestore:
			if strings.HasPrefix(s.File, "pipes/") {
				continue
			}
			j.toWrite = append(j.toWrite, s)
		case s.Action == ActionRestart:
			j.stop = append(j.stop, s.File)
			fallthrough
		case s.Action == ActionStart:
			j.start = append(j.start, s.File)
			j.enable = append(j.enable, s.File)
			from, ok := catchup[s.File]
			ok = ok && s.Action == ActionStart && (s.Reason == "new timer" || s.Reason == "timer inactive")
			if ok {
				j.catchup[s.File] = from
			}
			if loaded[s.File] || ok {
				j.guarded = append(j.guarded, s.File)
			}
		case s.Action == ActionStop:
			j.stop = append(j.stop, s.File)
			j.disable = append(j.disable, s.File)
		}
	}
	return j
}

// writeTempUnits writes the units of jobs.toWrite under temporary names,
// in parallel, for commitFiles. A pipe whose unit cannot be written fails
// and keeps its units as they were: none of its timers is started.
func (b *Systemd) writeTempUnits(preps []prepared, jobs *unitJobs, res *Result) []pendingFile {
	rendered := map[string][]byte{}
	for _, p := range preps {
		for _, u := range p.desired.Units {
			rendered[u.Name] = u.Data
		}
	}
	pend := make([]pendingFile, len(jobs.toWrite))
	errs := make([]error, len(jobs.toWrite))
	parallel(len(jobs.toWrite), func(i int) {
		f := jobs.toWrite[i].File
		pend[i], errs[i] = writeTemp(filepath.Join(b.cfg.UnitDir, f), rendered[f], 0o644)
	})
	var writes []pendingFile
	writeFailed := map[string]bool{}
	for i, s := range jobs.toWrite {
		if errs[i] != nil {
			res.fail(s.Pipe, errs[i])
			writeFailed[s.Pipe] = true
			continue
		}
		writes = append(writes, pend[i])
	}
	if len(writeFailed) > 0 {
		skip := func(unit string) bool { p, _ := pipeOfUnit(unit); return writeFailed[p] }
		jobs.start = slices.DeleteFunc(jobs.start, skip)
		jobs.enable = slices.DeleteFunc(jobs.enable, skip)
		jobs.guarded = slices.DeleteFunc(jobs.guarded, skip)
	}
	return writes
}

// removeUnits deletes unit files (and the stamps of removed timers).
func (b *Systemd) removeUnits(files []string, res *Result) {
	for _, f := range files {
		if err := os.Remove(filepath.Join(b.cfg.UnitDir, f)); err != nil && !os.IsNotExist(err) {
			p, _ := pipeOfUnit(f)
			res.fail(p, err)
		}
		if strings.HasSuffix(f, ".timer") {
			_ = removeStamp(b.cfg.StampDir, f)
		}
	}
	if len(files) > 0 {
		_ = atomicfile.SyncDir(b.cfg.UnitDir)
	}
}

// reloadAndStart reloads the manager when anything on disk changed (files
// written, changed says; or jobs touching files), starts the timers (as one
// batch when there are many), then disarms the guards and resets removed
// units' failed state.
func (b *Systemd) reloadAndStart(ctx context.Context, jobs unitJobs, changed bool, res *Result, lap func(string)) error {
	batch := len(jobs.start) >= batchMin
	if batch {
		if err := writeBatchTarget(b.runtimeUnitDir, jobs.start); err != nil {
			return fmt.Errorf("batch target: %w", err)
		}
		defer os.Remove(filepath.Join(b.runtimeUnitDir, batchTarget))
	}
	if changed || len(jobs.removes) > 0 || len(jobs.guarded) > 0 || len(jobs.enable) > 0 || len(jobs.disable) > 0 || batch {
		if err := b.conn.ReloadContext(ctx); err != nil {
			return fmt.Errorf("daemon-reload: %w", err)
		}
		res.Reloads++
	}
	lap("reload")
	if batch {
		b.startBatch(ctx, jobs.start, res)
	} else {
		b.runJobs(ctx, "start", jobs.start, res)
	}
	lap("start jobs")
	for _, tm := range jobs.guarded {
		disarmGuard(b.runtimeUnitDir, tm)
	}
	for _, u := range jobs.removes {
		_ = b.conn.ResetFailedUnitContext(ctx, u)
	}
	return nil
}

// phaseTimer logs, at debug level, how long each phase took.
func phaseTimer(log *slog.Logger, what string) func(phase string) {
	last := time.Now()
	return func(phase string) {
		now := time.Now()
		log.Debug(what, "phase", phase, "took", now.Sub(last))
		last = now
	}
}

// busy returns a function telling whether a pipe's service is running now.
func (b *Systemd) busy(ctx context.Context) func(string) bool {
	running := map[string]bool{}
	list, err := b.conn.ListUnitsByPatternsContext(ctx, []string{"active", "activating", "deactivating", "reloading"}, []string{"drover-pipe-*.service"})
	if err != nil {
		return func(string) bool { return true } // unsure: keep everything
	}
	for _, u := range list {
		if p, ok := pipeOfUnit(u.Name); ok {
			running[p] = true
		}
	}
	return func(p string) bool { return running[p] }
}

// runJobs queues a job per unit and waits for all of them. The D-Bus calls
// go out from a few goroutines at once, so their round trips overlap.
func (b *Systemd) runJobs(ctx context.Context, kind string, names []string, res *Result) {
	if len(names) == 0 {
		return
	}
	var (
		mu   sync.Mutex
		wg   sync.WaitGroup
		work = make(chan string)
	)
	fail := func(unit string, err error) {
		p, _ := pipeOfUnit(unit)
		mu.Lock()
		res.fail(p, fmt.Errorf("%s %s: %w", kind, unit, err))
		mu.Unlock()
	}
	for range min(jobWorkers, len(names)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := range work {
				ch := make(chan string, 1)
				var err error
				if kind == "stop" {
					_, err = b.conn.StopUnitContext(ctx, n, "replace", ch)
				} else {
					_, err = b.conn.StartUnitContext(ctx, n, "replace", ch)
				}
				if err != nil {
					if kind != "stop" || !strings.Contains(err.Error(), "not loaded") {
						fail(n, err)
					}
					continue
				}
				select {
				case r := <-ch:
					if r != "done" {
						fail(n, fmt.Errorf("job %s", r))
					}
				case <-ctx.Done():
					fail(n, ctx.Err())
				}
			}
		}()
	}
	for _, n := range names {
		work <- n
	}
	close(work)
	wg.Wait()
}

// Many timers are started with one job on a runtime target that wants them
// all: one transaction instead of one D-Bus call and transaction per timer.
const (
	batchMin    = 4
	batchTarget = "drover-apply-batch.target"
)

// writeBatchTarget writes the runtime target (loaded by the apply's reload)
// whose start starts timers; After= makes its job end after theirs.
func writeBatchTarget(runtimeUnitDir string, timers []string) error {
	if err := os.MkdirAll(runtimeUnitDir, 0o755); err != nil {
		return err
	}
	var b strings.Builder
	b.WriteString("# Written by drover-agent for one apply; removed right after.\n[Unit]\nDescription=drover-agent: start timers\nDefaultDependencies=no\n")
	for i := 0; i < len(timers); i += 32 {
		line := strings.Join(timers[i:min(i+32, len(timers))], " ")
		b.WriteString("Wants=" + line + "\nAfter=" + line + "\n")
	}
	return os.WriteFile(filepath.Join(runtimeUnitDir, batchTarget), []byte(b.String()), 0o644)
}

// removeStaleBatch removes a batch target a crashed apply left behind.
func (b *Systemd) removeStaleBatch(ctx context.Context) {
	if err := os.Remove(filepath.Join(b.runtimeUnitDir, batchTarget)); err != nil {
		return
	}
	ch := make(chan string, 1)
	if _, err := b.conn.StopUnitContext(ctx, batchTarget, "replace", ch); err == nil {
		select {
		case <-ch:
		case <-ctx.Done():
		}
	}
}

// startBatch starts timers through the batch target, then checks each one.
func (b *Systemd) startBatch(ctx context.Context, timers []string, res *Result) {
	ch := make(chan string, 1)
	if _, err := b.conn.StartUnitContext(ctx, batchTarget, "replace", ch); err != nil {
		b.cfg.Logger.Warn("batch start failed; starting one by one", "err", err)
		b.runJobs(ctx, "start", timers, res)
		return
	}
	select {
	case <-ch:
	case <-ctx.Done():
	}
	// Stopping a target does not stop what it only Wants=; stopped, the
	// target is unloaded once its file is gone.
	stop := make(chan string, 1)
	if _, err := b.conn.StopUnitContext(ctx, batchTarget, "replace", stop); err == nil {
		select {
		case <-stop:
		case <-ctx.Done():
		}
	}
	list, err := b.conn.ListUnitsByNamesContext(ctx, timers)
	if err != nil {
		b.cfg.Logger.Warn("check batch start", "err", err)
		return
	}
	var retry []string
	for _, u := range list {
		if u.ActiveState != "active" {
			retry = append(retry, u.Name)
		}
	}
	// Whatever did not start is tried alone, for a precise error.
	b.runJobs(ctx, "start", retry, res)
}

// jobWorkers bounds the D-Bus job calls in flight.
const jobWorkers = 16

// enableLinks does what `systemctl enable` does for our timers, whose only
// [Install] line is WantedBy=timers.target: a link
// <unit dir>/timers.target.wants/<timer> -> <unit dir>/<timer>. Done on disk
// before the one reload, it costs microseconds where EnableUnitFiles over
// D-Bus takes seconds for a thousand units.
func enableLinks(unitDir string, timers []string) error {
	if len(timers) == 0 {
		return nil
	}
	wants := filepath.Join(unitDir, "timers.target.wants")
	if err := os.MkdirAll(wants, 0o755); err != nil {
		return err
	}
	removeTemps(wants)
	for _, tm := range timers {
		link, target := filepath.Join(wants, tm), filepath.Join(unitDir, tm)
		err := os.Symlink(target, link)
		if err == nil {
			continue
		}
		if !os.IsExist(err) {
			return err
		}
		if cur, err := os.Readlink(link); err == nil && cur == target {
			continue
		}
		tmp := filepath.Join(wants, tmpPrefix+tm+"-"+randHex(4))
		if err := os.Symlink(target, tmp); err != nil {
			return err
		}
		if err := os.Rename(tmp, link); err != nil {
			os.Remove(tmp)
			return err
		}
	}
	return atomicfile.SyncDir(wants)
}

// disableLinks removes the links enableLinks makes.
func disableLinks(unitDir string, timers []string) error {
	if len(timers) == 0 {
		return nil
	}
	wants := filepath.Join(unitDir, "timers.target.wants")
	var errs []error
	for _, tm := range timers {
		if err := os.Remove(filepath.Join(wants, tm)); err != nil && !os.IsNotExist(err) {
			errs = append(errs, err)
		}
	}
	if _, err := os.Stat(wants); err == nil {
		errs = append(errs, atomicfile.SyncDir(wants))
	}
	return errors.Join(errs...)
}

// pipesOnDisk lists pipes with a managed unit in the unit dir.
func (b *Systemd) pipesOnDisk() []string {
	ents, _ := os.ReadDir(b.cfg.UnitDir)
	seen := map[string]bool{}
	var out []string
	for _, e := range ents {
		p, ok := pipeOfUnit(e.Name())
		if !ok || seen[p] {
			continue
		}
		data, err := os.ReadFile(filepath.Join(b.cfg.UnitDir, e.Name()))
		if err != nil || !units.IsManaged(data) {
			continue
		}
		seen[p] = true
		out = append(out, p)
	}
	sort.Strings(out)
	return out
}

func (b *Systemd) managed(pipe string) bool {
	data, err := os.ReadFile(filepath.Join(b.cfg.UnitDir, units.ServiceName(pipe)))
	return err == nil && units.IsManaged(data)
}

// Status implements Backend. It runs on every heartbeat and sync, so it
// asks the manager only for what it uses: the active states of every pipe
// unit in one ListUnitsByNames call, then per pipe the timer's next and
// last elapse and the service's Result and ExecMainStatus (and its
// InvocationID while it runs), one property each. Reading every property of both units
// (GetAllProperties, hundreds each) made an idle agent with 100 pipes
// allocate ~100 MB per 30 s. Enabled is our own timers.target.wants link,
// the only way the agent enables a timer.
func (b *Systemd) Status(ctx context.Context) ([]PipeState, error) {
	pipes := b.pipesOnDisk()
	if len(pipes) == 0 {
		return nil, nil
	}
	names := make([]string, 0, 2*len(pipes))
	for _, p := range pipes {
		names = append(names, units.TimerName(p), units.ServiceName(p))
	}
	list, err := b.conn.ListUnitsByNamesContext(ctx, names)
	if err != nil {
		return nil, fmt.Errorf("list units: %w", err)
	}
	active := make(map[string]string, len(list))
	for _, u := range list {
		active[u.Name] = u.ActiveState
	}
	wants := filepath.Join(b.cfg.UnitDir, "timers.target.wants")
	out := make([]PipeState, 0, len(pipes))
	for _, p := range pipes {
		tm, svc := units.TimerName(p), units.ServiceName(p)
		ps := PipeState{Name: p, Scheduled: active[tm] == "active"}
		if target, err := os.Readlink(filepath.Join(wants, tm)); err == nil && target == filepath.Join(b.cfg.UnitDir, tm) {
			ps.Enabled = true
		}
		next, err := b.conn.GetUnitTypePropertyContext(ctx, tm, "Timer", "NextElapseUSecRealtime")
		if err != nil {
			return nil, err
		}
		ps.Next = usecTime(next.Value.Value())
		if v, err := b.conn.GetUnitTypePropertyContext(ctx, tm, "Timer", "LastTriggerUSec"); err == nil {
			ps.LastTrigger = usecTime(v.Value.Value())
		}
		as := active[svc]
		ps.Running = as == "activating" || as == "active" || as == "deactivating"
		if ps.Running {
			if v, err := b.conn.GetUnitPropertyContext(ctx, svc, "InvocationID"); err == nil {
				ps.RunID = invocationID(v.Value.Value())
			}
		}
		if v, err := b.conn.GetServicePropertyContext(ctx, svc, "Result"); err == nil {
			ps.LastResult, _ = v.Value.Value().(string)
		}
		if v, err := b.conn.GetServicePropertyContext(ctx, svc, "ExecMainStatus"); err == nil {
			if st, ok := v.Value.Value().(int32); ok {
				ps.LastExit = int(st)
			}
		}
		out = append(out, ps)
	}
	return out, nil
}

func usecTime(v any) time.Time {
	u, ok := v.(uint64)
	if !ok || u == 0 || u == ^uint64(0) {
		return time.Time{}
	}
	return time.UnixMicro(int64(u))
}

func invocationID(v any) string {
	b, ok := v.([]byte)
	if !ok || len(b) == 0 {
		return ""
	}
	return fmt.Sprintf("%x", b)
}

// sameRunID compares run ids loosely: systemd's 32 hex digits or a UUID.
func sameRunID(a, b string) bool {
	norm := func(s string) string { return strings.ToLower(strings.ReplaceAll(s, "-", "")) }
	return norm(a) == norm(b)
}

// RunNow implements Backend: it writes the request file, then starts the
// service without waiting for the run to end; the file is removed when it
// has.
func (b *Systemd) RunNow(ctx context.Context, pipe, requestID string) error {
	if !manifest.ValidName(pipe) || !b.managed(pipe) {
		return fmt.Errorf("%w: %q", ErrUnknownPipe, pipe)
	}
	svc := units.ServiceName(pipe)
	if p, err := b.conn.GetUnitPropertyContext(ctx, svc, "ActiveState"); err == nil {
		if s, _ := p.Value.Value().(string); s == "active" || s == "activating" {
			return ErrAlreadyRunning
		}
	}
	path, err := runreq.Write(runreq.Dir(b.cfg.RuntimeDir), pipe, requestID, b.cfg.Now())
	if err != nil {
		return err
	}
	_, before, _ := b.invocationKey(ctx, pipe)
	req := &runNowReq{id: requestID, at: b.cfg.Now(), beforeKey: before}
	b.amu.Lock()
	b.reqs[pipe] = req
	b.amu.Unlock()
	ch := make(chan string, 1)
	if _, err := b.conn.StartUnitContext(ctx, svc, "replace", ch); err != nil {
		runreq.Remove(path, requestID)
		b.amu.Lock()
		if b.reqs[pipe] == req {
			delete(b.reqs, pipe)
		}
		b.amu.Unlock()
		return fmt.Errorf("start %s: %w", svc, err)
	}
	go func() {
		// oneshot: the start job ends when the run does. A job that did
		// not end "done" (the service could not start, or its run failed)
		// is settled by the daemon from the service's account (Ended):
		// never silence.
		r := <-ch
		runreq.Remove(path, requestID)
		b.amu.Lock()
		req.job = r
		b.amu.Unlock()
		if r != "done" {
			b.cfg.Logger.Warn("run now: the start job did not succeed", "pipe", pipe, "request_id", requestID, "job", r)
		}
		b.changes.notify()
	}()
	return nil
}

// Cancel implements Backend: StopUnit on the service; KillMode=control-group
// kills the whole tree.
func (b *Systemd) Cancel(ctx context.Context, pipe, runID string) error {
	if !manifest.ValidName(pipe) || !b.managed(pipe) {
		return fmt.Errorf("%w: %q", ErrUnknownPipe, pipe)
	}
	svc := units.ServiceName(pipe)
	props, err := b.conn.GetUnitPropertiesContext(ctx, svc)
	if err != nil {
		return err
	}
	as, _ := props["ActiveState"].(string)
	if as != "active" && as != "activating" && as != "reloading" {
		return ErrNotRunning
	}
	if runID != "" && !sameRunID(runID, invocationID(props["InvocationID"])) {
		return ErrNotRunning
	}
	ch := make(chan string, 1)
	if _, err := b.conn.StopUnitContext(ctx, svc, "replace", ch); err != nil {
		return fmt.Errorf("stop %s: %w", svc, err)
	}
	select {
	case r := <-ch:
		if r != "done" {
			return fmt.Errorf("stop %s: job %s", svc, r)
		}
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// DropInReason is the reason of the drift step for a removed drop-in; its
// File is "<unit>.d/<entry>" below the unit dir.
const DropInReason = "drop-in beside a managed unit removed"

// removeDropIns removes the drop-in directories (<unit>.d/) beside the units
// of preps and returns one restore step per entry removed.
func removeDropIns(unitDir string, preps []prepared) []Step {
	var out []Step
	for _, p := range preps {
		for _, u := range p.desired.Units {
			dir := filepath.Join(unitDir, u.Name+".d")
			st, err := os.Lstat(dir)
			if err != nil {
				continue
			}
			var names []string
			if st.IsDir() {
				ents, _ := os.ReadDir(dir)
				for _, e := range ents {
					names = append(names, u.Name+".d/"+e.Name())
				}
			}
			if len(names) == 0 {
				names = []string{u.Name + ".d"}
			}
			if err := os.RemoveAll(dir); err != nil {
				continue
			}
			for _, n := range names {
				out = append(out, Step{Action: ActionRestore, Pipe: p.pipe.Name, File: n, Reason: DropInReason})
			}
		}
	}
	if len(out) > 0 {
		_ = atomicfile.SyncDir(unitDir)
	}
	return out
}
