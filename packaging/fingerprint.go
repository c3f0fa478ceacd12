package packaging

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
)

// SourceFingerprint hashes what goes into the packages: the path and
// content of every file git tracks or would track (untracked but not
// ignored) outside dist/, except tests (_test.go, testdata/). Equal
// fingerprints mean a dist/ built earlier can be reused as is.
func SourceFingerprint(ctx context.Context, root string) (string, error) {
	cmd := exec.CommandContext(ctx, "git", "ls-files", "-z", "--cached", "--others", "--exclude-standard")
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("git ls-files: %w", err)
	}
	var files []string
	for _, f := range bytes.Split(out, []byte{0}) {
		p := string(f)
		if p == "" || strings.HasSuffix(p, "_test.go") || strings.Contains("/"+p, "/testdata/") || strings.HasPrefix(p, "dist/") {
			continue
		}
		files = append(files, p)
	}
	sort.Strings(files)
	h := sha256.New()
	for _, p := range files {
		f, err := os.Open(filepath.Join(root, p))
		if err != nil {
			if os.IsNotExist(err) { // deleted but still in the index
				continue
			}
			return "", err
		}
		fmt.Fprintf(h, "%s\x00", p)
		_, err = io.Copy(h, f)
		f.Close()
		if err != nil {
			return "", err
		}
		h.Write([]byte{0})
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}
