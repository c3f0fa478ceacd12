package server

import (
	"errors"
	"net/http"
	"sort"
	"strconv"
	"time"

	"github.com/drover/drover/api"
	"github.com/drover/drover/server/console"
	"github.com/drover/drover/server/errs"
	"github.com/drover/drover/server/store"
)

// The web console (server/console) under /ui/: its sessions stand for the
// API token a user logged in with, and act with that token's role on
// /api/v1 (authenticateSession); the token is checked again on every
// request, so revoking it ends its sessions.

var errNoSession = errs.New(errs.ErrUnauthenticated, "the console session expired or was ended; log in again")

// authenticateSession checks the request's console session: it must be
// live, from this origin, carry the session's CSRF token on a mutation,
// and its token must still be valid.
func (a *authenticator) authenticateSession(r *http.Request) (*principal, *console.Session, error) {
	s, err := a.sessions.Get(r.Context(), console.SessionID(r))
	if errors.Is(err, console.ErrNoSession) {
		return nil, nil, errNoSession
	}
	if err != nil {
		return nil, nil, err
	}
	if err := console.CheckRequest(r, s); err != nil {
		return nil, nil, errs.New(errs.ErrPermissionDenied, err.Error())
	}
	t, err := a.store.GetAPIToken(r.Context(), s.TokenID)
	if errors.Is(err, errs.ErrNotFound) {
		_ = a.sessions.Delete(r.Context(), s.ID)
		return nil, nil, errNoSession
	}
	if err != nil {
		return nil, nil, err
	}
	p, err := a.checkToken(r.Context(), t, errNoSession)
	if err != nil {
		_ = a.sessions.Delete(r.Context(), s.ID)
		return nil, nil, err
	}
	return p, s, nil
}

// consoleAuth is the server's side of the console's login.
type consoleAuth struct{ a *authenticator }

func (c consoleAuth) Login(r *http.Request, token string) (console.Principal, error) {
	req := r.Clone(r.Context())
	req.Header = http.Header{"Authorization": {"Bearer " + token}}
	p, err := c.a.authenticate(req)
	if err != nil {
		return console.Principal{}, err
	}
	return console.Principal{ID: p.ID, Name: p.Name, Role: p.Role.String()}, nil
}

func (c consoleAuth) Session(r *http.Request) (console.Principal, *console.Session, error) {
	if console.SessionID(r) == "" {
		return console.Principal{}, nil, errNoSession
	}
	p, s, err := c.a.authenticateSession(r)
	if err != nil {
		return console.Principal{}, nil, err
	}
	return console.Principal{ID: p.ID, Name: p.Name, Role: p.Role.String()}, s, nil
}

// newConsole makes the /ui/ handler and hooks its sessions into the
// authenticator.
func (s *Server) newConsole() http.Handler {
	sessions := console.NewStored(s.store, console.DefaultExpiry, s.clock.Now)
	s.auth.sessions = sessions
	return console.New(console.Config{
		Sessions:        sessions,
		Expiry:          console.DefaultExpiry,
		Auth:            consoleAuth{s.auth},
		WriteError:      errs.Write,
		Unauthenticated: func(m string) error { return errs.New(errs.ErrUnauthenticated, m) },
		Forbidden:       func(m string) error { return errs.New(errs.ErrPermissionDenied, m) },
		BadRequest:      func(m string) error { return errs.New(errs.ErrInvalidRequest, m) },
	})
}

// consoleSessionKey is the key a console session's requests are pooled
// and limited under, or "" without a session cookie.
func consoleSessionKey(r *http.Request) string {
	if id := console.SessionID(r); id != "" {
		return "session " + id
	}
	return ""
}

// consoleFleet is the console's fleet page in one answer, counted on the
// server so that the page stays small with any number of agents and runs.
type consoleFleet struct {
	Agents        fleetAgents `json:"agents"`
	Problems      []api.Agent `json:"problems"` // the first fleetProblems agents that need attention
	ProblemsTotal int         `json:"problems_total"`
	Since         time.Time   `json:"since"` // the runs counted: created at or after
	Runs          int         `json:"runs"`
	RunsTruncated bool        `json:"runs_truncated,omitempty"`
	Bad           []fleetBad  `json:"bad"` // the first fleetProblems pipes with failed or missed runs, worst first
	BadTotal      int         `json:"bad_total"`
	Heat          []fleetHeat `json:"heat"` // pipe × hour, the first fleetHeatPipes pipes
	HeatPipes     int         `json:"heat_pipes"`
}

type fleetAgents struct {
	Total    int `json:"total"`
	Online   int `json:"online"`
	Offline  int `json:"offline"`
	Revoked  int `json:"revoked"`
	Stale    int `json:"stale"`    // a manifest not applied, rejected or expired
	Identity int `json:"identity"` // identity conflicts seen
}

type fleetBad struct {
	Pipe       string    `json:"pipe"`
	Failed     int       `json:"failed"`
	Missed     int       `json:"missed"`
	LastID     string    `json:"last_id"`
	LastStatus string    `json:"last_status"`
	LastAt     time.Time `json:"last_at"`
}

// fleetHeat is one pipe's row: per hour since Since, "" or
// "<worst status> <runs of it>/<runs>".
type fleetHeat struct {
	Pipe  string   `json:"pipe"`
	Cells []string `json:"cells"`
}

const (
	fleetProblems  = 100
	fleetHeatPipes = 200
	fleetMaxRuns   = 100000
	fleetHours     = 25
)

// worstFirst orders run statuses for the heatmap.
var worstFirst = []string{"failed", "timed_out", "missed", "canceled", "running", "pending", "skipped", "succeeded"}

func staleManifest(a *api.Agent) bool {
	return !a.Revoked && (a.ManifestExpired || a.ManifestError != "" || a.ManifestState == "rejected" || (a.Manifest != nil && a.AppliedSerial < a.Manifest.Serial))
}

func (s *Server) handleConsoleFleet(w http.ResponseWriter, r *http.Request) error {
	console.SecurityHeaders(w)
	if _, err := s.authorize(r, roleViewer); err != nil {
		return err
	}
	as, err := s.store.ListAgents(r.Context())
	if err != nil {
		return err
	}
	out := consoleFleet{Problems: []api.Agent{}, Bad: []fleetBad{}, Heat: []fleetHeat{}}
	for _, a := range as {
		aj := s.agentJSON(a)
		out.Agents.Total++
		switch aj.State() {
		case "revoked":
			out.Agents.Revoked++
		case "online":
			out.Agents.Online++
		default:
			out.Agents.Offline++
		}
		stale := staleManifest(&aj)
		if stale {
			out.Agents.Stale++
		}
		if aj.IdentityConflicts > 0 {
			out.Agents.Identity++
		}
		if stale || aj.IdentityConflicts > 0 || (!aj.Online && !aj.Revoked) {
			if out.ProblemsTotal++; len(out.Problems) < fleetProblems {
				aj.Pipes = nil // not shown; keeps the answer small
				out.Problems = append(out.Problems, aj)
			}
		}
	}
	now := s.clock.Now()
	out.Since = now.Add(-24 * time.Hour).Truncate(time.Hour)
	runs, err := s.store.ListRuns(r.Context(), store.RunFilter{Since: out.Since, Limit: fleetMaxRuns + 1})
	if err != nil {
		return err
	}
	if len(runs) > fleetMaxRuns {
		runs, out.RunsTruncated = runs[:fleetMaxRuns], true
	}
	out.Runs = len(runs)
	bad := map[string]*fleetBad{}
	heat := map[string]*[fleetHours]map[string]int{}
	for _, run := range runs { // newest first
		if run.Status == "failed" || run.Status == "timed_out" || run.Status == "missed" {
			b := bad[run.Pipe]
			if b == nil {
				b = &fleetBad{Pipe: run.Pipe, LastID: run.ID, LastStatus: run.Status, LastAt: run.CreatedAt}
				bad[run.Pipe] = b
			}
			if run.Status == "missed" {
				b.Missed++
			} else {
				b.Failed++
			}
		}
		at := run.ScheduledAt
		if at.IsZero() {
			at = run.CreatedAt
		}
		h := int(at.Sub(out.Since) / time.Hour)
		if h < 0 || h >= fleetHours {
			continue
		}
		row := heat[run.Pipe]
		if row == nil {
			row = &[fleetHours]map[string]int{}
			heat[run.Pipe] = row
		}
		if row[h] == nil {
			row[h] = map[string]int{}
		}
		row[h][run.Status]++
	}
	for _, b := range bad {
		out.Bad = append(out.Bad, *b)
	}
	sort.Slice(out.Bad, func(i, j int) bool {
		if bi, bj := out.Bad[i].Failed+out.Bad[i].Missed, out.Bad[j].Failed+out.Bad[j].Missed; bi != bj {
			return bi > bj
		}
		return out.Bad[i].Pipe < out.Bad[j].Pipe
	})
	out.BadTotal = len(out.Bad)
	out.Bad = out.Bad[:min(len(out.Bad), fleetProblems)]
	// The heatmap shows the pipes with bad runs first, then the others by name.
	pipes := make([]string, 0, len(heat))
	for p := range heat {
		pipes = append(pipes, p)
	}
	sort.Slice(pipes, func(i, j int) bool {
		_, bi := bad[pipes[i]]
		_, bj := bad[pipes[j]]
		if bi != bj {
			return bi
		}
		return pipes[i] < pipes[j]
	})
	out.HeatPipes = len(pipes)
	for _, p := range pipes[:min(len(pipes), fleetHeatPipes)] {
		row := fleetHeat{Pipe: p, Cells: make([]string, fleetHours)}
		for h, counts := range heat[p] {
			total := 0
			for _, n := range counts {
				total += n
			}
			for _, st := range worstFirst {
				if n := counts[st]; n > 0 {
					row.Cells[h] = st + " " + strconv.Itoa(n) + "/" + strconv.Itoa(total)
					break
				}
			}
		}
		out.Heat = append(out.Heat, row)
	}
	return writeJSON(w, http.StatusOK, out)
}
