// Package runreq is the RunNow request file, the one place both its writer
// (the backends in agent/apply, when the server asks for a run) and its
// reader (the runner in agent/runner, which then records trigger=api and
// the request id) take its format, path and freshness rules from.
//
// The file is <dir>/<pipe>.json, mode 0644, JSON {"request_id", "trigger":
// "api", "requested_at", "expires_at"}; dir is <runtime dir>/requests
// (see Dir). A runner starting within Freshness of the file's mtime and
// before expires_at takes it; it may lack the right to remove it, so the
// backend removes it once the run has ended.
//
// Imported by agent/apply and agent/runner.
package runreq

import (
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/drover/drover/internal/atomicfile"
	"github.com/drover/drover/internal/paths"
	agentpb "github.com/drover/drover/proto"
)

// TTL bounds how long after RunNow a starting runner honours a request
// (its expires_at).
const TTL = time.Minute

// Freshness is how old a request file (its mtime) may be and still count.
const Freshness = time.Minute

// maxSize bounds the file a runner reads.
const maxSize = 64 << 10

// Trigger is the trigger a request stands for.
var Trigger = agentpb.Trigger_TRIGGER_API.Name()

// Request is the file's content.
type Request struct {
	RequestID   string    `json:"request_id"`
	Trigger     string    `json:"trigger"`
	RequestedAt time.Time `json:"requested_at"`
	ExpiresAt   time.Time `json:"expires_at"`
}

// Dir is the request directory below an agent runtime directory.
func Dir(runtimeDir string) string { return filepath.Join(runtimeDir, "requests") }

// DefaultDir is the request directory of a runner started without
// DROVER_REQUEST_DIR: below $XDG_RUNTIME_DIR (user scope) when set, else
// the system runtime directory.
func DefaultDir(xdgRuntimeDir string) string {
	if xdgRuntimeDir != "" {
		return Dir(filepath.Join(xdgRuntimeDir, paths.RuntimeName))
	}
	return Dir(paths.RuntimeDir)
}

// Path is pipe's request file in dir.
func Path(dir, pipe string) string { return filepath.Join(dir, pipe+".json") }

// Write leaves a request for pipe's next run in dir and returns its path.
func Write(dir, pipe, requestID string, now time.Time) (string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	b, err := json.Marshal(Request{RequestID: requestID, Trigger: Trigger, RequestedAt: now.UTC(), ExpiresAt: now.Add(TTL).UTC()})
	if err != nil {
		return "", err
	}
	path := Path(dir, pipe)
	// A runtime directory is a tmpfs: no directory sync.
	o := atomicfile.Options{Perm: 0o644, TempPrefix: ".drover-tmp-" + filepath.Base(path) + "-", NoDirSync: true}
	if err := o.Write(path, append(b, '\n')); err != nil {
		return "", err
	}
	return path, nil
}

// Remove deletes the request file at path if it still holds requestID.
func Remove(path, requestID string) {
	b, err := os.ReadFile(path)
	if err != nil {
		return
	}
	var r Request
	if json.Unmarshal(b, &r) == nil && r.RequestID == requestID {
		os.Remove(path)
	}
}

// Take consumes pipe's fresh request in dir and returns its id, or "".
// Fresh: a regular file written less than Freshness ago and, when it has
// an expires_at, not expired. lastID is the request the previous run
// consumed: a request whose file could not be removed must not count
// twice. removeErr is a failure to remove the file other than its absence
// or a lack of permission (a runner running as a dynamic user cannot
// remove it: the expected case).
func Take(dir, pipe, lastID string, now time.Time) (requestID string, removeErr error) {
	path := Path(dir, pipe)
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return "", nil
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil || !st.Mode().IsRegular() || st.Size() > maxSize {
		return "", nil
	}
	if age := now.Sub(st.ModTime()); age > Freshness || age < -Freshness {
		return "", nil
	}
	var req Request
	if err := json.NewDecoder(f).Decode(&req); err != nil || req.RequestID == "" || req.RequestID == lastID {
		return "", nil
	}
	if !req.ExpiresAt.IsZero() && !now.Before(req.ExpiresAt) {
		return "", nil
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) && !errors.Is(err, fs.ErrPermission) {
		return req.RequestID, err
	}
	return req.RequestID, nil
}
