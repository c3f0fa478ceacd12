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
		// The translation, then the correction instants the agent renders
		// at --after: the DST days of the next 400 days.
		"oncalendar": {"*-*-* 02:30:00 Europe/Berlin",
			"2026-10-25 00:30:00 UTC", "2026-10-26 01:30:00 UTC",
			"2027-03-28 01:00:00 UTC", "2027-03-29 00:30:00 UTC",
			"2027-10-31 00:30:00 UTC", "2027-11-01 01:30:00 UTC"},
		// 02:30 occurs twice on 25 October 2026 (CEST, then CET): it fires
		// once, at the first occurrence; CET from the next day on.
		"next":  {"2026-10-24T00:30:00Z", "2026-10-25T00:30:00Z", "2026-10-26T01:30:00Z"},
		"notes": {"2026-10-25T00:30:00Z: 02:30 occurs twice on 2026-10-25 (clocks go back): runs at the first only"},
	}
	for k, w := range want {
		if strings.Join(got[k], "|") != strings.Join(w, "|") {
			t.Errorf("%s = %q\nwant %q", k, got[k], w)
		}
	}
	if len(got) != len(want) {
		t.Errorf("keys %v", got)
	}
}

// TestScheduleExplainDST: the instants a DST change moved are marked, and
// the lines are those the agent renders at --after.
func TestScheduleExplainDST(t *testing.T) {
	code, out, errs := run(t, "schedule", "explain", "--cron", "30 2 * * *", "--tz", "America/New_York",
		"--after", "2027-03-13T12:00:00Z", "--count", "2")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	for _, w := range []string{
		"OnCalendar:  *-*-* 02:30:00 America/New_York\n",
		"OnCalendar:  2027-03-14 07:00:00 UTC\n",
		"2027-03-14T07:00:00Z  Sun 2027-03-14 03:00 EDT  02:30 does not exist on 2027-03-14: runs at 03:00\n",
		"2027-03-15T06:30:00Z  Mon 2027-03-15 02:30 EDT",
	} {
		if !strings.Contains(out, w) {
			t.Errorf("output lacks %q:\n%s", w, out)
		}
	}
	// A year later the window has moved: 2027-03-14 is gone.
	_, later, _ := run(t, "schedule", "explain", "--cron", "30 2 * * *", "--tz", "America/New_York",
		"--after", "2028-01-01T00:00:00Z", "--count", "1", "-o", "json")
	if strings.Contains(later, "2027-03-14") || !strings.Contains(later, "2028-03-12 07:00:00 UTC") {
		t.Errorf("--after 2028-01-01: %s", later)
	}
	// Wildcard entries run in both passes of the repeated hour.
	_, wild, _ := run(t, "schedule", "explain", "--cron", "*/30 1 * * *", "--tz", "America/New_York",
		"--after", "2026-11-01T04:50:00Z", "--count", "4", "-o", "json")
	var ex struct{ Next, Notes []string }
	if err := json.Unmarshal([]byte(wild), &ex); err != nil {
		t.Fatal(err)
	}
	if strings.Join(ex.Next, ",") != "2026-11-01T05:00:00Z,2026-11-01T05:30:00Z,2026-11-01T06:00:00Z,2026-11-01T06:30:00Z" ||
		len(ex.Notes) != 4 || !strings.Contains(ex.Notes[2], "01:00 occurs twice on 2026-11-01 (clocks go back): runs at both; this is the second") {
		t.Errorf("wildcard: %+v", ex)
	}
}

func TestScheduleExplainOversizedStep(t *testing.T) {
	code, out, errs := run(t, "schedule", "explain", "--cron", "*/60 * * * *", "--count", "2", "--after", "2026-06-01T10:00:00Z")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	if !strings.Contains(out, `Note:        step 60 in the minute field "*/60" is larger than its range 0-59: only 0 matches`) ||
		!strings.Contains(out, "2026-06-01T11:00:00Z") || !strings.Contains(out, "2026-06-01T12:00:00Z") {
		t.Errorf("output:\n%s", out)
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
