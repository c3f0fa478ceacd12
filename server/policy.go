package server

import (
	"context"
	"fmt"
	"net/http"
	"path"
	"slices"
	"sort"
	"strings"

	"github.com/drover/drover/api"
	"github.com/drover/drover/server/errs"
	"github.com/drover/drover/server/store"

	"github.com/drover/drover/manifest"
)

// The privileged-spec policy. An operator may write pipes, but some specs
// give a job more than an ordinary sandboxed batch job has, and on some
// hosts that is a way out of the operator role (the internal agent runs on
// the server's own host, next to its keys and admin.token). Such specs need
// the admin role, or a token named in privileged.allow_tokens. The check
// runs on every path that creates or changes a pipe version (PUT in JSON or
// YAML, restore of an old version) and dry-run reports it.
//
// A spec is privileged when it
//   - reaches an internal agent: its targets name an agent tagged
//     drover.internal, or its tag selector uses the drover.internal key;
//   - runs as root (run_as: root);
//   - turns the sandbox off (hardening: none);
//   - makes a system location writable: writable_paths equal to, inside or
//     above /etc, /root, /boot, /usr, /bin, /sbin, /lib*, /proc, /sys, /dev,
//     /run, /var/lib/systemd, /var/lib/drover, /var/lib/drover-server,
//     /var/spool/cron (so /var and /var/lib count too);
//   - sets an environment variable that changes how every program of the
//     job, the runner included, loads code: LD_* (LD_PRELOAD,
//     LD_LIBRARY_PATH, LD_AUDIT, ...), GCONV_PATH, GLIBC_TUNABLES.

// protectedPaths are the locations a non-admin spec may not make writable.
var protectedPaths = []string{
	"/etc", "/root", "/boot", "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32",
	"/proc", "/sys", "/dev", "/run",
	"/var/lib/systemd", "/var/lib/drover", "/var/lib/drover-server", "/var/spool/cron",
}

// loaderEnv reports environment names that change how programs load code.
func loaderEnv(k string) bool {
	return strings.HasPrefix(k, "LD_") || k == "GCONV_PATH" || k == "GLIBC_TUNABLES"
}

// pathOverlaps reports whether a is b, inside b, or above b.
func pathOverlaps(a, b string) bool {
	a, b = path.Clean(a), path.Clean(b)
	return a == b || strings.HasPrefix(a, b+"/") || strings.HasPrefix(b, a+"/")
}

// privilegedReasons lists why spec is privileged, as field errors; agents
// are the enrolled agents tagged internalAgentTag (the others play no part). Empty: not privileged.
func privilegedReasons(spec *manifest.Spec, agents []*store.Agent) []api.Detail {
	var out []api.Detail
	if t := spec.Targets; t != nil {
		if _, ok := t.Tags[internalAgentTag]; ok {
			out = append(out, api.Detail{Field: "spec.targets.tags." + internalAgentTag, Message: "targets the server's internal agent (it runs on the server's own host)"})
		} else {
			for _, a := range agents {
				if a.Tags[internalAgentTag] == "true" && a.RevokedAt.IsZero() && t.Selects(a.ID, a.Tags) {
					out = append(out, api.Detail{Field: "spec.targets", Message: fmt.Sprintf("reaches the server's internal agent %s (it runs on the server's own host)", a.ID)})
					break
				}
			}
		}
	}
	if spec.RunAs == "root" {
		out = append(out, api.Detail{Field: "spec.run_as", Message: "runs as root"})
	}
	if spec.Hardening == manifest.HardeningNone {
		out = append(out, api.Detail{Field: "spec.hardening", Message: "turns the sandbox off"})
	}
	for i, wp := range spec.WritablePaths {
		for _, p := range protectedPaths {
			if pathOverlaps(wp, p) {
				out = append(out, api.Detail{Field: fmt.Sprintf("spec.writable_paths[%d]", i), Message: fmt.Sprintf("%q makes %s writable", wp, p)})
				break
			}
		}
	}
	keys := make([]string, 0, len(spec.Env))
	for k := range spec.Env {
		if loaderEnv(k) {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	for _, k := range keys {
		out = append(out, api.Detail{Field: "spec.env." + k, Message: "changes how the job's programs load code"})
	}
	return out
}

// mayWritePrivileged reports whether p may write privileged specs.
func (s *Server) mayWritePrivileged(p *principal) bool {
	if p == nil {
		return false
	}
	if p.Role >= roleAdmin {
		return true
	}
	return slices.Contains(s.cfg.Privileged.AllowTokens, p.ID) || (p.Name != "" && slices.Contains(s.cfg.Privileged.AllowTokens, p.Name))
}

// checkPrivileged refuses a privileged spec from a caller who may not write
// one, with every reason as a field error.
func (s *Server) checkPrivileged(ctx context.Context, r *http.Request, spec *manifest.Spec) error {
	reasons, err := s.privileged(ctx, spec)
	if err != nil || len(reasons) == 0 {
		return err
	}
	p := principalOf(r)
	if s.mayWritePrivileged(p) {
		return nil
	}
	return privilegedRefusal(p, reasons)
}

func (s *Server) privileged(ctx context.Context, spec *manifest.Spec) ([]api.Detail, error) {
	agents, err := s.store.AgentsTagged(ctx, internalAgentTag)
	if err != nil {
		return nil, err
	}
	return privilegedReasons(spec, agents), nil
}

func privilegedRefusal(p *principal, reasons []api.Detail) error {
	who := "this token"
	if p != nil {
		who = "token " + p.ID + " (" + p.Name + ", " + p.Role.String() + ")"
	}
	return errs.New(errs.ErrPermissionDenied, "this spec is privileged and needs the admin role (or privileged.allow_tokens); "+who+" may not write it", reasons...)
}
