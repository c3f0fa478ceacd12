package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"
)

func run(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errb bytes.Buffer
	code = Run(context.Background(), args, Env{Stdout: &out, Stderr: &errb,
		Now: func() time.Time { return time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC) }})
	return code, out.String(), errb.String()
}

func TestScheduleExplainJSON(t *testing.T) {
	code, out, errs := run(t, "schedule", "explain", "--cron", "30 2 * * *", "--tz", "Europe/Berlin",
		"--after", "2026-10-24T00:00:00Z", "--count", "3", "-o", "json")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	var got map[string][]string
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, out)
	}
	want := map[string][]string{
		"oncalendar": {"*-*-* 02:30:00 Europe/Berlin"},
		// 02:30 occurs twice on 25 October 2026 (CEST, then CET): it fires
		// once, at the first occurrence; CET from the next day on.
		"next": {"2026-10-24T00:30:00Z", "2026-10-25T00:30:00Z", "2026-10-26T01:30:00Z"},
	}
	if len(got) != 2 || strings.Join(got["oncalendar"], "|") != strings.Join(want["oncalendar"], "|") ||
		strings.Join(got["next"], "|") != strings.Join(want["next"], "|") {
		t.Fatalf("got %v\nwant %v", got, want)
	}
}

func TestScheduleExplainTwoDayFields(t *testing.T) {
	code, out, errs := run(t, "schedule", "explain", "--cron", "0 9 1 * mon", "--count", "2", "-o", "json", "--after", "2026-06-01T10:00:00Z")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	var got struct{ OnCalendar, Next []string }
	json.Unmarshal([]byte(out), &got)
	if len(got.OnCalendar) != 2 {
		t.Fatalf("want two OnCalendar lines, got %v", got.OnCalendar)
	}
	// Either day matches: Monday 8 June, then Monday 15 June (1 July is later).
	if strings.Join(got.Next, ",") != "2026-06-08T09:00:00Z,2026-06-15T09:00:00Z" {
		t.Fatalf("next = %v", got.Next)
	}
}

func TestScheduleExplainTable(t *testing.T) {
	code, out, _ := run(t, "schedule", "explain", "--cron", "@hourly", "--count", "2")
	if code != 0 || !strings.Contains(out, "OnCalendar:") || !strings.Contains(out, "2026-11-30T13:00:00Z") || !strings.Contains(out, "2026-11-30T14:00:00Z") {
		t.Fatalf("exit %d, output:\n%s", code, out)
	}
}

func TestScheduleExplainRefusals(t *testing.T) {
	for _, c := range []struct {
		args []string
		code int
		msg  string
	}{
		{[]string{"schedule", "explain", "--cron", "@reboot"}, 1, "@reboot"},
		{[]string{"schedule", "explain", "--cron", "0 0 * * * *"}, 1, "schedule"},
		{[]string{"schedule", "explain", "--cron", "0 0 L * *"}, 1, "schedule"},
		{[]string{"schedule", "explain", "--cron", "* * * * 8"}, 1, "day-of-week"},
		{[]string{"schedule", "explain", "--cron", "* * * * *", "--tz", "Mars/Base"}, 1, "time zone"},
		{[]string{"schedule", "explain"}, 2, "--cron is required"},
		{[]string{"schedule", "explain", "--cron", "* * * * *", "--count", "0"}, 2, "--count"},
		{[]string{"schedule", "explain", "--cron", "* * * * *", "--after", "yesterday"}, 2, "RFC 3339"},
		{[]string{"schedule", "explain", "--bogus"}, 2, "unknown flag"},
		{[]string{"nonsense"}, 2, "unknown command"},
	} {
		code, out, errs := run(t, c.args...)
		if code != c.code || !strings.Contains(errs, c.msg) || out != "" {
			t.Errorf("%v: exit %d (want %d), stderr %q (want %q), stdout %q", c.args, code, c.code, errs, c.msg, out)
		}
	}
}
