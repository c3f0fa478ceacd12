package server

import (
	_ "embed"
	"net/http"

	"github.com/drover/drover/api"
)

func (s *Server) handleRotateKeys(w http.ResponseWriter, r *http.Request) error {
	signer, v := s.keys.Signer()
	before := api.RotateResponse{KeyID: signer.KeyID(), KeyListVersion: v}
	resp, err := s.rotateKeys(r.Context())
	if err != nil {
		return err
	}
	setAudit(r, "keys", before, resp)
	return writeJSON(w, http.StatusOK, resp)
}

func (s *Server) handleHealth(w http.ResponseWriter, r *http.Request) error {
	return writeJSON(w, http.StatusOK, api.Health{Status: "ok", Leader: s.leader.leading()})
}

func (s *Server) handleWhoAmI(w http.ResponseWriter, r *http.Request) error {
	p := principalOf(r)
	return writeJSON(w, http.StatusOK, api.WhoAmI{ID: p.ID, Name: p.Name, Role: p.Role.String()})
}

// openAPIDoc is the API's OpenAPI document, generated from the route table
// (openapi_test.go keeps it current: DROVER_UPDATE_OPENAPI=1 go test -run TestOpenAPI ./server).
//
//go:embed openapi.json
var openAPIDoc []byte

func (s *Server) handleOpenAPI(w http.ResponseWriter, r *http.Request) error {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(openAPIDoc)
	return nil
}
