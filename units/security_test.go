package units

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/drover/drover/manifest"
)

// exposureRE finds systemd-analyze security's verdict line:
// "→ Overall exposure level for drover-pipe-x.service: 1.5 OK 🙂".
var exposureRE = regexp.MustCompile(`Overall exposure level for [^:]+: ([0-9]+(?:\.[0-9]+)?)`)

// maxExposure is the highest `systemd-analyze security` exposure each
// profile may rate: strict ≤ 2.0, default ≤ 5.0.
var maxExposure = map[string]float64{"strict": 2.0, "default": 5.0}

// TestSecurityExposure renders system-scope services and scores them with
// `systemd-analyze security --offline=true`, which needs no running manager.
func TestSecurityExposure(t *testing.T) {
	analyze := oracleAnalyze(t) // skips, or fails when CI=true, without systemd-analyze
	root := t.TempDir()
	agent := fakeAgent(t, root)
	runtimeDir := filepath.Join(root, "runtime")
	if err := os.Mkdir(runtimeDir, 0o700); err != nil {
		t.Fatal(err)
	}
	for _, profile := range []string{"strict", "default", "none"} {
		for _, runAs := range []string{"", "backup", "root"} {
			name := profile + "/" + runAs
			if runAs == "" {
				name = profile + "/dynamic"
			}
			t.Run(name, func(t *testing.T) {
				spec := baseSpec()
				spec.Hardening = profile
				spec.RunAs = runAs
				spec.Secrets = []string{"PGPASSWORD"}
				files, err := Render(spec, Options{AgentPath: agent})
				if err != nil {
					t.Fatal(err)
				}
				dir := t.TempDir()
				p := filepath.Join(dir, files[0].Name)
				if err := os.WriteFile(p, files[0].Content, 0o644); err != nil {
					t.Fatal(err)
				}
				out, err := runAnalyze(t, analyze, runtimeDir, "security", "--offline=true", "--no-pager", p)
				m := exposureRE.FindStringSubmatch(out)
				if m == nil {
					t.Fatalf("no exposure level in the output (%v):\n%s", err, out)
				}
				score, _ := strconv.ParseFloat(m[1], 64)
				t.Logf("%s: exposure %.1f", name, score)
				// A root job is the operator's explicit choice; its score is
				// logged, the thresholds apply to unprivileged identities.
				if limit, ok := maxExposure[profile]; ok && runAs != "root" && score > limit {
					t.Errorf("%s: exposure %.1f, want at most %.1f\n%s", name, score, limit, out)
				}
			})
		}
	}
}

// The profiles, stated independently: what each must and must not contain.
func TestHardeningProfiles(t *testing.T) {
	type kv = [2]string
	must := map[string][]kv{
		"strict": {
			{"NoNewPrivileges", "yes"}, {"ProtectSystem", "strict"}, {"ProtectHome", "yes"}, {"PrivateTmp", "yes"},
			{"PrivateDevices", "yes"}, {"PrivateNetwork", "yes"}, {"PrivateUsers", "yes"}, {"CapabilityBoundingSet", ""},
			{"RestrictAddressFamilies", "AF_UNIX"}, {"SystemCallFilter", "@system-service"}, {"SystemCallFilter", "~@privileged"},
			{"SystemCallFilter", "~@resources"}, {"MemoryDenyWriteExecute", "yes"}, {"RestrictNamespaces", "yes"},
			{"ProtectKernelTunables", "yes"}, {"ProtectKernelModules", "yes"}, {"ProtectControlGroups", "yes"},
		},
		"default": {
			{"NoNewPrivileges", "yes"}, {"ProtectSystem", "strict"}, {"ProtectHome", "read-only"}, {"PrivateTmp", "yes"},
			{"PrivateDevices", "yes"}, {"CapabilityBoundingSet", ""}, {"RestrictAddressFamilies", "AF_UNIX AF_INET AF_INET6"},
			{"SystemCallFilter", "@system-service"}, {"SystemCallFilter", "~@privileged"}, {"SystemCallErrorNumber", "EPERM"},
			{"ProtectKernelTunables", "yes"}, {"ProtectKernelModules", "yes"}, {"ProtectControlGroups", "yes"},
		},
	}
	// Usability of default: network, JIT runtimes, nice/ionice/ulimit.
	mustNot := map[string][]string{
		"default": {"PrivateNetwork", "IPAddressDeny", "MemoryDenyWriteExecute", "PrivateUsers", "ProcSubset"},
	}
	for profile, want := range must {
		got, err := hardening(profile, ScopeSystem, false)
		if err != nil {
			t.Fatal(err)
		}
		for _, w := range want {
			found := false
			for _, o := range got {
				found = found || (o.Key == w[0] && o.Value == w[1])
			}
			if !found {
				t.Errorf("%s lacks %s=%s", profile, w[0], w[1])
			}
		}
		seen := map[string]bool{}
		for _, o := range got {
			if seen[o.Key] && o.Key != "SystemCallFilter" {
				t.Errorf("%s sets %s twice", profile, o.Key)
			}
			seen[o.Key] = true
		}
		for _, k := range mustNot[profile] {
			if seen[k] {
				t.Errorf("%s sets %s, which breaks ordinary jobs", profile, k)
			}
		}
		for _, o := range got {
			if profile == "default" && o.Key == "SystemCallFilter" && strings.Contains(o.Value, "@resources") {
				t.Errorf("default denies @resources (nice, ionice, ulimit)")
			}
		}
	}
	if h, _ := hardening("none", ScopeSystem, true); len(h) != 0 {
		t.Errorf("none has options: %v", h)
	}
	rootDefault, _ := hardening("default", ScopeSystem, true)
	if rootDefault[0] != (option{"CapabilityBoundingSet", "CAP_DAC_READ_SEARCH"}) {
		t.Errorf("default for root: %v", rootDefault[0])
	}
	rootStrict, _ := hardening("strict", ScopeSystem, true)
	if rootStrict[0] != (option{"CapabilityBoundingSet", ""}) {
		t.Errorf("strict for root: %v", rootStrict[0])
	}
	if _, err := hardening("paranoid", ScopeSystem, false); err == nil {
		t.Error("unknown profile accepted")
	}
	for _, profile := range []string{manifest.HardeningStrict, manifest.HardeningDefault} {
		h, _ := hardening(profile, ScopeUser, false)
		if len(h) == 0 {
			t.Errorf("user scope %s: no options", profile)
		}
	}
}
