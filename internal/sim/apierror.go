package sim

import (
	"encoding/json"
	"net/http"
)

// apiError is the real API's error body.
type apiError struct {
	Type      string         `json:"type"`
	Error     apiErrorDetail `json:"error"`
	RequestID string         `json:"request_id"`
}

type apiErrorDetail struct {
	Type    string `json:"type"`
	Message string `json:"message"`
}

// errorEvent is the data of an SSE error event; unlike the body of an error
// response it carries no request_id.
type errorEvent struct {
	Type  string         `json:"type"`
	Error apiErrorDetail `json:"error"`
}

var overloadedEvent = errorEvent{Type: "error", Error: apiErrorDetail{Type: "overloaded_error", Message: "Overloaded"}}

// fail logs the attempt and answers with an error body.
func (x *exchange) fail(outcome string, status int, errType, message string) {
	x.record(outcome, status)
	writeJSON(x.w, status, apiError{
		Type:      "error",
		Error:     apiErrorDetail{Type: errType, Message: message},
		RequestID: x.w.Header().Get("request-id"),
	})
}

// writeJSON answers with v as JSON. A write error means the client went
// away, which the simulator has no one to tell about.
func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	w.Write(append(b, '\n')) //nolint:errcheck // see above
}
