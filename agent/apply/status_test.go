package apply

import (
	"context"
	"reflect"
	"testing"
	"time"

	"github.com/drover/drover/agent/internal/sdtest"
	"github.com/drover/drover/units"
)

// statusAll is the reference for Status: every property of both units
// (GetAllProperties), as Status read them before it asked for only what it
// uses.
func statusAll(t *testing.T, b *Systemd) []PipeState {
	t.Helper()
	ctx := context.Background()
	var out []PipeState
	for _, p := range b.pipesOnDisk() {
		ps := PipeState{Name: p}
		tp, err := b.conn.GetAllPropertiesContext(ctx, units.TimerName(p))
		if err != nil {
			t.Fatal(err)
		}
		sp, err := b.conn.GetAllPropertiesContext(ctx, units.ServiceName(p))
		if err != nil {
			t.Fatal(err)
		}
		ps.Scheduled = tp["ActiveState"] == "active"
		ps.Enabled = tp["UnitFileState"] == "enabled"
		ps.Next = usecTime(tp["NextElapseUSecRealtime"])
		ps.LastTrigger = usecTime(tp["LastTriggerUSec"])
		as, _ := sp["ActiveState"].(string)
		ps.Running = as == "activating" || as == "active" || as == "deactivating"
		if ps.Running {
			ps.RunID = invocationID(sp["InvocationID"])
		}
		ps.LastResult, _ = sp["Result"].(string)
		if st, ok := sp["ExecMainStatus"].(int32); ok {
			ps.LastExit = int(st)
		}
		out = append(out, ps)
	}
	return out
}

// TestStatusMatchesAllProperties: Status, which asks the manager for a few
// properties, says exactly what reading every property says, for pipes
// scheduled, disabled, running, and after a failed and a good run.
func TestStatusMatchesAllProperties(t *testing.T) {
	sdtest.Require(t)
	t.Parallel()
	data := t.TempDir()
	b, _ := newOwnSystemd(t, data)
	in := input(t,
		spec("st-sched", "17 3 * * *"),
		spec("st-off", "17 3 * * *", disabled()),
		spec("st-fail", "0 0 1 1 *", withScript("exit 3\n")),
		spec("st-ok", "0 0 1 1 *"),
		spec("st-busy", "0 0 1 1 *", withScript("sleep 60\n")),
	)
	mustApply(t, b, in)
	ctx := context.Background()
	for _, p := range []string{"st-fail", "st-ok", "st-busy"} {
		if err := b.RunNow(ctx, p, "req-"+p); err != nil {
			t.Fatal(err)
		}
	}
	waitRun(t, data, "st-busy", 0, 10*time.Second)
	deadline := time.Now().Add(10 * time.Second)
	for {
		st, err := b.Status(ctx)
		if err != nil {
			t.Fatal(err)
		}
		byName := map[string]PipeState{}
		for _, s := range st {
			byName[s.Name] = s
		}
		if byName["st-fail"].LastResult == "exit-code" && byName["st-ok"].LastResult == "success" && byName["st-busy"].Running {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("runs did not settle: %+v", st)
		}
		time.Sleep(100 * time.Millisecond)
	}
	got, err := b.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := statusAll(t, b)
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Status:\n%+v\nall properties say:\n%+v", got, want)
	}
	checks := map[string]func(PipeState) bool{
		"st-sched": func(s PipeState) bool { return s.Enabled && s.Scheduled && !s.Next.IsZero() && !s.Running },
		"st-off":   func(s PipeState) bool { return !s.Enabled && !s.Scheduled },
		"st-fail":  func(s PipeState) bool { return s.LastResult == "exit-code" && s.LastExit == 3 && !s.Running },
		"st-ok":    func(s PipeState) bool { return s.LastResult == "success" && s.LastExit == 0 },
		"st-busy":  func(s PipeState) bool { return s.Running && len(s.RunID) == 32 },
	}
	for _, s := range got {
		if c := checks[s.Name]; c == nil || !c(s) {
			t.Errorf("%s: %+v", s.Name, s)
		}
	}
	for _, s := range got {
		if s.Name == "st-busy" {
			if err := b.Cancel(ctx, s.Name, s.RunID); err != nil {
				t.Errorf("cancel st-busy: %v", err)
			}
		}
	}
}

// BenchmarkStatus100 is Status with 100 pipes, against reading every
// property (the reference) in the same run.
func BenchmarkStatus100(b *testing.B) {
	sdtest.Require(b)
	data := b.TempDir()
	be := newSystemd(b, data)
	mustApply(b, be, input(b, benchSpecs(100)...))
	ctx := context.Background()
	b.Run("status", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := be.Status(ctx); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("all-properties", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			for _, p := range be.pipesOnDisk() {
				if _, err := be.conn.GetAllPropertiesContext(ctx, units.TimerName(p)); err != nil {
					b.Fatal(err)
				}
				if _, err := be.conn.GetAllPropertiesContext(ctx, units.ServiceName(p)); err != nil {
					b.Fatal(err)
				}
			}
		}
	})
}
