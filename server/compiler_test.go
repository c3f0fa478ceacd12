package server

import (
	"bytes"
	"testing"
	"time"

	"github.com/drover/drover/manifest"
	"github.com/drover/drover/server/store"
)

// The compiler assembles manifest bytes from pipes encoded once; they must
// be exactly what manifest.Manifest.Encode produces.
func TestEncodeManifestMatches(t *testing.T) {
	off := false
	specs := []manifest.Spec{
		{Name: "a", Schedule: "@daily", Script: "echo '<&>' \"x\"\n", Env: map[string]string{"B": "2", "A": "1"}, Secrets: []string{"S"}},
		{Name: "b", Schedule: "*/5 * * * *", Command: []string{"./run.sh", "--x"}, Files: []string{"run.sh"}, Enabled: &off, Timezone: "Europe/Berlin"},
	}
	now := time.Date(2026, 3, 29, 1, 30, 0, 0, time.UTC)
	for _, n := range []int{0, 1, 2} {
		m := manifest.Manifest{AgentID: "agt-x", Serial: 7, IssuedAt: now, ExpiresAt: now.Add(manifest.DefaultLifetime), KeyListVersion: 3, Pipes: []manifest.Pipe{}}
		var parts [][]byte
		for i := range n {
			s := specs[i]
			s.Normalize()
			e, err := newPipeEntry(&store.PipeVersion{Name: s.Name, Version: uint64(i + 1), Spec: s, PayloadDigest: manifest.Digest([]byte{byte(i)}), PayloadSize: 10})
			if err != nil {
				t.Fatal(err)
			}
			parts = append(parts, e.json)
			m.Pipes = append(m.Pipes, manifest.Pipe{Name: s.Name, Version: uint64(i + 1), Spec: s, Payload: manifest.Payload{Digest: manifest.Digest([]byte{byte(i)}), Size: 10}})
		}
		want, err := m.Encode()
		if err != nil {
			t.Fatal(err)
		}
		got, err := encodeManifest(m.AgentID, m.Serial, m.IssuedAt, m.ExpiresAt, m.KeyListVersion, parts)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("%d pipes:\n got %s\nwant %s", n, got, want)
		}
		if _, err := manifest.DecodeManifest(got); err != nil {
			t.Fatalf("%d pipes: %v", n, err)
		}
	}
}
