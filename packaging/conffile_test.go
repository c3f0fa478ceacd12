package packaging

import (
	"os"
	"reflect"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/drover/drover/agent"
	"github.com/drover/drover/server"
)

// The conffiles list every setting commented out as "#key: value" (nested
// ones as "#  key: value"); prose comments start with "# ". uncomment
// turns the settings on.
var settingLine = regexp.MustCompile(`^#(\S|  )`)

func uncomment(b []byte) []byte {
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		if settingLine.MatchString(line) {
			out = append(out, line[1:])
		}
	}
	return []byte(strings.Join(out, "\n") + "\n")
}

// yamlPaths lists the dotted YAML paths of every leaf field of a struct type.
func yamlPaths(t reflect.Type, prefix string) []string {
	var out []string
	for i := 0; i < t.NumField(); i++ {
		tag, _, _ := strings.Cut(t.Field(i).Tag.Get("yaml"), ",")
		if tag == "" || tag == "-" {
			continue
		}
		ft := t.Field(i).Type
		if ft.Kind() == reflect.Struct && ft != reflect.TypeOf(time.Duration(0)) {
			out = append(out, yamlPaths(ft, prefix+tag+".")...)
			continue
		}
		out = append(out, prefix+tag)
	}
	return out
}

// listedPaths returns the dotted paths of the commented settings.
func listedPaths(b []byte) map[string]bool {
	paths := map[string]bool{}
	section := ""
	for _, line := range strings.Split(string(b), "\n") {
		if !settingLine.MatchString(line) {
			continue
		}
		body := line[1:]
		key, _, ok := strings.Cut(strings.TrimSpace(body), ":")
		if !ok {
			continue
		}
		if strings.HasPrefix(body, "  ") {
			paths[section+"."+key] = true
			continue
		}
		section = key
		paths[key] = true
	}
	return paths
}

func checkListed(t *testing.T, file string, conf []byte, typ reflect.Type) {
	t.Helper()
	listed := listedPaths(conf)
	var missing []string
	for _, p := range yamlPaths(typ, "") {
		if !listed[p] {
			missing = append(missing, p)
		}
	}
	sort.Strings(missing)
	if len(missing) > 0 {
		t.Errorf("%s does not list these settings: %s", file, strings.Join(missing, ", "))
	}
}

// TestAgentConffile: agent.yaml lists every setting of agent.Config, and
// with every line uncommented it decodes strictly to the defaults (server
// and control_socket are examples, not defaults).
func TestAgentConffile(t *testing.T) {
	conf, err := os.ReadFile("config/agent.yaml")
	if err != nil {
		t.Fatal(err)
	}
	checkListed(t, "config/agent.yaml", conf, reflect.TypeOf(agent.Config{}))
	cfg := agent.DefaultConfig()
	if err := agent.DecodeConfig(uncomment(conf), &cfg); err != nil {
		t.Fatalf("agent.yaml uncommented: %v", err)
	}
	if cfg.Server == "" {
		t.Error("agent.yaml should show an example server URL")
	}
	if err := cfg.Validate(); err != nil {
		t.Errorf("agent.yaml uncommented does not validate: %v", err)
	}
	want := agent.DefaultConfig()
	want.Server = cfg.Server
	if cfg.ServerURLs != nil && len(cfg.ServerURLs) == 0 && len(cfg.GRPCAddrs) == 0 {
		want.ServerURLs, want.GRPCAddrs = cfg.ServerURLs, cfg.GRPCAddrs // "[]"
	}
	if !reflect.DeepEqual(cfg, want) {
		t.Errorf("agent.yaml's commented values differ from the defaults:\n got %+v\nwant %+v", cfg, want)
	}
	// The file as shipped (all commented) decodes to the defaults too.
	cfg = agent.DefaultConfig()
	if err := agent.DecodeConfig(conf, &cfg); err != nil || !reflect.DeepEqual(cfg, agent.DefaultConfig()) {
		t.Errorf("agent.yaml as shipped: %v, %+v", err, cfg)
	}
}

// TestServerConffile: the same for server.yaml and server.Config
// (public_url is an example).
func TestServerConffile(t *testing.T) {
	conf, err := os.ReadFile("config/server.yaml")
	if err != nil {
		t.Fatal(err)
	}
	checkListed(t, "config/server.yaml", conf, reflect.TypeOf(server.Config{}))
	cfg := server.DefaultConfig()
	if err := server.DecodeConfig(uncomment(conf), &cfg); err != nil {
		t.Fatalf("server.yaml uncommented: %v", err)
	}
	if err := cfg.Validate(); err != nil {
		t.Errorf("server.yaml uncommented does not validate: %v", err)
	}
	want := server.DefaultConfig()
	want.PublicURL = cfg.PublicURL
	if cfg.TLSSANs != nil && len(cfg.TLSSANs) == 0 {
		want.TLSSANs = cfg.TLSSANs // "[]" decodes to an empty, non-nil slice
	}
	if cfg.PublicURLs != nil && len(cfg.PublicURLs) == 0 && len(cfg.GRPCPublicAddrs) == 0 {
		want.PublicURLs, want.GRPCPublicAddrs = cfg.PublicURLs, cfg.GRPCPublicAddrs
	}
	if cfg.Privileged.AllowTokens != nil && len(cfg.Privileged.AllowTokens) == 0 {
		want.Privileged.AllowTokens = cfg.Privileged.AllowTokens
	}
	if !reflect.DeepEqual(cfg, want) {
		t.Errorf("server.yaml's commented values differ from the defaults:\n got %+v\nwant %+v", cfg, want)
	}
	cfg = server.DefaultConfig()
	if err := server.DecodeConfig(conf, &cfg); err != nil || !reflect.DeepEqual(cfg, server.DefaultConfig()) {
		t.Errorf("server.yaml as shipped: %v, %+v", err, cfg)
	}
}

func TestUncommentConvention(t *testing.T) {
	in := "# prose: not a setting\n#key: 1\n#section:\n#  nested: 2\n#\n##x\n"
	got := string(uncomment([]byte(in)))
	if got != "key: 1\nsection:\n  nested: 2\n#x\n" {
		t.Fatalf("uncomment: %q", got)
	}
}
