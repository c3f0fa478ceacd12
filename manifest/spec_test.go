package manifest

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"
)

func validSpec() Spec {
	return Spec{Name: "backup-db", Schedule: "30 2 * * *", Script: "echo hi\n"}
}

func problemsOf(t *testing.T, err error) []FieldError {
	t.Helper()
	if err == nil {
		return nil
	}
	var ve *ValidationError
	if !errors.As(err, &ve) {
		t.Fatalf("error %v is not a *ValidationError", err)
	}
	return ve.Problems
}

func TestSpecValidateAccepts(t *testing.T) {
	for _, s := range []Spec{
		validSpec(),
		{Name: "a", Schedule: "@hourly", Command: []string{"./run.sh", "--full"}, Files: []string{"run.sh", "lib/"}},
		{Name: "x-1", Schedule: "*/5 * * * *", Timezone: "Europe/Berlin", Script: "true", Env: map[string]string{"PGHOST": "localhost", "_A1": ""},
			Secrets: []string{"PGPASSWORD"}, RunAs: "postgres", Timeout: Duration(time.Hour), Catchup: "all", Jitter: Duration(5 * time.Minute),
			Hardening: "strict", Limits: Limits{CPUPercent: 50, MemoryMB: 512, Tasks: 64},
			Targets: &Targets{Tags: map[string]string{"role": "db", "env": "prod"}, Agents: []string{"agt-01"}}},
	} {
		if err := s.Validate(); err != nil {
			t.Errorf("%s: unexpected error: %v", s.Name, err)
		}
	}
}

func TestSpecValidateReportsEveryProblem(t *testing.T) {
	s := Spec{
		Name:        "Bad_Name",
		Description: "two\nlines",
		Schedule:    "",
		Timezone:    "Mars/Olympus",
		Script:      "x",
		Command:     []string{"y"},
		Env:         map[string]string{"1BAD": "v", "DROVER_X": "v"},
		Secrets:     []string{"OK", "OK", "bad-name"},
		RunAs:       "Root User",
		Timeout:     Duration(time.Millisecond),
		Catchup:     "sometimes",
		Jitter:      Duration(-time.Second),
		Hardening:   "paranoid",
		Limits:      Limits{CPUPercent: -1, MemoryMB: MaxMemoryMB + 1},
		Targets:     &Targets{Tags: map[string]string{"role": "a b"}, Agents: []string{"../x"}},
	}
	got := map[string]string{}
	for _, p := range problemsOf(t, s.Validate()) {
		got[p.Field] = p.Message
	}
	for _, field := range []string{"name", "description", "schedule", "timezone", "command", "env", "env.DROVER_X",
		"secrets[1]", "secrets[2]", "run_as", "timeout", "catchup", "jitter", "hardening", "limits.cpu_percent",
		"limits.memory_mb", "targets.tags.role", "targets.agents[0]"} {
		if _, ok := got[field]; !ok {
			t.Errorf("no problem reported for %s; got %v", field, got)
		}
	}
	if !strings.Contains(got["catchup"], "once, all, skip") {
		t.Errorf("catchup message should list the choices: %q", got["catchup"])
	}
}

func TestSpecValidateRejectsHostilePaths(t *testing.T) {
	for _, f := range []string{"/etc/passwd", "../up", "a/../../b", "", "a\nb", `a\b`, "."} {
		s := validSpec()
		s.Script = ""
		s.Command = []string{"./run"}
		s.Files = []string{f}
		ps := problemsOf(t, s.Validate())
		if len(ps) != 1 || ps[0].Field != "files[0]" {
			t.Errorf("files %q: got %v, want one problem at files[0]", f, ps)
		}
	}
}

func TestSpecNames(t *testing.T) {
	long := strings.Repeat("a", 63)
	for name, ok := range map[string]bool{"a": true, "0": true, long: true, long + "a": false, "-a": false, "a_b": false,
		"A": false, "../x": false, "a%n": false, "a\n": false, "": false, "a.b": false} {
		if ValidName(name) != ok {
			t.Errorf("ValidName(%q) = %v, want %v", name, !ok, ok)
		}
	}
}

func TestNormalizeIsIdempotentAndFillsDefaults(t *testing.T) {
	s := validSpec()
	s.Normalize()
	if s.Timezone != "UTC" || s.Timeout != DefaultTimeout || s.Catchup != CatchupOnce || s.Hardening != HardeningDefault ||
		s.Interpreter != "/bin/sh" || !s.IsEnabled() {
		t.Fatalf("defaults not filled: %+v", s)
	}
	a, _ := json.Marshal(s)
	s.Normalize()
	b, _ := json.Marshal(s)
	if string(a) != string(b) {
		t.Fatalf("Normalize not idempotent:\n%s\n%s", a, b)
	}
	if err := s.Validate(); err != nil {
		t.Fatal(err)
	}
}

func TestDurationText(t *testing.T) {
	for in, want := range map[string]string{"90m": "1h30m", "1h": "1h", "30s": "30s", "0s": "0s", "1h0m30s": "1h0m30s", "2m": "2m"} {
		d, err := parseDuration(in)
		if err != nil {
			t.Fatal(err)
		}
		if d.String() != want {
			t.Errorf("%s: got %s want %s", in, d, want)
		}
		var back Duration
		if err := json.Unmarshal([]byte(`"`+d.String()+`"`), &back); err != nil || back != d {
			t.Errorf("%s: JSON round trip gave %v, %v", in, back, err)
		}
	}
	var d Duration
	if err := json.Unmarshal([]byte(`3600`), &d); err == nil {
		t.Error("a bare number must be refused as a duration")
	}
}

func testManifest() *Manifest {
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	s := validSpec()
	s.Normalize()
	return &Manifest{AgentID: "agt-1", Serial: 3, IssuedAt: now, ExpiresAt: now.Add(DefaultLifetime), KeyListVersion: 1,
		Pipes: []Pipe{{Name: s.Name, Version: 2, Spec: s, Payload: Payload{Digest: Digest([]byte("x")), Size: 1}}}}
}

func TestManifestRoundTrip(t *testing.T) {
	m := testManifest()
	b, err := m.Encode()
	if err != nil {
		t.Fatal(err)
	}
	back, err := DecodeManifest(b)
	if err != nil {
		t.Fatal(err)
	}
	b2, _ := back.Encode()
	if string(b) != string(b2) {
		t.Fatalf("re-encoding differs:\n%s\n%s", b, b2)
	}
	for _, want := range []string{`"agent_id":"agt-1"`, `"serial":3`, `"key_list_version":1`, `"payload":{"digest":"sha256:`} {
		if !strings.Contains(string(b), want) {
			t.Errorf("encoding lacks %s: %s", want, b)
		}
	}
}

func TestDecodeManifestRefusesBadInput(t *testing.T) {
	m := testManifest()
	good, _ := m.Encode()
	cases := map[string]string{
		"unknown field": strings.Replace(string(good), `"serial":3`, `"serial":3,"extra":1`, 1),
		"trailing":      string(good) + "{}",
		"targets":       strings.Replace(string(good), `"enabled":true`, `"enabled":true,"targets":{"agents":["a"]}`, 1),
		"zero serial":   strings.Replace(string(good), `"serial":3`, `"serial":0`, 1),
		"bad digest":    strings.Replace(string(good), `"digest":"sha256:`, `"digest":"md5:`, 1),
		"bad schedule":  strings.Replace(string(good), `"30 2 * * *"`, `"61 2 * * *"`, 1),
	}
	for name, in := range cases {
		if in == string(good) {
			t.Fatalf("%s: replacement did not apply", name)
		}
		if _, err := DecodeManifest([]byte(in)); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	dup := testManifest()
	dup.Pipes = append(dup.Pipes, dup.Pipes[0])
	ps := problemsOf(t, dup.Validate())
	if len(ps) != 1 || ps[0].Field != "pipes[1].name" {
		t.Errorf("duplicate pipe: got %v", ps)
	}
	bad := testManifest()
	bad.Pipes[0].Spec.Timezone = "Nowhere/Land"
	ps = problemsOf(t, bad.Validate())
	if len(ps) != 1 || ps[0].Field != "pipes[0].spec.timezone" {
		t.Errorf("bad zone: got %v", ps)
	}
}

func TestTimezoneNames(t *testing.T) {
	for tz, ok := range map[string]bool{"UTC": true, "Europe/Berlin": true, "America/Argentina/Buenos_Aires": true, "Etc/GMT+5": true,
		"GMT": false, "CET": false, "EST": false, "right/Europe/Berlin": false, "posix/UTC": false, "Local": false, "": true,
		"Europe/../etc/passwd": false, "/etc/localtime": false, "Mars/Base": false} {
		s := validSpec()
		s.Timezone = tz
		if err := s.Validate(); (err == nil) != ok {
			t.Errorf("timezone %q: err = %v, want ok=%v", tz, err, ok)
		}
	}
}
