package stream

import (
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	agentpb "github.com/drover/drover/proto"

	"github.com/drover/drover/api"
	"github.com/drover/drover/manifest"
	"github.com/drover/drover/server/store"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// MaxManifestPipes bounds the pipes of one manifest that a ManifestStatus
// may list and that the server takes from a manifest.
const MaxManifestPipes = 10000

// Limits on strings in records.
const (
	maxIDLen     = 128
	maxTextLen   = 4096
	MaxReasonLen = 256
	maxPipeInfo  = 64
	maxPipeError = 1024
	maxFireTimes = 16
	maxDropIns   = 32
)

// CleanText makes agent text safe to store and show: valid UTF-8, at most n
// bytes, and every control character (C0 but newline and tab when
// multiline, DEL, C1), bidirectional override and line separator written as
// a visible \xNN or \uNNNN escape, so that no NUL, ANSI escape sequence or
// forged line reaches the database, a terminal or a page raw.
func CleanText(s string, n int, multiline bool) string {
	clean := true
	for _, r := range s {
		if r == utf8.RuneError || unsafeRune(r, multiline) {
			clean = false
			break
		}
	}
	if !clean {
		var b strings.Builder
		for _, r := range s { // invalid bytes arrive as U+FFFD
			switch {
			case !unsafeRune(r, multiline):
				b.WriteRune(r)
			case r < 0x100:
				fmt.Fprintf(&b, "\\x%02x", r)
			default:
				fmt.Fprintf(&b, "\\u%04x", r)
			}
			if b.Len() > n {
				break
			}
		}
		s = b.String()
	}
	if len(s) > n {
		s = s[:n]
		for !utf8.ValidString(s) {
			s = s[:len(s)-1]
		}
	}
	return s
}

func unsafeRune(r rune, multiline bool) bool {
	switch {
	case r == '\n' || r == '\t':
		return !multiline
	case r < 0x20, r == 0x7f, r >= 0x80 && r < 0xa0:
		return true
	case r >= 0x202a && r <= 0x202e, r >= 0x2066 && r <= 0x2069, r == 0x2028, r == 0x2029, r == 0x200e, r == 0x200f:
		return true
	}
	return false
}

// validRunID: 1-128 of letters, digits and . _ : - (UUIDs, systemd
// invocation ids, request ids).
func validRunID(id string) error {
	if !validToken(id, maxIDLen) {
		return fmt.Errorf("run_id must be 1-%d letters, digits, '.', '_', ':' or '-'", maxIDLen)
	}
	return nil
}

func validToken(id string, n int) bool {
	if id == "" || len(id) > n {
		return false
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '.' || c == '_' || c == ':' || c == '-') {
			return false
		}
	}
	return true
}

// cleanSignal keeps a signal name such as SIGKILL (or a number); anything
// else is stored as "invalid".
func cleanSignal(sig string) string {
	if sig == "" {
		return ""
	}
	if len(sig) > 16 {
		return "invalid"
	}
	for i := 0; i < len(sig); i++ {
		c := sig[i]
		if !('A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '+' || c == '-') {
			return "invalid"
		}
	}
	return sig
}

func cleanRequestID(id string) string {
	if validToken(id, maxIDLen) {
		return id
	}
	return ""
}

func cleanWrittenBy(w string) string {
	switch w {
	case "runner", "daemon":
		return w
	}
	return ""
}

func cleanDigest(d string) string {
	if manifest.ValidDigest(d) {
		return d
	}
	return ""
}

func ts(t *timestamppb.Timestamp) time.Time {
	if t == nil || (t.GetSeconds() == 0 && t.GetNanos() == 0) {
		return time.Time{}
	}
	return t.AsTime().UTC()
}

// recordRules are what toRecord checks a message against.
type recordRules struct {
	maxChunk   int
	maxRunning int
	// pipeKnown reports whether the agent's manifest names a pipe.
	pipeKnown func(string) bool
}

// Reasons for which an agent record is refused (the reason label of
// drover_agent_records_refused_total).
const (
	refusedInvalid     = "invalid"
	refusedUnknownPipe = "unknown_pipe"
	refusedTooLarge    = "too_large"
)

// RefusalReasons lists the reasons for which a record is refused.
func RefusalReasons() []string { return []string{refusedInvalid, refusedUnknownPipe, refusedTooLarge} }

// toRecord converts and checks one agent message. Identifiers (run ids,
// pipe names) must be valid, and pipes named by the agent's manifest, or
// the record is refused with a reason; text is bounded and escaped
// (CleanText); enumerations outside their sets are refused or dropped.
func toRecord(agentID string, msg *agentpb.AgentMessage, now time.Time, rules recordRules) (*store.Record, string, error) {
	r := &store.Record{AgentID: agentID, Received: now, Seq: msg.GetSeq()}
	pipe := func(name string) error {
		if !manifest.ValidName(name) {
			return fmt.Errorf("pipe %q is not a valid pipe name", CleanText(name, maxPipeInfo, false))
		}
		if rules.pipeKnown == nil || !rules.pipeKnown(name) {
			return fmt.Errorf("pipe %s is not in this agent's manifest", name)
		}
		return nil
	}
	// run checks the run id and the pipe of a run record: the refusal
	// reason and why, or nil.
	run := func(id, name string) (string, error) {
		if err := validRunID(id); err != nil {
			return refusedInvalid, err
		}
		if err := pipe(name); err != nil {
			return refusedUnknownPipe, err
		}
		return "", nil
	}
	switch b := msg.GetBody().(type) {
	case *agentpb.AgentMessage_Hello:
		h := b.Hello
		r.Hello = &store.HelloRecord{
			AgentVersion: CleanText(h.GetAgentVersion(), maxPipeInfo, false), OS: CleanText(h.GetOs(), maxPipeInfo, false), Arch: CleanText(h.GetArch(), maxPipeInfo, false),
			Hostname: CleanText(h.GetHostname(), 253, false), Backend: CleanText(h.GetBackend(), maxPipeInfo, false), Scope: CleanText(h.GetScope(), maxPipeInfo, false),
			SystemdVersion: CleanText(h.GetSystemdVersion(), maxPipeInfo, false), ManifestSerial: h.GetManifestSerial(), ManifestDigest: cleanDigest(h.GetManifestDigest()),
			MachineID: strings.ToLower(h.GetMachineId()),
		}
	case *agentpb.AgentMessage_Heartbeat:
		hb := b.Heartbeat
		ids := hb.GetRunningRunIds()
		if len(ids) > rules.maxRunning {
			return nil, refusedTooLarge, fmt.Errorf("heartbeat lists %d running runs, at most %d", len(ids), rules.maxRunning)
		}
		if hb.GetOutboxRecords() == 0 {
			// Every record the agent had is acknowledged, so committed:
			// its running list is the whole truth.
			st := &store.SettleRecord{Running: make(map[string]bool, len(ids)), SentAt: ts(hb.GetSentAt())}
			for _, id := range ids {
				if err := validRunID(id); err != nil {
					return nil, refusedInvalid, fmt.Errorf("running_run_ids: %w", err)
				}
				st.Running[id] = true
			}
			r.Settle = st
		}
	case *agentpb.AgentMessage_ManifestStatus:
		m := b.ManifestStatus
		if len(m.GetPipes()) > MaxManifestPipes {
			return nil, refusedTooLarge, fmt.Errorf("ManifestStatus lists %d pipes, at most %d", len(m.GetPipes()), MaxManifestPipes)
		}
		st := &store.StatusRecord{State: api.ManifestStateName(m.GetState()), Error: CleanText(m.GetError(), maxTextLen, true), AppliedSerial: m.GetAppliedSerial(),
			At: ts(m.GetAt()), Expired: m.GetManifestExpired(), ExpiresAt: ts(m.GetExpiresAt())}
		if st.State == "" {
			return nil, refusedInvalid, fmt.Errorf("ManifestStatus with state %v", m.GetState())
		}
		for _, p := range m.GetPipes() {
			if pipe(p.GetName()) != nil {
				continue // only the manifest's pipes are shown: bounded by it
			}
			ps := api.PipeStatus{Name: p.GetName(), Version: p.GetVersion(), ApplyError: CleanText(p.GetApplyError(), maxPipeError, true), DriftRestored: p.GetDriftRestored(),
				ElapseMismatch: CleanText(p.GetElapseMismatch(), MaxReasonLen, false), LeaseEnded: p.GetLeaseEnded(), LeaseUntil: ts(p.GetLeaseUntil())}
			for i, t := range p.GetNextFireTimes() {
				if i == maxFireTimes {
					break
				}
				ps.NextFireTimes = append(ps.NextFireTimes, ts(t))
			}
			for i, d := range p.GetDropInsRemoved() {
				if i == maxDropIns {
					break
				}
				ps.DropInsRemoved = append(ps.DropInsRemoved, CleanText(d, MaxReasonLen, false))
			}
			st.Pipes = append(st.Pipes, ps)
		}
		r.Status = st
	case *agentpb.AgentMessage_RunStarted:
		x := b.RunStarted
		if reason, err := run(x.GetRunId(), x.GetPipe()); err != nil {
			return nil, reason, err
		}
		r.RunStarted = &store.Run{ID: x.GetRunId(), Pipe: x.GetPipe(), PipeVersion: x.GetPipeVersion(), Trigger: api.TriggerName(x.GetTrigger()),
			StartedAt: ts(x.GetStartedAt()), ScheduledAt: ts(x.GetScheduledAt()), RequestID: cleanRequestID(x.GetRequestId()), Attempts: x.GetAttempt()}
	case *agentpb.AgentMessage_RunFinished:
		x := b.RunFinished
		if reason, err := run(x.GetRunId(), x.GetPipe()); err != nil {
			return nil, reason, err
		}
		st, ok := api.RunStatusName(x.GetStatus())
		if !ok {
			return nil, refusedInvalid, fmt.Errorf("RunFinished with status %v", x.GetStatus())
		}
		r.RunFinished = &store.Run{ID: x.GetRunId(), Pipe: x.GetPipe(), PipeVersion: x.GetPipeVersion(), Trigger: api.TriggerName(x.GetTrigger()),
			Status: st, ExitCode: int(x.GetExitCode()), Signal: cleanSignal(x.GetSignal()), StartedAt: ts(x.GetStartedAt()), FinishedAt: ts(x.GetFinishedAt()),
			DurationMS: max(0, x.GetDurationMs()), Error: CleanText(x.GetError(), maxTextLen, true), LogChunks: x.GetLogChunks(), ScheduledAt: ts(x.GetScheduledAt()),
			RequestID: cleanRequestID(x.GetRequestId()), Reason: CleanText(x.GetReason(), MaxReasonLen, false), Attempts: x.GetAttempts(),
			WrittenBy: cleanWrittenBy(x.GetWrittenBy())}
		r.RunFinished.Output, r.RunFinished.Metrics, r.RunFinished.TelemetryNotes = cleanTelemetry(x)
	case *agentpb.AgentMessage_LogChunk:
		x := b.LogChunk
		if err := validRunID(x.GetRunId()); err != nil {
			return nil, refusedInvalid, err
		}
		if len(x.GetData()) > rules.maxChunk {
			return nil, refusedTooLarge, fmt.Errorf("log chunk of %d bytes, at most %d", len(x.GetData()), rules.maxChunk)
		}
		stream := api.LogStreamName(x.GetStream())
		if stream == "" {
			stream = "stdout"
		}
		r.Chunk = &store.LogChunk{RunID: x.GetRunId(), Seq: x.GetChunkSeq(), Stream: stream, Data: x.GetData(), At: ts(x.GetAt())}
	default:
		return nil, refusedInvalid, errors.New("unknown message")
	}
	return r, "", nil
}
