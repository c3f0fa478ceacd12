package apply

import (
	"context"
	"fmt"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	sddbus "github.com/coreos/go-systemd/v22/dbus"
	"github.com/google/uuid"

	"github.com/drover/drover/agent/runreq"
	"github.com/drover/drover/units"
)

// The systemd backend's account of invocations: the manager keeps, for each
// service, the last invocation's InvocationID, Result, ExecMain* and
// timestamps. Ended reads them for every pipe whose service is not running;
// PropertiesChanged signals wake the daemon when a service changes state,
// and the daemon also calls Ended at start and on every status pass, so an
// invocation that ended while it was down is settled too (as long as no
// later invocation of the same pipe replaced it in the manager's memory).

// runNowReq is the last RunNow of a pipe: the invocation that starts right
// after it is that request's run.
type runNowReq struct {
	id        string
	at        time.Time
	beforeKey string // the service's invocation key before the start
	job       string // the start job's result; "" while it runs
	usedKey   string // the invocation found to be this request's run
}

// watch subscribes to the manager's signals and fires b.changes when a pipe
// service changes state. Without signals (a manager that refuses the
// subscription) the daemon's own passes still settle everything.
func (b *Systemd) watch() {
	if err := b.conn.Subscribe(); err != nil {
		b.cfg.Logger.Warn("systemd: no unit signals; ended runs are found on the status passes only", "err", err)
		return
	}
	updates := make(chan *sddbus.PropertiesUpdate, 256)
	errs := make(chan error, 16)
	b.conn.SetPropertiesSubscriber(updates, errs)
	go func() {
		for {
			select {
			case u, ok := <-updates:
				if !ok {
					return
				}
				if _, ok := pipeOfUnit(u.UnitName); ok && strings.HasSuffix(u.UnitName, ".service") {
					if _, ok := u.Changed["ActiveState"]; ok {
						b.changes.notify()
					}
				}
			case <-errs:
			case <-b.done:
				return
			}
		}
	}()
}

// Changes implements Accounter.
func (b *Systemd) Changes() <-chan struct{} { return b.changes }

// Forget implements Accounter.
func (b *Systemd) Forget(keys ...string) {
	b.amu.Lock()
	defer b.amu.Unlock()
	for _, k := range keys {
		if id, ok := strings.CutPrefix(k, "req/"); ok {
			for p, r := range b.reqs {
				if r.id == id {
					delete(b.reqs, p)
				}
			}
			continue
		}
		pipe, _, _ := strings.Cut(k, "/")
		b.settled[pipe] = k
	}
}

func usecProp(v any) time.Time { return usecTime(v) }

// invocationKey reads a service's InvocationID and state change time.
func (b *Systemd) invocationKey(ctx context.Context, pipe string) (inv, key string, err error) {
	svc := units.ServiceName(pipe)
	v, err := b.conn.GetUnitPropertyContext(ctx, svc, "InvocationID")
	if err != nil {
		return "", "", err
	}
	inv = invocationID(v.Value.Value())
	sc, err := b.conn.GetUnitPropertyContext(ctx, svc, "StateChangeTimestamp")
	if err != nil {
		return "", "", err
	}
	u, _ := sc.Value.Value().(uint64)
	return inv, fmt.Sprintf("%s/%s@%d", pipe, inv, u), nil
}

// Ended implements Accounter.
func (b *Systemd) Ended(ctx context.Context) ([]Ended, error) {
	pipes := b.pipesOnDisk()
	b.amu.Lock()
	for p, r := range b.reqs {
		if !b.managed(p) || r.job != "" && b.cfg.Now().Sub(r.at) > 10*time.Minute {
			delete(b.reqs, p)
		}
	}
	b.amu.Unlock()
	if len(pipes) == 0 {
		return nil, nil
	}
	names := make([]string, 0, len(pipes))
	for _, p := range pipes {
		names = append(names, units.ServiceName(p))
	}
	list, err := b.conn.ListUnitsByNamesContext(ctx, names)
	if err != nil {
		return nil, fmt.Errorf("list units: %w", err)
	}
	state := map[string]string{}
	for _, u := range list {
		state[u.Name] = u.ActiveState
	}
	var out []Ended
	for _, p := range pipes {
		as := state[units.ServiceName(p)]
		if as != "inactive" && as != "failed" {
			continue // running (or not loaded)
		}
		inv, key, err := b.invocationKey(ctx, p)
		if err != nil {
			return nil, err
		}
		b.amu.Lock()
		req := b.reqs[p]
		var reqCopy runNowReq
		if req != nil {
			reqCopy = *req
		}
		done := b.settled[p] == key
		b.amu.Unlock()
		if req != nil && reqCopy.job != "" && reqCopy.job != "done" && key == reqCopy.beforeKey {
			// The start job failed and no invocation began: nothing ran.
			out = append(out, Ended{
				Key: "req/" + reqCopy.id, Pipe: p, RunID: uuid.NewSHA1(uuid.NameSpaceOID, []byte("drover run-now "+reqCopy.id)).String(),
				StartedAt: reqCopy.at, FinishedAt: reqCopy.at, Result: reqCopy.job, ExitCode: -1,
				Reason: "run now: start job " + reqCopy.job, Trigger: triggerAPI, RequestID: reqCopy.id, OneAtATime: true,
			})
		}
		if done || inv == "" {
			continue
		}
		e, err := b.ended(ctx, p, inv, key)
		if err != nil {
			return nil, err
		}
		// The list above may predate a start: the invocation read must be
		// an ended one, and still the service's last.
		if v, err := b.conn.GetUnitPropertyContext(ctx, units.ServiceName(p), "ActiveState"); err != nil {
			return nil, err
		} else if as, _ := v.Value.Value().(string); as != "inactive" && as != "failed" {
			continue
		}
		if _, again, err := b.invocationKey(ctx, p); err != nil || again != key {
			continue
		}
		if req != nil && key != reqCopy.beforeKey && (reqCopy.usedKey == "" || reqCopy.usedKey == key) &&
			!e.StartedAt.Before(reqCopy.at.Add(-2*time.Second)) && e.StartedAt.Before(reqCopy.at.Add(runreq.TTL)) {
			// The first invocation after the request is its run.
			e.Trigger, e.RequestID = triggerAPI, reqCopy.id
			b.amu.Lock()
			req.usedKey = key
			b.amu.Unlock()
		}
		out = append(out, e)
	}
	return out, nil
}

// ended reads the account of pipe's last invocation.
func (b *Systemd) ended(ctx context.Context, pipe, inv, key string) (Ended, error) {
	svc := units.ServiceName(pipe)
	e := Ended{Key: key, Pipe: pipe, RunID: inv, ExitCode: -1, OneAtATime: true}
	get := func(iface, prop string) any {
		var v *sddbus.Property
		var err error
		if iface == "" {
			v, err = b.conn.GetUnitPropertyContext(ctx, svc, prop)
		} else {
			v, err = b.conn.GetUnitTypePropertyContext(ctx, svc, iface, prop)
		}
		if err != nil || v == nil {
			return nil
		}
		return v.Value.Value()
	}
	e.Result, _ = get("Service", "Result").(string)
	code, _ := get("Service", "ExecMainCode").(int32)
	status, _ := get("Service", "ExecMainStatus").(int32)
	e.StartedAt = usecProp(get("", "InactiveExitTimestamp"))
	e.FinishedAt = usecProp(get("", "InactiveEnterTimestamp"))
	if e.StartedAt.IsZero() || e.Result == "start-limit-hit" {
		// Refused before it started: the state change is the only time.
		e.StartedAt = usecProp(get("", "StateChangeTimestamp"))
	}
	if e.FinishedAt.Before(e.StartedAt) {
		e.FinishedAt = e.StartedAt
	}
	switch code {
	case 1:
		e.ExitCode = int(status)
	case 2, 3:
		e.Signal = signalName(int(status))
	}
	e.Reason = SystemdReason(e.Result, int(code), int(status))
	if e.Result == "start-limit-hit" {
		// No new InvocationID: this refusal is a run of its own.
		e.RunID = uuid.NewSHA1(uuid.NameSpaceOID, []byte("drover "+key)).String()
		e.ExitCode = -1
	}
	if v, err := b.conn.GetUnitTypePropertyContext(ctx, units.TimerName(pipe), "Timer", "LastTriggerUSec"); err == nil {
		if t := usecTime(v.Value.Value()); !t.IsZero() && !t.After(e.StartedAt.Add(time.Second)) && e.StartedAt.Sub(t) < 10*time.Second {
			e.Trigger, e.TriggeredAt = triggerSchedule, t
		}
	}
	return e, nil
}

func signalName(n int) string {
	if name := unix.SignalName(syscall.Signal(n)); name != "" {
		return name
	}
	return fmt.Sprintf("signal %d", n)
}
