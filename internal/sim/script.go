package sim

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"
)

// Script says which credentials the simulator accepts and how each account
// behaves.
type Script struct {
	Accounts []AccountScript `json:"accounts"`
	// AcceptUnknown: when true (the default used by weir dev), any
	// well-formed credential not listed is accepted as an account named
	// "key-<first 8 hex of sha256(credential)>"; when false, unknown
	// credentials get 401.
	AcceptUnknown bool `json:"accept_unknown"`
	// ToolCallsPerTurn is how many tool calls a turn of a conversation
	// gets, on requests that offer tools, before the text answer: a
	// request is answered with a tool call while its messages since the
	// last prompt hold fewer tool results. nil means 3; 0 answers text
	// always. An account's own setting overrides it.
	ToolCallsPerTurn *int `json:"tool_calls_per_turn,omitempty"`
	// PreferTools are the tool names called first when a request offers
	// them, in order; else its first tool is called. Empty means Bash,
	// Read, LS, Glob, exec_command, shell_command, shell. An account's own
	// list overrides it.
	PreferTools []string `json:"prefer_tools,omitempty"`
}

// Account kinds.
const (
	KindAPIKey = "api_key"
	KindOAuth  = "oauth"
)

// AccountScript describes one upstream account.
type AccountScript struct {
	// Name is used in logs and attempts; the credential itself is never logged.
	Name string `json:"name"`
	// Credential is the API key (sent as x-api-key) or the OAuth access
	// token (sent as Authorization: Bearer).
	Credential string `json:"credential"`
	// Kind is "api_key", "oauth", "chatgpt" or "openai_key". A chatgpt
	// account (a ChatGPT/Codex login) is served on
	// /backend-api/codex/responses and needs a Bearer plus the
	// chatgpt-account-id header; an openai_key account (Bearer sk-…) on
	// /v1/responses and /v1/chat/completions. Neither is accepted on the
	// Anthropic paths, nor Anthropic kinds on theirs. An oauth account's requests must carry
	// a Bearer and anthropic-beta containing oauth-2025-04-20, else 401 like
	// the real API. Empty means "oauth" when the credential starts with
	// "sk-ant-oat" and "api_key" otherwise.
	Kind string `json:"kind"`
	// Revoked makes every request fail with 401 authentication_error.
	Revoked bool `json:"revoked"`
	// FiveHourUtilization and SevenDayUtilization (0..1) are reported in the
	// unified rate-limit headers of oauth accounts, and in percent in the
	// x-codex-{primary,secondary}-* headers of the Responses paths.
	FiveHourUtilization float64 `json:"five_hour_utilization"`
	SevenDayUtilization float64 `json:"seven_day_utilization"`
	// Faults are consumed in order, one per /v1/messages (or Responses or
	// Chat Completions) attempt (each applying to Times attempts, or for
	// For or until Until). A fault scoped to a model is skipped, not
	// consumed, by requests for other models.
	Faults []Fault `json:"faults"`
	// ToolCallsPerTurn and PreferTools, when set, override the script's
	// for this account.
	ToolCallsPerTurn *int     `json:"tool_calls_per_turn,omitempty"`
	PreferTools      []string `json:"prefer_tools,omitempty"`

	// The fields below are opt-in and valid for oauth accounts only; left
	// out, the account behaves as it always has.

	// Windows, when set, gives the account live usage windows: successful
	// messages fill them, a full window answers 429 with the unified
	// rejection headers, the unified headers of successes report them
	// (instead of FiveHourUtilization and SevenDayUtilization), and so
	// does GET /api/oauth/usage.
	Windows *Windows `json:"windows,omitempty"`
	// RefreshToken makes the account refreshable through POST
	// /v1/oauth/token; every refresh rotates both tokens.
	RefreshToken string `json:"refresh_token,omitempty"`
	// AccessExpiresIn, when set, makes Credential expire that long after
	// the script is loaded (sim clock); it also is the lifetime of access
	// tokens issued by a refresh, which otherwise live 8 hours.
	AccessExpiresIn Duration `json:"access_expires_in,omitempty"`
	// UsageReadsPer10m is how many reads of GET /api/oauth/usage the
	// account allows in any rolling 10 minutes: 0 means 4, -1 means no
	// limit.
	UsageReadsPer10m int `json:"usage_reads_per_10m,omitempty"`
	// Grants are the account's banked rate-limit resets, claimed through
	// POST /api/organizations/{org}/reset_rate_limits.
	Grants []Grant `json:"grants,omitempty"`

	// ChatGPTAccountID, for chatgpt accounts only, is the account id the
	// Codex backend and usage endpoint require in the chatgpt-account-id
	// header, and the chatgpt_account_id claim of tokens issued by POST
	// /oauth/token. Default: the claim of a JWT-shaped Credential, else a
	// UUID-shaped id derived from Name (see Server.ChatGPTAccountID).
	// chatgpt accounts may also set windows (five_hour and seven_day only),
	// refresh_token, access_expires_in and usage_reads_per_10m.
	ChatGPTAccountID string `json:"chatgpt_account_id,omitempty"`
}

// kind is the account's kind, inferred from the credential when the
// script leaves it empty.
func (as AccountScript) kind() string {
	switch {
	case as.Kind != "":
		return as.Kind
	case strings.HasPrefix(as.Credential, "sk-ant-oat"):
		return KindOAuth
	default:
		return KindAPIKey
	}
}

// Fault kinds.
const (
	FaultRateLimit         = "rate_limit"
	FaultOverloaded        = "overloaded"
	FaultUnavailable       = "unavailable"
	FaultAPIError          = "api_error"
	FaultOverloadedEvent   = "overloaded_event"
	FaultErrorAfterContent = "error_after_content"
	FaultDropConnection    = "drop_connection"
	FaultDropMidStream     = "drop_mid_stream"
	FaultSlowHeaders       = "slow_headers"
	FaultRevoked           = "revoked"
	FaultBadRequest        = "bad_request"
)

var faultKinds = []string{
	FaultRateLimit, FaultOverloaded, FaultUnavailable, FaultAPIError,
	FaultOverloadedEvent, FaultErrorAfterContent, FaultDropConnection,
	FaultDropMidStream, FaultSlowHeaders, FaultRevoked, FaultBadRequest,
}

// Fault is one scripted misbehaviour of an account.
type Fault struct {
	// Kind is one of the Fault* constants.
	Kind string `json:"kind"`
	// Times is how many attempts the fault applies to; 0 means 1 (unless
	// For or Until is set); -1 means forever.
	Times int `json:"times"`
	// For, instead of Times, makes the fault apply to every matching
	// attempt for this long, counted on the sim clock from the first
	// attempt it applies to; then it is consumed.
	For Duration `json:"for,omitempty"`
	// Until, instead of Times, makes the fault apply to every matching
	// attempt until this time on the sim clock (RFC 3339); then it is
	// consumed.
	Until time.Time `json:"until,omitzero"`
	// RetryAfter is sent as retry-after (seconds) with rate_limit,
	// overloaded and unavailable; 0 sends no header. For
	// usage_limit_reached and usage_limit_event it is resets_in_seconds (0
	// means 3600); for google_quota_exhausted and google_rate_limit the
	// RetryInfo retryDelay ("22s"; 0 sends no RetryInfo).
	RetryAfter int `json:"retry_after,omitempty"`
	// Array, for google_quota_exhausted and google_rate_limit, wraps the
	// error body in a JSON array ([{"error":{…}}]) as some of Google's
	// OpenAI-compatible endpoints do.
	Array bool `json:"array,omitempty"`
	// Unified, for rate_limit, adds the unified rejection headers of a
	// subscription limit; without it the 429 looks like a burst limit.
	Unified *UnifiedRejection `json:"unified,omitempty"`
	// Delay, for slow_headers, is how long to wait before the headers.
	Delay Duration `json:"delay,omitempty"`
	// AfterDeltas, for error_after_content, at_capacity_after_output, usage_limit_after_output and
	// drop_mid_stream, is how many content deltas are sent first; 0 means 2.
	AfterDeltas int `json:"after_deltas,omitempty"`
	// Model restricts the fault to requests for this model; empty means any.
	Model string `json:"model,omitempty"`
	// Size, for the oversized_line kinds, body_longer_than_length and
	// huge_body, is how many bytes the oversized part has (see their
	// defaults).
	Size int `json:"size,omitempty"`
	// Status, for huge_body, is the answer's status; 0 means 200.
	Status int `json:"status,omitempty"`
	// Malformed, for the malformed kinds, is garbage (the default),
	// non_json_data, broken_json or no_event_name.
	Malformed string `json:"malformed,omitempty"`

	// ends is when a For fault that has begun to apply expires.
	ends time.Time
}

// Unified claims.
const (
	ClaimFiveHour                = "five_hour"
	ClaimSevenDay                = "seven_day"
	ClaimSevenDayOpus            = "seven_day_opus"
	ClaimSevenDaySonnet          = "seven_day_sonnet"
	ClaimSevenDayOverageIncluded = "seven_day_overage_included"
	ClaimOverage                 = "overage"
)

var claims = []string{
	ClaimFiveHour, ClaimSevenDay, ClaimSevenDayOpus, ClaimSevenDaySonnet,
	ClaimSevenDayOverageIncluded, ClaimOverage,
}

// UnifiedRejection describes the subscription window a rate_limit fault
// claims to have exhausted.
type UnifiedRejection struct {
	// Claim is the representative claim: five_hour, seven_day,
	// seven_day_opus, seven_day_sonnet, seven_day_overage_included or overage.
	Claim string `json:"claim"`
	// ResetIn is when the window resets, from now; 0 means the window's
	// regular reset.
	ResetIn Duration `json:"reset_in"`
}

// Duration is a time.Duration written in JSON as a Go duration string
// ("200ms", "2s", "5h").
type Duration time.Duration

// MarshalJSON writes the duration as a string such as "2s".
func (d Duration) MarshalJSON() ([]byte, error) {
	return json.Marshal(time.Duration(d).String())
}

// UnmarshalJSON reads a Go duration string. Bare numbers are refused
// because their unit would be a guess.
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("want a duration string such as \"2s\", got %s", b)
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return err
	}
	*d = Duration(v)
	return nil
}

// Validate reports every problem in the script, each naming its field.
func (sc Script) Validate() error {
	var errs []error
	names := map[string]int{}
	creds := map[string]int{}
	refresh := map[string]int{}
	for i, a := range sc.Accounts {
		field := fmt.Sprintf("accounts[%d]", i)
		switch {
		case a.Name == "":
			errs = append(errs, fmt.Errorf("%s.name: required", field))
		case strings.ContainsAny(a.Name, "/ \t\r\n"):
			errs = append(errs, fmt.Errorf("%s.name: %q must not contain '/' or white space", field, a.Name))
		default:
			if j, dup := names[a.Name]; dup {
				errs = append(errs, fmt.Errorf("%s.name: %q already used by accounts[%d]", field, a.Name, j))
			}
			names[a.Name] = i
		}
		switch {
		case a.Credential == "":
			errs = append(errs, fmt.Errorf("%s.credential: required", field))
		case !wellFormedCredential(a.Credential):
			errs = append(errs, fmt.Errorf("%s.credential: not a well-formed credential (1-%d characters of A-Z a-z 0-9 . _ ~ + / = -)", field, maxCredentialLen))
		default:
			if j, dup := creds[a.Credential]; dup {
				errs = append(errs, fmt.Errorf("%s.credential: already used by accounts[%d]", field, j))
			}
			creds[a.Credential] = i
		}
		if a.Kind != "" && !slices.Contains(accountKinds, a.Kind) {
			errs = append(errs, fmt.Errorf("%s.kind: %q is not %q, %q, %q or %q", field, a.Kind, KindAPIKey, KindOAuth, KindChatGPT, KindOpenAIKey))
		}
		if !(a.FiveHourUtilization >= 0 && a.FiveHourUtilization <= 1) {
			errs = append(errs, fmt.Errorf("%s.five_hour_utilization: %v is outside 0..1", field, a.FiveHourUtilization))
		}
		if !(a.SevenDayUtilization >= 0 && a.SevenDayUtilization <= 1) {
			errs = append(errs, fmt.Errorf("%s.seven_day_utilization: %v is outside 0..1", field, a.SevenDayUtilization))
		}
		errs = append(errs, validateFaults(field+".faults", a.Faults))
		errs = append(errs, validateToolSettings(field+".", a.ToolCallsPerTurn, a.PreferTools)...)
		errs = append(errs, validateOAuthExtras(field, a))
		if a.RefreshToken != "" {
			if j, dup := refresh[a.RefreshToken]; dup {
				errs = append(errs, fmt.Errorf("%s.refresh_token: already used by accounts[%d]", field, j))
			}
			refresh[a.RefreshToken] = i
		}
	}
	errs = append(errs, validateToolSettings("", sc.ToolCallsPerTurn, sc.PreferTools)...)
	for i, a := range sc.Accounts {
		if j, clash := creds[a.RefreshToken]; clash && a.RefreshToken != "" {
			errs = append(errs, fmt.Errorf("accounts[%d].refresh_token: is the credential of accounts[%d]", i, j))
		}
	}
	return errors.Join(errs...)
}

// validateFaults reports every problem in faults, each prefixed by field.
func validateFaults(field string, faults []Fault) error {
	var errs []error
	for i, f := range faults {
		ff := fmt.Sprintf("%s[%d]", field, i)
		if !slices.Contains(faultKinds, f.Kind) {
			errs = append(errs, fmt.Errorf("%s.kind: unknown fault kind %q (want one of %s)", ff, f.Kind, strings.Join(faultKinds, ", ")))
		}
		if f.Times < -1 {
			errs = append(errs, fmt.Errorf("%s.times: %d is invalid (0 means 1, -1 means forever)", ff, f.Times))
		}
		if f.For < 0 {
			errs = append(errs, fmt.Errorf("%s.for: %v is negative", ff, time.Duration(f.For)))
		}
		if set := f.lifetimeFields(); len(set) > 1 {
			errs = append(errs, fmt.Errorf("%s.%s: only one of times, for and until may be set, and this fault sets %s too", ff, set[1], set[0]))
		}
		if f.RetryAfter < 0 {
			errs = append(errs, fmt.Errorf("%s.retry_after: %d is negative", ff, f.RetryAfter))
		}
		if f.Delay < 0 {
			errs = append(errs, fmt.Errorf("%s.delay: %v is negative", ff, time.Duration(f.Delay)))
		}
		if f.AfterDeltas < 0 {
			errs = append(errs, fmt.Errorf("%s.after_deltas: %d is negative", ff, f.AfterDeltas))
		}
		errs = append(errs, validateMisbehaviour(ff, f)...)
		if f.Array && f.Kind != FaultGoogleQuotaExhausted && f.Kind != FaultGoogleRateLimit {
			errs = append(errs, fmt.Errorf("%s.array: only valid for kinds %q and %q", ff, FaultGoogleQuotaExhausted, FaultGoogleRateLimit))
		}
		if f.Unified != nil {
			if f.Kind != FaultRateLimit {
				errs = append(errs, fmt.Errorf("%s.unified: only valid for kind %q", ff, FaultRateLimit))
			}
			if !slices.Contains(claims, f.Unified.Claim) {
				errs = append(errs, fmt.Errorf("%s.unified.claim: unknown claim %q (want one of %s)", ff, f.Unified.Claim, strings.Join(claims, ", ")))
			}
			if f.Unified.ResetIn < 0 {
				errs = append(errs, fmt.Errorf("%s.unified.reset_in: %v is negative", ff, time.Duration(f.Unified.ResetIn)))
			}
		}
	}
	return errors.Join(errs...)
}

// LoadScript reads and validates a JSON script file. Unknown fields are
// errors, so that a misspelt key does not silently do nothing.
func LoadScript(path string) (Script, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return Script{}, fmt.Errorf("load script: %w", err)
	}
	var sc Script
	if err := decodeStrict(bytes.NewReader(b), &sc); err != nil {
		return Script{}, fmt.Errorf("load script %s: %w", path, err)
	}
	if err := sc.Validate(); err != nil {
		return Script{}, fmt.Errorf("load script %s: %w", path, err)
	}
	return sc, nil
}

// decodeStrict decodes exactly one JSON value, refusing unknown fields and
// trailing data.
func decodeStrict(r io.Reader, v any) error {
	dec := json.NewDecoder(r)
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("decode JSON: %w", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return errors.New("decode JSON: unexpected data after the value")
	}
	return nil
}

// lifetimeFields names the fields of times, for and until that f sets.
func (f Fault) lifetimeFields() []string {
	var set []string
	if f.Times != 0 {
		set = append(set, "times")
	}
	if f.For != 0 {
		set = append(set, "for")
	}
	if !f.Until.IsZero() {
		set = append(set, "until")
	}
	return set
}

// timed reports whether f lasts for a time (For or Until) rather than a
// number of attempts.
func (f Fault) timed() bool {
	return f.For != 0 || !f.Until.IsZero()
}

// expired reports whether a timed fault is over at now: a begun For past
// its end, or an Until reached.
func (f Fault) expired(now time.Time) bool {
	return (!f.ends.IsZero() && !now.Before(f.ends)) || (!f.Until.IsZero() && !now.Before(f.Until))
}

// normalized returns a copy of f that owns its pointers, with Times 0
// written as 1 (for a fault counted in attempts) so that the queue counts
// down uniformly.
func (f Fault) normalized() Fault {
	if f.Times == 0 && !f.timed() {
		f.Times = 1
	}
	if f.Unified != nil {
		u := *f.Unified
		f.Unified = &u
	}
	return f
}

// scripted is f as the script shows it: a For fault that has begun is
// shown as the Until it ends at, so that the script says how long it has
// left.
func (f Fault) scripted() Fault {
	f = f.normalized()
	if !f.ends.IsZero() {
		f.For, f.Until, f.ends = 0, f.ends.UTC(), time.Time{}
	}
	return f
}

// afterDeltas is the number of deltas sent before a mid-stream fault.
func (f Fault) afterDeltas() int {
	if f.AfterDeltas == 0 {
		return 2
	}
	return f.AfterDeltas
}
