package server

import "strconv"

// truncationMarker is the policy text the store keeps as a system log chunk
// in place of the first chunk that would take a run's log over the cap
// (store.IngestLimits).
func truncationMarker(limit int64) []byte {
	return []byte("\n[drover: log truncated: this run's output exceeded the server's cap of " + byteSize(limit) + "]\n")
}

func byteSize(n int64) string {
	switch {
	case n >= 1<<20 && n%(1<<20) == 0:
		return strconv.FormatInt(n>>20, 10) + " MiB"
	case n >= 1<<10 && n%(1<<10) == 0:
		return strconv.FormatInt(n>>10, 10) + " KiB"
	}
	return strconv.FormatInt(n, 10) + " bytes"
}
