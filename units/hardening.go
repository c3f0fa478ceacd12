package units

import (
	"fmt"

	"github.com/drover/drover/manifest"
)

// option is one "Key=Value" line; Value is already in unit-file syntax.
type option struct {
	Key, Value string
}

// Hardening profiles for the [Service] section (docs/design.md, "Secure by
// default"). Exposure measured with `systemd-analyze security --offline=true`
// on systemd 252 (security_test.go checks strict <= 2.0, default <= 5.0):
//
//	profile  dynamic user  run_as user  run_as root
//	strict   0.2           0.2          0.5
//	default  1.5           1.5          2.0
//	none     8.4           9.2          9.6
//
// The profile is only part of the picture: identity (DynamicUser= or User=),
// the pipe's read-only bind mount and its state directory are rendered for
// every profile by render.go.

// baseHardening is shared by default and strict. Every line keeps ordinary
// batch jobs working; the comments say why each is safe to have on.
var baseHardening = []option{
	// setuid binaries and file capabilities cannot raise privileges; a job
	// that needs sudo is not a job for a sandbox.
	{"NoNewPrivileges", "yes"},
	// The whole file system is read-only except /dev, /proc, /sys, the
	// per-pipe StateDirectory= (the runner's spool and the place for a job's
	// own output: $STATE_DIRECTORY) and the private /tmp and /var/tmp below.
	// A dynamic user gets this anyway; it is spelled out so run_as pipes get
	// the same file system. A job that must write elsewhere (e.g. a dump into
	// /var/backups) lists those paths in writable_paths (ReadWritePaths=).
	{"ProtectSystem", "strict"},
	// Home directories stay readable: backing them up is a common job.
	{"ProtectHome", "read-only"},
	// Private /tmp and /var/tmp, writable, removed after the run.
	{"PrivateTmp", "yes"},
	// Only pseudo devices (/dev/null, /dev/urandom, ...): jobs work on files
	// and the network, not on raw disks.
	{"PrivateDevices", "yes"},
	{"PrivateMounts", "yes"},
	// The kernel and the system's configuration are off limits.
	{"ProtectKernelTunables", "yes"},
	{"ProtectKernelModules", "yes"},
	{"ProtectKernelLogs", "yes"},
	{"ProtectControlGroups", "yes"},
	{"ProtectClock", "yes"},
	{"ProtectHostname", "yes"},
	// Other users' processes are invisible. /proc's system files (meminfo,
	// cpuinfo, ...) stay, many tools read them.
	{"ProtectProc", "invisible"},
	// No new namespaces: jobs do not run containers of their own.
	{"RestrictNamespaces", "yes"},
	{"RestrictRealtime", "yes"},
	{"RestrictSUIDSGID", "yes"},
	{"LockPersonality", "yes"},
	{"RemoveIPC", "yes"},
	// Files the job creates are private to its user.
	{"UMask", "0077"},
	{"SystemCallArchitectures", "native"},
	// The set systemd maintains for ordinary services. @resources stays
	// allowed: backup scripts use nice, ionice and ulimit. @privileged
	// (chown to others, setuid, open_by_handle_at, ...) is denied.
	{"SystemCallFilter", "@system-service"},
	{"SystemCallFilter", "~@privileged"},
	// A denied call fails with EPERM instead of killing the job: tools that
	// try chown or setrlimit and carry on keep working.
	{"SystemCallErrorNumber", "EPERM"},
}

// defaultNetwork: a backup job connects to its database and ships its output
// elsewhere, so local sockets and IPv4/IPv6 stay allowed; packet, netlink
// and exotic sockets do not.
var defaultNetwork = []option{
	{"RestrictAddressFamilies", "AF_UNIX AF_INET AF_INET6"},
}

// strictExtra replaces defaultNetwork and tightens the rest: no network at
// all (only AF_UNIX, for the runner's socket to the agent), no home
// directories, no write+execute memory (breaks JITs), only /proc's process
// files, a private user namespace, no resource tuning calls.
var strictExtra = []option{
	{"ProtectHome", "yes"},
	{"PrivateNetwork", "yes"},
	{"IPAddressDeny", "any"},
	{"RestrictAddressFamilies", "AF_UNIX"},
	{"MemoryDenyWriteExecute", "yes"},
	{"ProcSubset", "pid"},
	{"PrivateUsers", "yes"},
	{"SystemCallFilter", "~@resources"},
	{"DevicePolicy", "closed"},
}

// userHardening lists what works in the systemd user manager, which cannot
// set up namespaces (ProtectSystem=, PrivateTmp=, ... fail with
// 226/NAMESPACE) nor drop bounding capabilities: prctl and seccomp based
// options only. The user manager implies NoNewPrivileges= for them anyway.
var userHardening = []option{
	{"NoNewPrivileges", "yes"},
	{"RestrictNamespaces", "yes"},
	{"RestrictRealtime", "yes"},
	{"RestrictSUIDSGID", "yes"},
	{"LockPersonality", "yes"},
	{"UMask", "0077"},
	{"SystemCallArchitectures", "native"},
	{"SystemCallFilter", "@system-service"},
	{"SystemCallFilter", "~@privileged"},
	{"SystemCallErrorNumber", "EPERM"},
}

var userStrictExtra = []option{
	{"RestrictAddressFamilies", "AF_UNIX"},
	{"MemoryDenyWriteExecute", "yes"},
	{"SystemCallFilter", "~@resources"},
}

// hardening returns the [Service] options of a profile. runAsRoot matters to
// the default profile only: a root job (typically a backup reading every
// file) keeps CAP_DAC_READ_SEARCH, which lets it read but not write anything
// the read-only file system shows; every other job runs with an empty
// bounding set. The returned slice is fresh; the caller may append to it.
func hardening(profile string, scope Scope, runAsRoot bool) ([]option, error) {
	var out []option
	switch profile {
	case manifest.HardeningNone:
		return nil, nil
	case manifest.HardeningDefault, manifest.HardeningStrict:
	default:
		return nil, fmt.Errorf("units: unknown hardening profile %q", profile)
	}
	strict := profile == manifest.HardeningStrict
	if scope == ScopeUser {
		out = append(out, userHardening...)
		if strict {
			out = append(out, userStrictExtra...)
		} else {
			out = append(out, defaultNetwork...)
		}
		return out, nil
	}
	caps := ""
	if runAsRoot && !strict {
		caps = "CAP_DAC_READ_SEARCH"
	}
	out = append(out, option{"CapabilityBoundingSet", caps})
	for _, o := range baseHardening {
		if strict && o.Key == "ProtectHome" {
			continue // strictExtra sets it
		}
		out = append(out, o)
	}
	if strict {
		out = append(out, strictExtra...)
	} else {
		out = append(out, defaultNetwork...)
	}
	return out, nil
}

// networkAllowed reports whether a profile lets the job use the network, so
// that the service orders itself after network-online.target.
func networkAllowed(profile string) bool {
	return profile != manifest.HardeningStrict
}
