package storetest

import (
	"testing"
	"time"

	"github.com/drover/drover/api"
	"github.com/drover/drover/server/errs"
	"github.com/drover/drover/server/store"
)

// testNotifyConfig: channels and rules are replaced in place (creation
// time kept), listed by name, and deleted (a channel with its queue).
func testNotifyConfig(t *testing.T, st store.Store) {
	ctx := t.Context()
	must(t, st.PutChannel(ctx, &store.NotifyChannel{Name: "hook", Kind: "webhook", URL: "http://a", SealedSecret: []byte("s1"), CreatedAt: t0, UpdatedAt: t0}))
	must(t, st.PutChannel(ctx, &store.NotifyChannel{Name: "hook", Kind: "webhook", URL: "http://b", SealedSecret: []byte("s2"), CreatedAt: t0.Add(time.Hour), UpdatedAt: t0.Add(time.Hour)}))
	must(t, st.PutChannel(ctx, &store.NotifyChannel{Name: "am", Kind: "alertmanager", URL: "http://am", CreatedAt: t0, UpdatedAt: t0}))
	c, err := st.GetChannel(ctx, "hook")
	if err != nil || c.URL != "http://b" || string(c.SealedSecret) != "s2" || !c.CreatedAt.Equal(t0) || !c.UpdatedAt.Equal(t0.Add(time.Hour)) {
		t.Fatalf("GetChannel after replace: %+v %v", c, err)
	}
	if ls, err := st.ListChannels(ctx); err != nil || len(ls) != 2 || ls[0].Name != "am" {
		t.Fatalf("ListChannels: %v %v", ls, err)
	}
	r := &api.NotifyRule{Name: "r", Kinds: []string{"run.failed"}, Pipes: []string{"p"}, Tags: map[string]string{"env": "prod"}, Channels: []string{"hook"}, CreatedAt: t0, UpdatedAt: t0}
	must(t, st.PutRule(ctx, r))
	got, err := st.GetRule(ctx, "r")
	if err != nil || got.Tags["env"] != "prod" || len(got.Channels) != 1 || !got.CreatedAt.Equal(t0) {
		t.Fatalf("GetRule: %+v %v", got, err)
	}
	if ls, err := st.ListRules(ctx); err != nil || len(ls) != 1 {
		t.Fatalf("ListRules: %v %v", ls, err)
	}
	must(t, st.DeleteRule(ctx, "r"))
	wantKind(t, "DeleteRule twice", st.DeleteRule(ctx, "r"), errs.ErrNotFound)
	wantKind(t, "GetRule deleted", func() error { _, err := st.GetRule(ctx, "r"); return err }(), errs.ErrNotFound)

	must(t, st.EnqueueDeliveries(ctx, []*store.Delivery{{Channel: "am", Body: []byte("{}"), CreatedAt: t0, NextAt: t0}}))
	must(t, st.DeleteChannel(ctx, "am"))
	wantKind(t, "DeleteChannel twice", st.DeleteChannel(ctx, "am"), errs.ErrNotFound)
	if ds, err := st.ClaimDeliveries(ctx, t0.Add(time.Hour), time.Minute, 10); err != nil || len(ds) != 0 {
		t.Fatalf("a deleted channel's deliveries stay queued: %v %v", ds, err)
	}
}

// testNotifyQueue: routing moves the cursor, the states and the queue in
// one step; claimed deliveries are leased; failures are retried at their
// next attempt or given up; the status per channel counts them.
func testNotifyQueue(t *testing.T, st store.Store) {
	ctx := t.Context()
	must(t, st.AddEvents(ctx, []*store.Event{
		{At: t0, Kind: "run.failed", Pipe: "job", AgentID: "a", RunID: "r1", Dedupe: "1"},
		{At: t0, Kind: "run.recovered", Pipe: "job", AgentID: "a", RunID: "r2", Dedupe: "2"},
	}))
	cur, state, err := st.NotifyProgress(ctx)
	if err != nil || cur != 0 || len(state) != 0 {
		t.Fatalf("NotifyProgress of a new store: %d %v %v", cur, state, err)
	}
	evs, err := st.EventsAfter(ctx, 0, 10)
	if err != nil || len(evs) != 2 || evs[0].Kind != "run.failed" {
		t.Fatalf("EventsAfter (oldest first): %v %v", evs, err)
	}
	ds := []*store.Delivery{
		{Channel: "hook", EventID: evs[0].ID, Body: []byte(`{"a":1}`), CreatedAt: t0, NextAt: t0},
		{Channel: "hook", EventID: evs[0].ID, Body: []byte(`{"a":2}`), CreatedAt: t0, NextAt: t0.Add(time.Minute)},
	}
	must(t, st.RouteEvents(ctx, evs[0].ID, map[string]string{"run/a/job": "x"}, ds))
	must(t, st.RouteEvents(ctx, evs[0].ID, map[string]string{"other": "y", "run/a/job": ""}, nil))
	cur, state, err = st.NotifyProgress(ctx)
	if err != nil || cur != evs[0].ID || len(state) != 1 || state["other"] != "y" {
		t.Fatalf("NotifyProgress: %d %v %v", cur, state, err)
	}
	if evs, err := st.EventsAfter(ctx, cur, 10); err != nil || len(evs) != 1 || evs[0].Kind != "run.recovered" {
		t.Fatalf("EventsAfter(cursor): %v %v", evs, err)
	}
	got, err := st.ClaimDeliveries(ctx, t0, time.Minute, 10)
	if err != nil || len(got) != 1 || string(got[0].Body) != `{"a":1}` {
		t.Fatalf("ClaimDeliveries (only the due one): %v %v", got, err)
	}
	if again, err := st.ClaimDeliveries(ctx, t0.Add(30*time.Second), time.Minute, 10); err != nil || len(again) != 0 {
		t.Fatalf("a claimed delivery is leased: %v %v", again, err)
	}
	must(t, st.DeliveryFailed(ctx, got[0].ID, t0.Add(time.Second), "connection refused", t0.Add(2*time.Minute), false))
	got2, err := st.ClaimDeliveries(ctx, t0.Add(2*time.Minute), time.Minute, 10)
	if err != nil || len(got2) != 1 || got2[0].ID != ds[0].ID || got2[0].Attempts != 1 || got2[0].LastError != "connection refused" {
		t.Fatalf("ClaimDeliveries after the retry time (a channel's oldest first): %v %v", got2, err)
	}
	must(t, st.DeliveryDone(ctx, ds[0].ID, t0.Add(2*time.Minute)))
	got3, err := st.ClaimDeliveries(ctx, t0.Add(2*time.Minute), time.Minute, 10)
	if err != nil || len(got3) != 1 || got3[0].ID != ds[1].ID {
		t.Fatalf("ClaimDeliveries after the first was delivered: %v %v", got3, err)
	}
	must(t, st.DeliveryFailed(ctx, ds[1].ID, t0.Add(2*time.Minute), "gave up: 500", t0.Add(2*time.Minute), true))
	if left, err := st.ClaimDeliveries(ctx, t0.Add(time.Hour), time.Minute, 10); err != nil || len(left) != 0 {
		t.Fatalf("finished deliveries are not claimed: %v %v", left, err)
	}
	stat, err := st.DeliveryStatus(ctx)
	if err != nil || stat["hook"] == nil {
		t.Fatalf("DeliveryStatus: %v %v", stat, err)
	}
	if h := stat["hook"]; h.Pending != 0 || h.Delivered != 1 || h.Failed != 1 || h.LastError != "gave up: 500" || !h.LastDeliveredAt.Equal(t0.Add(2*time.Minute)) {
		t.Fatalf("DeliveryStatus[hook]: %+v", h)
	}
	if n, err := st.PruneDeliveries(ctx, t0.Add(time.Hour)); err != nil || n != 2 {
		t.Fatalf("PruneDeliveries: %d %v", n, err)
	}
}
