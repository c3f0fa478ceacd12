package apply

import (
	"bufio"
	"bytes"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/drover/drover/units"
)

// Action is what a Step does.
type Action string

const (
	ActionNoop     Action = "noop"     // the pipe is as desired
	ActionCreate   Action = "create"   // write a file or pipe directory that does not exist
	ActionUpdate   Action = "update"   // replace it: the manifest changed
	ActionRestore  Action = "restore"  // drift: put back what was changed or deleted by hand
	ActionRemove   Action = "remove"   // delete a managed file or pipe directory no longer wanted
	ActionStart    Action = "start"    // enable and start a timer
	ActionRestart  Action = "restart"  // stop a timer before the reload, start it after (schedule changed)
	ActionStop     Action = "stop"     // stop and disable a timer (pipe disabled)
	ActionConflict Action = "conflict" // an unmanaged file holds the name: nothing of the pipe is touched
	ActionError    Action = "error"    // the pipe could not be prepared: nothing of it is touched
)

// Step is one thing Plan decided. File is a unit file name
// ("drover-pipe-x.timer") or "pipes/<name>" for the pipe directory.
type Step struct {
	Action Action `json:"action"`
	Pipe   string `json:"pipe"`
	File   string `json:"file,omitempty"`
	Reason string `json:"reason"`
}

func (s Step) String() string {
	f := s.File
	if f == "" {
		f = "-"
	}
	return fmt.Sprintf("%s %s %s: %s", s.Action, s.Pipe, f, s.Reason)
}

// Changes reports whether the step changes the host.
func (s Step) Changes() bool {
	switch s.Action {
	case ActionNoop, ActionConflict, ActionError:
		return false
	}
	return true
}

// UnitFile is one rendered unit.
type UnitFile struct {
	Name string
	Data []byte
}

// Desired is what the manifest wants for one pipe.
type Desired struct {
	Pipe    string
	Units   []UnitFile // rendered units (none on the cron backend)
	Digest  string     // the pipe directory's content digest, hex; its first 12 digits name the generation
	Enabled bool
	// LeaseEnded: the pipe is held (placement: one) and its lease ended
	// unrenewed; Enabled is then false, and its timer is stopped and
	// disabled like a disabled pipe's.
	LeaseEnded bool
	// CatchupFrom is set when the pipe is held with a known last fire time
	// served: a start of its timer (new, or stopped) catches up the fire
	// times after it (the backend's business; Plan ignores it).
	CatchupFrom time.Time
	Err         error // preparing the pipe failed: Plan leaves everything of it as it is
}

// Gen is the generation name of d's pipe directory.
func (d Desired) Gen() string { return genOf(d.Digest) }

func genOf(digest string) string {
	if len(digest) > 12 {
		return digest[:12]
	}
	return digest
}

// FileState is one unit file found on disk.
type FileState struct {
	Managed bool   // the first line is units.Header
	Data    []byte // its content
}

// TimerState is a timer as the service manager sees it.
type TimerState struct {
	Active  bool // ActiveState active or activating
	Enabled bool // linked into timers.target.wants
}

// State is what is on the host.
type State struct {
	// Units holds every drover-pipe-* unit file in the unit directory.
	Units map[string]FileState
	// PipeDirs maps a pipe name to the generation D/pipes/<name> points at
	// ("" when the link or its target is broken).
	PipeDirs map[string]string
	// Timers holds the runtime state of timers by unit name; nil when not
	// known (no runtime steps but those implied by file changes).
	Timers map[string]TimerState
}

// pipeOfUnit returns the pipe name of a drover unit file name.
func pipeOfUnit(file string) (string, bool) {
	rest, ok := strings.CutPrefix(file, "drover-pipe-")
	if !ok {
		return "", false
	}
	for _, suf := range []string{".service", ".timer"} {
		if name, ok := strings.CutSuffix(rest, suf); ok && name != "" {
			return name, true
		}
	}
	return "", false
}

// Plan compares desired and current and returns the steps that make the host
// match, in a stable order: per pipe in desired's order (sorted by name), then
// removals sorted by file. It does no I/O.
func Plan(desired []Desired, current State) []Step {
	desired = slices.Clone(desired)
	sort.SliceStable(desired, func(i, j int) bool { return desired[i].Pipe < desired[j].Pipe })
	var steps []Step
	keep := map[string]bool{} // unit files and pipe dirs that stay
	wanted := map[string]bool{}
	for _, d := range desired {
		wanted[d.Pipe] = true
		steps = append(steps, planPipe(d, current, keep)...)
	}

	var removals []Step
	for name, st := range current.Units {
		pipe, ok := pipeOfUnit(name)
		if !ok || keep[name] || !st.Managed || wanted[pipe] && hasUnit(desired, pipe, name) {
			continue
		}
		removals = append(removals, Step{Action: ActionRemove, Pipe: pipe, File: name, Reason: removeReason(wanted[pipe])})
	}
	for pipe := range current.PipeDirs {
		if !wanted[pipe] {
			removals = append(removals, Step{Action: ActionRemove, Pipe: pipe, File: "pipes/" + pipe, Reason: "pipe no longer in the manifest"})
		}
	}
	sort.Slice(removals, func(i, j int) bool {
		if removals[i].Pipe != removals[j].Pipe {
			return removals[i].Pipe < removals[j].Pipe
		}
		return removals[i].File < removals[j].File
	})
	return append(steps, removals...)
}

func removeReason(pipeWanted bool) string {
	if pipeWanted {
		return "unit no longer rendered for this pipe"
	}
	return "pipe no longer in the manifest"
}

func hasUnit(desired []Desired, pipe, name string) bool {
	for _, d := range desired {
		if d.Pipe != pipe || d.Err != nil {
			continue
		}
		for _, u := range d.Units {
			if u.Name == name {
				return true
			}
		}
	}
	return false
}

func planPipe(d Desired, cur State, keep map[string]bool) []Step {
	// Whatever happens below, nothing of a wanted pipe is removed as stale.
	keepAll := func() {
		keep[units.ServiceName(d.Pipe)] = true
		keep[units.TimerName(d.Pipe)] = true
		for _, u := range d.Units {
			keep[u.Name] = true
		}
	}
	if d.Err != nil {
		keepAll()
		return []Step{{Action: ActionError, Pipe: d.Pipe, Reason: d.Err.Error()}}
	}
	var conflicts []Step
	for _, u := range d.Units {
		if st, ok := cur.Units[u.Name]; ok && !st.Managed {
			conflicts = append(conflicts, Step{Action: ActionConflict, Pipe: d.Pipe, File: u.Name,
				Reason: "an unmanaged file (no drover header) has this name; it is left alone and the pipe is not installed"})
		}
	}
	if len(conflicts) > 0 {
		keepAll()
		return conflicts
	}

	var steps []Step
	curGen, hasDir := cur.PipeDirs[d.Pipe]
	sameGen := hasDir && curGen != "" && curGen == d.Gen()
	switch {
	case !hasDir:
		steps = append(steps, Step{Action: ActionCreate, Pipe: d.Pipe, File: "pipes/" + d.Pipe, Reason: "new pipe"})
	case curGen == "":
		steps = append(steps, Step{Action: ActionRestore, Pipe: d.Pipe, File: "pipes/" + d.Pipe, Reason: "pipe directory broken or deleted by hand"})
	case !sameGen:
		steps = append(steps, Step{Action: ActionUpdate, Pipe: d.Pipe, File: "pipes/" + d.Pipe, Reason: "pipe changed (generation " + curGen + " -> " + d.Gen() + ")"})
	}

	var timer string
	timerNew, timerSchedule := false, false
	for _, u := range d.Units {
		keep[u.Name] = true
		isTimer := strings.HasSuffix(u.Name, ".timer")
		if isTimer {
			timer = u.Name
		}
		st, ok := cur.Units[u.Name]
		var step Step
		switch {
		case !ok && sameGen:
			step = Step{Action: ActionRestore, Pipe: d.Pipe, File: u.Name, Reason: "deleted by hand"}
		case !ok:
			step = Step{Action: ActionCreate, Pipe: d.Pipe, File: u.Name, Reason: "new unit"}
		case !bytes.Equal(st.Data, u.Data) && sameGen:
			step = Step{Action: ActionRestore, Pipe: d.Pipe, File: u.Name, Reason: "edited by hand"}
		case !bytes.Equal(st.Data, u.Data):
			step = Step{Action: ActionUpdate, Pipe: d.Pipe, File: u.Name, Reason: updateReason(st.Data, u.Data)}
		default:
			continue
		}
		steps = append(steps, step)
		if isTimer {
			if !ok {
				timerNew = true
			} else if !slices.Equal(timingLines(st.Data), timingLines(u.Data)) {
				timerSchedule = true
			}
		}
	}

	if timer != "" {
		if st, ok := timerStep(d, cur.Timers, timer, timerNew, timerSchedule); ok {
			steps = append(steps, st)
		}
	}
	if len(steps) == 0 {
		steps = append(steps, Step{Action: ActionNoop, Pipe: d.Pipe, Reason: "up to date"})
	}
	return steps
}

// timerStep is what the pipe's timer needs beyond its file: a start, a
// restart (its schedule changed, or it is new) or a stop (pipe disabled),
// from what the manager reports of it (timers). ok is false when it needs
// nothing.
func timerStep(d Desired, timers map[string]TimerState, timer string, timerNew, timerSchedule bool) (step Step, ok bool) {
	ts, known := timers[timer]
	changed := timerNew || timerSchedule
	var act Action
	var reason string
	switch {
	case d.Enabled && changed:
		act, reason = ActionRestart, "schedule changed"
		if timerNew {
			reason = "new timer"
		}
		if !known && timerNew || known && !ts.Active {
			act = ActionStart
		}
	case d.Enabled && known && !ts.Active:
		act, reason = ActionStart, "timer inactive"
	case d.Enabled && known && !ts.Enabled:
		act, reason = ActionStart, "timer not enabled"
	case !d.Enabled && (known && (ts.Active || ts.Enabled) || !known && timerSchedule):
		act, reason = ActionStop, "pipe disabled"
		if d.LeaseEnded {
			reason = ReasonLeaseEnded
		}
	}
	if act == "" {
		return Step{}, false
	}
	return Step{Action: act, Pipe: d.Pipe, File: timer, Reason: reason}, true
}

// ReasonLeaseEnded is the reason of the stop step of a held pipe whose
// lease ended unrenewed.
const ReasonLeaseEnded = "lease ended"

// timingKeys are the [Timer] settings that decide elapse times; a change to
// any of them makes the timer restart under the guard.
var timingKeys = []string{"OnCalendar=", "OnActiveSec=", "OnBootSec=", "OnStartupSec=",
	"OnUnitActiveSec=", "OnUnitInactiveSec=", "Persistent="}

func timingLines(unit []byte) []string {
	var out []string
	sc := bufio.NewScanner(bytes.NewReader(unit))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		for _, k := range timingKeys {
			if strings.HasPrefix(line, k) {
				out = append(out, line)
			}
		}
	}
	return out
}

func updateReason(old, new []byte) string {
	o, n := timingLines(old), timingLines(new)
	if !slices.Equal(o, n) {
		return "schedule changed: " + strings.Join(o, " ") + " -> " + strings.Join(n, " ")
	}
	return "content changed"
}
