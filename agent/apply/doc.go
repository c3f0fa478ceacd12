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
// built under D/pipes/.tmp-<random>, synced, renamed to .<name>.<gen>, and
// published by renaming a new symlink (.lnk-<random>) over D/pipes/<name>:
// readers see the old or the new generation, never a mix. Old generations
// are removed after the swap, unless the pipe is running at that moment
// (then at the next apply or check). Temporary entries left by a crash are
// removed by the next apply. The runner gets D/pipes/<name> in
// $DROVER_PIPE_DIR and should resolve the link once at start
// (filepath.EvalSymlinks) so that one run sees one generation. It only reads
// there.
//
// Secret files are written atomically (temp file, fsync, rename) and stale
// ones removed; in system scope the units load them with LoadCredential=, in
// user scope and under cron the runner reads $DROVER_SECRETS_DIR =
// D/secrets/<name>.
//
// # RunNow requests
//
// RunNow writes a request file before it starts the run:
//
//	system scope: /run/drover/requests/<name>.json
//	user scope:   $XDG_RUNTIME_DIR/drover/requests/<name>.json
//
// mode 0644, JSON {"request_id", "trigger":"api", "requested_at",
// "expires_at"}. A runner starting before expires_at with such a file present
// takes trigger=api and the request id from it; it must not remove it (it
// may lack the right to): the backend removes it once the run has ended.
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
// # No unplanned run
//
// See guard.go: every timer the agent (re)starts gets its Persistent= stamp
// set to the present and a runtime drop-in that makes it Persistent for that
// start, so systemd computes its next elapse from now; systemd's own timer
// starts (at boot, or by hand) still catch up from the real stamp.
package apply
