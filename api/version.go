package api

// Version is the answer of GET /api/v1/version: the build of the server
// that answered.
type Version struct {
	// Server is the server's version, as drover-server version prints it.
	Server string `json:"server"`
}
