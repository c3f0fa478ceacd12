package server

import (
	"context"
	"errors"
	"net/http"
	"sort"

	"github.com/drover/drover/api"
	"github.com/drover/drover/server/errs"
	"github.com/drover/drover/server/notify"
	"github.com/drover/drover/server/store"
)

// Notification channels and rules (docs/monitoring.md, "Notifications").
// A channel's secret is write-only: sealed with the secrets key before it is
// stored, never answered, logged or audited (the audit digest covers the
// channel as the API shows it).

const maxNotifyBody = 16 << 10

// notifyName is the {name} of a channel or rule route, checked.
func notifyName(r *http.Request) (string, error) {
	name := r.PathValue("name")
	if !notify.ValidName(name) {
		return "", errs.New(errs.ErrInvalidRequest, "invalid name "+quoteName(name)+" in the path",
			api.Detail{Field: "name", Message: "use 1-63 lowercase letters, digits and '-', starting and ending with a letter or digit"})
	}
	return name, nil
}

// channelView is a stored channel as the API shows it (no secret).
func channelView(c *store.NotifyChannel) *api.NotifyChannel {
	if c == nil {
		return nil
	}
	return &api.NotifyChannel{Name: c.Name, Kind: c.Kind, URL: c.URL, HasSecret: len(c.SealedSecret) > 0, CreatedAt: c.CreatedAt, UpdatedAt: c.UpdatedAt}
}

// getOrNil returns the stored value, nil when there is none.
func getOrNil[T any](ctx context.Context, get func(context.Context, string) (*T, error), name string) (*T, error) {
	v, err := get(ctx, name)
	if errors.Is(err, errs.ErrNotFound) {
		return nil, nil
	}
	return v, err
}

func (s *Server) handleListChannels(w http.ResponseWriter, r *http.Request) error {
	list, err := s.store.ListChannels(r.Context())
	if err != nil {
		return err
	}
	out := api.NotifyChannelList{Channels: []api.NotifyChannel{}}
	for _, c := range list {
		out.Channels = append(out.Channels, *channelView(c))
	}
	return writeJSON(w, http.StatusOK, out)
}

func (s *Server) handleGetChannel(w http.ResponseWriter, r *http.Request) error {
	name, err := notifyName(r)
	if err != nil {
		return err
	}
	c, err := s.store.GetChannel(r.Context(), name)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, channelView(c))
}

func (s *Server) handlePutChannel(w http.ResponseWriter, r *http.Request) error {
	name, err := notifyName(r)
	if err != nil {
		return err
	}
	var req api.NotifyChannel
	if err := decodeJSON(w, r, maxNotifyBody, &req); err != nil {
		return err
	}
	if req.Name == "" {
		req.Name = name
	}
	ctx := r.Context()
	old, err := getOrNil(ctx, s.store.GetChannel, name)
	if err != nil {
		return err
	}
	var ds []api.Detail
	if req.Name != name {
		ds = append(ds, api.Detail{Field: "name", Message: "differs from the name in the path"})
	}
	keep := old != nil && old.Kind == req.Kind && len(old.SealedSecret) > 0
	ds = append(ds, notify.ValidateChannel(&req, keep)...)
	if old == nil {
		if list, err := s.store.ListChannels(ctx); err != nil {
			return err
		} else if len(list) >= notify.MaxChannels {
			ds = append(ds, api.Detail{Field: "name", Message: "too many channels (at most 100)"})
		}
	}
	if len(ds) > 0 {
		return errs.New(errs.ErrValidation, "invalid channel", ds...)
	}
	now := s.clock.Now()
	c := &store.NotifyChannel{Name: name, Kind: req.Kind, URL: req.URL, CreatedAt: now, UpdatedAt: now}
	switch {
	case req.Secret != nil:
		c.SealedSecret = s.sealer.Seal(notify.SealName(name), []byte(*req.Secret))
	case keep:
		c.SealedSecret = old.SealedSecret
	}
	if err := s.store.PutChannel(ctx, c); err != nil {
		return err
	}
	after, err := s.store.GetChannel(ctx, name)
	if err != nil {
		return err
	}
	s.log.Info("notification channel set", "channel", name, "kind", c.Kind)
	setAudit(r, "channel/"+name, channelView(old), channelView(after))
	return writeJSON(w, http.StatusOK, channelView(after))
}

func (s *Server) handleDeleteChannel(w http.ResponseWriter, r *http.Request) error {
	name, err := notifyName(r)
	if err != nil {
		return err
	}
	ctx := r.Context()
	old, err := s.store.GetChannel(ctx, name)
	if err != nil {
		return err
	}
	rules, err := s.store.ListRules(ctx)
	if err != nil {
		return err
	}
	for _, ru := range rules {
		for _, c := range ru.Channels {
			if c == name {
				return errs.New(errs.ErrConflict, "channel "+name+" is used by rule "+ru.Name)
			}
		}
	}
	if err := s.store.DeleteChannel(ctx, name); err != nil {
		return err
	}
	setAudit(r, "channel/"+name, channelView(old), nil)
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (s *Server) handleTestChannel(w http.ResponseWriter, r *http.Request) error {
	name, err := notifyName(r)
	if err != nil {
		return err
	}
	if _, err := s.store.GetChannel(r.Context(), name); err != nil {
		return err
	}
	setAudit(r, "channel/"+name, nil, nil)
	resp := api.NotifyTestResponse{Channel: name, OK: true}
	if err := s.notifier.Test(r.Context(), name); err != nil {
		resp.OK, resp.Error = false, err.Error()
	}
	return writeJSON(w, http.StatusOK, resp)
}

func (s *Server) handleChannelStatus(w http.ResponseWriter, r *http.Request) error {
	list, err := s.store.ListChannels(r.Context())
	if err != nil {
		return err
	}
	st, err := s.store.DeliveryStatus(r.Context())
	if err != nil {
		return err
	}
	out := api.ChannelStatusList{Channels: []api.ChannelStatus{}}
	for _, c := range list {
		cs := api.ChannelStatus{Channel: c.Name}
		if x := st[c.Name]; x != nil {
			cs = *x
		}
		out.Channels = append(out.Channels, cs)
	}
	return writeJSON(w, http.StatusOK, out)
}

func (s *Server) handleListRules(w http.ResponseWriter, r *http.Request) error {
	list, err := s.store.ListRules(r.Context())
	if err != nil {
		return err
	}
	out := api.NotifyRuleList{Rules: []api.NotifyRule{}}
	for _, ru := range list {
		out.Rules = append(out.Rules, *ru)
	}
	return writeJSON(w, http.StatusOK, out)
}

func (s *Server) handleGetRule(w http.ResponseWriter, r *http.Request) error {
	name, err := notifyName(r)
	if err != nil {
		return err
	}
	ru, err := s.store.GetRule(r.Context(), name)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, ru)
}

func (s *Server) handlePutRule(w http.ResponseWriter, r *http.Request) error {
	name, err := notifyName(r)
	if err != nil {
		return err
	}
	var req api.NotifyRule
	if err := decodeJSON(w, r, maxNotifyBody, &req); err != nil {
		return err
	}
	if req.Name == "" {
		req.Name = name
	}
	ctx := r.Context()
	old, err := getOrNil(ctx, s.store.GetRule, name)
	if err != nil {
		return err
	}
	chans, err := s.store.ListChannels(ctx)
	if err != nil {
		return err
	}
	have := map[string]bool{}
	for _, c := range chans {
		have[c.Name] = true
	}
	var ds []api.Detail
	if req.Name != name {
		ds = append(ds, api.Detail{Field: "name", Message: "differs from the name in the path"})
	}
	ds = append(ds, notify.ValidateRule(&req, have)...)
	if old == nil {
		if list, err := s.store.ListRules(ctx); err != nil {
			return err
		} else if len(list) >= notify.MaxRules {
			ds = append(ds, api.Detail{Field: "name", Message: "too many rules (at most 200)"})
		}
	}
	if len(ds) > 0 {
		return errs.New(errs.ErrValidation, "invalid rule", ds...)
	}
	sort.Strings(req.Pipes)
	now := s.clock.Now()
	req.CreatedAt, req.UpdatedAt = now, now
	if err := s.store.PutRule(ctx, &req); err != nil {
		return err
	}
	after, err := s.store.GetRule(ctx, name)
	if err != nil {
		return err
	}
	setAudit(r, "rule/"+name, old, after)
	return writeJSON(w, http.StatusOK, after)
}

func (s *Server) handleDeleteRule(w http.ResponseWriter, r *http.Request) error {
	name, err := notifyName(r)
	if err != nil {
		return err
	}
	old, err := s.store.GetRule(r.Context(), name)
	if err != nil {
		return err
	}
	if err := s.store.DeleteRule(r.Context(), name); err != nil {
		return err
	}
	setAudit(r, "rule/"+name, old, nil)
	w.WriteHeader(http.StatusNoContent)
	return nil
}
