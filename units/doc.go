// Package units turns a pipe into its systemd units: drover-pipe-<name>.service
// and .timer, with cron schedules translated to OnCalendar= lines, values escaped
// per systemd.syntax(7), and the hardening profiles. It only renders bytes; the
// agent's systemd backend writes and loads them.
//
// Imported by the agent (and by droverctl for `schedule explain`).
package units
