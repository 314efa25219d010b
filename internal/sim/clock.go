package sim

import (
	"errors"
	"fmt"
	"net/http"
	"time"
)

// errNoManualClock is returned by Advance when the simulator runs on
// Config.Now rather than its own virtual time.
var errNoManualClock = errors.New("the simulator has no manual clock (Config.ManualClock is false)")

// Now is the simulator's clock: Config.Now, or the virtual time of a
// manual clock.
func (s *Server) Now() time.Time { return s.now() }

// Advance moves a manual clock (Config.ManualClock) on by d. Windows whose
// reset it passes empty, tokens and grants whose expiry it passes lapse,
// and usage reads older than 10 minutes free up, all on the next request
// that looks at them.
func (s *Server) Advance(d time.Duration) error {
	if s.clock == nil {
		return errNoManualClock
	}
	if d < 0 {
		return fmt.Errorf("advance: %v is negative; the clock only moves forward", d)
	}
	now := s.clock.Advance(d)
	s.log.Info("sim clock advanced", "by", d, "now", now)
	return nil
}

// clockBody is the answer of the clock control endpoints.
type clockBody struct {
	Now    time.Time `json:"now"`
	Manual bool      `json:"manual"`
}

// getClock answers the sim clock.
func (s *Server) getClock(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, clockBody{Now: s.now().UTC(), Manual: s.clock != nil})
}

// postClock advances a manual clock by {"advance":"2h"}; without one it
// answers 409.
func (s *Server) postClock(w http.ResponseWriter, r *http.Request) {
	if s.clock == nil {
		controlError(w, http.StatusConflict, errNoManualClock.Error())
		return
	}
	var req struct {
		Advance Duration `json:"advance"`
	}
	if err := decodeStrict(http.MaxBytesReader(w, r.Body, maxControlBody), &req); err != nil {
		controlError(w, http.StatusBadRequest, err.Error())
		return
	}
	if err := s.Advance(time.Duration(req.Advance)); err != nil {
		controlError(w, http.StatusBadRequest, err.Error())
		return
	}
	writeJSON(w, http.StatusOK, clockBody{Now: s.now().UTC(), Manual: true})
}
