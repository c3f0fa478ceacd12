package apply

import (
	"errors"
	"os"
	"path/filepath"
	"time"
)

// The no-unplanned-run guard.
//
// systemd (252, as in Debian 12, which the tests run) computes a
// calendar timer's next elapse from a base: the last trigger if it knows one,
// else the time the timer unit was last activated, else now. An elapse
// before the present fires at once. So, measured on the user manager in
// this package's tests:
//
//   - a daemon-reload with a changed OnCalendar= recomputes from the
//     deserialised last trigger or activation time: a schedule edit fires
//     the service at once when the new calendar has an instant in between;
//   - stop + start of a Persistent= timer takes the last trigger from the
//     stamp file's mtime; of a non-persistent one, from its previous
//     activation time (kept in memory, even across reloads): again an
//     immediate run.
//
// The guard, applied to every timer the agent starts or restarts while the
// manager has it loaded:
//
//  1. a timer whose schedule changed is stopped before the reload (so the
//     reload cannot fire it);
//  2. before the reload, its stamp file gets mtime = now and a runtime
//     drop-in (<runtime unit dir>/<timer>.d/50-drover-guard.conf,
//     "Persistent=true") makes the next start read that stamp, whatever the
//     pipe's catchup policy;
//  3. after the reload the timer is started: base = now, so its next elapse
//     is exactly the evaluator's Next(now);
//  4. the drop-in is deleted (without a reload: the loaded unit keeps it
//     until the next reload, which then keeps the last trigger in memory).
//
// A timer the manager does not have loaded starts fresh (base = now); the
// guard only deletes a stale stamp left by an earlier pipe of the same name.
//
// Genuine catch-up is untouched: at boot (or any start not made by the
// agent) systemd reads the real stamp, which it updated at each elapse, and
// fires once for a missed instant when Persistent=true (catchup once|all).
// The agent never starts timers at boot: timers.target does, before the
// agent is even running. The cost: list-timers shows LAST = the time the
// agent (re)started the timer after a schedule edit, re-enable or repair.
const guardDropIn = "50-drover-guard.conf"

var guardContent = []byte("# Written by drover-agent for one timer start; removed right after.\n[Timer]\nPersistent=true\n")

func stampPath(stampDir, timer string) string { return filepath.Join(stampDir, "stamp-"+timer) }

// armGuard prepares a loaded timer for a guarded start.
func armGuard(runtimeUnitDir, stampDir, timer string, now time.Time) error {
	dir := filepath.Join(runtimeUnitDir, timer+".d")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, guardDropIn), guardContent, 0o644); err != nil {
		return err
	}
	return touchStamp(stampDir, timer, now)
}

func touchStamp(stampDir, timer string, now time.Time) error {
	if err := os.MkdirAll(stampDir, 0o755); err != nil {
		return err
	}
	p := stampPath(stampDir, timer)
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE, 0o644)
	if err != nil {
		return err
	}
	f.Close()
	return os.Chtimes(p, now, now)
}

// disarmGuard removes the drop-in (and its directory when empty).
func disarmGuard(runtimeUnitDir, timer string) {
	dir := filepath.Join(runtimeUnitDir, timer+".d")
	os.Remove(filepath.Join(dir, guardDropIn))
	os.Remove(dir)
}

// removeStaleGuards removes guard drop-ins a crashed apply left behind.
func removeStaleGuards(runtimeUnitDir string) {
	matches, _ := filepath.Glob(filepath.Join(runtimeUnitDir, "drover-pipe-*.timer.d", guardDropIn))
	for _, m := range matches {
		os.Remove(m)
		os.Remove(filepath.Dir(m))
	}
}

func removeStamp(stampDir, timer string) error {
	err := os.Remove(stampPath(stampDir, timer))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	return err
}
