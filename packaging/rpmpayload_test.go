package packaging

import (
	"bytes"
	"fmt"
	"slices"
	"strconv"
	"testing"
)

// newc writes a newc cpio archive: each member named as given, its data
// "data of <index>".
func newc(names ...string) []byte {
	var b bytes.Buffer
	pad := func(n int) { b.Write(make([]byte, (4-n%4)%4)) }
	for i, n := range append(names, "TRAILER!!!") {
		data := fmt.Sprintf("data of %d", i)
		if n == "TRAILER!!!" {
			data = ""
		}
		fmt.Fprintf(&b, "070701%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X",
			i, 0o100644, 0, 0, 1, 1700000000, len(data), 0, 0, 0, 0, len(n)+1, 0)
		b.WriteString(n + "\x00")
		pad(110 + len(n) + 1)
		b.WriteString(data)
		pad(len(data))
	}
	return b.Bytes()
}

// members reads a newc archive back: names and data.
func members(t *testing.T, a []byte) (names, data []string) {
	t.Helper()
	for off := 0; ; {
		field := func(i int) int {
			v, err := strconv.ParseUint(string(a[off+6+8*i:off+14+8*i]), 16, 32)
			if err != nil {
				t.Fatal(err)
			}
			return int(v)
		}
		size, nsize := field(6), field(11)
		name := string(a[off+110 : off+110+nsize-1])
		start := off + 110 + nsize
		start += (4 - start%4) % 4
		names, data = append(names, name), append(data, string(a[start:start+size]))
		if name == "TRAILER!!!" {
			return names, data
		}
		off = start + size + (4-size%4)%4
	}
}

func TestRelativizeCpio(t *testing.T) {
	in := newc("/usr/bin/drover-agent", "/etc/drover/agent.yaml", "./already/relative", "/a")
	out, changed, err := RelativizeCpio(in)
	if err != nil || !changed {
		t.Fatalf("changed %v, err %v", changed, err)
	}
	names, data := members(t, out)
	if want := []string{"./usr/bin/drover-agent", "./etc/drover/agent.yaml", "./already/relative", "./a", "TRAILER!!!"}; !slices.Equal(names, want) {
		t.Errorf("names %q, want %q", names, want)
	}
	if _, wantData := members(t, in); !slices.Equal(data, wantData) {
		t.Errorf("data %q, want %q", data, wantData)
	}
	// Idempotent: a relative archive comes back unchanged.
	again, changed, err := RelativizeCpio(out)
	if err != nil || changed || !bytes.Equal(again, out) {
		t.Errorf("second pass: changed %v, err %v", changed, err)
	}
	if _, _, err := RelativizeCpio(in[:200]); err == nil {
		t.Error("a truncated archive is accepted")
	}
	if _, _, err := RelativizeCpio([]byte("070707 an old binary cpio header, not newc ........................................................................")); err == nil {
		t.Error("a non-newc archive is accepted")
	}
	if _, err := RelativizeRPM([]byte("not an rpm")); err == nil {
		t.Error("RelativizeRPM accepts a non-RPM")
	}
}
