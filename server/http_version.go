package server

import (
	"net/http"

	"github.com/drover/drover/api"
)

// buildVersion is the version of this build of drover-server, set by Main
// from the binary's main.version.
var buildVersion = "dev"

func (s *Server) handleVersion(w http.ResponseWriter, r *http.Request) error {
	return writeJSON(w, http.StatusOK, api.Version{Server: buildVersion})
}
