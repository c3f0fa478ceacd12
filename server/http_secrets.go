package server

import (
	"context"
	"fmt"
	"net/http"
	"regexp"

	"github.com/drover/drover/api"
	"github.com/drover/drover/server/errs"
)

var secretNameRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,127}$`)

// maxSecretBytes caps one secret value.
const maxSecretBytes = 64 << 10

func (s *Server) handlePutSecret(w http.ResponseWriter, r *http.Request) error {
	name, req, err := paramBody[api.SecretRequest](w, r, secretName, maxSecretBytes*2+1024)
	if err != nil {
		return err
	}
	switch {
	case req.Value == nil:
		return errs.New(errs.ErrValidation, "value is required", api.Detail{Field: "value", Message: "required"})
	case len(*req.Value) > maxSecretBytes:
		return errs.New(errs.ErrValidation, "value is too long", api.Detail{Field: "value", Message: fmt.Sprintf("at most %d bytes", maxSecretBytes)})
	}
	before, err := s.secretInfo(r.Context(), name)
	if err != nil {
		return err
	}
	if err := s.store.PutSecret(r.Context(), name, s.sealer.Seal(name, []byte(*req.Value)), s.clock.Now()); err != nil {
		return err
	}
	s.log.Info("secret set", "secret", name)
	after, err := s.secretInfo(r.Context(), name)
	if err != nil {
		return err
	}
	setAudit(r, "secret/"+name, before, after)
	if err := s.compiler.SecretChanged(r.Context(), name); err != nil {
		return err
	}
	return noContent(w)
}

// secretInfo describes a secret (never its value); nil when there is none.
func (s *Server) secretInfo(ctx context.Context, name string) (*api.Secret, error) {
	list, err := s.store.ListSecrets(ctx, "", 0)
	if err != nil {
		return nil, err
	}
	for i := range list {
		if list[i].Name == name {
			return &list[i], nil
		}
	}
	return nil, nil
}

func (s *Server) handleListSecrets(w http.ResponseWriter, r *http.Request) error {
	pg, err := parsePage(r)
	if err != nil {
		return err
	}
	list, err := s.store.ListSecrets(r.Context(), pg.cursor, pg.limit+1)
	if err != nil {
		return err
	}
	list, next := cutPage(list, pg, func(s api.Secret) string { return s.Name })
	return writeJSON(w, http.StatusOK, api.SecretList{Secrets: list, NextCursor: next})
}

func (s *Server) handleDeleteSecret(w http.ResponseWriter, r *http.Request) error {
	name, before, err := fetchParam(r, secretName, s.secretInfo)
	if err != nil {
		return err
	}
	if err := s.store.DeleteSecret(r.Context(), name); err != nil {
		return err
	}
	s.log.Info("secret deleted", "secret", name)
	setAudit(r, "secret/"+name, before, nil)
	if err := s.compiler.SecretChanged(r.Context(), name); err != nil {
		return err
	}
	return noContent(w)
}
