package sim

import (
	"net/http"
	"strconv"
)

// googleExhaustedMessage is the message of Google's 429s, both kinds.
const googleExhaustedMessage = "Resource has been exhausted (e.g. check quota)."

// Google's error body (google.rpc.Status), as its OpenAI-compatible
// endpoints send it.
type (
	googleError struct {
		Error googleErrorDetail `json:"error"`
	}
	googleErrorDetail struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
		Status  string `json:"status"`
		Details []any  `json:"details"`
	}
	googleErrorInfo struct {
		Type   string `json:"@type"`
		Reason string `json:"reason"`
		Domain string `json:"domain"`
	}
	googleRetryInfo struct {
		Type       string `json:"@type"`
		RetryDelay string `json:"retryDelay"`
	}
)

// googleExhausted answers Google's 429 RESOURCE_EXHAUSTED: reason
// QUOTA_EXHAUSTED for google_quota_exhausted, RATE_LIMIT_EXCEEDED for
// google_rate_limit, a RetryInfo when f.RetryAfter is set, and the body
// wrapped in an array with f.Array.
func (x *exchange) googleExhausted(f Fault) {
	reason := "QUOTA_EXHAUSTED"
	if f.Kind == FaultGoogleRateLimit {
		reason = "RATE_LIMIT_EXCEEDED"
	}
	ge := googleError{Error: googleErrorDetail{
		Code:    http.StatusTooManyRequests,
		Message: googleExhaustedMessage,
		Status:  "RESOURCE_EXHAUSTED",
		Details: []any{googleErrorInfo{Type: "type.googleapis.com/google.rpc.ErrorInfo", Reason: reason, Domain: "googleapis.com"}},
	}}
	if f.RetryAfter > 0 {
		ge.Error.Details = append(ge.Error.Details, googleRetryInfo{Type: "type.googleapis.com/google.rpc.RetryInfo", RetryDelay: strconv.Itoa(f.RetryAfter) + "s"})
	}
	x.record(f.Kind, http.StatusTooManyRequests)
	if f.Array {
		writeJSON(x.w, http.StatusTooManyRequests, []googleError{ge})
		return
	}
	writeJSON(x.w, http.StatusTooManyRequests, ge)
}
