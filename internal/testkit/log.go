package testkit

import (
	"bytes"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"
	"time"
)

// LogWriter writes each write to t.Log, without its trailing newline, after
// prefix (may be empty), e.g. "drover-agent: ".
func LogWriter(t testing.TB, prefix string) *TestWriter {
	return &TestWriter{t: t, prefix: prefix}
}

// TestWriter is an io.Writer into a test's log; see LogWriter.
type TestWriter struct {
	t      testing.TB
	prefix string
}

func (w *TestWriter) Write(p []byte) (int, error) {
	w.t.Log(w.prefix + strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// Logger is a text logger into the test's log at level, or at debug level
// when DROVER_TEST_LOG is set.
func Logger(t testing.TB, level slog.Level) *slog.Logger {
	if os.Getenv("DROVER_TEST_LOG") != "" {
		level = slog.LevelDebug
	}
	return slog.New(slog.NewTextHandler(LogWriter(t, ""), &slog.HandlerOptions{Level: level}))
}

// Buffer is a bytes.Buffer safe for concurrent Write and String, e.g. the
// sink of a logger or of a child process's output.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *Buffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

// String returns what was written so far.
func (s *Buffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// Clock is the wall clock moved by Advance, for code that takes a clock
// with a Now method. The zero Clock reads time.Now.
type Clock struct {
	mu  sync.Mutex
	off time.Duration
}

// Now is time.Now plus everything Advance added.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return time.Now().Add(c.off)
}

// Advance moves the clock d forward.
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	c.off += d
	c.mu.Unlock()
}
