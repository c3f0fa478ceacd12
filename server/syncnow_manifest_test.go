package server

import (
	"bytes"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/drover/drover/internal/testkit"
	agentpb "github.com/drover/drover/proto"
)

// lastSyncAtLeast returns the last SyncNow the stream received announcing
// at least serial, waiting for it.
func (s *testStream) lastSyncAtLeast(t *testing.T, serial uint64, timeout time.Duration) *agentpb.SyncNow {
	t.Helper()
	var got *agentpb.SyncNow
	testkit.WaitFor(t, timeout, "a SyncNow of serial "+strconv.FormatUint(serial, 10), func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		for _, m := range s.syncMsgs {
			if m.GetSerial() >= serial {
				got = m
			}
		}
		return got != nil
	})
	return got
}

// checkCarried fails t unless sn carries exactly what the agent's manifest
// GET answers with 200: the body byte for byte, its ETag and its serial.
func checkCarried(t *testing.T, a *testAgent, sn *agentpb.SyncNow) {
	t.Helper()
	r, err := a.get("/api/v1/agents/self/manifest")
	if err != nil || r.code != 200 {
		t.Fatalf("GET manifest: %v %v", r, err)
	}
	if len(sn.GetManifest()) == 0 {
		t.Fatalf("SyncNow %d carries no manifest", sn.GetSerial())
	}
	if !bytes.Equal(sn.GetManifest(), r.body) {
		t.Fatalf("the SyncNow's manifest (%d bytes) differs from the GET's body (%d bytes)", len(sn.GetManifest()), len(r.body))
	}
	if sn.GetManifestEtag() != r.header.Get("ETag") || strconv.FormatUint(sn.GetManifestSerial(), 10) != r.header.Get("X-Drover-Manifest-Serial") {
		t.Fatalf("SyncNow ETag %s serial %d, the GET's %s %s", sn.GetManifestEtag(), sn.GetManifestSerial(), r.header.Get("ETag"), r.header.Get("X-Drover-Manifest-Serial"))
	}
	if sn.GetManifestSerial() < sn.GetSerial() {
		t.Fatalf("SyncNow announces %d and carries the older %d", sn.GetSerial(), sn.GetManifestSerial())
	}
}

// A change's SyncNow carries the manifest the GET serves, byte for byte;
// so does the SyncNow a Hello that is behind gets; a manifest larger than
// the bound is announced alone.
func TestSyncNowCarriesManifest(t *testing.T) {
	ts := startServer(t)
	tags := map[string]string{"role": "carry"}
	a := ts.enrollAgent(tags)
	st := a.mustStream(t)

	ts.putScriptPipe("carry-job", "echo carry", tags)
	var serial uint64 = 2
	checkCarried(t, a, st.lastSyncAtLeast(t, serial, 5*time.Second))

	// A stream whose Hello says it holds an older manifest is told at once,
	// with the manifest.
	late, err := a.openStreamHello("", &agentpb.Hello{AgentVersion: "test", Os: "linux", Arch: "amd64", Hostname: "h", Backend: "systemd", Scope: "user", ManifestSerial: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(late.close)
	checkCarried(t, a, late.lastSyncAtLeast(t, serial, 5*time.Second))

	// Larger than the bound: announced alone.
	before := ts.s.fleet.hub.SyncNowCounts()
	big := map[string]string{}
	for i := range 10 {
		big["BIG_"+strconv.Itoa(i)] = strings.Repeat("x", 30<<10)
	}
	ts.adminOK("PUT", "/api/v1/pipes/carry-job", map[string]any{"spec": map[string]any{"schedule": "@hourly", "script": "echo carry",
		"env": big, "targets": map[string]any{"tags": tags}}}, nil)
	sn := late.lastSyncAtLeast(t, serial+1, 5*time.Second)
	if len(sn.GetManifest()) != 0 || sn.GetManifestEtag() != "" {
		t.Fatalf("a manifest over %d bytes went on the stream (%d bytes)", agentpb.MaxSyncNowManifestBytes, len(sn.GetManifest()))
	}
	if r, err := a.get("/api/v1/agents/self/manifest"); err != nil || len(r.body) <= agentpb.MaxSyncNowManifestBytes {
		t.Fatalf("the large manifest has %d bytes, want more than the bound (%v)", len(r.body), err)
	}
	if after := ts.s.fleet.hub.SyncNowCounts(); after.TooLarge < before.TooLarge+1 || after.Manifest != before.Manifest {
		t.Fatalf("SyncNow counts %+v, then %+v", before, after)
	}
}
