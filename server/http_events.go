package server

import (
	"net/http"
	"slices"
	"strconv"
	"strings"

	"github.com/drover/drover/api"
	"github.com/drover/drover/manifest"
	"github.com/drover/drover/server/errs"
	"github.com/drover/drover/server/store"
	"github.com/drover/drover/server/stream"
)

// handleListEvents lists fleet events newest first (docs/monitoring.md,
// "Events").
func (s *Server) handleListEvents(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	pg, err := parsePage(r)
	if err != nil {
		return err
	}
	f := store.EventFilter{Kind: q.Get("kind"), Pipe: q.Get("pipe"), Agent: q.Get("agent"), Limit: pg.limit + 1}
	var details []api.Detail
	if f.Kind != "" && !slices.Contains(eventKinds, f.Kind) {
		details = append(details, api.Detail{Field: "kind", Message: "not an event kind (" + strings.Join(eventKinds, ", ") + ")"})
	}
	if f.Pipe != "" && !manifest.ValidName(f.Pipe) {
		details = append(details, api.Detail{Field: "pipe", Message: "not a pipe name"})
	}
	if len(f.Agent) > 128 || stream.CleanText(f.Agent, 128, false) != f.Agent {
		details = append(details, api.Detail{Field: "agent", Message: "at most 128 printable characters"})
	}
	if f.Since, err = queryTime(r, "since"); err != nil {
		details = append(details, errs.Details(err)...)
	}
	if len(details) > 0 {
		return errs.New(errs.ErrInvalidRequest, "invalid event filter", details...)
	}
	if f.BeforeID, err = pg.idCursor(); err != nil {
		return err
	}
	evs, err := s.store.ListEvents(r.Context(), f)
	if err != nil {
		return err
	}
	evs, next := cutPage(evs, pg, func(e *store.Event) string { return strconv.FormatInt(e.ID, 10) })
	return writeJSON(w, http.StatusOK, api.EventList{NextCursor: next, Events: mapList(evs, func(e *store.Event) api.Event {
		return api.Event{ID: e.ID, At: e.At.UTC(), Kind: e.Kind, Pipe: e.Pipe, Agent: e.AgentID, RunID: e.RunID, Message: e.Message}
	})})
}
