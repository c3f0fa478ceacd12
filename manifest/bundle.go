package manifest

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"time"
)

// A bundle is a pipe's payload: a gzip-compressed tar of regular files and
// directories, built deterministically (sorted paths, zero times and owners,
// modes 0644/0755) so the same files always give the same digest.
//
// An inline script becomes a bundle holding one executable file, ScriptFile.

// ScriptFile is the name of an inline script inside its bundle.
const ScriptFile = "script"

// DefaultMaxBundleBytes caps a compressed bundle (the server's default).
const DefaultMaxBundleBytes = 10 << 20

// BundleFile is one file going into a bundle.
type BundleFile struct {
	Path string // slash-separated, relative
	Mode fs.FileMode
	Data []byte
}

// The bundle limits: at most MaxBundleEntries entries and MaxBundleBytes
// bytes uncompressed, checked by the server at upload and by the agent
// before it unpacks (the zero UnpackLimits). DefaultMaxBundleBytes caps the
// compressed size.
const (
	MaxBundleEntries = 10000
	MaxBundleBytes   = 256 << 20
)

// UnpackLimits bound what unpacking a bundle may create; a zero field is
// its default.
type UnpackLimits struct {
	MaxFiles int   // entries, default MaxBundleEntries
	MaxBytes int64 // total uncompressed bytes, default MaxBundleBytes
}

// Digest returns "sha256:<hex>" of b.
func Digest(b []byte) string {
	sum := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// ScriptBundle returns the bundle for an inline script.
func ScriptBundle(script string) ([]byte, error) {
	return BuildBundle([]BundleFile{{Path: ScriptFile, Mode: 0o755, Data: []byte(script)}})
}

// BuildBundle makes a deterministic bundle of files. Parent directories are
// added implicitly. Paths must be relative and stay inside the bundle.
func BuildBundle(files []BundleFile) ([]byte, error) {
	entries := map[string]BundleFile{}
	dirs := map[string]bool{}
	for _, f := range files {
		p := path.Clean(f.Path)
		if msg := checkRelPath(f.Path); msg != "" {
			return nil, fmt.Errorf("bundle file %s", msg)
		}
		if _, dup := entries[p]; dup {
			return nil, fmt.Errorf("bundle file %q given twice", p)
		}
		entries[p] = f
		for d := path.Dir(p); d != "."; d = path.Dir(d) {
			dirs[d] = true
		}
	}
	for d := range dirs {
		if _, clash := entries[d]; clash {
			return nil, fmt.Errorf("bundle path %q is both a file and a directory", d)
		}
	}
	names := make([]string, 0, len(entries)+len(dirs))
	for p := range entries {
		names = append(names, p)
	}
	for d := range dirs {
		names = append(names, d+"/")
	}
	sort.Strings(names)

	var buf bytes.Buffer
	gz, _ := gzip.NewWriterLevel(&buf, gzip.BestCompression)
	tw := tar.NewWriter(gz)
	epoch := time.Unix(0, 0).UTC()
	for _, n := range names {
		hdr := &tar.Header{Name: n, ModTime: epoch, Format: tar.FormatPAX, Uname: "", Gname: ""}
		if strings.HasSuffix(n, "/") {
			hdr.Typeflag, hdr.Mode = tar.TypeDir, 0o755
			if err := tw.WriteHeader(hdr); err != nil {
				return nil, err
			}
			continue
		}
		f := entries[n]
		hdr.Typeflag, hdr.Mode, hdr.Size = tar.TypeReg, 0o644, int64(len(f.Data))
		if f.Mode&0o111 != 0 {
			hdr.Mode = 0o755
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return nil, err
		}
		if _, err := tw.Write(f.Data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	if err := gz.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// ReadBundleFiles collects the files a spec's `files:` names, relative to
// baseDir (the directory of the YAML file). A directory is read recursively in
// lexical order. Symbolic links are refused; so are paths leaving baseDir.
func ReadBundleFiles(baseDir string, paths []string) ([]BundleFile, error) {
	var out []BundleFile
	for _, p := range paths {
		if msg := checkRelPath(p); msg != "" {
			return nil, fmt.Errorf("files: %s", msg)
		}
		root := filepath.Join(baseDir, filepath.FromSlash(path.Clean(p)))
		err := filepath.WalkDir(root, func(fp string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			rel, err := filepath.Rel(baseDir, fp)
			if err != nil {
				return err
			}
			if d.Type()&fs.ModeSymlink != 0 {
				return fmt.Errorf("%s is a symbolic link; bundles hold only regular files", rel)
			}
			if d.IsDir() {
				return nil
			}
			if !d.Type().IsRegular() {
				return fmt.Errorf("%s is not a regular file", rel)
			}
			info, err := d.Info()
			if err != nil {
				return err
			}
			data, err := os.ReadFile(fp)
			if err != nil {
				return err
			}
			out = append(out, BundleFile{Path: filepath.ToSlash(rel), Mode: info.Mode().Perm(), Data: data})
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("files: %w", err)
		}
	}
	return out, nil
}

// ErrUnsafeBundle is returned for a bundle entry that would escape its
// directory, is not a regular file or directory, or breaks a limit.
var ErrUnsafeBundle = errors.New("unsafe bundle")

// BundleEntry is one entry of a bundle, as ScanBundle reads it.
type BundleEntry struct {
	Name string // clean, relative, slash-separated
	Dir  bool
	Exec bool // a file with an execute bit
	Size int64
}

// ScanBundle reads a bundle without writing anything and applies the one
// bundle rule that both the server (at upload) and the agent (before it
// unpacks) enforce:
//   - a gzip-compressed tar of regular files and directories only;
//   - every name a clean relative path (no "..", no leading "/"), without
//     '\', control characters (newlines included) or invalid UTF-8;
//   - no name twice, no file where another entry needs a directory (a file
//     "d" and an entry "d/x", in either order);
//   - at most lim.MaxFiles entries and lim.MaxBytes bytes uncompressed.
//
// The error wraps ErrUnsafeBundle and names the entry.
func ScanBundle(bundle []byte, lim UnpackLimits) ([]BundleEntry, error) {
	if lim.MaxFiles <= 0 {
		lim.MaxFiles = MaxBundleEntries
	}
	if lim.MaxBytes <= 0 {
		lim.MaxBytes = MaxBundleBytes
	}
	gz, err := gzip.NewReader(bytes.NewReader(bundle))
	if err != nil {
		return nil, fmt.Errorf("%w: not a gzip-compressed tar archive", ErrUnsafeBundle)
	}
	tr := tar.NewReader(gz)
	var total int64
	var out []BundleEntry
	kind := map[string]bool{}    // name -> is a directory (explicit entries)
	parents := map[string]bool{} // directories some entry lives in
	for n := 0; ; n++ {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("%w: not a valid tar archive", ErrUnsafeBundle)
		}
		if n >= lim.MaxFiles {
			return nil, fmt.Errorf("%w: more than %d entries", ErrUnsafeBundle, lim.MaxFiles)
		}
		name := strings.TrimSuffix(hdr.Name, "/")
		if msg := checkRelPath(name); msg != "" || path.Clean(name) != name {
			return nil, fmt.Errorf("%w: entry %q is not a clean relative path without control characters or '\\'", ErrUnsafeBundle, hdr.Name)
		}
		if _, dup := kind[name]; dup {
			return nil, fmt.Errorf("%w: entry %q appears twice", ErrUnsafeBundle, name)
		}
		for d := path.Dir(name); d != "."; d = path.Dir(d) {
			if isDir, ok := kind[d]; ok && !isDir {
				return nil, fmt.Errorf("%w: entry %q is inside %q, which is a file", ErrUnsafeBundle, name, d)
			}
		}
		e := BundleEntry{Name: name}
		switch hdr.Typeflag {
		case tar.TypeDir:
			e.Dir = true
		case tar.TypeReg:
			if parents[name] {
				return nil, fmt.Errorf("%w: file %q is also a directory of an earlier entry", ErrUnsafeBundle, name)
			}
			if hdr.Size < 0 || total+hdr.Size > lim.MaxBytes {
				return nil, fmt.Errorf("%w: more than %d bytes uncompressed", ErrUnsafeBundle, lim.MaxBytes)
			}
			w, err := io.Copy(io.Discard, io.LimitReader(tr, hdr.Size))
			if err != nil || w != hdr.Size {
				return nil, fmt.Errorf("%w: entry %q is truncated", ErrUnsafeBundle, name)
			}
			total += w
			e.Size, e.Exec = w, hdr.Mode&0o111 != 0
		default:
			return nil, fmt.Errorf("%w: entry %q is not a regular file or directory", ErrUnsafeBundle, name)
		}
		kind[name] = e.Dir
		for d := path.Dir(name); d != "."; d = path.Dir(d) {
			parents[d] = true
		}
		out = append(out, e)
	}
	return out, nil
}

// BundleProgram returns the bundle entry a command runs, clean, when
// command[0] is a relative path with a slash ("bin/run"); ok is false for a
// program looked up on PATH or an absolute one, which the bundle need not
// hold.
func BundleProgram(command []string) (name string, ok bool) {
	if len(command) == 0 || !strings.Contains(command[0], "/") || path.IsAbs(command[0]) {
		return "", false
	}
	return path.Clean(command[0]), true
}

// FindEntry returns the entry called name, or nil.
func FindEntry(entries []BundleEntry, name string) *BundleEntry {
	for i := range entries {
		if entries[i].Name == name {
			return &entries[i]
		}
	}
	return nil
}

// UnpackBundle extracts a bundle into dir, which must exist and be empty.
// The whole bundle is checked with ScanBundle first, so a refused bundle
// writes nothing; then only regular files and directories are created. On
// an I/O error dir may hold a partial tree: unpack into a temporary
// directory and rename it into place on success.
func UnpackBundle(bundle []byte, dir string, lim UnpackLimits) error {
	if _, err := ScanBundle(bundle, lim); err != nil {
		return err
	}
	gz, err := gzip.NewReader(bytes.NewReader(bundle))
	if err != nil {
		return fmt.Errorf("%w: not gzip: %v", ErrUnsafeBundle, err)
	}
	tr := tar.NewReader(gz)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return fmt.Errorf("%w: %v", ErrUnsafeBundle, err)
		}
		name := strings.TrimSuffix(hdr.Name, "/")
		target := filepath.Join(dir, filepath.FromSlash(name))
		switch hdr.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(target, 0o755); err != nil {
				return err
			}
		case tar.TypeReg:
			if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
				return err
			}
			// The parent chain was created by us from clean names, so no
			// component is a link; O_EXCL refuses anything already there.
			mode := os.FileMode(0o644)
			if hdr.Mode&0o111 != 0 {
				mode = 0o755
			}
			f, err := os.OpenFile(target, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
			if err != nil {
				return fmt.Errorf("%w: %v", ErrUnsafeBundle, err)
			}
			w, err := io.Copy(f, io.LimitReader(tr, hdr.Size))
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return err
			}
			if w != hdr.Size {
				return fmt.Errorf("%w: entry %q is truncated", ErrUnsafeBundle, name)
			}
		}
	}
	return nil
}
