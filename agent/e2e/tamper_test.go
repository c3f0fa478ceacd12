package e2e

import (
	"bytes"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/drover/drover/internal/testkit"
	"github.com/drover/drover/manifest"
	"github.com/drover/drover/units"
)

// Tamper modes of the proxy.
const (
	passThrough   = ""
	flipManifest  = "flip bytes in the manifest"
	replayOld     = "replay an older manifest"
	otherAgents   = "serve another agent's manifest"
	corruptBundle = "serve a payload whose digest does not match"
	notModified   = "answer 304 to every manifest request"
)

// tamperProxy is a FAULT INJECTOR for the tests, not a product component:
// a TLS reverse proxy on 127.0.0.1 between the agent and the server's HTTPS
// API that corrupts what the server sends. It plays an attacker who holds
// the server's TLS key and the agent's client key (so that TLS does not
// stop it and only the manifest's own protection can): it answers with the
// server's certificate and forwards with the agent's.
type tamperProxy struct {
	t    *testing.T
	ts   *httptest.Server
	mu   sync.Mutex
	mode string
	old  []byte // replayOld: an older envelope of the same agent
	peer func() []byte
	hits map[string]int // tampered responses served, by mode
}

func newTamperProxy(t *testing.T, srv *serverProc, agentDataDir string) *tamperProxy {
	t.Helper()
	upstream, err := url.Parse(srv.base)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := tls.LoadX509KeyPair(filepath.Join(srv.dataDir, "tls.crt"), filepath.Join(srv.dataDir, "tls.key"))
	if err != nil {
		t.Fatal(err)
	}
	p := &tamperProxy{t: t, hits: map[string]int{}}
	rp := &httputil.ReverseProxy{
		Transport: &http.Transport{TLSClientConfig: agentTLS(t, agentDataDir)},
		Rewrite: func(r *httputil.ProxyRequest) {
			r.SetURL(upstream)
			r.Out.Host = upstream.Host
			if p.getMode() != passThrough {
				// Always a full answer to corrupt, never a 304.
				r.Out.Header.Del("If-None-Match")
			}
		},
		ModifyResponse: p.tamper,
	}
	p.ts = httptest.NewUnstartedServer(rp)
	p.ts.TLS = &tls.Config{Certificates: []tls.Certificate{cert}, ClientAuth: tls.RequireAnyClientCert}
	p.ts.StartTLS()
	t.Cleanup(p.ts.Close)
	return p
}

func (p *tamperProxy) URL() string { return p.ts.URL }

func (p *tamperProxy) getMode() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.mode
}

func (p *tamperProxy) setMode(m string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.mode = m
}

func (p *tamperProxy) served(m string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.hits[m]
}

var digestHex = regexp.MustCompile(`sha256:[0-9a-f]{64}`)

// tamper rewrites a response of the server according to the mode.
func (p *tamperProxy) tamper(resp *http.Response) error {
	mode := p.getMode()
	path := resp.Request.URL.Path
	isManifest := path == "/api/v1/agents/self/manifest"
	isPayload := strings.HasPrefix(path, "/api/v1/agents/self/payloads/")
	if isManifest && mode == notModified {
		// A frozen or stuck server: nothing newer, for ever.
		resp.Body.Close()
		resp.StatusCode, resp.Status = http.StatusNotModified, "304 Not Modified"
		resp.Body, resp.ContentLength = http.NoBody, 0
		resp.Header.Del("Content-Length")
		p.mu.Lock()
		p.hits[mode]++
		p.mu.Unlock()
		return nil
	}
	if mode == passThrough || resp.StatusCode != 200 || (!isManifest && !isPayload) {
		return nil
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		return err
	}
	switch {
	case isManifest && mode == flipManifest:
		// Flip one hex digit of a payload digest inside the signed bytes:
		// still a well-formed manifest, so only the signature can tell.
		var e map[string]any
		if err := json.Unmarshal(body, &e); err != nil {
			return err
		}
		var e2 dsse
		json.Unmarshal(body, &e2)
		loc := digestHex.FindIndex(e2.Payload)
		if loc == nil {
			return fmt.Errorf("tamper proxy: no digest in the manifest")
		}
		i := loc[1] - 1
		e2.Payload[i] = "0123456789abcdef"[(strings.IndexByte("0123456789abcdef", e2.Payload[i])+1)%16]
		e["payload"] = e2.Payload
		if body, err = json.Marshal(e); err != nil {
			return err
		}
	case isManifest && mode == replayOld:
		body = p.old
	case isManifest && mode == otherAgents:
		body = p.peer()
	case isPayload && mode == corruptBundle:
		// Same length, different bytes.
		body = bytes.Clone(body)
		body[len(body)/2] ^= 0x55
	default:
		resp.Body = io.NopCloser(bytes.NewReader(body))
		return nil
	}
	p.mu.Lock()
	p.hits[mode]++
	p.mu.Unlock()
	resp.Body = io.NopCloser(bytes.NewReader(body))
	resp.ContentLength = int64(len(body))
	resp.Header.Set("Content-Length", strconv.Itoa(len(body)))
	return nil
}

// TestTamperingProxy puts a fault-injecting proxy between a running agent
// and the server's HTTPS API (the stream stays direct) and makes it flip
// bytes of the manifest, replay an older manifest of the same agent, serve
// another agent's manifest, and serve a payload whose digest does not
// match. Each time the agent refuses the manifest (`drover-agent sync`
// says rejected, its status keeps the error), reports it (the server shows
// manifest_state rejected with the reason), and leaves the installed pipes
// alone: unit files (bytes and mtime), pipe directories and timers. With
// the proxy passing everything through again, the pending change applies.
func TestTamperingProxy(t *testing.T) {
	mgr, srv, tags := userScenario(t, "tamper")
	ag, id := enrolledAgent(t, srv, agentOpts{name: "agent-tamper", backend: "systemd", mgr: &mgr, tags: tags})

	// Another agent of the same server with the same pipes, enrolled with
	// `drover-agent enroll` (no daemon): its manifest is what the proxy
	// serves as "another agent's".
	other := testkit.ShortTempDir(t, "e2e")
	otherCfg := filepath.Join(other, "agent.yaml")
	if err := os.WriteFile(otherCfg, fmt.Appendf(nil, "server: %s\ndata_dir: %s\nbackend: cron\nscope: user\nagent_path: %s\n",
		srv.base, filepath.Join(other, "data"), agentBin()), 0o600); err != nil {
		t.Fatal(err)
	}
	enroll := exec.Command(agentBin(), "enroll", "--token", srv.token(tags), "--config", otherCfg)
	enroll.Env = childEnv()
	if out, err := enroll.CombinedOutput(); err != nil {
		t.Fatalf("drover-agent enroll: %v\n%s", err, out)
	}
	otherClient := agentHTTP(t, filepath.Join(other, "data"))

	// The agent talks to the server's HTTPS API through the proxy from now on.
	ag.stop()
	proxy := newTamperProxy(t, srv, ag.dataDir)
	ag.writeConfig(proxy.URL())
	ag.start()
	ag.waitOnline()

	base := pipeSpec{Schedule: far, Script: "echo one\n", Targets: byTags(tags)}
	srv.putPipe("t-one", base)
	two := base
	two.Script = "echo two v1\n"
	srv.putPipe("t-two", two)
	ag.waitPipes(60*time.Second, "t-one", "t-two")
	client := agentHTTP(t, ag.dataDir)
	oldEnv, oldM := fetchManifest(t, client, srv.base)
	two.Script = "echo two v2\n"
	srv.putPipe("t-two", two)
	testkit.WaitFor(t, 60*time.Second, "the agent to apply the next serial", func() bool {
		st := ag.status()
		return st != nil && st.AppliedSerial > oldM.Serial && st.AppliedSerial == st.Serial
	})
	inForce := ag.status().AppliedSerial
	_, otherM := fetchManifest(t, otherClient, srv.base)
	if otherM.AgentID == id || len(otherM.Pipes) != 2 {
		t.Fatalf("the other agent's manifest: agent %s, %d pipes", otherM.AgentID, len(otherM.Pipes))
	}
	proxy.old = oldEnv
	proxy.peer = func() []byte { env, _ := fetchManifest(t, otherClient, srv.base); return env }

	snapshot := func() (map[string]fileStamp, map[string]string, map[string]time.Time) {
		links := map[string]string{}
		for _, p := range []string{"t-one", "t-two"} {
			l, err := os.Readlink(filepath.Join(ag.dataDir, "pipes", p))
			if err != nil {
				t.Fatal(err)
			}
			links[p] = l
		}
		next := map[string]time.Time{}
		for name, tm := range mgr.ListTimers(t) {
			next[name] = tm.Next
		}
		return stampFiles(t, mgr.UnitDir()), links, next
	}
	units0, links0, timers0 := snapshot()
	if len(units0) != 4 {
		t.Fatalf("%d unit files, want 4", len(units0))
	}

	// lastAt is when the previous rejection was reported: each check waits
	// for a newer report, so it can never read the previous step's reason.
	var lastAt time.Time
	check := func(mode string, change func()) string {
		t.Helper()
		before := time.Now()
		proxy.setMode(mode)
		if change != nil {
			change()
		}
		if got := ag.syncCLI(); got != "rejected" {
			t.Fatalf("%s: drover-agent sync says %q, want rejected", mode, got)
		}
		if proxy.served(mode) == 0 {
			t.Fatalf("%s: the proxy never served a tampered answer", mode)
		}
		var reason string
		testkit.WaitFor(t, 30*time.Second, mode+": the rejection reported to the server", func() bool {
			v := srv.agentView(id)
			reason = v.ManifestError
			if v.ManifestState == "rejected" && v.StatusAt != nil && v.StatusAt.After(before.Add(-time.Second)) &&
				v.StatusAt.After(lastAt) && reason != "" {
				lastAt = *v.StatusAt
				return true
			}
			return false
		})
		st := ag.status()
		if st.AppliedSerial != inForce || st.LastSyncError == "" {
			t.Fatalf("%s: agent status applied serial %d (want %d), last sync error %q", mode, st.AppliedSerial, inForce, st.LastSyncError)
		}
		u, l, tm := snapshot()
		if d := sameStamps(units0, u); d != "" {
			t.Fatalf("%s: the unit files changed: %s", mode, d)
		}
		for p, link := range links0 {
			if l[p] != link {
				t.Fatalf("%s: pipe %s now runs %s, was %s", mode, p, l[p], link)
			}
		}
		for name, next := range timers0 {
			if !tm[name].Equal(next) {
				t.Fatalf("%s: timer %s next elapse %s, was %s", mode, name, tm[name], next)
			}
		}
		t.Logf("%-45s refused, reported: %s", mode+":", reason)
		return reason
	}

	reasons := map[string]string{}
	reasons[flipManifest] = check(flipManifest, nil)
	reasons[replayOld] = check(replayOld, nil)
	reasons[otherAgents] = check(otherAgents, nil)
	// A real change on the server whose payload the proxy corrupts.
	two.Script = "echo two v3\n"
	reasons[corruptBundle] = check(corruptBundle, func() { srv.putPipe("t-two", two) })
	for mode, want := range map[string]string{flipManifest: "signature", replayOld: "serial", otherAgents: "agent", corruptBundle: "digest"} {
		if !strings.Contains(strings.ToLower(reasons[mode]), want) {
			t.Errorf("%s: the reported reason %q does not mention %q", mode, reasons[mode], want)
		}
	}

	// Without the faults, the pending change goes through.
	proxy.setMode(passThrough)
	if got := ag.syncCLI(); got != "applied" {
		t.Fatalf("sync through an honest proxy: %s", got)
	}
	_, cur := fetchManifest(t, client, srv.base)
	testkit.WaitFor(t, 30*time.Second, "the server to see the manifest applied", func() bool {
		v := srv.agentView(id)
		return v.ManifestState == "applied" && v.AppliedSerial == cur.Serial
	})
	l, err := os.Readlink(filepath.Join(ag.dataDir, "pipes", "t-two"))
	if err != nil || l == links0["t-two"] {
		t.Fatalf("t-two's pipe dir after the honest sync: %s (was %s) %v", l, links0["t-two"], err)
	}
	var pj manifest.Pipe
	b, _ := os.ReadFile(filepath.Join(ag.dataDir, "pipes", "t-two", "pipe.json"))
	json.Unmarshal(b, &pj)
	for _, p := range cur.Pipes {
		if p.Name == "t-two" && p.Payload.Digest != pj.Payload.Digest {
			t.Fatalf("t-two runs payload %s after the honest sync, the manifest says %s", pj.Payload.Digest, p.Payload.Digest)
		}
	}
	if _, ok := unitFiles(t, mgr.UnitDir())[units.ServiceName("t-two")]; !ok {
		t.Fatal("t-two's service is gone")
	}
}
