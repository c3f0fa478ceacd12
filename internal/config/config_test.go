package config

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/drover/drover/manifest"
)

type sub struct {
	Timeout time.Duration `yaml:"timeout"`
}

type testConfig struct {
	Name  string   `yaml:"name"`
	Count int      `yaml:"count"`
	On    bool     `yaml:"on"`
	List  []string `yaml:"list"`
	Sub   sub      `yaml:"sub"`
	Skip  string   `yaml:"-"`
}

func TestLoadDecodeAndEnv(t *testing.T) {
	path := filepath.Join(t.TempDir(), "c.yaml")
	if err := os.WriteFile(path, []byte("name: file\ncount: 3\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := testConfig{Count: 1, Sub: sub{Timeout: time.Second}}
	env := []string{"DROVER_COUNT=7", "DROVER_ON=true", "DROVER_LIST= a, ,b", "DROVER_SUB_TIMEOUT=2m", "DROVER_OTHER=x", "HOME=/"}
	if err := Load(path, true, env, &cfg); err != nil {
		t.Fatal(err)
	}
	want := testConfig{Name: "file", Count: 7, On: true, List: []string{"a", "b"}, Sub: sub{Timeout: 2 * time.Minute}}
	if !reflect.DeepEqual(cfg, want) {
		t.Fatalf("got %+v, want %+v", cfg, want)
	}
	if err := Load(filepath.Join(t.TempDir(), "missing"), false, nil, &cfg); err != nil {
		t.Fatalf("missing optional file: %v", err)
	}
	if err := Load(filepath.Join(t.TempDir(), "missing"), true, nil, &cfg); err == nil || !strings.HasPrefix(err.Error(), "read config: ") {
		t.Fatalf("missing required file: %v", err)
	}
	if err := os.WriteFile(path, []byte("nope: 1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := Load(path, true, nil, &cfg); err == nil || !strings.HasPrefix(err.Error(), "config "+path+": decode yaml: ") {
		t.Fatalf("unknown field: %v", err)
	}
	if err := Decode(nil, &cfg); err != nil {
		t.Fatalf("empty document: %v", err)
	}
	if err := ApplyEnv(&cfg, []string{"DROVER_SUB_TIMEOUT=soon"}); err == nil || !strings.HasPrefix(err.Error(), "environment DROVER_SUB_TIMEOUT: ") {
		t.Fatalf("bad duration: %v", err)
	}
}

func TestEnvNames(t *testing.T) {
	got := EnvNames(&testConfig{})
	want := []string{"DROVER_NAME", "DROVER_COUNT", "DROVER_ON", "DROVER_LIST", "DROVER_SUB_TIMEOUT"}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}
}

func TestProblems(t *testing.T) {
	var ps Problems
	if ps.Err() != nil {
		t.Fatal("no problems, an error")
	}
	ps.Add("a", "bad %d", 1)
	ps.OneOf("b", "x", "y", "z")
	ps.OneOf("c", "y", "y", "z")
	ps.Logging("loud", "json")
	var ve *manifest.ValidationError
	if !errors.As(ps.Err(), &ve) {
		t.Fatalf("Err = %v", ps.Err())
	}
	want := []manifest.FieldError{{Field: "a", Message: "bad 1"}, {Field: "b", Message: `"x" is not one of y, z`},
		{Field: "log_level", Message: `"loud" is not one of debug, info, warn, error`}}
	if !reflect.DeepEqual(ve.Problems, want) {
		t.Fatalf("got %v, want %v", ve.Problems, want)
	}
}
