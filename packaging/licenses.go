package packaging

import (
	"bytes"
	"context"
	"debug/buildinfo"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"unicode"
)

// The binaries are linked statically: besides Drover's own code each one
// carries the Go standard library and the Go modules it imports, whose
// licences (MIT, BSD, Apache-2.0) ask that their notices travel with the
// binary. writeModuleLicenses writes, per package, the list of what is
// compiled into its binary and each part's licence text, taken from the
// module cache the build just used; the packages ship it beside their
// copyright file as go-modules-licenses.

// licenseFiles are the names a module's licence goes by, in order of
// preference.
var licenseFiles = []string{"LICENSE", "LICENSE.txt", "LICENSE.md", "LICENCE", "COPYING", "LICENSE-MIT", "LICENSE-APACHE"}

// escapeModulePath is the module cache's spelling of a module path: an
// upper-case letter becomes '!' and the letter in lower case.
func escapeModulePath(p string) string {
	var b strings.Builder
	for _, r := range p {
		if unicode.IsUpper(r) {
			b.WriteByte('!')
			r = unicode.ToLower(r)
		}
		b.WriteRune(r)
	}
	return b.String()
}

// licenseName guesses the SPDX identifier of a licence text, for the
// file's index; the text itself is what counts.
func licenseName(text string) string {
	switch {
	case strings.Contains(text, "Apache License") && strings.Contains(text, "Version 2.0"):
		return "Apache-2.0"
	case strings.Contains(text, "Mozilla Public License"):
		return "MPL-2.0"
	case strings.Contains(text, "Permission is hereby granted, free of charge"):
		return "MIT"
	case strings.Contains(text, "Permission to use, copy, modify, and/or distribute"), strings.Contains(text, "Permission to use, copy, modify, and distribute"):
		return "ISC"
	case strings.Contains(text, "Redistribution and use") && strings.Contains(text, "Neither the name"), strings.Contains(text, "Redistribution and use") && strings.Contains(text, "names of its contributors"):
		return "BSD-3-Clause"
	case strings.Contains(text, "Redistribution and use"):
		return "BSD-2-Clause"
	}
	return "see the text"
}

// ModuleLicenses returns the go-modules-licenses text of a binary: Go's
// own licence and, for each module compiled in (as its build information
// lists them), the module, its version, a guessed SPDX name and the full
// licence text found in modCache. A module without a licence file there is
// an error: the package must not ship without it.
func ModuleLicenses(binary, goroot, modCache string) ([]byte, error) {
	bi, err := buildinfo.ReadFile(binary)
	if err != nil {
		return nil, fmt.Errorf("build information of %s: %w", binary, err)
	}
	goLicense, err := os.ReadFile(filepath.Join(goroot, "LICENSE"))
	if err != nil {
		return nil, fmt.Errorf("the Go licence: %w", err)
	}
	type part struct{ name, version, license, text string }
	parts := []part{{"Go standard library and runtime", bi.GoVersion, licenseName(string(goLicense)), string(goLicense)}}
	for _, d := range bi.Deps {
		m := d
		if d.Replace != nil {
			m = d.Replace
		}
		dir := filepath.Join(modCache, escapeModulePath(m.Path)+"@"+m.Version)
		var text []byte
		for _, n := range licenseFiles {
			if text, err = os.ReadFile(filepath.Join(dir, n)); err == nil {
				break
			}
		}
		if text == nil {
			return nil, fmt.Errorf("module %s %s compiled into %s has no licence file in %s", m.Path, m.Version, filepath.Base(binary), dir)
		}
		parts = append(parts, part{d.Path, m.Version, licenseName(string(text)), string(text)})
	}
	slices.SortStableFunc(parts[1:], func(a, b part) int { return strings.Compare(a.name, b.name) })

	var b bytes.Buffer
	fmt.Fprintf(&b, "Licences of the code compiled into %s besides Drover's own (see copyright).\n", filepath.Base(binary))
	fmt.Fprintf(&b, "The binary is linked statically; `go version -m %s` lists the same modules.\n\n", "/usr/bin/"+filepath.Base(binary))
	for _, p := range parts {
		fmt.Fprintf(&b, "  %-50s %-38s %s\n", p.name, p.version, p.license)
	}
	for _, p := range parts {
		fmt.Fprintf(&b, "\n%s\n%s %s (%s)\n%s\n\n%s\n", strings.Repeat("=", 72), p.name, p.version, p.license, strings.Repeat("=", 72), strings.TrimSpace(p.text))
	}
	return b.Bytes(), nil
}

// writeModuleLicenses writes doc/<binary>.go-modules-licenses for each
// binary in hostBin.
func writeModuleLicenses(ctx context.Context, hostBin, docDir string) error {
	env := func(k string) (string, error) {
		out, err := exec.CommandContext(ctx, goCommand(), "env", k).Output()
		if err != nil {
			return "", fmt.Errorf("go env %s: %w", k, err)
		}
		return strings.TrimSpace(string(out)), nil
	}
	goroot, err := env("GOROOT")
	if err != nil {
		return err
	}
	modCache, err := env("GOMODCACHE")
	if err != nil {
		return err
	}
	for _, bin := range Binaries {
		b, err := ModuleLicenses(filepath.Join(hostBin, bin), goroot, modCache)
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(docDir, bin+".go-modules-licenses"), b, 0o644); err != nil {
			return err
		}
	}
	return nil
}
