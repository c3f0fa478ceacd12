package runreq

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestWriteTake: a request the backend writes is taken once by the runner,
// with its id; an expired or already-consumed one is not; Remove removes
// only the request it names.
func TestWriteTake(t *testing.T) {
	dir := Dir(t.TempDir())
	now := time.Now()
	path, err := Write(dir, "demo", "req-1", now)
	if err != nil {
		t.Fatal(err)
	}
	if path != filepath.Join(dir, "demo.json") {
		t.Fatalf("path %s", path)
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o644 {
		t.Fatalf("stat %v, %v", fi, err)
	}
	if id, err := Take(dir, "demo", "req-1", now); id != "" || err != nil {
		t.Fatalf("a consumed request counted twice: %q %v", id, err)
	}
	if id, _ := Take(dir, "demo", "", now.Add(TTL)); id != "" {
		t.Fatalf("an expired request counted: %q", id)
	}
	if id, err := Take(dir, "demo", "", now); id != "req-1" || err != nil {
		t.Fatalf("take: %q %v", id, err)
	}
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Fatal("the request was not consumed")
	}
	Write(dir, "demo", "req-2", now)
	Remove(path, "req-1")
	if _, err := os.Stat(path); err != nil {
		t.Fatal("Remove removed another request")
	}
	Remove(path, "req-2")
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Fatal("Remove left its request")
	}
	if DefaultDir("") != "/run/drover/requests" || DefaultDir("/run/user/7") != "/run/user/7/drover/requests" {
		t.Fatalf("default dirs %s, %s", DefaultDir(""), DefaultDir("/run/user/7"))
	}
}
