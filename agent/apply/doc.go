// Package apply makes a host match an accepted manifest: it materialises each
// pipe's files, writes its secrets, and installs its schedule on a backend —
// systemd timers (the default) or an internal cron scheduler where systemd is
// absent.
//
// # Plan, then execute
//
// Plan is pure: it compares what the manifest wants (Desired: rendered units,
// the pipe directory's generation, the enabled flag) with what is on disk
// (State) and returns Steps (create, update, restore, remove, start, restart,
// stop, conflict, error, noop), each with a reason. Backends execute a plan.
// Only unit files whose first line is units.Header are ours: a file without it
// is never modified or removed, and a desired unit whose name is taken by such
// a file is a conflict step; that pipe is skipped, the others go on.
//
// # Host layout (pinned between apply, the runner and the daemon)
//
//	D = the agent data dir (default /var/lib/drover), mode 0700, owned by the agent.
//
//	D/pipes/                          0755
//	D/pipes/<name>                    symlink -> .<name>.<gen>  (relative)
//	D/pipes/.<name>.<gen>/            0755, one generation of the pipe, never changed once linked
//	D/pipes/.<name>.<gen>/pipe.json   0644, the manifest.Pipe as JSON
//	D/pipes/.<name>.<gen>/payload/    the unpacked bundle (dirs 0755, files 0644/0755)
//	D/secrets/<name>/<SECRET>         dir 0700, files 0600: secret values
//	D/cron-state.json                 cron backend only: last fire time per pipe
//
// <gen> is the first 12 hex digits of a sha256 over pipe.json, the payload
// digest and the rendered units (Desired.Digest), so any change to what a
// pipe runs or how it is scheduled makes a new generation. A generation is
// built in place (after removing anything a crash left under that name: no
// link points at it), the file system is synced once for all pipes of the
// apply, and only then is it published: a new link, or a fresh link
// (.lnk-<random>) renamed over D/pipes/<name>. Readers see the old or the new
// generation, never a mix or a partial one. Generations no link points at
// (old ones, half-built ones) and stray links are removed at the end of
// every apply, except those of a pipe running at that moment (then at the
// next apply or check). The runner gets D/pipes/<name> in $DROVER_PIPE_DIR
// and should resolve the link once at start (filepath.EvalSymlinks) so that
// one run sees one generation; it only reads there. D/pipes is 0755 and the
// payload world-readable so that a system-scope unit can bind it read-only
// for a dynamic user (D itself stays 0700).
//
// Secret files are written atomically (temp file, fsync, rename) and stale
// ones removed; in system scope the units load them with LoadCredential=, in
// user scope and under cron the runner reads $DROVER_SECRETS_DIR =
// D/secrets/<name>.
//
// # RunNow requests
//
// RunNow writes a request file (agent/runreq: its format, path and
// freshness) before it starts the run:
//
//	system scope: /run/drover/requests/<name>.json
//	user scope:   $XDG_RUNTIME_DIR/drover/requests/<name>.json
//
// A runner starting before its expires_at takes trigger=api and the request
// id from it; it must not remove it (it may lack the right to): the backend
// removes it once the run has ended.
//
// # The cron backend's contract with the runner
//
// The cron backend runs `<agent> run <name> [run args]` in its own process
// group with DROVER_PIPE_DIR, DROVER_SECRETS_DIR, DROVER_TRIGGER
// (schedule | catchup | api), DROVER_SCHEDULED_AT (RFC 3339, the fire time it
// stands for) and DROVER_RUN_ID (a UUIDv7 the runner should use as run id, so
// that Cancel can name it). A fire while a run of the same pipe is active
// still starts the runner: the runner holds an exclusive lock for the length
// of a run and records `skipped` when it cannot take it (the same rule
// covers a `drover-agent run` started by hand). Catch-up (once / all, at most
// manifest.MaxCatchup, oldest first) is decided by the backend from
// D/cron-state.json when it starts and is started with DROVER_TRIGGER=catchup.
//
// # Unit files and the manager
//
// Changed units are written as hidden temporary files next to their targets
// (systemd ignores those), synced with one syncfs(2), renamed, and the
// directory synced. Enabling a timer is done on disk as `systemctl enable`
// does it for WantedBy=timers.target (a link in
// <unit dir>/timers.target.wants), before the apply's one daemon-reload.
// Stops (removed, disabled and schedule-changed timers; removed services,
// so removing a pipe also ends a run of it in progress) happen before the
// reload, starts after it; a changed service alone is not restarted (the
// next run uses it); four or more timers are
// started with one job on a runtime target that wants them
// (drover-apply-batch.target, removed at once), which is seconds faster for
// a thousand timers than a job each.
//
// # No unplanned run
//
// See guard.go: every timer the agent (re)starts gets its Persistent= stamp
// set to the present and a runtime drop-in that makes it Persistent for that
// start, so systemd computes its next elapse from now; systemd's own timer
// starts (at boot, or by hand) still catch up from the real stamp.
//
// # Leases (placement: one)
//
// See fence.go: a held pipe whose lease ended is planned like a disabled
// one; a start of a held pipe's timer arms the guard with the last fire
// time served instead of now, so that systemd's Persistent= catch-up covers
// the fire times nobody ran. pipe.json carries lease_until and
// last_fire_served (the runner's own lease check reads them there), so a
// renewal makes a new generation of the pipe directory; the units, and so
// the timers, do not change.
//
// Imported by the daemon (agent) and agent/cli, which picks the backend.
package apply
