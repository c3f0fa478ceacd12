package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/spf13/pflag"

	"github.com/drover/drover/internal/command"
)

// get -w: print the list, then each object that appears or changes, the
// way kubectl get -w does. It polls the list (the server answers an
// unchanged one with 304 Not Modified, so a quiet fleet costs a header
// exchange per interval).

// watchOpts are the flags of get -w.
type watchOpts struct {
	on    bool
	every time.Duration
}

// The bounds of --watch-interval: often enough to follow a run, never so
// often that many watchers load the server.
const (
	minWatchInterval = 500 * time.Millisecond
	maxWatchInterval = 10 * time.Minute
)

// watchKinds are the resources get -w follows.
var watchKinds = []string{"pipes", "agents", "runs", "fires", "events"}

func (w *watchOpts) flags(f *pflag.FlagSet) {
	f.BoolVarP(&w.on, "watch", "w", false, "after listing, print each object that appears or changes (pipes, agents, runs, fires, events) until Ctrl-C")
	f.DurationVar(&w.every, "watch-interval", 2*time.Second, "how often -w asks the server (500ms-10m)")
}

// watch prints get kind's answer, then every row (or, with -o json, yaml or
// name, every object) that is new or changed since it was last printed,
// until ctx ends.
func (a *app) watch(ctx context.Context, kind string, names []string, o listOpts, w watchOpts) error {
	if !slices.Contains(watchKinds, kind) {
		return command.Usagef("-w follows %s, not %s", strings.Join(watchKinds, ", "), kind)
	}
	if w.every < minWatchInterval || w.every > maxWatchInterval {
		return command.Usagef("--watch-interval %s out of range %s-%s", w.every, minWatchInterval, maxWatchInterval)
	}
	c, err := a.apiClient()
	if err != nil {
		return err
	}
	c.http.Transport = &etagCache{base: c.http.Transport, entries: map[string]*etagEntry{}}
	p := &watchPrinter{a: a, kind: kind, out: a.stdout(), last: map[string]string{}}
	failing := false
	for first := true; ; first = false {
		var buf bytes.Buffer
		err := a.captured(&buf, func() error { return a.get(ctx, kind, names, o) })
		switch {
		case ctx.Err() != nil:
			return nil
		case err != nil:
			var ue command.UsageError
			if first || errors.As(err, &ue) {
				return err
			}
			if !failing {
				a.warnf("watch: %v (trying again every %s)", err, w.every)
			}
			failing = true
		default:
			failing = false
			if err := p.emit(buf.Bytes()); err != nil {
				return err
			}
		}
		t := time.NewTimer(w.every)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
	}
}

// captured runs f with the command's stdout going to buf and, for -o json
// and yaml, JSON output, which watchPrinter splits into objects.
func (a *app) captured(buf *bytes.Buffer, f func() error) error {
	out, format := a.env.Stdout, a.output
	a.env.Stdout = buf
	if format == "json" || format == "yaml" {
		a.output = "json"
	}
	defer func() { a.env.Stdout, a.output = out, format }()
	return f()
}

// watchPrinter prints what changed between answers.
type watchPrinter struct {
	a          *app
	kind       string
	out        io.Writer
	headerDone bool
	// last is the last printed form of each row or object, by its key.
	last map[string]string
}

func (p *watchPrinter) emit(answer []byte) error {
	switch p.a.output {
	case "json", "yaml":
		return p.emitObjects(answer)
	}
	lines := strings.Split(strings.TrimRight(string(answer), "\n"), "\n")
	if len(lines) == 1 && lines[0] == "" {
		return nil
	}
	table := p.a.output != "name" && p.kind != "fires"
	if table {
		if !p.headerDone {
			fmt.Fprintln(p.out, lines[0])
			p.headerDone = true
		}
		lines = lines[1:]
	}
	for _, l := range lines {
		// Columns are aligned afresh in every answer: compare the cells.
		norm := strings.Join(strings.Fields(l), " ")
		key := norm
		switch {
		case p.a.output == "name" || p.kind == "events":
		case p.kind == "fires":
			key, _, _ = strings.Cut(l, "  ") // the fire time
		default:
			key = strings.Fields(l)[0] // the name or id
		}
		if p.last[key] == norm {
			continue
		}
		p.last[key] = norm
		fmt.Fprintln(p.out, l)
	}
	return nil
}

// emitObjects prints each new or changed object of a JSON answer (a list
// answer, or one object) as one JSON line, or as one YAML document.
func (p *watchPrinter) emitObjects(answer []byte) error {
	var top map[string]json.RawMessage
	if err := json.Unmarshal(answer, &top); err != nil {
		return fmt.Errorf("the server sent malformed JSON: %w", err)
	}
	items := []json.RawMessage{json.RawMessage(answer)}
	if list, ok := top[p.kind]; ok {
		if err := json.Unmarshal(list, &items); err != nil {
			return fmt.Errorf("unexpected %s from the server: %w", p.kind, err)
		}
	}
	for _, it := range items {
		var buf bytes.Buffer
		if err := json.Compact(&buf, it); err != nil {
			return fmt.Errorf("the server sent malformed JSON: %w", err)
		}
		line := buf.String()
		var fields map[string]json.RawMessage
		_ = json.Unmarshal(it, &fields)
		key := line
		for _, f := range []string{"id", "name", "at"} {
			if v := unquoteID(fields[f]); v != "" {
				key = v
				break
			}
		}
		if p.last[key] == line {
			continue
		}
		p.last[key] = line
		if p.a.output == "yaml" {
			b, err := jsonToYAML([]byte(line))
			if err != nil {
				return err
			}
			fmt.Fprintf(p.out, "---\n%s", b)
			continue
		}
		fmt.Fprintln(p.out, line)
	}
	return nil
}

// etagCache is a transport that remembers the ETag and body of each GET
// answered 200 and asks again with If-None-Match; a 304 is answered from
// the copy, so the rest of droverctl sees a 200.
type etagCache struct {
	base    http.RoundTripper
	mu      sync.Mutex
	entries map[string]*etagEntry
}

type etagEntry struct {
	etag   string
	header http.Header
	body   []byte
}

// maxETagEntries bounds the cache: a watch asks for a page or a few.
const maxETagEntries = 64

func (e *etagCache) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Method != http.MethodGet {
		return e.base.RoundTrip(r)
	}
	key := r.URL.String()
	e.mu.Lock()
	ent := e.entries[key]
	e.mu.Unlock()
	if ent != nil {
		r = r.Clone(r.Context())
		r.Header.Set("If-None-Match", ent.etag)
	}
	resp, err := e.base.RoundTrip(r)
	if err != nil {
		return nil, err
	}
	switch {
	case resp.StatusCode == http.StatusNotModified && ent != nil:
		resp.Body.Close()
		return &http.Response{Status: "200 OK", StatusCode: http.StatusOK, Proto: resp.Proto, ProtoMajor: resp.ProtoMajor, ProtoMinor: resp.ProtoMinor,
			Header: ent.header.Clone(), Body: io.NopCloser(bytes.NewReader(ent.body)), ContentLength: int64(len(ent.body)), Request: r}, nil
	case resp.StatusCode == http.StatusOK && resp.Header.Get("ETag") != "":
		body, err := io.ReadAll(io.LimitReader(resp.Body, maxResponseBytes+1))
		resp.Body.Close()
		if err != nil {
			return nil, err
		}
		resp.Body = io.NopCloser(bytes.NewReader(body))
		if len(body) <= maxResponseBytes {
			e.mu.Lock()
			if len(e.entries) >= maxETagEntries {
				clear(e.entries)
			}
			e.entries[key] = &etagEntry{etag: resp.Header.Get("ETag"), header: resp.Header.Clone(), body: body}
			e.mu.Unlock()
		}
	}
	return resp, nil
}
