package agent

import (
	"encoding/json"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/drover/drover/api"
	"github.com/drover/drover/internal/testkit"
	agentpb "github.com/drover/drover/proto"
)

// metric reads one sample of the real server's /metrics (0 when absent).
func (rs *realServer) metric(t *testing.T, series string) float64 {
	t.Helper()
	code, body := rs.srv.API("GET", "/metrics", nil)
	if code != 200 {
		t.Fatalf("GET /metrics: %d", code)
	}
	m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(series) + ` (\S+)$`).FindSubmatch(body)
	if m == nil {
		return 0
	}
	v, err := strconv.ParseFloat(string(m[1]), 64)
	must(t, err)
	return v
}

// manifestGETs is how many manifest GETs the server answered (any code).
func (rs *realServer) manifestGETs(t *testing.T) float64 {
	return rs.metric(t, `drover_manifest_requests_total{code="200"}`) + rs.metric(t, `drover_manifest_requests_total{code="304"}`) +
		rs.metric(t, `drover_manifest_requests_total{code="error"}`)
}

func (rs *realServer) putPipe(t *testing.T, name string, spec map[string]any) {
	t.Helper()
	var put api.PutPipeResponse
	rs.api("PUT", "/api/v1/pipes/"+name, map[string]any{"spec": spec}, &put)
}

// TestManifestOnStream runs the agent against the real server: a change
// arrives with its SyncNow and is applied without a manifest GET (its
// payload fetched by digest, its ETag remembered: the next poll is a 304);
// a manifest larger than the bound is announced alone and polled. The
// tampered and the older manifest are put where the stream puts them
// (pushManifest, as handleCommand does): the real server never sends
// either, and nothing else can make it.
func TestManifestOnStream(t *testing.T) {
	rs := startRealServer(t)
	var tok api.EnrollmentTokenCreated
	rs.api("POST", "/api/v1/enrollment-tokens", api.EnrollmentTokenRequest{Tags: map[string]string{"role": "streamtest"}}, &tok)
	cfg := testConfig(t, nil)
	cfg.Server = rs.srv.URL
	ta := startAgent(t, cfg, nil, WithEnrollToken(tok.Token))
	id := ta.enrolled(15 * time.Second)
	testkit.WaitFor(t, 15*time.Second, "the agent online", func() bool {
		var ag api.Agent
		rs.api("GET", "/api/v1/agents/"+id.AgentID, nil, &ag)
		return ag.Online && ta.a.Status(t.Context()).StreamConnected
	})
	targets := map[string]any{"tags": map[string]string{"role": "streamtest"}}
	applied := func(what string, serialAbove uint64, ok func(Status) bool) Status {
		t.Helper()
		var st Status
		testkit.WaitFor(t, 20*time.Second, what, func() bool {
			// Serial == AppliedSerial: the pipes are read from the backend,
			// which has the new manifest's units a moment before the agent
			// records it applied (under load a status in that moment gave
			// the older serial with the newer pipes).
			st = ta.a.Status(t.Context())
			return st.AppliedSerial > serialAbove && st.Serial == st.AppliedSerial && ok(st)
		})
		return st
	}
	rs.putPipe(t, "st-one", map[string]any{"schedule": "11 4 * * *", "script": "echo one", "targets": targets})
	st1 := applied("the first pipe", 0, func(st Status) bool { return len(st.Pipes) == 1 })
	ms1, err := ta.a.manifestState()
	must(t, err)
	env1 := append([]byte(nil), ms1.Envelope...)
	digest1 := ta.fake.lastApply().Manifest.Pipes[0].Payload.Digest

	// A change: its SyncNow carries the manifest; no GET.
	gets, carried, took := rs.manifestGETs(t), rs.metric(t, `drover_sync_now_total{carried="manifest"}`), ta.a.streamManifests.Load()
	rs.putPipe(t, "st-one", map[string]any{"schedule": "11 4 * * *", "script": "echo two", "targets": targets})
	st2 := applied("the change", st1.AppliedSerial, func(st Status) bool { return len(st.Pipes) == 1 && st.Pipes[0].Version == 2 })
	if g := rs.manifestGETs(t); g != gets {
		t.Fatalf("the change took %v manifest GETs, want none (it came on the stream)", g-gets)
	}
	if c := rs.metric(t, `drover_sync_now_total{carried="manifest"}`); c <= carried {
		t.Fatalf("drover_sync_now_total{carried=manifest} %v, was %v", c, carried)
	}
	// Counted once the sync returns, just after the apply.
	testkit.WaitFor(t, 5*time.Second, "the stream's manifest counted", func() bool { return ta.a.Status(t.Context()).StreamManifests == took+1 })
	if in := ta.fake.lastApply(); in == nil {
		t.Fatal("nothing applied")
	} else if p := &in.Manifest.Pipes[0]; p.Payload.Digest == digest1 {
		t.Fatal("the change did not change the payload")
	} else if _, err := in.Payloads(p); err != nil {
		t.Fatalf("the new payload was not fetched: %v", err)
	}
	// The ETag came with it: the next poll is a 304.
	if r := ta.syncNow(); r.Outcome != OutcomeUnchanged || !r.NotModified || r.FromStream {
		t.Fatalf("poll after the stream's manifest: %+v, want a 304", r)
	}
	if g := rs.manifestGETs(t); g != gets+1 {
		t.Fatalf("manifest GETs %v, want %v", g, gets+1)
	}

	// An older manifest on the stream (verified, serial lower) is ignored:
	// no poll, nothing reported, the serial stays.
	gets = rs.manifestGETs(t)
	if !ta.a.pushManifest(&agentpb.SyncNow{Serial: st1.AppliedSerial, Manifest: env1, ManifestEtag: `"old"`, ManifestSerial: st1.AppliedSerial}) {
		t.Fatal("the older manifest was refused before its check")
	}
	if r := ta.syncNow(); r.Outcome != OutcomeUnchanged || !r.FromStream || r.Serial != st2.AppliedSerial {
		t.Fatalf("older manifest on the stream: %+v", r)
	}
	if st := ta.a.Status(t.Context()); st.Serial != st2.AppliedSerial || st.AppliedSerial != st2.AppliedSerial || st.StreamManifestsRefused != 0 {
		t.Fatalf("after the older manifest: %+v", st)
	}
	if g := rs.manifestGETs(t); g != gets {
		t.Fatalf("the older manifest set off %v GETs", g-gets)
	}

	// A tampered manifest (the current one with its payload changed under
	// the signature) is refused, counted, and the agent polls at once.
	ms2, err := ta.a.manifestState()
	must(t, err)
	var env map[string]any
	must(t, json.Unmarshal(ms2.Envelope, &env))
	payload := env["payload"].(string)
	env["payload"] = payload[:len(payload)-8] + strings.Repeat("A", 8)
	if env["payload"] == payload {
		env["payload"] = payload[:len(payload)-8] + strings.Repeat("B", 8)
	}
	tampered, err := json.Marshal(env)
	must(t, err)
	gets = rs.manifestGETs(t)
	if !ta.a.pushManifest(&agentpb.SyncNow{Serial: st2.AppliedSerial + 1, Manifest: tampered, ManifestEtag: `"tampered"`, ManifestSerial: st2.AppliedSerial + 1}) {
		t.Fatal("the tampered manifest was refused before its check")
	}
	if r := ta.syncNow(); r.FromStream || !r.NotModified || r.Outcome != OutcomeUnchanged {
		t.Fatalf("tampered manifest on the stream: %+v, want the poll's 304", r)
	}
	if g := rs.manifestGETs(t); g != gets+1 {
		t.Fatalf("after the tampered manifest: %v GETs, want one poll", g-gets)
	}
	if st := ta.a.Status(t.Context()); st.Serial != st2.AppliedSerial || st.StreamManifestsRefused != 1 {
		t.Fatalf("after the tampered manifest: serial %d refused %d", st.Serial, st.StreamManifestsRefused)
	}
	if !strings.Contains(ta.logs.String(), "the manifest on the stream was not accepted; polling") {
		t.Fatal("the refusal was not logged")
	}

	// Out of bounds before any work: larger than the bound, or a serial
	// below the one announced.
	if ta.a.pushManifest(&agentpb.SyncNow{Serial: 9, Manifest: make([]byte, agentpb.MaxSyncNowManifestBytes+1), ManifestSerial: 9}) ||
		ta.a.pushManifest(&agentpb.SyncNow{Serial: 9, Manifest: env1, ManifestSerial: 8}) {
		t.Fatal("an out-of-bounds manifest was kept")
	}

	// A manifest larger than the bound: the server announces it alone and
	// the agent polls (one 200).
	big := map[string]string{}
	for i := range 10 {
		big["BIG_"+strconv.Itoa(i)] = strings.Repeat(strconv.Itoa(i), 30<<10)
	}
	gets, tooLarge, took := rs.manifestGETs(t), rs.metric(t, `drover_sync_now_total{carried="too_large"}`), ta.a.streamManifests.Load()
	ok200 := rs.metric(t, `drover_manifest_requests_total{code="200"}`)
	rs.putPipe(t, "st-one", map[string]any{"schedule": "11 4 * * *", "script": "echo two", "env": big, "targets": targets})
	applied("the large manifest", st2.AppliedSerial, func(st Status) bool { return len(st.Pipes) == 1 && st.Pipes[0].Version == 3 })
	if c := rs.metric(t, `drover_sync_now_total{carried="too_large"}`); c != tooLarge+1 {
		t.Fatalf("drover_sync_now_total{carried=too_large} %v, want %v", c, tooLarge+1)
	}
	if g, o := rs.manifestGETs(t), rs.metric(t, `drover_manifest_requests_total{code="200"}`); g != gets+1 || o != ok200+1 {
		t.Fatalf("the large manifest: %v GETs (%v answered 200), want one poll", g-gets, o-ok200)
	}
	if n := ta.a.streamManifests.Load(); n != took {
		t.Fatalf("stream manifests %d, want %d", n, took)
	}
}
