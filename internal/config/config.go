// Package config is the loading shared by the agent's and the server's
// configuration files (docs/design.md, "Configuration"): a strict YAML
// decode over the defaults, DROVER_<PATH> environment overrides derived
// from the yaml tags, and a collector of field problems for Validate.
//
// Imported by agent and server; it knows neither configuration.
package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"reflect"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/drover/drover/manifest"
)

// Load overlays cfg (a pointer to a struct holding the defaults) with the
// YAML file at path, if path is not empty (a missing file is an error only
// when required), and then with the DROVER_* variables of env (os.Environ
// form, see ApplyEnv).
func Load(path string, required bool, env []string, cfg any) error {
	if path != "" {
		b, err := os.ReadFile(path)
		switch {
		case err == nil:
			if err := Decode(b, cfg); err != nil {
				return fmt.Errorf("config %s: %w", path, err)
			}
		case errors.Is(err, os.ErrNotExist) && !required:
		default:
			return fmt.Errorf("read config: %w", err)
		}
	}
	return ApplyEnv(cfg, env)
}

// Decode decodes YAML over cfg, refusing unknown fields.
func Decode(b []byte, cfg any) error {
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	if err := dec.Decode(cfg); err != nil && !errors.Is(err, io.EOF) {
		return fmt.Errorf("decode yaml: %w", err)
	}
	return nil
}

// ApplyEnv applies DROVER_<PATH> variables of env (os.Environ form) to cfg,
// a pointer to a struct, where PATH is the upper-cased YAML path joined by
// '_': DROVER_DATA_DIR, DROVER_ENROLLMENT_CERT_LIFETIME. Durations are Go
// durations, lists of strings are comma-separated. Unknown DROVER_
// variables are ignored: the agent, the server and droverctl share the
// prefix.
func ApplyEnv(cfg any, env []string) error {
	vars := map[string]string{}
	for _, kv := range env {
		if k, v, ok := strings.Cut(kv, "="); ok && strings.HasPrefix(k, "DROVER_") {
			vars[k] = v
		}
	}
	if len(vars) == 0 {
		return nil
	}
	return walkEnv(reflect.ValueOf(cfg).Elem(), "DROVER", func(name string, fv reflect.Value) error {
		s, ok := vars[name]
		if !ok {
			return nil
		}
		if err := setField(fv, s); err != nil {
			return fmt.Errorf("environment %s: %w", name, err)
		}
		return nil
	})
}

// EnvNames returns the variables ApplyEnv reads for cfg (a pointer to a
// struct), in field order.
func EnvNames(cfg any) []string {
	var names []string
	_ = walkEnv(reflect.ValueOf(cfg).Elem(), "DROVER", func(name string, _ reflect.Value) error {
		names = append(names, name)
		return nil
	})
	return names
}

// walkEnv calls f with the variable name of each leaf field of v.
func walkEnv(v reflect.Value, prefix string, f func(name string, fv reflect.Value) error) error {
	t := v.Type()
	for i := 0; i < t.NumField(); i++ {
		tag, _, _ := strings.Cut(t.Field(i).Tag.Get("yaml"), ",")
		if tag == "" || tag == "-" {
			continue
		}
		name := prefix + "_" + strings.ToUpper(tag)
		fv := v.Field(i)
		var err error
		if fv.Kind() == reflect.Struct {
			err = walkEnv(fv, name, f)
		} else {
			err = f(name, fv)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

var durationType = reflect.TypeOf(time.Duration(0))

func setField(fv reflect.Value, s string) error {
	switch {
	case fv.Type() == durationType:
		d, err := time.ParseDuration(s)
		if err != nil {
			return err
		}
		fv.SetInt(int64(d))
	case fv.Kind() == reflect.String:
		fv.SetString(s)
	case fv.Kind() == reflect.Int || fv.Kind() == reflect.Int64:
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return err
		}
		fv.SetInt(n)
	case fv.Kind() == reflect.Bool:
		b, err := strconv.ParseBool(s)
		if err != nil {
			return err
		}
		fv.SetBool(b)
	case fv.Kind() == reflect.Slice && fv.Type().Elem().Kind() == reflect.String:
		var list []string
		for _, p := range strings.Split(s, ",") {
			if p = strings.TrimSpace(p); p != "" {
				list = append(list, p)
			}
		}
		fv.Set(reflect.ValueOf(list))
	}
	return nil
}

// Problems collects the field problems Validate finds, to report them all
// at once.
type Problems []manifest.FieldError

// Add records a problem with field (its YAML path).
func (p *Problems) Add(field, format string, args ...any) {
	*p = append(*p, manifest.FieldError{Field: field, Message: fmt.Sprintf(format, args...)})
}

// OneOf records a problem unless v is one of allowed.
func (p *Problems) OneOf(field, v string, allowed ...string) {
	for _, a := range allowed {
		if v == a {
			return
		}
	}
	p.Add(field, "%q is not one of %s", v, strings.Join(allowed, ", "))
}

// Logging checks log_level and log_format.
func (p *Problems) Logging(level, format string) {
	p.OneOf("log_level", level, "debug", "info", "warn", "error")
	p.OneOf("log_format", format, "text", "json")
}

// Err is nil without problems, else a *manifest.ValidationError.
func (p Problems) Err() error {
	if len(p) == 0 {
		return nil
	}
	return &manifest.ValidationError{Problems: p}
}
