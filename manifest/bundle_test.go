package manifest

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"errors"
	"os"
	"path/filepath"
	"testing"
)

func TestBundleDeterministicAndRoundTrip(t *testing.T) {
	files := []BundleFile{{Path: "lib/util.sh", Mode: 0o600, Data: []byte("u")}, {Path: "run.sh", Mode: 0o700, Data: []byte("#!/bin/sh\n")}}
	a, err := BuildBundle(files)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := BuildBundle([]BundleFile{files[1], files[0]})
	if !bytes.Equal(a, b) || Digest(a) != Digest(b) {
		t.Fatal("bundle bytes depend on input order")
	}
	dir := t.TempDir()
	if err := UnpackBundle(a, dir, UnpackLimits{}); err != nil {
		t.Fatal(err)
	}
	for p, mode := range map[string]os.FileMode{"run.sh": 0o755, "lib/util.sh": 0o644, "lib": 0o755 | os.ModeDir} {
		fi, err := os.Stat(filepath.Join(dir, p))
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode()&(os.ModeDir|0o777) != mode {
			t.Errorf("%s: mode %v, want %v", p, fi.Mode(), mode)
		}
	}
}

func rawBundle(t *testing.T, hdrs ...*tar.Header) []byte {
	t.Helper()
	var buf bytes.Buffer
	gz := gzip.NewWriter(&buf)
	tw := tar.NewWriter(gz)
	for _, h := range hdrs {
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if h.Size > 0 {
			tw.Write(bytes.Repeat([]byte("x"), int(h.Size)))
		}
	}
	tw.Close()
	gz.Close()
	return buf.Bytes()
}

func TestUnpackRefusesUnsafeEntries(t *testing.T) {
	cases := map[string][]*tar.Header{
		"absolute":   {{Name: "/etc/x", Typeflag: tar.TypeReg, Mode: 0o644}},
		"dotdot":     {{Name: "../x", Typeflag: tar.TypeReg, Mode: 0o644}},
		"inner ..":   {{Name: "a/../../x", Typeflag: tar.TypeReg, Mode: 0o644}},
		"symlink":    {{Name: "l", Typeflag: tar.TypeSymlink, Linkname: "/etc"}},
		"hardlink":   {{Name: "l", Typeflag: tar.TypeLink, Linkname: "x"}},
		"device":     {{Name: "d", Typeflag: tar.TypeChar}},
		"duplicate":  {{Name: "a", Typeflag: tar.TypeReg, Mode: 0o644}, {Name: "a", Typeflag: tar.TypeReg, Mode: 0o644}},
		"too big":    {{Name: "a", Typeflag: tar.TypeReg, Mode: 0o644, Size: 2048}},
		"many files": {{Name: "a", Typeflag: tar.TypeReg}, {Name: "b", Typeflag: tar.TypeReg}, {Name: "c", Typeflag: tar.TypeReg}},
	}
	for name, hdrs := range cases {
		err := UnpackBundle(rawBundle(t, hdrs...), t.TempDir(), UnpackLimits{MaxFiles: 2, MaxBytes: 1024})
		if !errors.Is(err, ErrUnsafeBundle) {
			t.Errorf("%s: got %v, want ErrUnsafeBundle", name, err)
		}
	}
	if err := UnpackBundle([]byte("not gzip"), t.TempDir(), UnpackLimits{}); !errors.Is(err, ErrUnsafeBundle) {
		t.Errorf("garbage: got %v", err)
	}
}

func TestReadBundleFilesRefusesSymlinks(t *testing.T) {
	dir := t.TempDir()
	os.MkdirAll(filepath.Join(dir, "lib"), 0o755)
	os.WriteFile(filepath.Join(dir, "run.sh"), []byte("x"), 0o755)
	os.WriteFile(filepath.Join(dir, "lib", "b"), []byte("b"), 0o644)
	os.WriteFile(filepath.Join(dir, "lib", "a"), []byte("a"), 0o644)
	files, err := ReadBundleFiles(dir, []string{"run.sh", "lib/"})
	if err != nil {
		t.Fatal(err)
	}
	if len(files) != 3 || files[1].Path != "lib/a" || files[2].Path != "lib/b" {
		t.Fatalf("got %+v", files)
	}
	os.Symlink("/etc/passwd", filepath.Join(dir, "lib", "evil"))
	if _, err := ReadBundleFiles(dir, []string{"lib"}); err == nil {
		t.Fatal("symlink accepted")
	}
	if _, err := ReadBundleFiles(dir, []string{"../x"}); err == nil {
		t.Fatal("path outside accepted")
	}
}
