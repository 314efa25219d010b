package sim

import (
	"errors"
	"net/http"
)

// maxControlBody bounds the JSON bodies of control requests.
const maxControlBody = 4 << 20

// registerControl adds the JSON control API under /_sim/. It has no auth:
// the simulator is a test and demo tool bound to loopback.
func (s *Server) registerControl(mux *http.ServeMux) {
	mux.HandleFunc("GET /_sim/script", s.getScript)
	mux.HandleFunc("PUT /_sim/script", s.putScript)
	mux.HandleFunc("POST /_sim/accounts/{name}/faults", s.postFaults)
	mux.HandleFunc("GET /_sim/attempts", s.getAttempts)
	mux.HandleFunc("POST /_sim/reset", s.postReset)
	mux.HandleFunc("GET /_sim/accounts/{name}/windows", s.getWindows)
	mux.HandleFunc("GET /_sim/clock", s.getClock)
	mux.HandleFunc("POST /_sim/clock", s.postClock)
	mux.HandleFunc("/_sim/", func(w http.ResponseWriter, r *http.Request) {
		controlError(w, http.StatusNotFound, "no such control endpoint: "+r.Method+" "+r.URL.Path)
	})
}

type controlErrorBody struct {
	Error string `json:"error"`
}

func controlError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, controlErrorBody{Error: msg})
}

// getScript answers the current script: remaining fault queues, discovered
// accounts, and credentials masked to their last 4 characters.
func (s *Server) getScript(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, s.script())
}

// putScript replaces the script.
func (s *Server) putScript(w http.ResponseWriter, r *http.Request) {
	var sc Script
	if err := decodeStrict(http.MaxBytesReader(w, r.Body, maxControlBody), &sc); err != nil {
		controlError(w, http.StatusBadRequest, err.Error())
		return
	}
	if err := s.SetScript(sc); err != nil {
		controlError(w, http.StatusBadRequest, err.Error())
		return
	}
	writeJSON(w, http.StatusOK, s.script())
}

// postFaults appends faults to an account's queue and answers the
// account's resulting state. Each fault lasts times attempts, or for a
// duration or until a time (one of the three); one setting two is refused
// with 400 naming the field.
func (s *Server) postFaults(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	var faults []Fault
	if err := decodeStrict(http.MaxBytesReader(w, r.Body, maxControlBody), &faults); err != nil {
		controlError(w, http.StatusBadRequest, err.Error())
		return
	}
	if err := s.AddFaults(name, faults...); err != nil {
		status := http.StatusBadRequest
		if errors.Is(err, errNoAccount) {
			status = http.StatusNotFound
		}
		controlError(w, status, err.Error())
		return
	}
	for _, a := range s.script().Accounts {
		if a.Name == name {
			writeJSON(w, http.StatusOK, a)
			return
		}
	}
	// SetScript removed the account in the meantime.
	controlError(w, http.StatusNotFound, "no such account: "+name)
}

func (s *Server) getAttempts(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, s.Attempts())
}

func (s *Server) postReset(w http.ResponseWriter, r *http.Request) {
	s.Reset()
	w.WriteHeader(http.StatusNoContent)
}

// getWindows answers an account's live windows (WindowsState).
func (s *Server) getWindows(w http.ResponseWriter, r *http.Request) {
	st, err := s.Windows(r.PathValue("name"))
	if err != nil {
		controlError(w, http.StatusNotFound, err.Error())
		return
	}
	writeJSON(w, http.StatusOK, st)
}
