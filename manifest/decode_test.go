package manifest

import (
	"fmt"
	"strings"
	"testing"
)

func TestDecodeSpecsSeveralDocuments(t *testing.T) {
	src := `---
name: backup-db
description: Nightly database dump
schedule: "30 2 * * *"
timezone: Europe/Berlin
script: |
  pg_dump mydb > /var/backups/mydb.sql
env: {PGHOST: localhost}
secrets: [PGPASSWORD]
run_as: postgres
timeout: 1h
catchup: once
jitter: 5m
hardening: default
limits: {cpu_percent: 50, memory_mb: 512, tasks: 64}
targets: {tags: {role: db, env: prod}, agents: []}
enabled: true
---
# an empty document is ignored
---
name: rotate
schedule: "@daily"
command: ["./run.sh", "--full"]
files: [run.sh, lib/]
`
	specs, err := DecodeSpecs([]byte(src))
	if err != nil {
		t.Fatal(err)
	}
	if len(specs) != 2 || specs[0].Name != "backup-db" || specs[1].Name != "rotate" {
		t.Fatalf("got %+v", specs)
	}
	s := specs[0]
	if s.Jitter.String() != "5m" || s.Limits.MemoryMB != 512 || s.Targets.Tags["role"] != "db" || s.Env["PGHOST"] != "localhost" {
		t.Fatalf("fields not decoded: %+v", s)
	}
}

func TestDecodeSpecsErrorsCarryFieldAndLine(t *testing.T) {
	cases := []struct {
		src, field string
		line       int
		msg        string
	}{
		{"name: a\nschedule: '* * * * *'\nscript: x\nbogus: 1\n", "[0].bogus", 4, "unknown field"},
		{"name: a\nschedule: '* * * * *'\nscript: x\nlimits:\n  cpus: 2\n", "[0].limits.cpus", 5, "unknown field"},
		{"name: a\nschedule: '* * * * *'\nscript: x\ntimeout: soon\n", "[0].timeout", 4, "not a duration"},
		{"name: a\nschedule: '* * * * *'\nscript: x\n---\nname: a\nschedule: '@hourly'\nscript: y\n", "[1].name", 5, "duplicate"},
		{"name: ../x\nschedule: '* * * * *'\nscript: x\n", "[0].name", 1, "not a valid name"},
		{"name: a\nschedule: '* * * * *'\nscript: x\ntimezone: Mars/Base\n", "[0].timezone", 4, "unknown time zone"},
		{"name: a\nschedule: '* * * * *'\nscript: x\nsecrets: [A, A]\n", "[0].secrets[1]", 4, "duplicate"},
		{"- a\n- b\n", "[0]", 1, "mapping"},
		{"name: a\nname: b\nschedule: '* * * * *'\nscript: x\n", "[0].name", 2, "twice"},
		{"name: [\n", "[0]", 0, ""},
	}
	for _, c := range cases {
		_, err := DecodeSpecs([]byte(c.src))
		ps := problemsOf(t, err)
		if len(ps) == 0 {
			t.Errorf("%q: accepted", c.src)
			continue
		}
		p := ps[0]
		if p.Field != c.field || (c.line != 0 && p.Line != c.line) || !strings.Contains(p.Message, c.msg) {
			t.Errorf("%q:\n got %s (field %q line %d)\nwant field %q line %d containing %q", c.src, p.Error(), p.Field, p.Line, c.field, c.line, c.msg)
		}
	}
}

func TestDecodeSpecsDocumentCap(t *testing.T) {
	var b strings.Builder
	for i := 0; i < MaxSpecsPerFile+1; i++ {
		fmt.Fprintf(&b, "---\nname: p%d\nschedule: '@hourly'\nscript: x\n", i)
	}
	_, err := DecodeSpecs([]byte(b.String()))
	if err == nil || !strings.Contains(err.Error(), "documents") {
		t.Fatalf("got %v, want the document cap", err)
	}
}

func FuzzDecodeSpecs(f *testing.F) {
	f.Add([]byte("name: a\nschedule: '*/5 * * * *'\nscript: echo\n"))
	f.Add([]byte("name: b\nschedule: '@every 5m'\ncommand: [x]\nfiles: [x]\nenv: {A: b}\nlimits: {tasks: 3}\n"))
	f.Add([]byte("---\n---\nname: [\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		specs, err := DecodeSpecs(data)
		if err != nil {
			return
		}
		// Whatever decodes must validate, normalise and survive a JSON round trip.
		for i := range specs {
			s := specs[i].Clone()
			s.Normalize()
			if err := s.Validate(); err != nil {
				t.Fatalf("accepted spec invalid after Normalize: %v", err)
			}
			if !ValidName(s.Name) {
				t.Fatalf("accepted bad name %q", s.Name)
			}
		}
	})
}

func TestSpecFileLine(t *testing.T) {
	src := "name: a\nschedule: '@daily'\nscript: x\n---\n# b\nname: b\nschedule: '@daily'\ncommand: [run]\nfiles:\n  - x\n  - y\nlimits:\n  memory_mb: 5\n"
	f, err := DecodeSpecFile([]byte(src))
	if err != nil || len(f.Specs) != 2 {
		t.Fatalf("%v %+v", err, f)
	}
	for _, c := range []struct {
		doc   int
		field string
		want  int
	}{
		{0, "", 1}, {0, "schedule", 2}, {0, "nope", 1},
		{1, "name", 6}, {1, "files[1]", 11}, {1, "files[7]", 9}, {1, "files[-1]", 9},
		{1, "limits.memory_mb", 13}, {1, "limits.nope", 12}, {2, "name", 0},
	} {
		if got := f.Line(c.doc, c.field); got != c.want {
			t.Errorf("Line(%d, %q) = %d, want %d", c.doc, c.field, got, c.want)
		}
	}
}
