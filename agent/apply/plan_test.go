package apply

import (
	"errors"
	"fmt"
	"strings"
	"testing"
)

func unitsFor(pipe, schedule string) []UnitFile {
	h := "# Managed by drover-agent. Local changes are overwritten.\n"
	return []UnitFile{
		{Name: "drover-pipe-" + pipe + ".service", Data: []byte(h + "[Service]\nExecStart=/x run " + pipe + "\n")},
		{Name: "drover-pipe-" + pipe + ".timer", Data: []byte(h + "[Timer]\nOnCalendar=" + schedule + "\nPersistent=true\n")},
	}
}

func desiredFor(pipe, schedule, digest string, enabled bool) Desired {
	return Desired{Pipe: pipe, Units: unitsFor(pipe, schedule), Digest: digest, Enabled: enabled}
}

// installed is the State after d was applied (timers active when enabled).
func installed(ds ...Desired) State {
	st := State{Units: map[string]FileState{}, PipeDirs: map[string]string{}, Timers: map[string]TimerState{}}
	for _, d := range ds {
		for _, u := range d.Units {
			st.Units[u.Name] = FileState{Managed: true, Data: u.Data}
		}
		st.PipeDirs[d.Pipe] = d.Gen()
		st.Timers["drover-pipe-"+d.Pipe+".timer"] = TimerState{Active: d.Enabled, Enabled: d.Enabled}
	}
	return st
}

func fmtSteps(steps []Step) string {
	var b strings.Builder
	for _, s := range steps {
		fmt.Fprintf(&b, "%s %s %s\n", s.Action, s.Pipe, s.File)
	}
	return b.String()
}

func TestPlan(t *testing.T) {
	a1 := desiredFor("a", "daily", "1111aaaaaaaaaaaa", true)
	a2 := desiredFor("a", "hourly", "2222aaaaaaaaaaaa", true) // schedule edit
	a2svc := a1
	a2svc.Digest = "3333aaaaaaaaaaaa"
	a2svc.Units = []UnitFile{{Name: a1.Units[0].Name, Data: append([]byte(nil), a1.Units[0].Data...)}, a1.Units[1]}
	a2svc.Units[0].Data = append(a2svc.Units[0].Data, "Environment=X=1\n"...)
	b1 := desiredFor("b", "weekly", "1111bbbbbbbbbbbb", true)
	bOff := desiredFor("b", "weekly", "2222bbbbbbbbbbbb", false)

	edited := installed(a1)
	edited.Units["drover-pipe-a.timer"] = FileState{Managed: true, Data: append(append([]byte(nil), a1.Units[1].Data...), "OnCalendar=minutely\n"...)}
	deleted := installed(a1)
	delete(deleted.Units, "drover-pipe-a.service")
	stopped := installed(a1)
	stopped.Timers["drover-pipe-a.timer"] = TimerState{Active: false, Enabled: true}
	foreign := State{Units: map[string]FileState{"drover-pipe-a.timer": {Managed: false, Data: []byte("[Timer]\n")}}}
	foreignOther := installed(a1)
	foreignOther.Units["drover-pipe-zz.timer"] = FileState{Managed: false, Data: []byte("[Timer]\n")}
	brokenDir := installed(a1)
	brokenDir.PipeDirs["a"] = ""
	noRuntime := installed(a1)
	noRuntime.Timers = nil

	cases := []struct {
		name    string
		desired []Desired
		current State
		want    string
	}{
		{"empty", nil, State{}, ""},
		{"new pipe", []Desired{a1}, State{}, `
create a pipes/a
create a drover-pipe-a.service
create a drover-pipe-a.timer
start a drover-pipe-a.timer`},
		{"unchanged", []Desired{a1, b1}, installed(a1, b1), `
noop a 
noop b `},
		{"schedule edit restarts the timer", []Desired{a2}, installed(a1), `
update a pipes/a
update a drover-pipe-a.timer
restart a drover-pipe-a.timer`},
		{"service-only change keeps the timer running", []Desired{a2svc}, installed(a1), `
update a pipes/a
update a drover-pipe-a.service`},
		{"hand edit restored", []Desired{a1}, edited, `
restore a drover-pipe-a.timer
restart a drover-pipe-a.timer`},
		{"hand delete restored", []Desired{a1}, deleted, `
restore a drover-pipe-a.service`},
		{"timer stopped by hand", []Desired{a1}, stopped, `
start a drover-pipe-a.timer`},
		{"pipe dir broken", []Desired{a1}, brokenDir, `
restore a pipes/a`},
		{"removed pipe", []Desired{b1}, installed(a1, b1), `
noop b 
remove a drover-pipe-a.service
remove a drover-pipe-a.timer
remove a pipes/a`},
		{"disable", []Desired{bOff}, installed(b1), `
update b pipes/b
stop b drover-pipe-b.timer`},
		{"disabled stays stopped", []Desired{bOff}, installed(bOff), `
noop b `},
		{"re-enable", []Desired{b1}, installed(bOff), `
update b pipes/b
start b drover-pipe-b.timer`},
		{"unmanaged file with the same name", []Desired{a1}, foreign, `
conflict a drover-pipe-a.timer`},
		{"unmanaged file of another pipe is ignored", []Desired{a1}, foreignOther, `
noop a `},
		{"render error keeps the old units", []Desired{{Pipe: "a", Err: errors.New("bad")}}, installed(a1), `
error a `},
		{"no runtime state: file changes only", []Desired{a1}, noRuntime, `
noop a `},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := "\n" + fmtSteps(Plan(c.desired, c.current))
			want := strings.TrimPrefix(c.want, "\n")
			if want != "" {
				want = "\n" + want + "\n"
			} else {
				want = "\n"
			}
			if got != want {
				t.Errorf("steps:%s\nwant:%s", got, want)
			}
		})
	}
}

func TestPlanReasons(t *testing.T) {
	a1 := desiredFor("a", "daily", "1111aaaaaaaaaaaa", true)
	a2 := desiredFor("a", "hourly", "2222aaaaaaaaaaaa", true)
	for _, s := range Plan([]Desired{a2}, installed(a1)) {
		if s.Reason == "" {
			t.Errorf("%v: no reason", s)
		}
		if s.File == "drover-pipe-a.timer" && s.Action == ActionUpdate && !strings.Contains(s.Reason, "OnCalendar=daily") {
			t.Errorf("update reason %q does not show the schedule change", s.Reason)
		}
	}
	steps := Plan([]Desired{a1}, State{Units: map[string]FileState{"drover-pipe-a.timer": {}}})
	if len(steps) != 1 || steps[0].Action != ActionConflict || !strings.Contains(steps[0].Reason, "unmanaged") {
		t.Errorf("conflict: %v", steps)
	}
}

func TestPlanIsPure(t *testing.T) {
	a1 := desiredFor("a", "daily", "1111aaaaaaaaaaaa", true)
	b1 := desiredFor("b", "daily", "1111bbbbbbbbbbbb", true)
	st := installed(a1)
	in := []Desired{b1, a1}
	first := fmtSteps(Plan(in, st))
	if in[0].Pipe != "b" {
		t.Fatal("Plan reordered its input")
	}
	if again := fmtSteps(Plan(in, st)); again != first {
		t.Fatalf("not deterministic:\n%s\n%s", first, again)
	}
}
