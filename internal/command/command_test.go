package command

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/spf13/cobra"
)

func TestExitCode(t *testing.T) {
	for _, c := range []struct {
		err  error
		want int
	}{
		{nil, ExitOK},
		{errors.New("boom"), ExitError},
		{Usagef("bad %s", "flag"), ExitUsage},
		{fmt.Errorf("wrapped: %w", Usage(errors.New("x"))), ExitUsage},
	} {
		if got := ExitCode(c.err); got != c.want {
			t.Errorf("ExitCode(%v) = %d, want %d", c.err, got, c.want)
		}
	}
	if err := Usagef("bad %s", "flag"); err.Error() != "bad flag" {
		t.Errorf("Usagef: %q", err)
	}
}

func TestSetupRootFlagErrorIsUsage(t *testing.T) {
	var out, errb bytes.Buffer
	root := &cobra.Command{Use: "x", RunE: func(*cobra.Command, []string) error { return nil }}
	SetupRoot(root, []string{"--nope"}, &out, &errb)
	err := root.Execute()
	if ExitCode(err) != ExitUsage || !strings.Contains(err.Error(), "nope") {
		t.Fatalf("err = %v", err)
	}
	if out.Len()+errb.Len() != 0 {
		t.Fatalf("printed %q %q: errors are the caller's to print", out.String(), errb.String())
	}
}

func TestNewLogger(t *testing.T) {
	var b bytes.Buffer
	log := NewLogger("warn", "json", &b)
	log.Info("hidden")
	log.Warn("shown")
	if s := b.String(); strings.Contains(s, "hidden") || !strings.Contains(s, `"msg":"shown"`) {
		t.Fatalf("json warn logger wrote %q", s)
	}
	b.Reset()
	NewLogger("debug", "text", &b).Debug("dbg")
	if !strings.Contains(b.String(), "msg=dbg") {
		t.Fatalf("text debug logger wrote %q", b.String())
	}
}
