package cli

import (
	"bytes"
	"strings"
	"testing"
	"time"

	agentpb "github.com/drover/drover/proto"
)

func TestTermWriter(t *testing.T) {
	cases := []struct {
		in   []string
		want string
	}{
		{[]string{"plain\ttext\n"}, "plain\ttext\n"},
		{[]string{"\x1b[2J\x1b]0;pwned\x07"}, `\x1b[2J\x1b]0;pwned\x07`},
		{[]string{"a\rb\x00c\x7f"}, `a\x0db\x00c\x7f`},
		{[]string{"csi \u009b31m"}, `csi \u009b31m`},
		{[]string{"bidi \u202eabc"}, `bidi \u202eabc`},
		{[]string{"h\xc3", "\xa9llo ü"}, "hé" + "llo ü"}, // a character split between writes
		{[]string{"bad \xff\xfe"}, `bad \xff\xfe`},
		{[]string{"end \xe2\x82"}, `end \xe2\x82`}, // incomplete at the end: flushed escaped
	}
	for _, c := range cases {
		var b bytes.Buffer
		w := newTermWriter(&b)
		for _, p := range c.in {
			if n, err := w.Write([]byte(p)); err != nil || n != len(p) {
				t.Fatalf("write %q: %d %v", p, n, err)
			}
		}
		if err := w.Flush(); err != nil {
			t.Fatal(err)
		}
		if b.String() != c.want {
			t.Errorf("%q: got %q, want %q", c.in, b.String(), c.want)
		}
	}
}

// TestLogsEscapeTerminalSequences: a run's log with escape sequences (here
// sent by an agent) reaches the terminal escaped, with and without -f;
// --raw passes it through.
func TestLogsEscapeTerminalSequences(t *testing.T) {
	f := newFleet(t)
	evil := "ok\n\x1b]52;c;cHduZWQ=\x07\x1b[2J\x1b[1;1Hall good\n"
	start := time.Date(2030, 1, 15, 12, 0, 0, 0, time.UTC)
	f.db.runStarted("run-evil", "backup-db", 1, start)
	f.db.logChunks("run-evil", 0, start, evil)
	f.db.runFinished("run-evil", "backup-db", 1, agentpb.RunStatus_RUN_STATUS_SUCCEEDED, 0, start, time.Second, 1)
	want := `ok` + "\n" + `\x1b]52;c;cHduZWQ=\x07\x1b[2J\x1b[1;1Hall good` + "\n"
	for _, args := range [][]string{{"logs", "run-evil"}, {"logs", "-f", "run-evil"}} {
		r := f.ts.ctlOK(args...)
		if r.stdout != want || strings.ContainsRune(r.stdout, 0x1b) {
			t.Errorf("droverctl %s: %q, want %q", strings.Join(args, " "), r.stdout, want)
		}
	}
	if r := f.ts.ctlOK("logs", "--raw", "run-evil"); r.stdout != evil {
		t.Errorf("logs --raw: %q", r.stdout)
	}
}
