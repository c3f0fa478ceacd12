package spool

import (
	"bufio"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/drover/drover/internal/testkit"
	agentpb "github.com/drover/drover/proto"
)

func chunk(run string, seq uint64, data []byte) *agentpb.AgentMessage {
	return &agentpb.AgentMessage{Body: &agentpb.AgentMessage_LogChunk{LogChunk: &agentpb.LogChunk{
		RunId: run, ChunkSeq: seq, Stream: agentpb.LogStream_LOG_STREAM_STDOUT, Data: data,
	}}}
}

func started(run, pipe string) *agentpb.AgentMessage {
	return &agentpb.AgentMessage{Body: &agentpb.AgentMessage_RunStarted{RunStarted: &agentpb.RunStarted{RunId: run, Pipe: pipe}}}
}

func TestWriteDrainInOrder(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "a", "spool")
	w, err := NewWriter(dir)
	if err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(dir)
	if err != nil || st.Mode().Perm() != DirMode {
		t.Fatalf("spool dir mode %v, %v", st.Mode(), err)
	}
	if _, err := w.Write(started("r1", "p")); err != nil {
		t.Fatal(err)
	}
	for i := range 50 {
		write := w.WriteDeferred
		if i%2 == 0 {
			write = w.Write
		}
		if _, err := write(chunk("r1", uint64(i), []byte(fmt.Sprint(i)))); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Sync(); err != nil {
		t.Fatal(err)
	}
	names, _ := List(dir)
	if len(names) != 51 {
		t.Fatalf("%d records, want 51", len(names))
	}
	for _, n := range names {
		st, err := os.Stat(filepath.Join(dir, n))
		if err != nil || st.Mode().Perm() != FileMode {
			t.Fatalf("%s mode %v, %v", n, st.Mode(), err)
		}
	}
	var got []string
	n, err := Drain(dir, func(r Record) error {
		switch b := r.Msg.Body.(type) {
		case *agentpb.AgentMessage_RunStarted:
			got = append(got, "start")
		case *agentpb.AgentMessage_LogChunk:
			got = append(got, string(b.LogChunk.Data))
		}
		return nil
	})
	if err != nil || n != 51 {
		t.Fatalf("drain: %d, %v", n, err)
	}
	if got[0] != "start" {
		t.Fatalf("first record %q", got[0])
	}
	for i, s := range got[1:] {
		if s != fmt.Sprint(i) {
			t.Fatalf("record %d is %q", i+1, s)
		}
	}
	if names, _ := List(dir); len(names) != 0 {
		t.Fatalf("%d records left after drain", len(names))
	}
}

func TestDrainKeepsUncommitted(t *testing.T) {
	dir := t.TempDir()
	w, _ := NewWriter(dir)
	for i := range 10 {
		if _, err := w.Write(chunk("r", uint64(i), nil)); err != nil {
			t.Fatal(err)
		}
	}
	boom := errors.New("store down")
	var seen []uint64
	n, err := Drain(dir, func(r Record) error {
		if r.Msg.GetLogChunk().ChunkSeq == 4 {
			return boom
		}
		seen = append(seen, r.Msg.GetLogChunk().ChunkSeq)
		return nil
	})
	if !errors.Is(err, boom) || n != 4 {
		t.Fatalf("drain = %d, %v", n, err)
	}
	r := Reader{Dir: dir, Batch: 3}
	var batches [][]uint64
	n, err = r.DrainBatch(func(recs []Record) error {
		var b []uint64
		for _, rec := range recs {
			b = append(b, rec.Msg.GetLogChunk().ChunkSeq)
		}
		batches = append(batches, b)
		return nil
	})
	if err != nil || n != 6 {
		t.Fatalf("drain batch = %d, %v", n, err)
	}
	if fmt.Sprint(batches) != "[[4 5 6] [7 8 9]]" {
		t.Fatalf("batches %v", batches)
	}
}

func TestReaderIgnoresJunkAndSetsAsideBadFiles(t *testing.T) {
	dir := t.TempDir()
	w, _ := NewWriter(dir)
	if _, err := w.Write(started("r", "mine")); err != nil {
		t.Fatal(err)
	}
	// A half-written record of a crashed writer, the runner's own files.
	half := TempPrefix + recordName(time.Now().UnixNano(), 1, 1)
	os.WriteFile(filepath.Join(dir, half), []byte{0x6a, 0x05, 0x0a}, 0o600)
	os.WriteFile(filepath.Join(dir, "lock"), nil, 0o600)
	os.WriteFile(filepath.Join(dir, "state.json"), []byte("{}"), 0o600)
	// Files named like records that are not: garbage, empty, a symlink to a
	// file the daemon could read but the runner could not, a FIFO, a record
	// for another pipe.
	base := time.Now().Add(time.Hour).UnixNano()
	garbage := recordName(base, 2, 1)
	os.WriteFile(filepath.Join(dir, garbage), []byte("\xff\xff\xff"), 0o600)
	empty := recordName(base+1, 2, 2)
	os.WriteFile(filepath.Join(dir, empty), nil, 0o600)
	link := recordName(base+2, 2, 3)
	os.Symlink("/etc/hostname", filepath.Join(dir, link))
	fifo := recordName(base+3, 2, 4)
	if err := syscall.Mkfifo(filepath.Join(dir, fifo), 0o600); err != nil {
		t.Fatal(err)
	}
	w2, _ := NewWriter(dir)
	other, _ := w2.Write(started("r2", "other"))

	var bad []string
	r := Reader{Dir: dir, Pipe: "mine", OnBad: func(name string, err error) { bad = append(bad, name) }}
	var got []string
	n, err := r.DrainBatch(func(recs []Record) error {
		for _, rec := range recs {
			got = append(got, rec.Msg.GetRunStarted().GetRunId())
		}
		return nil
	})
	if err != nil || n != 1 || fmt.Sprint(got) != "[r]" {
		t.Fatalf("drain = %d %v %v", n, got, err)
	}
	want := []string{garbage, empty, link, fifo, other}
	if fmt.Sprint(bad) != fmt.Sprint(want) {
		t.Fatalf("set aside %v, want %v", bad, want)
	}
	for _, name := range []string{half, "lock", "state.json", BadPrefix + garbage, BadPrefix + fifo} {
		if _, err := os.Lstat(filepath.Join(dir, name)); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
	// The stale temp file goes once it is old.
	old := time.Now().Add(-2 * time.Hour)
	os.Chtimes(filepath.Join(dir, half), old, old)
	r.DrainBatch(func([]Record) error { return nil })
	if _, err := os.Lstat(filepath.Join(dir, half)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("stale temp file kept: %v", err)
	}
}

func TestNamesIncreaseWhenClockStepsBack(t *testing.T) {
	dir := t.TempDir()
	w, _ := NewWriter(dir)
	future := time.Now().Add(24 * time.Hour)
	w.now = func() time.Time { return future }
	a, _ := w.Write(chunk("r", 0, nil))
	w.now = func() time.Time { return future.Add(-time.Hour) }
	b, _ := w.Write(chunk("r", 1, nil))
	// A new writer (the next run) with the clock back to normal.
	w2, _ := NewWriter(dir)
	c, _ := w2.Write(chunk("r", 2, nil))
	if !(a < b && b < c) {
		t.Fatalf("names out of order: %s %s %s", a, b, c)
	}
	var seqs []uint64
	Drain(dir, func(r Record) error { seqs = append(seqs, r.Msg.GetLogChunk().ChunkSeq); return nil })
	if fmt.Sprint(seqs) != "[0 1 2]" {
		t.Fatalf("order %v", seqs)
	}
}

func TestWriteFileAtomic(t *testing.T) {
	p := filepath.Join(t.TempDir(), "state.json")
	for _, s := range []string{"one", "two-longer"} {
		if err := WriteFileAtomic(p, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
		if b, _ := os.ReadFile(p); string(b) != s {
			t.Fatalf("content %q", b)
		}
	}
	ents, _ := os.ReadDir(filepath.Dir(p))
	if len(ents) != 1 {
		t.Fatalf("left over files: %v", ents)
	}
}

// payload returns a self-checking chunk body: 8 bytes length, 32 bytes
// sha256 of the rest, the rest.
func payload(rng *rand.Rand, size int) []byte {
	rest := make([]byte, size)
	for i := range rest {
		rest[i] = byte(rng.UintN(256))
	}
	sum := sha256.Sum256(rest)
	out := binary.BigEndian.AppendUint64(nil, uint64(size))
	out = append(out, sum[:]...)
	return append(out, rest...)
}

func checkPayload(b []byte) error {
	if len(b) < 40 {
		return fmt.Errorf("short payload: %d bytes", len(b))
	}
	n := binary.BigEndian.Uint64(b)
	rest := b[40:]
	if uint64(len(rest)) != n {
		return fmt.Errorf("payload says %d bytes, has %d", n, len(rest))
	}
	if sha256.Sum256(rest) != [32]byte(b[8:40]) {
		return errors.New("payload checksum mismatch")
	}
	return nil
}

// TestMain doubles as the crash test's writer subprocess.
func TestMain(m *testing.M) {
	if dir := os.Getenv("SPOOL_CRASH_WRITER"); dir != "" {
		crashWriter(dir)
		return
	}
	if dir := os.Getenv("SPOOL_PLAIN_WRITER"); dir != "" {
		w, err := NewWriter(dir)
		if err == nil {
			_, err = w.WriteBatch(started("r", "p"), chunk("r", 0, []byte("hi")))
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// crashWriter writes records until killed, printing the chunk seq of each
// record after its Write returned.
func crashWriter(dir string) {
	run := os.Getenv("SPOOL_CRASH_RUN")
	seed, _ := strconv.ParseUint(os.Getenv("SPOOL_CRASH_SEED"), 10, 64)
	rng := rand.New(rand.NewPCG(seed, 1))
	w, err := NewWriter(dir)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	out := bufio.NewWriter(os.Stdout)
	fmt.Fprintln(out, "ready")
	out.Flush()
	for seq := uint64(0); ; seq++ {
		size := rng.IntN(4096)
		if rng.IntN(4) == 0 {
			size = 256<<10 + rng.IntN(2<<20) // slow writes: more kills mid-write
		}
		write := w.Write
		if seq%3 == 0 {
			write = w.WriteDeferred
		}
		if _, err := write(chunk(run, seq, payload(rng, size))); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		fmt.Fprintln(out, seq)
		out.Flush()
	}
}

// TestCrashSafety kills a writer subprocess at random points while a reader
// drains the same directory: the reader only ever yields complete records,
// in write order, and every record whose Write returned is there.
func TestCrashSafety(t *testing.T) {
	dir := t.TempDir()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 7))
	iterations := 30
	if testing.Short() {
		iterations = 8
	}
	got := map[string][]uint64{} // run -> chunk seqs in drain order
	drain := func() {
		_, err := Drain(dir, func(r Record) error {
			c := r.Msg.GetLogChunk()
			if c == nil {
				return fmt.Errorf("%s: not a log chunk", r.Name)
			}
			if err := checkPayload(c.Data); err != nil {
				return fmt.Errorf("%s: partial record: %w", r.Name, err)
			}
			got[c.RunId] = append(got[c.RunId], c.ChunkSeq)
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	acked := map[string]uint64{}
	for it := range iterations {
		run := fmt.Sprintf("run-%d", it)
		cmd := exec.Command(exe, "-test.run=^$")
		cmd.Env = append(os.Environ(), "SPOOL_CRASH_WRITER="+dir, "SPOOL_CRASH_RUN="+run,
			fmt.Sprintf("SPOOL_CRASH_SEED=%d", rng.Uint64()))
		outPath := filepath.Join(t.TempDir(), "out")
		stdout, err := os.Create(outPath)
		if err != nil {
			t.Fatal(err)
		}
		cmd.Stdout = stdout
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		stdout.Close()
		for start := time.Now(); time.Since(start) < 10*time.Second; time.Sleep(time.Millisecond) {
			if b, _ := os.ReadFile(outPath); len(b) > 0 {
				break
			}
		}
		deadline := time.Now().Add(time.Duration(rng.IntN(80)) * time.Millisecond)
		for time.Now().Before(deadline) {
			drain() // concurrently with the writer
			time.Sleep(time.Millisecond)
		}
		cmd.Process.Signal(syscall.SIGKILL)
		cmd.Wait()
		b, _ := os.ReadFile(outPath)
		lines := strings.Fields(string(b))[1:]
		if len(lines) > 0 {
			n, _ := strconv.ParseUint(lines[len(lines)-1], 10, 64)
			acked[run] = n + 1
		}
	}
	drain()
	total := 0
	for it := range iterations {
		run := fmt.Sprintf("run-%d", it)
		seqs := got[run]
		for i, s := range seqs {
			if s != uint64(i) {
				t.Fatalf("%s: record %d has seq %d (order or gap)", run, i, s)
			}
		}
		// Every acknowledged write is there; at most the one in flight more.
		if n := uint64(len(seqs)); n < acked[run] || n > acked[run]+1 {
			t.Fatalf("%s: %d records, %d acknowledged", run, n, acked[run])
		}
		total += len(seqs)
	}
	if names, _ := List(dir); len(names) != 0 {
		t.Fatalf("records left: %v", names)
	}
	t.Logf("%d writers killed, %d records drained", iterations, total)
}

func TestWriteBatch(t *testing.T) {
	dir := t.TempDir()
	w, _ := NewWriter(dir)
	w.Write(started("r", "p"))
	var batch []*agentpb.AgentMessage
	for i := range 20 {
		batch = append(batch, chunk("r", uint64(i), []byte(fmt.Sprint(i))))
	}
	names, err := w.WriteBatch(batch...)
	if err != nil || len(names) != 20 {
		t.Fatalf("batch: %d %v", len(names), err)
	}
	if _, err := w.WriteBatch(chunk("r", 99, nil), &agentpb.AgentMessage{}); err == nil {
		t.Fatal("empty record accepted")
	}
	var got []string
	Drain(dir, func(r Record) error {
		if c := r.Msg.GetLogChunk(); c != nil {
			got = append(got, string(c.Data))
		}
		return nil
	})
	if len(got) != 20 {
		t.Fatalf("%d chunks", len(got))
	}
	for i, s := range got {
		if s != fmt.Sprint(i) {
			t.Fatalf("chunk %d is %q", i, s)
		}
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Fatalf("left: %v", ents)
	}
}

// TestUnprivilegedWriterRootReader writes a spool as an unprivileged user
// (as a runner with DynamicUser= does, in its own StateDirectory=) and
// drains it as root (the daemon).
func TestUnprivilegedWriterRootReader(t *testing.T) {
	if os.Geteuid() != 0 {
		testkit.Unavailable(t, "needs root")
	}
	const uid = 65534
	root := t.TempDir()
	os.Chmod(root, 0o755)
	os.Chmod(filepath.Dir(root), 0o755)
	exe, _ := os.Executable()
	b, _ := os.ReadFile(exe)
	bin := filepath.Join(root, "writer")
	os.WriteFile(bin, b, 0o755)
	state := filepath.Join(root, "state")
	os.Mkdir(state, 0o700)
	os.Chown(state, uid, uid)
	dir := filepath.Join(state, "spool")

	cmd := exec.Command(bin)
	cmd.Env = []string{"SPOOL_PLAIN_WRITER=" + dir}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: uid}}
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("writer as uid %d: %v %s", uid, err, out)
	}
	names, _ := List(dir)
	for _, n := range names {
		var st syscall.Stat_t
		syscall.Stat(filepath.Join(dir, n), &st)
		if st.Uid != uid || st.Mode&0o777 != 0o600 {
			t.Fatalf("%s: uid %d mode %o", n, st.Uid, st.Mode&0o777)
		}
	}
	n, err := Drain(dir, func(Record) error { return nil })
	if err != nil || n != 2 {
		t.Fatalf("root drained %d: %v", n, err)
	}
}
