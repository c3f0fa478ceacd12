package sdtest

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

func TestMain(m *testing.M) { Main(m) }

func TestManagerRunsTimers(t *testing.T) {
	e := Require(t)
	unit := "sdtest-probe"
	mark := filepath.Join(t.TempDir(), "ran")
	write := func(name, body string) {
		if err := os.WriteFile(filepath.Join(e.UnitDir(), name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(unit+".service", "[Service]\nType=oneshot\nExecStart=/bin/touch "+mark+"\n")
	write(unit+".timer", "[Timer]\nOnCalendar=2099-01-01 00:00:00 UTC\nAccuracySec=1s\n")
	Systemctl(t, "daemon-reload")
	Systemctl(t, "start", unit+".timer")
	timers := ListTimers(t)
	tm, ok := timers[unit+".timer"]
	if !ok {
		t.Fatalf("timer not listed: %v", timers)
	}
	if want := time.Date(2099, 1, 1, 0, 0, 0, 0, time.UTC); !tm.Next.Equal(want) {
		t.Errorf("next = %v, want %v", tm.Next, want)
	}
	if tm.Activates != unit+".service" {
		t.Errorf("activates = %q", tm.Activates)
	}
	Systemctl(t, "start", unit+".service")
	WaitProperty(t, unit+".service", "Result", 5*time.Second, func(v string) bool { return v == "success" })
	if _, err := os.Stat(mark); err != nil {
		t.Fatalf("service did not run: %v", err)
	}
	if got := os.Getenv("DBUS_SESSION_BUS_ADDRESS"); got != e.BusAddress || got == "" {
		t.Errorf("DBUS_SESSION_BUS_ADDRESS = %q", got)
	}
}

func TestParseListTimers(t *testing.T) {
	got, err := ParseListTimers([]byte(`[{"next":1796090400000000,"left":1,"last":0,"passed":0,"unit":"a.timer","activates":"a.service"},{"next":null,"last":null,"unit":"b.timer","activates":"b.service"}]`))
	if err != nil {
		t.Fatal(err)
	}
	if !got["a.timer"].Next.Equal(time.UnixMicro(1796090400000000)) || !got["a.timer"].Last.IsZero() {
		t.Errorf("a: %+v", got["a.timer"])
	}
	if !got["b.timer"].Next.IsZero() {
		t.Errorf("b: %+v", got["b.timer"])
	}
}

func TestNewManager(t *testing.T) {
	main := Require(t)
	other := NewManager(t)
	if other.BusAddress == main.BusAddress || other.UnitDir() == main.UnitDir() {
		t.Fatalf("not a separate manager: %+v", other)
	}
	unit := "sdtest-other.service"
	if err := os.WriteFile(filepath.Join(other.UnitDir(), unit), []byte("[Service]\nType=oneshot\nExecStart=/bin/true\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	other.Systemctl(t, "daemon-reload")
	other.Systemctl(t, "start", unit)
	other.WaitProperty(t, unit, "Result", 5*time.Second, func(v string) bool { return v == "success" })
	// The main manager does not know it.
	if ls := Show(t, unit, "LoadState"); ls != "not-found" {
		t.Errorf("main manager: LoadState %s", ls)
	}
}
