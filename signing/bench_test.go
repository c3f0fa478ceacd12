package signing

import (
	"testing"

	"github.com/drover/drover/manifest"
)

// manifest1000 is a manifest with 1,000 realistic, normalised pipes, encoded
// exactly as the server signs it.
func manifest1000(tb testing.TB) []byte {
	return encode(tb, newManifest("agent-1", 42, 1, 1000))
}

func BenchmarkSignManifest1000(b *testing.B) {
	payload := manifest1000(b)
	for _, alg := range algs {
		b.Run(string(alg), func(b *testing.B) {
			s := mustKey(b, alg)
			var env []byte
			b.SetBytes(int64(len(payload)))
			b.ResetTimer()
			for b.Loop() {
				env = mustSign(b, s, manifest.PayloadType, payload)
			}
			b.ReportMetric(float64(len(payload)), "payload-bytes")
			b.ReportMetric(float64(len(env)), "envelope-bytes")
		})
	}
}

// BenchmarkVerifyManifest1000 measures what an agent does per pull: verify the
// key list, verify the envelope, decode and validate the manifest, and check
// agent, serial and times.
func BenchmarkVerifyManifest1000(b *testing.B) {
	payload := manifest1000(b)
	for _, alg := range algs {
		b.Run(string(alg), func(b *testing.B) {
			root, s := mustKey(b, alg), mustKey(b, alg)
			tr := mustTrustRoot(b, root, mustKeyList(b, root, 1, t0.AddDate(1, 0, 0), s))
			env := mustSign(b, s, manifest.PayloadType, payload)
			st := State{AgentID: "agent-1", Serial: 41}
			b.SetBytes(int64(len(env)))
			b.ResetTimer()
			for b.Loop() {
				if _, err := AcceptManifest(env, tr, st, t0, 0); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(len(env)), "envelope-bytes")
		})
	}
}

// BenchmarkVerifyEnvelope1000 isolates the signature check (Verify alone).
func BenchmarkVerifyEnvelope1000(b *testing.B) {
	payload := manifest1000(b)
	for _, alg := range algs {
		b.Run(string(alg), func(b *testing.B) {
			s := mustKey(b, alg)
			env := mustSign(b, s, manifest.PayloadType, payload)
			keys := []PublicKey{s.Public()}
			b.SetBytes(int64(len(env)))
			b.ResetTimer()
			for b.Loop() {
				if _, _, err := Verify(env, manifest.PayloadType, keys); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func TestManifest1000Accepted(t *testing.T) {
	if testing.Short() {
		t.Skip("short")
	}
	root, s := mustKey(t, Ed25519), mustKey(t, Ed25519)
	tr := mustTrustRoot(t, root, mustKeyList(t, root, 1, t0.AddDate(1, 0, 0), s))
	env := signManifest(t, s, newManifest("agent-1", 42, 1, 1000))
	acc, err := AcceptManifest(env, tr, State{AgentID: "agent-1"}, t0, 0)
	if err != nil || len(acc.Manifest.Pipes) != 1000 {
		t.Fatalf("1000-pipe manifest: %v", err)
	}
}
