package server

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/drover/drover/api"

	agentpb "github.com/drover/drover/proto"
)

// sseEvent is one Server-Sent Event with the time it arrived.
type sseEvent struct {
	id, event, data string
	at              time.Time
}

// readSSE parses events from r onto ch until r ends, then closes ch.
func readSSE(r io.Reader, ch chan<- sseEvent) {
	defer close(ch)
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	var ev sseEvent
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "":
			if ev.event != "" || ev.data != "" {
				ev.at = time.Now()
				ch <- ev
			}
			ev = sseEvent{}
		case strings.HasPrefix(line, ":"):
		default:
			k, v, _ := strings.Cut(line, ":")
			v = strings.TrimPrefix(v, " ")
			switch k {
			case "id":
				ev.id = v
			case "event":
				ev.event = v
			case "data":
				ev.data += v
			}
		}
	}
}

// openSSE opens a run's live log over HTTP/2 (as droverctl does).
func (ts *testServer) openSSE(ctx context.Context, token, run, lastID string) (*http.Response, <-chan sseEvent) {
	ts.t.Helper()
	return ts.openSSEProto(ctx, true, token, run, lastID)
}

// openSSEProto opens a run's live log over HTTP/2 or HTTP/1.1.
func (ts *testServer) openSSEProto(ctx context.Context, h2 bool, token, run, lastID string) (*http.Response, <-chan sseEvent) {
	ts.t.Helper()
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ts.s.CACertPEM())
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}, ForceAttemptHTTP2: h2}}
	req, _ := http.NewRequestWithContext(ctx, "GET", ts.base+"/api/v1/runs/"+run+"/logs/stream", nil)
	req.Header.Set("Accept", "text/event-stream")
	req.Header.Set("Authorization", "Bearer "+token)
	if lastID != "" {
		req.Header.Set("Last-Event-ID", lastID)
	}
	resp, err := client.Do(req)
	if err != nil {
		ts.t.Fatal(err)
	}
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream" || (resp.ProtoMajor == 2) != h2 {
		b, _ := io.ReadAll(resp.Body)
		ts.t.Fatalf("live log: %s %d %s %s", resp.Proto, resp.StatusCode, resp.Header.Get("Content-Type"), b)
	}
	ch := make(chan sseEvent, 64)
	go readSSE(resp.Body, ch)
	return resp, ch
}

func nextEvent(t *testing.T, ch <-chan sseEvent, timeout time.Duration) sseEvent {
	t.Helper()
	select {
	case ev, ok := <-ch:
		if !ok {
			t.Fatal("the live log ended early")
		}
		return ev
	case <-time.After(timeout):
		t.Fatalf("no event within %s", timeout)
	}
	return sseEvent{}
}

// Clients following a run (one over HTTP/2, one over HTTP/1.1) see each
// chunk within 1 s of the agent sending it (the test agent sends LogChunks
// on its stream; the server ingests, commits, and wakes the live logs),
// then the end of the run; a reconnect with Last-Event-ID resumes after
// it. The server's read and write timeouts (1 s here) do not cut the
// streams.
func TestLiveLogsSSE(t *testing.T) {
	ts := startServer(t, func(c *Config) { c.HTTP.WriteTimeout, c.HTTP.ReadTimeout = time.Second, time.Second })
	viewer, _ := ts.apiToken("tail", "viewer", "")
	_, st := ts.jobStream()
	seq := sendAll(t, st, 1, &agentpb.AgentMessage{Body: &agentpb.AgentMessage_RunStarted{RunStarted: &agentpb.RunStarted{RunId: "live", Pipe: "job", PipeVersion: 1}}})
	// A chunk stored before the client connects comes first.
	seq = sendAll(t, st, seq, &agentpb.AgentMessage{Body: &agentpb.AgentMessage_LogChunk{LogChunk: &agentpb.LogChunk{RunId: "live", ChunkSeq: 0, Data: []byte("line 0\n")}}})

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var followers []<-chan sseEvent
	for _, h2 := range []bool{true, false} {
		resp, events := ts.openSSEProto(ctx, h2, viewer, "live", "")
		defer resp.Body.Close()
		ev := nextEvent(t, events, 5*time.Second)
		if ev.event != "chunk" || ev.id != "0" {
			t.Fatalf("first event %+v", ev)
		}
		followers = append(followers, events)
	}
	time.Sleep(1500 * time.Millisecond) // past the read and write timeouts
	const n = 6
	var worst time.Duration
	for i := 1; i < n; i++ {
		sent := time.Now()
		if err := st.stream.Send(&agentpb.AgentMessage{Seq: seq, Body: &agentpb.AgentMessage_LogChunk{LogChunk: &agentpb.LogChunk{RunId: "live", ChunkSeq: uint64(i),
			Stream: agentpb.LogStream_LOG_STREAM_STDERR, Data: fmt.Appendf(nil, "line %d\n", i)}}}); err != nil {
			t.Fatal(err)
		}
		seq++
		for _, events := range followers {
			ev := nextEvent(t, events, 5*time.Second)
			var c api.LogChunk
			if err := json.Unmarshal([]byte(ev.data), &c); err != nil || ev.event != "chunk" || ev.id != fmt.Sprint(i) || c.Seq != uint64(i) ||
				string(c.Data) != fmt.Sprintf("line %d\n", i) || c.Stream != "stderr" {
				t.Fatalf("event %+v (%v)", ev, err)
			}
			if lat := ev.at.Sub(sent); lat > worst {
				worst = lat
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("worst latency from the agent's send to a follower: %s", worst)
	if worst > time.Second {
		t.Fatalf("a chunk took %s to reach the live log", worst)
	}
	sendAll(t, st, seq, &agentpb.AgentMessage{Body: &agentpb.AgentMessage_RunFinished{RunFinished: &agentpb.RunFinished{RunId: "live", Pipe: "job",
		Status: agentpb.RunStatus_RUN_STATUS_SUCCEEDED, LogChunks: n, DurationMs: 10}}})
	for _, events := range followers {
		ev := nextEvent(t, events, 5*time.Second)
		var run api.Run
		if err := json.Unmarshal([]byte(ev.data), &run); err != nil || ev.event != "end" || run.Status != "succeeded" || run.ID != "live" {
			t.Fatalf("end event %+v", ev)
		}
		if _, ok := <-events; ok {
			t.Fatal("the stream went on after the end event")
		}
	}

	// Resume after chunk 3: chunks 4 and 5, then the end at once.
	resp2, events2 := ts.openSSE(ctx, viewer, "live", "3")
	defer resp2.Body.Close()
	var got []string
	for ev := range events2 {
		got = append(got, ev.event+":"+ev.id)
	}
	if strings.Join(got, " ") != "chunk:4 chunk:5 end:" {
		t.Fatalf("resumed stream: %v", got)
	}

	// Errors come before the stream starts.
	if r := ts.do("GET", "/api/v1/runs/nope/logs/stream", viewer, nil); r.code != 404 || r.errorCode() != "not_found" {
		t.Fatalf("unknown run: %d %s", r.code, r.body)
	}
	if r := ts.doCT("GET", "/api/v1/runs/live/logs/stream", viewer, "", nil, "Last-Event-ID", "x"); r.code != 400 {
		t.Fatalf("bad Last-Event-ID: %d %s", r.code, r.body)
	}
}
