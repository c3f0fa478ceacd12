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

// rawEntry is a tar entry written as is (BuildBundle would refuse them).
type rawEntry struct {
	name string
	dir  bool
	data string
}

// rawEntries builds a gzip'd tar of entries exactly as given.
func rawEntries(t testing.TB, entries ...rawEntry) []byte {
	t.Helper()
	var buf bytes.Buffer
	gz := gzip.NewWriter(&buf)
	tw := tar.NewWriter(gz)
	for _, e := range entries {
		h := &tar.Header{Name: e.name, Mode: 0o755, Typeflag: tar.TypeReg, Size: int64(len(e.data)), Format: tar.FormatPAX}
		if e.dir {
			h.Typeflag, h.Size = tar.TypeDir, 0
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write([]byte(e.data)); err != nil {
			t.Fatal(err)
		}
	}
	tw.Close()
	gz.Close()
	return buf.Bytes()
}

// BadBundles are bundles every agent refuses, so the server must too.
func badBundles(t testing.TB) map[string][]byte {
	return map[string][]byte{
		"backslash":        rawEntries(t, rawEntry{name: `a\b`, data: "x"}),
		"newline":          rawEntries(t, rawEntry{name: "x\ny", data: "x"}),
		"escape":           rawEntries(t, rawEntry{name: "x\x1b[2J", data: "x"}),
		"dir then file":    rawEntries(t, rawEntry{name: "d/x", data: "x"}, rawEntry{name: "d", data: "y"}),
		"file then dir":    rawEntries(t, rawEntry{name: "d", data: "y"}, rawEntry{name: "d/x", data: "x"}),
		"file then subdir": rawEntries(t, rawEntry{name: "d", data: "y"}, rawEntry{name: "d/e/", dir: true}),
		"duplicate":        rawEntries(t, rawEntry{name: "a", data: "1"}, rawEntry{name: "a", data: "2"}),
		"dotdot":           rawEntries(t, rawEntry{name: "../a", data: "1"}),
		"absolute":         rawEntries(t, rawEntry{name: "/etc/a", data: "1"}),
		"unclean":          rawEntries(t, rawEntry{name: "a//b", data: "1"}),
	}
}

// TestBundleRule: ScanBundle refuses every bad bundle, and UnpackBundle
// (the agent's side) refuses the same ones before writing anything.
func TestBundleRule(t *testing.T) {
	for name, b := range badBundles(t) {
		if _, err := ScanBundle(b, UnpackLimits{}); !errors.Is(err, ErrUnsafeBundle) {
			t.Errorf("%s: ScanBundle: %v", name, err)
		}
		dir := t.TempDir()
		if err := UnpackBundle(b, dir, UnpackLimits{}); !errors.Is(err, ErrUnsafeBundle) {
			t.Errorf("%s: UnpackBundle: %v", name, err)
		}
		if left, _ := os.ReadDir(dir); len(left) != 0 {
			t.Errorf("%s: a refused bundle left %d entries", name, len(left))
		}
	}
	good := rawEntries(t, rawEntry{name: "d/", dir: true}, rawEntry{name: "d/x", data: "x"}, rawEntry{name: "run.sh", data: "#!/bin/sh\n"})
	es, err := ScanBundle(good, UnpackLimits{})
	if err != nil || len(es) != 3 || !es[2].Exec || es[1].Size != 1 {
		t.Fatalf("good bundle: %+v %v", es, err)
	}
	dir := t.TempDir()
	if err := UnpackBundle(good, dir, UnpackLimits{}); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "d", "x")); err != nil || string(b) != "x" {
		t.Fatalf("unpacked d/x: %q %v", b, err)
	}
}

func TestBundleProgram(t *testing.T) {
	for cmd, want := range map[string]string{"bin/../run.sh": "run.sh", "./d/x": "d/x", "run.sh": "", "/bin/sh": ""} {
		got, ok := BundleProgram([]string{cmd, "arg"})
		if got != want || ok != (want != "") {
			t.Errorf("BundleProgram(%q) = %q, %v", cmd, got, ok)
		}
	}
	if _, ok := BundleProgram(nil); ok {
		t.Error("BundleProgram(nil) is ok")
	}
	es := []BundleEntry{{Name: "d", Dir: true}, {Name: "d/x"}}
	if e := FindEntry(es, "d/x"); e == nil || e.Name != "d/x" {
		t.Errorf("FindEntry(d/x) = %+v", e)
	}
	if e := FindEntry(es, "x"); e != nil {
		t.Errorf("FindEntry(x) = %+v", e)
	}
}
