package atomicfile

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

func TestWriteReplacesWithMode(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "f")
	old := syscall.Umask(0o077)
	defer syscall.Umask(old)
	if err := Write(path, []byte("one"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := Write(path, []byte("two"), 0o640); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil || string(b) != "two" {
		t.Fatalf("read %q, %v", b, err)
	}
	fi, _ := os.Stat(path)
	if fi.Mode().Perm() != 0o640 {
		t.Fatalf("mode %v, want 0640 whatever the umask", fi.Mode().Perm())
	}
	ents, _ := os.ReadDir(dir)
	if len(ents) != 1 {
		t.Fatalf("left behind: %v", ents)
	}
}

func TestWriteDefaults(t *testing.T) {
	path := filepath.Join(t.TempDir(), "f")
	if err := (Options{}).Write(path, nil); err != nil {
		t.Fatal(err)
	}
	if fi, _ := os.Stat(path); fi.Mode().Perm() != 0o600 || fi.Size() != 0 {
		t.Fatalf("mode %v size %d", fi.Mode().Perm(), fi.Size())
	}
}

func TestWriteOwnerAndPrefix(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "f")
	o := Options{Perm: 0o600, Owner: &Owner{UID: os.Getuid(), GID: os.Getgid()}, TempPrefix: ".x-", NoDirSync: true}
	if err := o.Write(path, []byte("a")); err != nil {
		t.Fatal(err)
	}
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil || int(st.Uid) != os.Getuid() || int(st.Gid) != os.Getgid() {
		t.Fatalf("owner %d:%d, %v", st.Uid, st.Gid, err)
	}
	if err := SyncDir(dir); err != nil {
		t.Fatal(err)
	}
}

// TestWriteFailureLeavesTarget: a write that cannot rename (the target is
// a non-empty directory) leaves the target and no temporary file.
func TestWriteFailureLeavesTarget(t *testing.T) {
	dir := t.TempDir()
	target := filepath.Join(dir, "d")
	if err := os.MkdirAll(filepath.Join(target, "x"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := Write(target, []byte("a"), 0o600); err == nil {
		t.Fatal("renaming over a non-empty directory succeeded")
	}
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		if strings.Contains(e.Name(), ".tmp-") {
			t.Fatalf("temporary file left: %s", e.Name())
		}
	}
	if err := Write(filepath.Join(dir, "missing", "f"), nil, 0o600); err == nil {
		t.Fatal("writing into a missing directory succeeded")
	}
	if err := SyncDir(filepath.Join(dir, "missing")); err == nil || !strings.Contains(err.Error(), "sync ") {
		t.Fatalf("SyncDir of a missing dir: %v", err)
	}
}

func TestPrivateDir(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "a", "b")
	if err := PrivateDir(dir); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := PrivateDir(dir); err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(dir); err != nil || st.Mode().Perm() != 0o700 {
		t.Fatalf("mode %v %v", st.Mode(), err)
	}
	file := filepath.Join(dir, "f")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := PrivateDir(file); err == nil {
		t.Fatal("a file passed as a directory")
	}
}
