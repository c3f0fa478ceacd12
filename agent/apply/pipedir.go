package apply

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/drover/drover/agent/runner"
	"github.com/drover/drover/internal/atomicfile"
	"github.com/drover/drover/manifest"
)

// Layout paths below the data dir (see the package doc).
const (
	pipesDir   = "pipes"
	secretsDir = "secrets"
	pipeJSON   = "pipe.json"
	payloadDir = "payload"
	linkPref   = ".lnk-" // a symlink about to be renamed over D/pipes/<name>
)

// PipeDir returns D/pipes/<name>, the path the runner gets in DROVER_PIPE_DIR.
func PipeDir(dataDir, pipe string) string { return filepath.Join(dataDir, pipesDir, pipe) }

// SecretsDir returns D/secrets/<name>.
func SecretsDir(dataDir, pipe string) string { return filepath.Join(dataDir, secretsDir, pipe) }

// encodePipe returns the bytes of pipe.json.
func encodePipe(p *manifest.Pipe) ([]byte, error) {
	b, err := json.MarshalIndent(p, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(b, '\n'), nil
}

// pipeDigest is the content digest of a pipe directory generation: what the
// runner gets (pipe.json, the payload) and how it is scheduled (the units).
func pipeDigest(pipeJSON []byte, payloadDigest string, rendered []UnitFile) string {
	h := sha256.New()
	fmt.Fprintf(h, "drover pipe generation v1\n%d\n", len(pipeJSON))
	h.Write(pipeJSON)
	fmt.Fprintf(h, "\n%s\n", payloadDigest)
	for _, u := range rendered {
		sum := sha256.Sum256(u.Data)
		fmt.Fprintf(h, "%s %x\n", u.Name, sum)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// readPipeDirs returns, for each D/pipes/<name> link, the generation it
// points at ("" if the link or its target is broken).
func readPipeDirs(dataDir string) (map[string]string, error) {
	root := filepath.Join(dataDir, pipesDir)
	ents, err := os.ReadDir(root)
	if os.IsNotExist(err) {
		return map[string]string{}, nil
	}
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, e := range ents {
		name := e.Name()
		if strings.HasPrefix(name, ".") || !manifest.ValidName(name) {
			continue
		}
		out[name] = ""
		target, err := os.Readlink(filepath.Join(root, name))
		if err != nil {
			continue
		}
		gen, ok := strings.CutPrefix(target, "."+name+".")
		if !ok || strings.ContainsAny(gen, "/.") {
			continue
		}
		// A generation rebuilt in place (restoreSuffix) is the same one.
		gen, _, _ = strings.Cut(gen, "-")
		if st, err := os.Stat(filepath.Join(root, target, pipeJSON)); err != nil || !st.Mode().IsRegular() {
			continue
		}
		if st, err := os.Stat(filepath.Join(root, target, payloadDir)); err != nil || !st.IsDir() {
			continue
		}
		// A payload edited by hand is drift: the generation counts as
		// broken and is rebuilt from the verified bundle.
		if !payloadIntact(filepath.Join(root, target)) {
			continue
		}
		out[name] = gen
	}
	return out, nil
}

// payloadIntact reports whether a generation's payload is still what was
// unpacked from the bundle its pipe.json names.
func payloadIntact(genDir string) bool {
	b, err := os.ReadFile(filepath.Join(genDir, pipeJSON))
	if err != nil {
		return false
	}
	var p manifest.Pipe
	if json.Unmarshal(b, &p) != nil {
		return false
	}
	return runner.VerifyPayload(genDir, p.Payload.Digest) == nil
}

// buildGeneration writes a generation of a pipe's directory at its final
// name, D/pipes/.<name>.<gen>, after removing whatever a crashed apply left
// there (no link points at it: Plan only asks for generations that are not
// the live one). Nothing is synced: the caller syncs once for all pipes
// before publishGeneration makes any of them live.
func buildGeneration(dataDir string, p *manifest.Pipe, pj []byte, bundle []byte, gen string) (string, error) {
	final := filepath.Join(dataDir, pipesDir, "."+p.Name+"."+gen)
	if t, err := os.Readlink(filepath.Join(dataDir, pipesDir, p.Name)); err == nil && strings.HasPrefix(t, "."+p.Name+"."+gen) {
		// Restoring the live generation (its payload was edited): build
		// beside it, so that a run starting meanwhile never sees it half
		// gone; the old one is collected once the link moved.
		final = filepath.Join(dataDir, pipesDir, "."+p.Name+"."+gen+"-"+randHex(3))
	}
	if err := os.RemoveAll(final); err != nil {
		return "", err
	}
	fail := func(err error) (string, error) {
		os.RemoveAll(final)
		return "", err
	}
	if err := mkdirMode(final, 0o755); err != nil {
		return fail(err)
	}
	if err := writeFileMode(filepath.Join(final, pipeJSON), pj, 0o644); err != nil {
		return fail(err)
	}
	payload := filepath.Join(final, payloadDir)
	if err := mkdirMode(payload, 0o755); err != nil {
		return fail(err)
	}
	if err := manifest.UnpackBundle(bundle, payload, manifest.UnpackLimits{}); err != nil {
		return fail(fmt.Errorf("unpack payload: %w", err))
	}
	if umask&0o022 != 0 {
		// A strict umask narrowed what UnpackBundle created; the runner
		// (possibly another user) must read it.
		if err := fixModes(payload); err != nil {
			return fail(err)
		}
	}
	if err := runner.WritePayloadSum(final, p.Payload.Digest); err != nil {
		return fail(err)
	}
	return final, nil
}

// publishGeneration points D/pipes/<name> at final (a sibling directory):
// a new link, or an atomic rename of a fresh link over the old one. The
// caller syncs the directory.
func publishGeneration(dataDir, name, final string) error {
	root := filepath.Join(dataDir, pipesDir)
	link := filepath.Join(root, name)
	err := os.Symlink(filepath.Base(final), link)
	if err == nil || !os.IsExist(err) {
		return err
	}
	tmp := filepath.Join(root, linkPref+randHex(6))
	if err := os.Symlink(filepath.Base(final), tmp); err != nil {
		return err
	}
	if err := os.Rename(tmp, link); err != nil {
		os.Remove(tmp)
		// A directory in the way (not ours: we only make links) is
		// refused rather than removed.
		return err
	}
	return nil
}

// gcPipeDirs removes every hidden entry of D/pipes that no live link points
// at (old generations, half-built ones and temporary links of a crashed apply), except generations
// of pipes busy(name) says are running, and links of pipes not in keep.
func gcPipeDirs(dataDir string, keep map[string]bool, busy func(string) bool) error {
	root := filepath.Join(dataDir, pipesDir)
	ents, err := os.ReadDir(root)
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		return err
	}
	live := map[string]bool{}
	for _, e := range ents {
		name := e.Name()
		if strings.HasPrefix(name, ".") {
			continue
		}
		if !keep[name] {
			if busy != nil && busy(name) {
				if t, err := os.Readlink(filepath.Join(root, name)); err == nil {
					live[t] = true
				}
				continue
			}
			if e.Type()&os.ModeSymlink != 0 {
				os.Remove(filepath.Join(root, name))
			}
			continue
		}
		if t, err := os.Readlink(filepath.Join(root, name)); err == nil {
			live[t] = true
		}
	}
	for _, e := range ents {
		name := e.Name()
		if !strings.HasPrefix(name, ".") || live[name] {
			continue
		}
		if pipe, _, ok := strings.Cut(strings.TrimPrefix(name, "."), "."); ok && busy != nil && !strings.HasPrefix(name, linkPref) && busy(pipe) {
			continue
		}
		os.RemoveAll(filepath.Join(root, name))
	}
	return atomicfile.SyncDir(root)
}

// writeSecrets makes D/secrets/<name> hold exactly values (files 0600 in a
// 0700 dir), writing only what changed, atomically.
func writeSecrets(dataDir, pipe string, values map[string]string) error {
	dir := SecretsDir(dataDir, pipe)
	if len(values) == 0 {
		if _, err := os.Stat(dir); os.IsNotExist(err) {
			return nil
		}
	}
	if err := ensureDir(filepath.Join(dataDir, secretsDir), 0o700); err != nil {
		return err
	}
	if err := ensureDir(dir, 0o700); err != nil {
		return err
	}
	removeTemps(dir)
	changed := false
	for k, v := range values {
		if !validSecretName(k) {
			return fmt.Errorf("secret name %q is not valid", k)
		}
		path := filepath.Join(dir, k)
		if old, err := os.ReadFile(path); err == nil && bytes.Equal(old, []byte(v)) {
			if st, err := os.Stat(path); err == nil && st.Mode().Perm() == 0o600 {
				continue
			}
		}
		if err := replaceFile(path, []byte(v), 0o600); err != nil {
			return err
		}
		changed = true
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range ents {
		if _, ok := values[e.Name()]; !ok {
			os.RemoveAll(filepath.Join(dir, e.Name()))
			changed = true
		}
	}
	if changed {
		return atomicfile.SyncDir(dir)
	}
	return nil
}

// removeSecretsExcept deletes the secret dirs of pipes not in keep.
func removeSecretsExcept(dataDir string, keep map[string]bool) {
	root := filepath.Join(dataDir, secretsDir)
	ents, err := os.ReadDir(root)
	if err != nil {
		return
	}
	for _, e := range ents {
		if !keep[e.Name()] {
			os.RemoveAll(filepath.Join(root, e.Name()))
		}
	}
}

func validSecretName(s string) bool {
	if s == "" || len(s) > 128 {
		return false
	}
	for i, r := range s {
		ok := r == '_' || 'A' <= r && r <= 'Z' || 'a' <= r && r <= 'z' || i > 0 && '0' <= r && r <= '9'
		if !ok {
			return false
		}
	}
	return true
}
