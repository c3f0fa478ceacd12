package runner

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
)

// PayloadSumFile sits beside payload/ in a pipe directory generation: the
// agent writes it when it unpacks a verified bundle, with the bundle's
// digest (the manifest's) and the digest of the unpacked tree. The runner
// recomputes the tree digest before every run: a payload edited on the host
// is refused (reason payload_mismatch) and the agent's next sync restores it.
const PayloadSumFile = "payload.sum"

// ReasonPayloadMismatch is the run reason of a refused payload.
const ReasonPayloadMismatch = "payload_mismatch"

// ErrPayloadMismatch says the payload on disk is not the one the manifest names.
var ErrPayloadMismatch = errors.New("the payload on disk differs from the one the manifest names")

type payloadSum struct {
	Bundle string `json:"bundle"`
	Tree   string `json:"tree"`
}

// TreeDigest digests a directory tree: every entry's relative path, kind,
// executable bit, size and content, in sorted order. Anything but regular
// files and directories (a symlink put there by hand) is part of the digest
// too, so it changes it.
func TreeDigest(dir string) (string, error) {
	type ent struct{ rel, line string }
	var ents []ent
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p == dir {
			return nil
		}
		rel, _ := filepath.Rel(dir, p)
		rel = filepath.ToSlash(rel)
		info, err := d.Info()
		if err != nil {
			return err
		}
		switch {
		case d.IsDir():
			ents = append(ents, ent{rel, "d " + rel})
		case info.Mode().IsRegular():
			f, err := os.Open(p)
			if err != nil {
				return err
			}
			h := sha256.New()
			_, err = io.Copy(h, f)
			f.Close()
			if err != nil {
				return err
			}
			x := 0
			if info.Mode()&0o111 != 0 {
				x = 1
			}
			ents = append(ents, ent{rel, fmt.Sprintf("f %d %d %x %s", x, info.Size(), h.Sum(nil), rel)})
		default:
			ents = append(ents, ent{rel, fmt.Sprintf("o %s %s", info.Mode().Type(), rel)})
		}
		return nil
	})
	if err != nil {
		return "", err
	}
	sort.Slice(ents, func(i, j int) bool { return ents[i].rel < ents[j].rel })
	h := sha256.New()
	io.WriteString(h, "drover payload tree v1\n")
	for _, e := range ents {
		io.WriteString(h, e.line+"\n")
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil)), nil
}

// WritePayloadSum records, in genDir, the digest of genDir/payload as
// unpacked from the bundle whose digest is bundleDigest.
func WritePayloadSum(genDir, bundleDigest string) error {
	tree, err := TreeDigest(filepath.Join(genDir, "payload"))
	if err != nil {
		return fmt.Errorf("payload digest: %w", err)
	}
	b, err := json.Marshal(payloadSum{Bundle: bundleDigest, Tree: tree})
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(genDir, PayloadSumFile), append(b, '\n'), 0o644)
}

// VerifyPayload checks genDir/payload against the sum recorded at unpack
// time for the bundle bundleDigest. A missing or foreign sum is a mismatch:
// nothing vouches for those bytes.
func VerifyPayload(genDir, bundleDigest string) error {
	b, err := os.ReadFile(filepath.Join(genDir, PayloadSumFile))
	if err != nil {
		return fmt.Errorf("%w: no payload sum: %v", ErrPayloadMismatch, err)
	}
	var s payloadSum
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("%w: payload sum unreadable: %v", ErrPayloadMismatch, err)
	}
	if s.Bundle != bundleDigest {
		return fmt.Errorf("%w: payload sum is for %s, the manifest names %s", ErrPayloadMismatch, s.Bundle, bundleDigest)
	}
	tree, err := TreeDigest(filepath.Join(genDir, "payload"))
	if err != nil {
		return fmt.Errorf("%w: %v", ErrPayloadMismatch, err)
	}
	if tree != s.Tree {
		return fmt.Errorf("%w (%s, unpacked as %s)", ErrPayloadMismatch, tree, s.Tree)
	}
	return nil
}
