package stream

import (
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/drover/drover/manifest"
	agentpb "github.com/drover/drover/proto"
	"github.com/drover/drover/server/store"
)

// FuzzRecordValidation feeds arbitrary wire bytes, decoded as an agent
// message, through the stream's record validation: it never panics, and
// whatever it accepts names only the manifest's pipes, valid run ids, and
// text that is valid UTF-8, bounded and free of control characters (but
// newline and tab in multi-line fields).
func FuzzRecordValidation(f *testing.F) {
	seeds := []*agentpb.AgentMessage{
		{Seq: 1, Body: &agentpb.AgentMessage_RunFinished{RunFinished: &agentpb.RunFinished{RunId: "r1", Pipe: "job", Status: agentpb.RunStatus_RUN_STATUS_FAILED,
			Error: "boom\x00\x1b[31m", Reason: "exit 1\n", Signal: "SIGKILL", WrittenBy: "daemon", FinishedAt: timestamppb.Now()}}},
		{Seq: 2, Body: &agentpb.AgentMessage_RunStarted{RunStarted: &agentpb.RunStarted{RunId: "0190aa-bb", Pipe: "other", RequestId: "req-1"}}},
		{Body: &agentpb.AgentMessage_Hello{Hello: &agentpb.Hello{Hostname: "h\u202e\x7f", MachineId: "0123456789abcdef0123456789abcdef", ManifestDigest: "x"}}},
		{Body: &agentpb.AgentMessage_Heartbeat{Heartbeat: &agentpb.Heartbeat{RunningRunIds: []string{"a", "b\x00"}}}},
		{Seq: 3, Body: &agentpb.AgentMessage_ManifestStatus{ManifestStatus: &agentpb.ManifestStatus{State: agentpb.ManifestStatus_STATE_APPLIED,
			Pipes: []*agentpb.PipeStatus{{Name: "job", ApplyError: "\x1b]0;x\x07"}, {Name: "nope"}}}}},
		{Seq: 4, Body: &agentpb.AgentMessage_LogChunk{LogChunk: &agentpb.LogChunk{RunId: "r1", Data: []byte("\x1b[2J")}}},
	}
	for _, m := range seeds {
		b, err := proto.Marshal(m)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	rules := recordRules{maxChunk: 1024, maxRunning: 64, pipeKnown: func(n string) bool { return n == "job" }}
	f.Fuzz(func(t *testing.T, b []byte) {
		var msg agentpb.AgentMessage
		if proto.Unmarshal(b, &msg) != nil {
			return
		}
		rec, reason, err := toRecord("agt-x", &msg, time.Now(), rules)
		if err != nil {
			if reason == "" || rec != nil {
				t.Fatalf("refused without a reason or with a record: %q %v", reason, err)
			}
			return
		}
		text := func(field, s string, n int, multiline bool) {
			if len(s) > n || !utf8.ValidString(s) || strings.ContainsFunc(s, func(r rune) bool { return unsafeRune(r, multiline) }) {
				t.Fatalf("%s not clean: %q", field, s)
			}
		}
		run := func(r *store.Run) {
			if validRunID(r.ID) != nil || r.Pipe != "job" || (r.RequestID != "" && !validToken(r.RequestID, maxIDLen)) || cleanSignal(r.Signal) != r.Signal ||
				cleanWrittenBy(r.WrittenBy) != r.WrittenBy {
				t.Fatalf("run accepted with bad identifiers: %+v", r)
			}
			text("error", r.Error, maxTextLen, true)
			text("reason", r.Reason, MaxReasonLen, false)
		}
		switch {
		case rec.RunStarted != nil:
			run(rec.RunStarted)
		case rec.RunFinished != nil:
			run(rec.RunFinished)
		case rec.Hello != nil:
			h := rec.Hello
			for field, v := range map[string]string{"hostname": h.Hostname, "os": h.OS, "arch": h.Arch, "version": h.AgentVersion, "backend": h.Backend} {
				text(field, v, 253, false)
			}
			if h.ManifestDigest != "" && !manifest.ValidDigest(h.ManifestDigest) {
				t.Fatalf("digest %q", h.ManifestDigest)
			}
		case rec.Status != nil:
			for _, p := range rec.Status.Pipes {
				if p.Name != "job" {
					t.Fatalf("status of pipe %q kept", p.Name)
				}
				text("apply_error", p.ApplyError, maxPipeError, true)
				text("elapse_mismatch", p.ElapseMismatch, MaxReasonLen, false)
			}
			text("status error", rec.Status.Error, maxTextLen, true)
		case rec.Chunk != nil:
			if validRunID(rec.Chunk.RunID) != nil || len(rec.Chunk.Data) > rules.maxChunk {
				t.Fatalf("chunk accepted: %+v", rec.Chunk)
			}
		case rec.Settle != nil:
			if len(rec.Settle.Running) > rules.maxRunning {
				t.Fatal("too many running ids")
			}
			for id := range rec.Settle.Running {
				if validRunID(id) != nil {
					t.Fatalf("running id %q", id)
				}
			}
		}
	})
}
