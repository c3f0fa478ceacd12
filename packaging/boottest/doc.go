// Package boottest boots a real Debian bookworm system under systemd-nspawn
// for tests that need a PID-1 systemd: system-scope units, hardening,
// dynamic users, credentials and package installs (docs/design.md, "Testing on a
// real systemd" → "Booted system").
//
// The root file system is built once per machine with
//
//	debootstrap --variant=minbase --include=systemd,dbus,systemd-sysv bookworm DIR
//
// into a temporary directory next to the cache and renamed into place when
// complete, so an interrupted build never leaves a half root behind. The cache
// lives outside the repository, in /var/cache/drover-test/bookworm-rootfs
// ($DROVER_BOOTTEST_CACHE overrides the directory). A lock file beside it
// serialises builders and keeps a rebuild from pulling the root from under a
// running container: builders hold it exclusively, containers shared.
//
// Every Boot gets a private, writable copy of that root: an overlayfs mount
// (the cached root as the read-only lower layer, a per-container upper layer)
// when the kernel allows it, which costs milliseconds, else a `cp -a` copy
// (a few seconds). The overlay is mounted in a private mount namespace that
// belongs to the container's systemd-nspawn, so it disappears with it even
// when the test binary is killed.
//
// The container is started with
//
//	systemd-nspawn -D DIR --boot --register=no --keep-unit
//
// (`--keep-unit` because the host's systemd is not PID 1 here: nspawn then
// needs no D-Bus) inside a cgroup of its own, so several test binaries can
// boot containers at once. Boot waits for `systemctl is-system-running
// --wait` inside; Exec runs a command in all of the container's namespaces
// with nsenter(1). Without PrivateNetwork the container shares the host's
// network namespace, so it reaches a server listening on the host's
// 127.0.0.1 — and a server started inside binds the host's ports.
//
// When a prerequisite is missing (not root, no systemd-nspawn and no way to
// install it, no debootstrap to build the cache) Boot skips the test, or fails
// it when CI=true, so CI never passes by skipping. As root, missing Debian
// packages (systemd-container, debootstrap) are installed with apt-get.
//
// Use:
//
//	c := boottest.Boot(t, boottest.Options{PrivateNetwork: true})
//	c.CopyIn(t, "bin/drover-agent", "/usr/bin/drover-agent")
//	c.WriteFile(t, "/etc/drover/agent.yaml", cfg, 0o644)
//	out := c.Exec(t, "systemctl", "list-timers", "--all")
//	stdout, stderr, err := c.Output(ctx, "systemctl", "is-active", "x.service") // no t.Fatal on failure
//
// The container stops when t ends (its journal is logged first when t
// failed). Start/Stop do the same without a testing.TB, e.g. to share one
// container between the tests of a package from TestMain. Measured here: a
// boot takes 1 to 3 s (overlay prepared in well under 0.2 s, a copy in about
// 4 s); stopping takes under a second; building the cached root took 5 to 9
// minutes (network-bound).
//
// Importable from every package of the module (it is deliberately not under
// an internal/ directory, which would hide it from agent/).
package boottest
