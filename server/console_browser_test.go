package server

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	cdplog "github.com/chromedp/cdproto/log"
	cdppage "github.com/chromedp/cdproto/page"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"

	"github.com/drover/drover/api"
	"github.com/drover/drover/internal/testkit"
	agentpb "github.com/drover/drover/proto"
	"github.com/drover/drover/server/store"
)

// browser is a headless Chromium driven over the DevTools protocol, with
// the console errors and dialogs it saw.
type browser struct {
	t    *testing.T
	ctx  context.Context
	base string
	shot string // screenshot directory

	mu      sync.Mutex
	errors  []string
	dialogs []string
}

// startBrowser starts Debian's chromium (a missing one skips, or fails with
// CI=true) trusting only the test server's own certificate.
func startBrowser(t *testing.T, ts *testServer) *browser {
	exe := testkit.RequireCommand(t, "chromium", "Debian package chromium; scripts/deps.sh installs it")
	resp, err := ts.client.Get(ts.base + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	spki := sha256.Sum256(resp.TLS.PeerCertificates[0].RawSubjectPublicKeyInfo)
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(exe), chromedp.Headless, chromedp.NoSandbox, chromedp.DisableGPU, chromedp.NoFirstRun,
		chromedp.NoDefaultBrowserCheck, chromedp.UserDataDir(t.TempDir()),
		chromedp.Flag("disable-background-networking", true), chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true), chromedp.Flag("disable-dev-shm-usage", true),
		// Only the test server's key is trusted, nothing else.
		chromedp.Flag("ignore-certificate-errors-spki-list", base64.StdEncoding.EncodeToString(spki[:])),
		chromedp.WindowSize(1280, 800),
	}
	actx, cancelA := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancelC := chromedp.NewContext(actx)
	ctx, cancelT := context.WithTimeout(ctx, 3*time.Minute)
	t.Cleanup(func() { cancelT(); cancelC(); cancelA() })
	shot := filepath.Join(os.TempDir(), "drover-console-screenshots-"+time.Now().Format("20060102-150405"))
	if err := os.MkdirAll(shot, 0o755); err != nil {
		t.Fatal(err)
	}
	b := &browser{t: t, ctx: ctx, base: ts.base, shot: shot}
	if err := chromedp.Do(ctx); err != nil { // starts the browser
		t.Fatalf("chromium: %v", err)
	}
	err = chromedp.Listen(ctx, func(ev any) {
		b.mu.Lock()
		defer b.mu.Unlock()
		switch e := ev.(type) {
		case *runtime.EventConsoleAPICalled:
			if e.Type == runtime.ConsoleAPICalledTypeError || e.Type == runtime.ConsoleAPICalledTypeAssert {
				var parts []string
				for _, a := range e.Args {
					parts = append(parts, string(a.Value)+a.Description)
				}
				b.errors = append(b.errors, "console."+string(e.Type)+": "+strings.Join(parts, " "))
			}
		case *runtime.EventExceptionThrown:
			b.errors = append(b.errors, "exception: "+e.ExceptionDetails.Text)
		case *cdplog.EventEntryAdded:
			if e.Entry.Level == cdplog.EntryLevelError {
				b.errors = append(b.errors, "log: "+e.Entry.Text+" "+e.Entry.URL)
			}
		case *cdppage.EventJavascriptDialogOpening:
			b.dialogs = append(b.dialogs, e.Message)
			go func() {
				_, _ = chromedp.Call(ctx, cdppage.HandleJavaScriptDialog, cdppage.HandleJavaScriptDialogParams{})
			}()
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, err := range []error{call(ctx, cdplog.Enable), call(ctx, runtime.Enable)} {
		if err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("console screenshots: %s", shot)
	return b
}

func call(ctx context.Context, cmd cdp.Command[cdp.Empty, cdp.Empty]) error {
	_, err := chromedp.Call(ctx, cmd, cdp.Empty{})
	return err
}

func (b *browser) run(actions ...chromedp.Action[chromedp.Void]) {
	b.t.Helper()
	if err := chromedp.Do(b.ctx, actions...); err != nil {
		b.t.Fatalf("browser: %v", err)
	}
}

// js runs a script (awaiting a promise it returns) for its side effects.
func js(expr string) chromedp.Action[chromedp.Void] {
	return func(ctx context.Context, t *chromedp.Target) (chromedp.Void, error) {
		return chromedp.Evaluate[chromedp.Void](expr, chromedp.EvalAwaitPromise)(ctx, t)
	}
}

func must[T any](b *browser, a chromedp.Action[T]) T {
	b.t.Helper()
	v, err := chromedp.Run(b.ctx, a)
	if err != nil {
		b.t.Fatalf("browser: %v", err)
	}
	return v
}

// show switches the page to a view and waits until it has drawn.
func (b *browser) show(hash, view string) {
	b.t.Helper()
	b.run(js(`document.getElementById('view').removeAttribute('data-ready'); location.hash = `+jsString(hash)),
		chromedp.WaitVisible(chromedp.CSS(`#view[data-ready="true"][data-view="`+view+`"]`)))
}

// shoot writes screenshots of the page at a desktop and a phone size.
func (b *browser) shoot(name string) {
	b.t.Helper()
	for _, sz := range [][2]int64{{390, 844}, {1280, 800}} {
		b.run(chromedp.EmulateViewport(sz[0], sz[1]), chromedp.Sleep(100*time.Millisecond))
		buf := must(b, chromedp.CaptureScreenshot())
		if err := os.WriteFile(filepath.Join(b.shot, fmt.Sprintf("%s-%dx%d.png", name, sz[0], sz[1])), buf, 0o644); err != nil {
			b.t.Fatal(err)
		}
	}
}

func (b *browser) text(sel string) string {
	b.t.Helper()
	return must(b, chromedp.TextContent(chromedp.CSS(sel)))
}

// eval runs a script (awaiting a promise it returns) for its value.
func eval[T any](b *browser, expr string) T {
	b.t.Helper()
	return must(b, chromedp.Evaluate[T](expr, chromedp.EvalAwaitPromise))
}

func (b *browser) count(sel string) int {
	b.t.Helper()
	return eval[int](b, `document.querySelectorAll(`+jsString(sel)+`).length`)
}

func (b *browser) login(token string) {
	b.t.Helper()
	b.run(chromedp.WaitVisible(chromedp.CSS(`#token`)), chromedp.SetValue(chromedp.CSS(`#token`), token),
		chromedp.Click(chromedp.CSS(`#login-form button[type=submit]`)), chromedp.WaitVisible(chromedp.CSS(`#logout`)))
}

func (b *browser) takeErrors() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	e := b.errors
	b.errors = nil
	return e
}

func jsString(s string) string {
	return "'" + strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(s) + "'"
}

// The console in a real headless Chromium against a real server over TLS
// with an agent on its stream: log in, the fleet, a pipe applied through
// the API appears, run it now from the page and follow its log live (a
// log with <script> and ANSI escapes renders as text), cancel it, restore
// an old version, create and revoke tokens, log out; a viewer sees no
// mutating control and its forged POST is refused, as are a mutation
// without the CSRF header and one from another origin; no console errors.
func TestConsoleBrowser(t *testing.T) {
	ts := startServer(t)
	agent, st := ts.jobStream()
	viewer, _ := ts.apiToken("watcher", "viewer", "")
	// History for the fleet page: a failed run.
	seq := sendAll(t, st, 1,
		&agentpb.AgentMessage{Body: &agentpb.AgentMessage_RunStarted{RunStarted: &agentpb.RunStarted{RunId: "old-fail", Pipe: "job", PipeVersion: 1, Trigger: agentpb.Trigger_TRIGGER_SCHEDULE}}},
		&agentpb.AgentMessage{Body: &agentpb.AgentMessage_RunFinished{RunFinished: &agentpb.RunFinished{RunId: "old-fail", Pipe: "job", PipeVersion: 1,
			Status: agentpb.RunStatus_RUN_STATUS_FAILED, ExitCode: 1, DurationMs: 10}}})

	b := startBrowser(t, ts)
	b.run(chromedp.Navigate(ts.base + "/ui/"))
	b.shoot("login")
	b.login(ts.admin)
	b.run(chromedp.WaitVisible(chromedp.CSS(`#view[data-ready="true"][data-view="fleet"]`)))
	if got := b.text(`[data-count="online"] .n`); got != "1" {
		t.Fatalf("fleet: %s agents online, want 1", got)
	}
	if got := b.text(`#who`); !strings.Contains(got, "admin") {
		t.Fatalf("who: %q", got)
	}
	// The failed run colours its hour in the heatmap.
	if bg := eval[string](b, `getComputedStyle(document.querySelector('.heat .cell.s-failed')).backgroundColor`); bg != "rgb(192, 57, 43)" {
		t.Fatalf("the failed hour is coloured %q", bg)
	}
	b.shoot("fleet")

	// A pipe applied through the API appears on the pipes page.
	ts.putScriptPipe("fresh", "echo fresh", map[string]string{"job": "yes"})
	b.show("#/pipes", "pipes")
	b.run(chromedp.WaitVisible(chromedp.CSS(`tr[data-pipe="fresh"]`)), chromedp.WaitVisible(chromedp.CSS(`tr[data-pipe="job"]`)))
	b.shoot("pipes")

	// A placement: one pipe's page names its holder and lease.
	ts.adminOK("PUT", "/api/v1/pipes/solo", map[string]any{"spec": map[string]any{"schedule": "@daily", "script": "true", "placement": "one",
		"targets": map[string]any{"tags": map[string]string{"job": "yes"}}}}, nil)
	b.show("#/pipe/solo", "pipe")
	if got := b.text(`#placement`); !strings.Contains(got, "held by "+agent.id) || !strings.Contains(got, "lease until") {
		t.Fatalf("placement line %q", got)
	}
	ts.adminOK("DELETE", "/api/v1/pipes/solo", nil, nil)

	// Run now from the pipe page; the agent gets RunNow.
	b.show("#/pipe/job", "pipe")
	if n := b.count(`#run-agent option[value="` + agent.id + `"]`); n != 1 {
		t.Fatalf("the agent is not offered for run now (%d)", n)
	}
	b.run(chromedp.Click(chromedp.CSS(`#run-now button[type=submit]`)), chromedp.WaitVisible(chromedp.CSS(`#run-result a`)))
	var reqID string
	testkit.WaitFor(t, 10*time.Second, "RunNow on the agent's stream", func() bool {
		st.mu.Lock()
		defer st.mu.Unlock()
		if len(st.runNows) > 0 {
			reqID = st.runNows[0].GetRequestId()
		}
		return reqID != ""
	})
	b.shoot("pipe")
	seq = sendAll(t, st, seq,
		&agentpb.AgentMessage{Body: &agentpb.AgentMessage_RunStarted{RunStarted: &agentpb.RunStarted{RunId: "web-1", Pipe: "job", PipeVersion: 1, Trigger: agentpb.Trigger_TRIGGER_API, RequestId: reqID}}},
		&agentpb.AgentMessage{Body: &agentpb.AgentMessage_LogChunk{LogChunk: &agentpb.LogChunk{RunId: "web-1", ChunkSeq: 0, Data: []byte("first line\n")}}})

	// Its log arrives live, as text.
	b.show("#/run/web-1", "run")
	b.run(chromedp.WaitVisible(chromedp.CSS(`#log-state`)))
	if got := b.text(`#log-state`); got != "live" {
		t.Fatalf("log state %q", got)
	}
	evil := "<script>alert(1)</script><img src=x onerror=alert(2)>\x1b[31mred\x1b[0m\n"
	seq = sendAll(t, st, seq, &agentpb.AgentMessage{Body: &agentpb.AgentMessage_LogChunk{LogChunk: &agentpb.LogChunk{RunId: "web-1", ChunkSeq: 1, Data: []byte(evil)}}})
	want := "first line\n<script>alert(1)</script><img src=x onerror=alert(2)>red\n"
	testkit.WaitFor(t, 10*time.Second, "the live log in the page", func() bool { return b.text(`#log`) == want })
	if n := b.count(`#log *`); n != 0 {
		t.Fatalf("the log made %d elements", n)
	}
	b.shoot("run")
	// Cancel it from the page; the agent gets CancelRun and reports the end.
	b.run(chromedp.Click(chromedp.CSS(`#cancel-run`)))
	testkit.WaitFor(t, 10*time.Second, "CancelRun on the agent's stream", func() bool {
		st.mu.Lock()
		defer st.mu.Unlock()
		return len(st.cancels) > 0 && st.cancels[0] == "web-1"
	})
	seq = sendAll(t, st, seq, &agentpb.AgentMessage{Body: &agentpb.AgentMessage_RunFinished{RunFinished: &agentpb.RunFinished{RunId: "web-1", Pipe: "job", PipeVersion: 1,
		Status: agentpb.RunStatus_RUN_STATUS_CANCELED, Signal: "SIGTERM", LogChunks: 2, DurationMs: 1500,
		Output: "rows=42 <b>bold</b>", Metrics: []*agentpb.MetricSample{{Name: "job_rows", Value: 42, Type: "gauge", Labels: map[string]string{"table": "users"}}}}}})
	testkit.WaitFor(t, 10*time.Second, "the end of the run in the page", func() bool { return b.text(`#log-state`) == "ended" })
	if got := b.text(`#run-status`); got != "canceled" {
		t.Fatalf("run status %q", got)
	}
	// Its telemetry, as text.
	testkit.WaitFor(t, 10*time.Second, "the run's telemetry in the page", func() bool { return b.count(`tr[data-metric="job_rows"]`) == 1 })
	if got := b.text(`#run-output`); got != "rows=42 <b>bold</b>" || b.count(`#run-output *`) != 0 {
		t.Fatalf("run output %q", got)
	}
	_ = seq

	// Restore an old version.
	ts.putScriptPipe("job", "echo v2", map[string]string{"job": "yes"})
	b.show("#/pipe/job", "pipe")
	b.run(chromedp.Click(chromedp.CSS(`button[data-restore="1"]`)))
	testkit.WaitFor(t, 10*time.Second, "version 3 restored from version 1", func() bool {
		var p api.Pipe
		ts.adminOK("GET", "/api/v1/pipes/job", nil, &p)
		return p.Version == 3 && p.Spec.Script == "echo job"
	})

	// Agents, agent, audit, events.
	b.show("#/agents", "agents")
	b.run(chromedp.WaitVisible(chromedp.CSS(`tr[data-agent="` + agent.id + `"]`)))
	b.shoot("agents")
	b.show("#/agent/"+agent.id, "agent")
	b.run(chromedp.WaitVisible(chromedp.CSS(`#tags-form`)))
	b.shoot("agent")
	b.show("#/audit", "audit")
	b.shoot("audit")
	b.show("#/events", "events")
	b.shoot("events")
	b.show("#/runs", "runs")
	b.shoot("runs")

	// Notifications: channels with their delivery status and rules; an admin
	// sends a test through a real receiver; the channel's secret is never shown.
	var hookMu sync.Mutex
	hookPosts := 0
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Drover-Signature") != "" {
			hookMu.Lock()
			hookPosts++
			hookMu.Unlock()
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	defer hook.Close()
	hookSecret := "console-hook-secret-4711"
	ts.adminOK("PUT", "/api/v1/notify/channels/ops-hook", api.NotifyChannel{Kind: "webhook", URL: hook.URL, Secret: &hookSecret}, nil)
	ts.adminOK("PUT", "/api/v1/notify/rules/failures", api.NotifyRule{Kinds: []string{"run.failed"}, Channels: []string{"ops-hook"}}, nil)
	b.show("#/notify", "notify")
	b.run(chromedp.WaitVisible(chromedp.CSS(`tr[data-channel="ops-hook"]`)), chromedp.WaitVisible(chromedp.CSS(`tr[data-rule="failures"]`)))
	b.run(chromedp.Click(chromedp.CSS(`button[data-test-channel="ops-hook"]`)), chromedp.WaitVisible(chromedp.CSS(`#view p.ok`)))
	testkit.WaitFor(t, 10*time.Second, "the console's test notification at the receiver", func() bool {
		hookMu.Lock()
		defer hookMu.Unlock()
		return hookPosts == 1
	})
	if page := b.text(`#view`); strings.Contains(page, hookSecret) || !strings.Contains(page, "run.failed") {
		t.Fatalf("notifications page: secret shown or rule missing: %q", page)
	}
	b.shoot("notify")

	// Tokens: a new secret is shown once; a token is revoked.
	_, victim := ts.apiToken("victim", "viewer", "")
	b.show("#/tokens", "tokens")
	b.run(chromedp.SetValue(chromedp.CSS(`#api-token-name`), "made-in-browser"), chromedp.Click(chromedp.CSS(`#api-token-form button[type=submit]`)),
		chromedp.WaitVisible(chromedp.CSS(`#new-secret .secret`)))
	if s := b.text(`#new-secret .secret`); !strings.HasPrefix(s, "drvt1.") {
		t.Fatalf("new token secret %q", s)
	}
	b.shoot("tokens")
	b.run(chromedp.Click(chromedp.CSS(`tr[data-token="`+victim+`"] button[data-action="revoke"]`)),
		chromedp.Click(chromedp.CSS(`tr[data-token="`+victim+`"] button[data-action="confirm"]`)))
	testkit.WaitFor(t, 10*time.Second, "the token revoked", func() bool {
		var l api.APITokenList
		ts.adminOK("GET", "/api/v1/api-tokens", nil, &l)
		for _, tk := range l.Tokens {
			if tk.ID == victim {
				return tk.RevokedAt != nil
			}
		}
		return false
	})

	// So far no console error, no dialog, and the CSP was in force.
	if errs := b.takeErrors(); len(errs) > 0 {
		t.Fatalf("console errors: %q", errs)
	}
	csp := eval[string](b, `fetch('/ui/').then(r => r.headers.get('Content-Security-Policy'))`)
	if !strings.Contains(csp, "script-src 'self'") {
		t.Fatalf("CSP %q", csp)
	}

	// A mutation without the CSRF header is refused, even from the page.
	code := eval[int](b, `fetch('/api/v1/pipes/job/run', {method: 'POST', headers: {'Content-Type': 'application/json'}, body: '{}'}).then(r => r.status)`)
	if code != 403 {
		t.Fatalf("a POST without the CSRF header: %d", code)
	}
	// From another origin (localhost is another site than 127.0.0.1) the
	// cookie is not sent, and the mutation does not happen.
	runNows := func() int { st.mu.Lock(); defer st.mu.Unlock(); return len(st.runNows) }
	before := runNows()
	other := strings.Replace(ts.base, "127.0.0.1", "localhost", 1)
	b.run(chromedp.Navigate(other + "/ui/"))
	b.run(chromedp.WaitVisible(chromedp.CSS(`#token`))) // not logged in there
	// The promise settles once the server has answered.
	b.run(js(`fetch(` + jsString(ts.base+"/api/v1/pipes/job/run") + `, {method: 'POST', credentials: 'include', mode: 'no-cors', body: '{}'}).then(() => 1, () => 1)`))
	if n := runNows(); n != before {
		t.Fatalf("a cross-origin POST ran the pipe")
	}

	// Log out; a viewer sees no mutating control and its forged POST is refused.
	b.run(chromedp.Navigate(ts.base+"/ui/"), chromedp.WaitVisible(chromedp.CSS(`#logout`)), chromedp.Click(chromedp.CSS(`#logout`)),
		chromedp.WaitVisible(chromedp.CSS(`#token`)))
	b.login(viewer)
	b.run(chromedp.WaitVisible(chromedp.CSS(`#who[data-role="viewer"]`)))
	mutating := `#run-now, [data-restore], [data-cancel], #cancel-run, #tags-form, [data-action], #api-token-form, #enroll-token-form, [data-test-channel]`
	for _, v := range [][2]string{{"#/pipe/job", "pipe"}, {"#/agent/" + agent.id, "agent"}, {"#/runs", "runs"}, {"#/tokens", "tokens"}, {"#/fleet", "fleet"}, {"#/notify", "notify"}} {
		b.show(v[0], v[1])
		time.Sleep(300 * time.Millisecond) // paged lists fill in after the view
		if n := b.count(mutating); n != 0 {
			t.Fatalf("the viewer sees %d mutating controls on %s", n, v[0])
		}
	}
	if n := b.count(`#nav a[href="#/tokens"]:not([hidden])`); n != 0 {
		t.Fatal("the viewer sees the tokens page")
	}
	b.show("#/pipe/job", "pipe")
	b.shoot("pipe-viewer")
	code = eval[int](b, `fetch('/ui/session').then(r => r.json()).then(s => fetch('/api/v1/pipes/job/run', {method: 'POST', headers: {'Content-Type': 'application/json', 'X-CSRF-Token': s.csrf}, body: '{}'})).then(r => r.status)`)
	if code != 403 {
		t.Fatalf("the viewer's forged POST: %d", code)
	}
	b.mu.Lock()
	dialogs := b.dialogs
	b.mu.Unlock()
	if len(dialogs) > 0 {
		t.Fatalf("dialogs opened (script ran): %q", dialogs)
	}
}

// The fleet page with 10,000 agents, 1,000 pipes and 24 hours of runs:
// time to first contentful paint, to the page drawn, and the bytes
// transferred, measured in the browser (the figures are in the README).
func TestConsoleBrowserLargeFleet(t *testing.T) {
	testkit.RequireCommand(t, "chromium", "Debian package chromium; scripts/deps.sh installs it")
	ts := startServer(t)
	ctx := context.Background()
	for i := range 1000 {
		spec := map[string]any{"schedule": "0 * * * *", "script": "true", "targets": map[string]any{"tags": map[string]string{"role": "web", "pipe": fmt.Sprint(i)}}}
		ts.adminOK("PUT", fmt.Sprintf("/api/v1/pipes/p%04d", i), map[string]any{"spec": spec}, nil)
	}
	db := ts.db()
	seedAgents(t, db, 10000)
	// Runs of the last 24 hours: per pipe one an hour, some failed.
	start := time.Now().Add(-23 * time.Hour).Truncate(time.Hour)
	var recs []*store.Record
	flush := func() {
		if err := db.ApplyRecords(ctx, recs, store.IngestLimits{MaxLogBytes: 1 << 20}); err != nil {
			t.Fatal(err)
		}
		recs = recs[:0]
	}
	for p := range 1000 {
		for h := range 24 {
			at := start.Add(time.Duration(h) * time.Hour)
			id := fmt.Sprintf("r-%04d-%02d", p, h)
			status := "succeeded"
			if (p+h)%97 == 0 {
				status = "failed"
			}
			agent := fmt.Sprintf("agt-bench-%05d", (p*24+h)%10000)
			recs = append(recs, &store.Record{AgentID: agent, Received: at, RunStarted: &store.Run{ID: id, Pipe: fmt.Sprintf("p%04d", p), PipeVersion: 1, Trigger: "schedule", StartedAt: at, ScheduledAt: at}},
				&store.Record{AgentID: agent, Received: at, RunFinished: &store.Run{ID: id, Pipe: fmt.Sprintf("p%04d", p), PipeVersion: 1, Trigger: "schedule", Status: status, StartedAt: at, FinishedAt: at.Add(time.Second), ScheduledAt: at}})
			if len(recs) >= 2000 {
				flush()
			}
		}
	}
	flush()

	b := startBrowser(t, ts)
	b.run(chromedp.Navigate(ts.base + "/ui/"))
	b.login(ts.admin)
	b.run(chromedp.WaitVisible(chromedp.CSS(`#view[data-ready="true"][data-view="fleet"]`)))
	// Measure a fresh load of the page with the session.
	b.run(js(`window.onbeforeunload = null`), chromedp.Navigate(ts.base+"/ui/#/fleet"), chromedp.WaitVisible(chromedp.CSS(`#view[data-ready="true"][data-view="fleet"]`)))
	type figures struct {
		FCP   float64 `json:"fcp"`
		Ready float64 `json:"ready"`
		Bytes float64 `json:"bytes"`
	}
	f := eval[figures](b, `(() => {
		const fcp = performance.getEntriesByType('paint').find((e) => e.name === 'first-contentful-paint');
		const nav = performance.getEntriesByType('navigation')[0];
		let bytes = nav.transferSize;
		for (const e of performance.getEntriesByType('resource')) bytes += e.transferSize || e.encodedBodySize;
		return {fcp: fcp ? fcp.startTime : -1, ready: performance.now(), bytes};
	})()`)
	if got := b.text(`[data-count="offline"] .n`); got != "10000" {
		t.Fatalf("offline agents %q", got)
	}
	t.Logf("fleet page, 10,000 agents, 1,000 pipes, 24,000 runs: first contentful paint %.0f ms, drawn %.0f ms, %.0f KB transferred", f.FCP, f.Ready, f.Bytes/1024)
	if f.FCP < 0 || f.FCP > 1000 {
		t.Errorf("first contentful paint %.0f ms, want under 1 s", f.FCP)
	}
	if f.Bytes > 500<<10 {
		t.Errorf("%.0f KB transferred, want under 500 KB", f.Bytes/1024)
	}
	b.shoot("fleet-10k")
}
