package cli

import (
	"strings"
	"testing"
	"time"

	"github.com/drover/drover/agent"
)

// TestPrintPipesLeases: the pipe table says each held pipe's lease, active
// or ended, and shows no next run for an ended one.
func TestPrintPipesLeases(t *testing.T) {
	until := time.Date(2026, 3, 1, 12, 0, 0, 0, time.Local)
	var b strings.Builder
	printPipes(&b, []agent.PipeInfo{
		{Name: "free", Version: 1, Enabled: true, NextRun: until},
		{Name: "held", Version: 2, Enabled: true, NextRun: until.Add(-time.Minute), LeaseUntil: until},
		{Name: "gone", Version: 3, Enabled: true, LeaseUntil: until, LeaseEnded: true},
	})
	lines := strings.Split(b.String(), "\n")
	if len(lines) < 4 {
		t.Fatalf("table:\n%s", b.String())
	}
	if strings.Contains(lines[1], "lease") {
		t.Errorf("a pipe that is not held shows a lease: %q", lines[1])
	}
	if !strings.Contains(lines[2], "lease active until 2026-03-01 12:00:00") {
		t.Errorf("held pipe: %q", lines[2])
	}
	if !strings.Contains(lines[3], "lease ended") || !strings.Contains(lines[3], "not run here until renewed") || strings.Fields(lines[3])[2] != "lease" {
		t.Errorf("ended lease: %q", lines[3])
	}
}
