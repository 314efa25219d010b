package dataplane

import (
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	weirv1 "github.com/weirhq/weir/gen/weir/v1"
)

// openAINow is the clock of the OpenAI evidence tests.
var openAINow = time.Unix(1785700000, 0).UTC()

const (
	quotaCodex  = weirv1.QuotaKind_QUOTA_KIND_CODEX_USAGE_LIMIT
	quotaOpenAI = weirv1.QuotaKind_QUOTA_KIND_OPENAI_INSUFFICIENT_QUOTA
	quotaGoogle = weirv1.QuotaKind_QUOTA_KIND_GOOGLE_QUOTA_EXHAUSTED
)

// Captures in the providers' wire shapes (docs/wire.md).
const (
	codexUsageLimitMessage = "The usage limit has been reached"
	codexUsageLimitBody    = `{"error":{"type":"usage_limit_reached","message":"The usage limit has been reached","plan_type":"plus","resets_at":1785736800,"resets_in_seconds":36800}}`
	insufficientQuotaMsg   = "You exceeded your current quota, please check your plan and billing details. For more information on this error, read the docs: https://platform.openai.com/docs/guides/error-codes/api-errors."
	insufficientQuotaBody  = `{
    "error": {
        "message": "You exceeded your current quota, please check your plan and billing details. For more information on this error, read the docs: https://platform.openai.com/docs/guides/error-codes/api-errors.",
        "type": "insufficient_quota",
        "param": null,
        "code": "insufficient_quota"
    }
}
`
	googleQuotaMessage = "You exceeded your current quota, please check your plan and billing details."
	googleQuotaError   = `{
    "code": 429,
    "message": "You exceeded your current quota, please check your plan and billing details.",
    "status": "RESOURCE_EXHAUSTED",
    "details": [
      {
        "@type": "type.googleapis.com/google.rpc.QuotaFailure",
        "violations": [{"quotaMetric": "generativelanguage.googleapis.com/generate_content_free_tier_requests", "quotaId": "GenerateRequestsPerDayPerProjectPerModel-FreeTier"}]
      },
      {
        "@type": "type.googleapis.com/google.rpc.ErrorInfo",
        "reason": "QUOTA_EXHAUSTED",
        "domain": "googleapis.com",
        "metadata": {"service": "generativelanguage.googleapis.com"}
      },
      {
        "@type": "type.googleapis.com/google.rpc.RetryInfo",
        "retryDelay": "22s"
      }
    ]
  }`
	googleQuotaBody        = `{"error": ` + googleQuotaError + "}\n"
	googleQuotaArrayBody   = `[{"error": ` + googleQuotaError + "}]\n"
	googleBurstBody        = `[{"error":{"code":429,"message":"Resource has been exhausted (e.g. check quota).","status":"RESOURCE_EXHAUSTED","details":[{"@type":"type.googleapis.com/google.rpc.ErrorInfo","reason":"RATE_LIMIT_EXCEEDED","domain":"googleapis.com"},{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"1.5s"}]}}]`
	googleQuotaNoRetry     = `{"error":{"code":429,"message":"Quota exceeded for quota metric 'Generate Content API requests per minute'.","status":"RESOURCE_EXHAUSTED","details":[{"@type":"type.googleapis.com/google.rpc.ErrorInfo","reason":"QUOTA_EXHAUSTED","domain":"googleapis.com"}]}}`
	codexAtCapacityMessage = "Selected model is at capacity. Please try a different model."
	overloadedBody         = `{"error":{"message":"Selected model is at capacity. Please try a different model.","type":"server_error","param":null,"code":"server_is_overloaded"}}`
	atCapacityFailed       = `{"type":"response.failed","sequence_number":1,"response":{"id":"resp_1","object":"response","created_at":1785700000,"status":"failed","model":"gpt-5-codex","output":[],"usage":null,"error":{"code":"server_is_overloaded","message":"Selected model is at capacity. Please try a different model."}}}`
	responsesCompleted     = `{"type":"response.completed","sequence_number":7,"response":{"id":"resp_1","object":"response","created_at":1785700000,"status":"completed","model":"gpt-5-codex","output":[{"id":"msg_1","type":"message","status":"completed","role":"assistant","content":[{"type":"output_text","text":"Hello!","annotations":[]}]}],"usage":{"input_tokens":1234,"input_tokens_details":{"cached_tokens":1024},"output_tokens":56,"output_tokens_details":{"reasoning_tokens":32},"total_tokens":1290},"error":null}}`
)

// codexHeaders are the x-codex-* rate-limit headers of a Codex answer.
func codexHeaders(primaryUsed string, primaryReset int64, secondaryUsed string, secondaryReset int64) http.Header {
	h := http.Header{}
	h.Set("x-codex-primary-used-percent", primaryUsed)
	h.Set("x-codex-primary-window-minutes", "300")
	h.Set("x-codex-primary-reset-at", strconv.FormatInt(primaryReset, 10))
	h.Set("x-codex-primary-reset-after-seconds", strconv.FormatInt(primaryReset-openAINow.Unix(), 10))
	h.Set("x-codex-secondary-used-percent", secondaryUsed)
	h.Set("x-codex-secondary-window-minutes", "10080")
	h.Set("x-codex-secondary-reset-at", strconv.FormatInt(secondaryReset, 10))
	h.Set("x-codex-secondary-reset-after-seconds", strconv.FormatInt(secondaryReset-openAINow.Unix(), 10))
	h.Set("x-codex-plan-type", "plus")
	h.Set("Content-Type", "application/json")
	return h
}

func unixTimestamp(s int64) *timestamppb.Timestamp { return timestamppb.New(time.Unix(s, 0)) }

func checkOpenAIFailure(t *testing.T, got, want eventFailure) {
	t.Helper()
	if got.class != want.class || got.errorType != want.errorType || got.message != want.message || got.status != want.status {
		t.Errorf("failure = {class %v, errorType %q, message %q, status %d}\nwant      {class %v, errorType %q, message %q, status %d}",
			got.class, got.errorType, got.message, got.status, want.class, want.errorType, want.message, want.status)
	}
	if !proto.Equal(got.quota, want.quota) {
		t.Errorf("quota = %v\nwant    %v", got.quota, want.quota)
	}
}

func TestOpenAIErrorEvidence(t *testing.T) {
	t.Parallel()
	longMessage := strings.Repeat("é", 200) // 400 bytes
	tests := []struct {
		name   string
		status int
		header http.Header
		body   string
		want   eventFailure
	}{
		{
			name: "codex usage limit with both reset fields", status: 429, body: codexUsageLimitBody,
			want: eventFailure{class: classRate, errorType: "usage_limit_reached", message: codexUsageLimitMessage, status: 429,
				quota: &weirv1.QuotaEvidence{Kind: quotaCodex, ResetsAt: unixTimestamp(1785736800), ResetAfter: durationpb.New(36800 * time.Second), Message: codexUsageLimitMessage}},
		},
		{
			name: "codex usage limit with only resets_in_seconds", status: 429,
			body: `{"error":{"type":"usage_limit_reached","message":"The usage limit has been reached","plan_type":"pro","resets_in_seconds":3600}}`,
			want: eventFailure{class: classRate, errorType: "usage_limit_reached", message: codexUsageLimitMessage, status: 429,
				quota: &weirv1.QuotaEvidence{Kind: quotaCodex, ResetAfter: durationpb.New(time.Hour), Message: codexUsageLimitMessage}},
		},
		{
			name: "codex usage limit with resets as strings of digits", status: 429,
			body: `{"error":{"type":"usage_limit_reached","message":"The usage limit has been reached","resets_at":"1785736800","resets_in_seconds":"36800"}}`,
			want: eventFailure{class: classRate, errorType: "usage_limit_reached", message: codexUsageLimitMessage, status: 429,
				quota: &weirv1.QuotaEvidence{Kind: quotaCodex, ResetsAt: unixTimestamp(1785736800), ResetAfter: durationpb.New(36800 * time.Second), Message: codexUsageLimitMessage}},
		},
		{
			name: "codex usage limit with a past resets_at", status: 429,
			body: `{"error":{"type":"usage_limit_reached","message":"The usage limit has been reached","plan_type":"plus","resets_at":1785690000,"resets_in_seconds":0}}`,
			want: eventFailure{class: classRate, errorType: "usage_limit_reached", message: codexUsageLimitMessage, status: 429,
				quota: &weirv1.QuotaEvidence{Kind: quotaCodex, Message: codexUsageLimitMessage}},
		},
		{
			// Both windows spent; the body's reset is the weekly one's.
			name: "codex usage limit picks the 10080 window by its reset", status: 429,
			header: codexHeaders("100", 1785710000, "100.0", 1785736800), body: codexUsageLimitBody,
			want: eventFailure{class: classRate, errorType: "usage_limit_reached", message: codexUsageLimitMessage, status: 429,
				quota: &weirv1.QuotaEvidence{Kind: quotaCodex, ResetsAt: unixTimestamp(1785736800), ResetAfter: durationpb.New(36800 * time.Second), WindowMinutes: 10080, Message: codexUsageLimitMessage}},
		},
		{
			// Only the reset-after form in the body, one second off the header.
			name: "codex usage limit matches the 300 window within 2s", status: 429,
			header: codexHeaders("100", 1785710001, "100", 1785736800),
			body:   `{"error":{"type":"usage_limit_reached","message":"The usage limit has been reached","resets_in_seconds":10000}}`,
			want: eventFailure{class: classRate, errorType: "usage_limit_reached", message: codexUsageLimitMessage, status: 429,
				quota: &weirv1.QuotaEvidence{Kind: quotaCodex, ResetAfter: durationpb.New(10000 * time.Second), WindowMinutes: 300, Message: codexUsageLimitMessage}},
		},
		{
			name: "codex usage limit with one spent window", status: 429,
			header: codexHeaders("100", 1785710000, "63", 1786000000),
			body:   `{"error":{"type":"usage_limit_reached","message":"The usage limit has been reached"}}`,
			want: eventFailure{class: classRate, errorType: "usage_limit_reached", message: codexUsageLimitMessage, status: 429,
				quota: &weirv1.QuotaEvidence{Kind: quotaCodex, WindowMinutes: 300, Message: codexUsageLimitMessage}},
		},
		{
			// Both spent and neither reset is the body's: no telling.
			name: "codex usage limit with two spent windows and no match", status: 429,
			header: codexHeaders("100", 1785710000, "100", 1786000000), body: codexUsageLimitBody,
			want: eventFailure{class: classRate, errorType: "usage_limit_reached", message: codexUsageLimitMessage, status: 429,
				quota: &weirv1.QuotaEvidence{Kind: quotaCodex, ResetsAt: unixTimestamp(1785736800), ResetAfter: durationpb.New(36800 * time.Second), Message: codexUsageLimitMessage}},
		},
		{
			// Numbers no upstream means are dropped, not turned into a
			// cooldown of centuries (or an overflowed Duration).
			name: "codex usage limit with absurd resets", status: 429,
			body: `{"error":{"type":"usage_limit_reached","message":"The usage limit has been reached","resets_at":1e300,"resets_in_seconds":"99999999999999999999"}}`,
			want: eventFailure{class: classRate, errorType: "usage_limit_reached", message: codexUsageLimitMessage, status: 429,
				quota: &weirv1.QuotaEvidence{Kind: quotaCodex, Message: codexUsageLimitMessage}},
		},
		{
			name: "insufficient quota", status: 429, body: insufficientQuotaBody,
			want: eventFailure{class: classRate, errorType: "insufficient_quota", message: insufficientQuotaMsg, status: 429,
				quota: &weirv1.QuotaEvidence{Kind: quotaOpenAI, Message: insufficientQuotaMsg}},
		},
		{
			name: "openai rate limit is a burst", status: 429,
			body: `{"error":{"message":"Rate limit reached for gpt-4.1 in organization org-abc on requests per min (RPM): Limit 500, Used 500, Requested 1. Please try again in 120ms.","type":"requests","param":null,"code":"rate_limit_exceeded"}}`,
			want: eventFailure{class: classRate, errorType: "rate_limit_exceeded", status: 429,
				message: "Rate limit reached for gpt-4.1 in organization org-abc on requests per min (RPM): Limit 500, Used 500, Requested 1. Please try again in 120ms."},
		},
		{
			name: "google quota exhausted with retryDelay", status: 429, body: googleQuotaBody,
			want: eventFailure{class: classRate, errorType: "QUOTA_EXHAUSTED", message: googleQuotaMessage, status: 429,
				quota: &weirv1.QuotaEvidence{Kind: quotaGoogle, ResetAfter: durationpb.New(22 * time.Second), Message: googleQuotaMessage}},
		},
		{
			name: "google array form", status: 429, body: googleQuotaArrayBody,
			want: eventFailure{class: classRate, errorType: "QUOTA_EXHAUSTED", message: googleQuotaMessage, status: 429,
				quota: &weirv1.QuotaEvidence{Kind: quotaGoogle, ResetAfter: durationpb.New(22 * time.Second), Message: googleQuotaMessage}},
		},
		{
			name: "google rate limit exceeded is a burst", status: 429, body: googleBurstBody,
			want: eventFailure{class: classRate, errorType: "RATE_LIMIT_EXCEEDED", message: "Resource has been exhausted (e.g. check quota).", status: 429},
		},
		{
			name: "google quota exhausted without RetryInfo takes Retry-After", status: 429,
			header: http.Header{"Retry-After": {"30"}}, body: googleQuotaNoRetry,
			want: eventFailure{class: classRate, errorType: "QUOTA_EXHAUSTED", status: 429,
				message: "Quota exceeded for quota metric 'Generate Content API requests per minute'.",
				quota: &weirv1.QuotaEvidence{Kind: quotaGoogle, ResetAfter: durationpb.New(30 * time.Second),
					Message: "Quota exceeded for quota metric 'Generate Content API requests per minute'."}},
		},
		{
			name: "google quota exhausted with a Retry-After date", status: 429,
			header: http.Header{"Retry-After": {openAINow.Add(90 * time.Second).Format(http.TimeFormat)}}, body: googleQuotaNoRetry,
			want: eventFailure{class: classRate, errorType: "QUOTA_EXHAUSTED", status: 429,
				message: "Quota exceeded for quota metric 'Generate Content API requests per minute'.",
				quota: &weirv1.QuotaEvidence{Kind: quotaGoogle, ResetAfter: durationpb.New(90 * time.Second),
					Message: "Quota exceeded for quota metric 'Generate Content API requests per minute'."}},
		},
		{
			name: "google quota exhausted with a useless Retry-After", status: 429,
			header: http.Header{"Retry-After": {"0"}}, body: googleQuotaNoRetry,
			want: eventFailure{class: classRate, errorType: "QUOTA_EXHAUSTED", status: 429,
				message: "Quota exceeded for quota metric 'Generate Content API requests per minute'.",
				quota:   &weirv1.QuotaEvidence{Kind: quotaGoogle, Message: "Quota exceeded for quota metric 'Generate Content API requests per minute'."}},
		},
		{
			// A retryDelay that is not a positive Duration falls back to
			// Retry-After, which must be finite.
			name: "google quota exhausted with bad delays", status: 429,
			header: http.Header{"Retry-After": {"Inf"}},
			body:   `{"error":{"code":429,"message":"Quota exceeded.","status":"RESOURCE_EXHAUSTED","details":[{"@type":"type.googleapis.com/google.rpc.ErrorInfo","reason":"QUOTA_EXHAUSTED"},{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"-5s"}]}}`,
			want: eventFailure{class: classRate, errorType: "QUOTA_EXHAUSTED", message: "Quota exceeded.", status: 429,
				quota: &weirv1.QuotaEvidence{Kind: quotaGoogle, Message: "Quota exceeded."}},
		},
		{
			name: "google resource exhausted without ErrorInfo", status: 429,
			body: `[{"error":{"code":429,"message":"Resource has been exhausted (e.g. check quota).","status":"RESOURCE_EXHAUSTED"}}]`,
			want: eventFailure{class: classRate, errorType: "RESOURCE_EXHAUSTED", message: "Resource has been exhausted (e.g. check quota).", status: 429},
		},
		{
			name: "google invalid argument", status: 400,
			body: `[{"error":{"code":400,"message":"Invalid JSON payload received.","status":"INVALID_ARGUMENT"}}]`,
			want: eventFailure{class: classClient, errorType: "INVALID_ARGUMENT", message: "Invalid JSON payload received.", status: 400},
		},
		{
			name: "503 server_is_overloaded", status: 503, body: overloadedBody,
			want: eventFailure{class: classOverload, errorType: "server_is_overloaded", message: codexAtCapacityMessage, status: 503},
		},
		{
			// A proxy's status in front of an overloaded upstream: the code decides.
			name: "502 slow_down", status: 502,
			body: `{"error":{"message":"Please slow down.","type":"server_error","param":null,"code":"slow_down"}}`,
			want: eventFailure{class: classOverload, errorType: "slow_down", message: "Please slow down.", status: 502},
		},
		{
			// Only a 5xx: a 4xx naming it is the status's class.
			name: "429 slow_down stays rate limited", status: 429,
			body: `{"error":{"message":"Please slow down.","type":"server_error","code":"slow_down"}}`,
			want: eventFailure{class: classRate, errorType: "slow_down", message: "Please slow down.", status: 429},
		},
		{
			name: "500 server_error", status: 500,
			body: `{"error":{"message":"The server had an error while processing your request. Sorry about that!","type":"server_error","param":null,"code":null}}`,
			want: eventFailure{class: classOverload, errorType: "server_error", message: "The server had an error while processing your request. Sorry about that!", status: 500},
		},
		{
			name: "non-JSON 502", status: 502, header: http.Header{"Content-Type": {"text/html"}},
			body: "<html>\r\n<head><title>502 Bad Gateway</title></head>\r\n<body><center><h1>502 Bad Gateway</h1></center></body>\r\n</html>\r\n",
			want: eventFailure{class: weirv1.OutcomeClass_OUTCOME_CLASS_GATEWAY_ERROR, status: 502},
		},
		{
			name: "empty body", status: 503, body: "",
			want: eventFailure{class: classOverload, status: 503},
		},
		{
			name: "JSON without an error object", status: 500, body: `{"detail":"Internal Server Error"}`,
			want: eventFailure{class: classOverload, status: 500},
		},
		{
			name: "error as a bare string", status: 404, body: `{"error":"Not Found"}`,
			want: eventFailure{class: classClient, message: "Not Found", status: 404},
		},
		{
			name: "context_length_exceeded at an odd status", status: 422,
			body: `{"error":{"message":"Your input exceeds the context window of this model. Please adjust your input and try again.","type":"invalid_request_error","param":"input","code":"context_length_exceeded"}}`,
			want: eventFailure{class: classClient, errorType: "context_length_exceeded", status: 422,
				message: "Your input exceeds the context window of this model. Please adjust your input and try again."},
		},
		{
			name: "invalid_request_error at a 500", status: 500,
			body: `{"error":{"message":"Invalid 'input[3].content': empty array.","type":"invalid_request_error","param":"input[3].content","code":null}}`,
			want: eventFailure{class: classClient, errorType: "invalid_request_error", message: "Invalid 'input[3].content': empty array.", status: 500},
		},
		{
			// OpenAI's missing-key 401 is of type invalid_request_error: still an auth error.
			name: "401 of type invalid_request_error", status: 401,
			body: `{"error":{"message":"You didn't provide an API key.","type":"invalid_request_error","param":null,"code":null}}`,
			want: eventFailure{class: classAuth, errorType: "invalid_request_error", message: "You didn't provide an API key.", status: 401},
		},
		{
			name: "secrets redacted", status: 401,
			body: `{"error":{"message":"Incorrect API key provided: sk-proj-********************************************AbCd. Header was Authorization: Bearer eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiIxMjMifQ.c2lnbmF0dXJl and key sk-ant-api03-abcDEF123_xyz.","type":"invalid_request_error","param":null,"code":"invalid_api_key"}}`,
			want: eventFailure{class: classAuth, errorType: "invalid_api_key", status: 401,
				message: "Incorrect API key provided: [redacted]. Header was Authorization: Bearer [redacted] and key [redacted]."},
		},
		{
			name: "message collapsed to one line", status: 400,
			body: `{"error":{"message":"line one\n\tline two\r\n  line three ","type":"invalid_request_error","code":null}}`,
			want: eventFailure{class: classClient, errorType: "invalid_request_error", message: "line one line two line three", status: 400},
		},
		{
			name: "long message truncated on a rune boundary", status: 400,
			body: `{"error":{"message":"` + longMessage + `","type":"invalid_request_error","code":null}}`,
			want: eventFailure{class: classClient, errorType: "invalid_request_error", message: strings.Repeat("é", 150), status: 400},
		},
		{
			// A 2xx is read by the body's names, as classify does.
			name: "error body under a 200", status: 200, body: overloadedBody,
			want: eventFailure{class: classOverload, errorType: "server_is_overloaded", message: codexAtCapacityMessage, status: 200},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got := openAIErrorEvidence(tt.status, tt.header, []byte(tt.body), openAINow)
			checkOpenAIFailure(t, got, tt.want)
		})
	}
}

func TestOpenAIMessageLimits(t *testing.T) {
	t.Parallel()
	// 299 ASCII bytes then a 3-byte rune: the rune does not fit.
	msg := strings.Repeat("a", 299) + "€" + "tail"
	got := upstreamMessageLine(msg)
	if got != strings.Repeat("a", 299) {
		t.Errorf("upstreamMessageLine cut to %d bytes %q, want the 299 a's", len(got), got[290:])
	}
	if got := upstreamMessageLine("bad \xff\xfe utf8"); got != "bad \uFFFD utf8" {
		t.Errorf("upstreamMessageLine(invalid UTF-8) = %q", got)
	}
	// Words that merely contain the prefixes are kept.
	if got := upstreamMessageLine("the task-runner and desk-top sk-1"); got != "the task-runner and desk-top sk-1" {
		t.Errorf("upstreamMessageLine redacted a non-secret: %q", got)
	}
}

func TestResponsesSignal(t *testing.T) {
	t.Parallel()
	ev := func(name, data string) sseEvent { return sseEvent{name: name, data: []byte(data)} }
	tests := []struct {
		name string
		ev   sseEvent
		want streamSignal
	}{
		{"created", ev("response.created", `{"type":"response.created","sequence_number":0,"response":{"id":"resp_1","object":"response","status":"in_progress","output":[],"usage":null}}`), streamSignal{}},
		{"in progress", ev("response.in_progress", `{"type":"response.in_progress","sequence_number":1,"response":{"id":"resp_1","status":"in_progress"}}`), streamSignal{}},
		{"queued", ev("response.queued", `{"type":"response.queued","sequence_number":1,"response":{"id":"resp_1","status":"queued"}}`), streamSignal{}},
		{"codex rate limits", ev("codex.rate_limits", `{"type":"codex.rate_limits","primary":{"used_percent":42.0,"window_minutes":300,"resets_at":1785710000}}`), streamSignal{}},
		{"output item added", ev("response.output_item.added", `{"type":"response.output_item.added","sequence_number":2,"output_index":0,"item":{"id":"msg_1","type":"message","status":"in_progress","role":"assistant","content":[]}}`), streamSignal{output: true}},
		{"content part added", ev("response.content_part.added", `{"type":"response.content_part.added","sequence_number":3,"item_id":"msg_1","output_index":0,"content_index":0,"part":{"type":"output_text","text":"","annotations":[]}}`), streamSignal{output: true}},
		{"text delta", ev("response.output_text.delta", `{"type":"response.output_text.delta","sequence_number":4,"item_id":"msg_1","output_index":0,"content_index":0,"delta":"Hel"}`), streamSignal{output: true}},
		{"reasoning summary delta", ev("response.reasoning_summary_text.delta", `{"type":"response.reasoning_summary_text.delta","sequence_number":3,"item_id":"rs_1","output_index":0,"summary_index":0,"delta":"**Planning**"}`), streamSignal{output: true}},
		{"function call arguments delta", ev("response.function_call_arguments.delta", `{"type":"response.function_call_arguments.delta","sequence_number":5,"item_id":"fc_1","output_index":1,"delta":"{\"cmd\":"}`), streamSignal{output: true}},
		{"unknown response event", ev("response.web_search_call.searching", `{"type":"response.web_search_call.searching","sequence_number":3,"output_index":0,"item_id":"ws_1"}`), streamSignal{output: true}},
		{"unknown non-response event", ev("keepalive", `{"type":"keepalive"}`), streamSignal{}},
		{"named by data type", ev("message", `{"type":"response.output_text.delta","delta":"x"}`), streamSignal{output: true}},
		{"completed with tokens", ev("response.completed", responsesCompleted), streamSignal{done: true, usage: usage{input: 210, output: 56, cacheRead: 1024, reasoning: 32}}},
		{"completed without usage", ev("response.completed", `{"type":"response.completed","response":{"id":"resp_1","status":"completed","usage":null}}`), streamSignal{done: true}},
		{"incomplete", ev("response.incomplete", `{"type":"response.incomplete","response":{"id":"resp_1","status":"incomplete","incomplete_details":{"reason":"max_output_tokens"},"usage":{"input_tokens":900,"output_tokens":4096}}}`), streamSignal{done: true, usage: usage{input: 900, output: 4096}}},
		{"completed not JSON", ev("response.completed", `{`), streamSignal{done: true}},
	}
	for _, tt := range tests {
		if got := responsesSignal(tt.ev); got.output != tt.want.output || got.done != tt.want.done || got.failure != nil ||
			got.usage != tt.want.usage {
			t.Errorf("%s: responsesSignal = %+v, want %+v", tt.name, got, tt.want)
		}
	}
}

func TestResponsesSignalFailure(t *testing.T) {
	t.Parallel()
	ev := func(name, data string) sseEvent { return sseEvent{name: name, data: []byte(data)} }
	tests := []struct {
		name string
		ev   sseEvent
		want eventFailure
	}{
		{
			name: "response.failed at capacity", ev: ev("response.failed", atCapacityFailed),
			want: eventFailure{class: classOverload, errorType: "server_is_overloaded", message: codexAtCapacityMessage, status: 503},
		},
		{
			// The at-capacity message decides whatever the code.
			name: "at capacity with another code",
			ev:   ev("response.failed", `{"type":"response.failed","response":{"status":"failed","error":{"code":"model_error","message":"Selected model is at capacity. Please try a different model."}}}`),
			want: eventFailure{class: classOverload, errorType: "model_error", message: codexAtCapacityMessage, status: 503},
		},
		{
			name: "response.failed rate limit",
			ev:   ev("response.failed", `{"type":"response.failed","response":{"status":"failed","error":{"code":"rate_limit_exceeded","message":"Rate limit reached for gpt-5 on tokens per min (TPM). Please try again in 1.2s."}}}`),
			want: eventFailure{class: classRate, errorType: "rate_limit_exceeded", message: "Rate limit reached for gpt-5 on tokens per min (TPM). Please try again in 1.2s.", status: 429},
		},
		{
			name: "response.failed usage limit",
			ev:   ev("response.failed", `{"type":"response.failed","response":{"status":"failed","error":{"code":"usage_limit_reached","message":"The usage limit has been reached","resets_at":1785736800,"resets_in_seconds":36800}}}`),
			want: eventFailure{class: classRate, errorType: "usage_limit_reached", message: codexUsageLimitMessage, status: 429,
				quota: &weirv1.QuotaEvidence{Kind: quotaCodex, ResetsAt: unixTimestamp(1785736800), ResetAfter: durationpb.New(36800 * time.Second), Message: codexUsageLimitMessage}},
		},
		{
			name: "response.failed insufficient quota",
			ev:   ev("response.failed", `{"type":"response.failed","response":{"status":"failed","error":{"code":"insufficient_quota","message":"You exceeded your current quota."}}}`),
			want: eventFailure{class: classRate, errorType: "insufficient_quota", message: "You exceeded your current quota.", status: 429,
				quota: &weirv1.QuotaEvidence{Kind: quotaOpenAI, Message: "You exceeded your current quota."}},
		},
		{
			name: "response.failed context length",
			ev:   ev("response.failed", `{"type":"response.failed","response":{"status":"failed","error":{"code":"context_length_exceeded","message":"Your input exceeds the context window of this model."}}}`),
			want: eventFailure{class: classClient, errorType: "context_length_exceeded", message: "Your input exceeds the context window of this model.", status: 400},
		},
		{
			name: "response.failed server_error",
			ev:   ev("response.failed", `{"type":"response.failed","response":{"status":"failed","error":{"code":"server_error","message":"An error occurred while processing your request."}}}`),
			want: eventFailure{class: classOverload, errorType: "server_error", message: "An error occurred while processing your request.", status: 503},
		},
		{
			name: "response.failed unknown code",
			ev:   ev("response.failed", `{"type":"response.failed","response":{"status":"failed","error":{"code":"vector_store_timeout","message":"Timed out."}}}`),
			want: eventFailure{class: classUpstream, errorType: "vector_store_timeout", message: "Timed out.", status: 500},
		},
		{
			name: "response.failed without an error", ev: ev("response.failed", `{"type":"response.failed","response":{"status":"failed","error":null}}`),
			want: eventFailure{class: classUpstream, status: 500},
		},
		{
			name: "response.failed not JSON", ev: ev("response.failed", `not json`),
			want: eventFailure{class: classUpstream, status: 500},
		},
		{
			name: "error event",
			ev:   ev("error", `{"type":"error","sequence_number":3,"code":"server_is_overloaded","message":"The server is overloaded, please try again later.","param":null}`),
			want: eventFailure{class: classOverload, errorType: "server_is_overloaded", message: "The server is overloaded, please try again later.", status: 503},
		},
		{
			name: "error event invalid prompt",
			ev:   ev("error", `{"type":"error","sequence_number":1,"code":"invalid_prompt","message":"Invalid prompt: your prompt was flagged.","param":null}`),
			want: eventFailure{class: classClient, errorType: "invalid_prompt", message: "Invalid prompt: your prompt was flagged.", status: 400},
		},
		{
			name: "error event nested",
			ev:   ev("error", `{"type":"error","error":{"type":"invalid_request_error","code":"context_length_exceeded","message":"Too long."}}`),
			want: eventFailure{class: classClient, errorType: "context_length_exceeded", message: "Too long.", status: 400},
		},
		{
			// Without an event: line the data's type names it.
			name: "error event named by data",
			ev:   ev("message", `{"type":"error","code":"rate_limit_exceeded","message":"Slow down."}`),
			want: eventFailure{class: classRate, errorType: "rate_limit_exceeded", message: "Slow down.", status: 429},
		},
		{
			name: "error event not JSON", ev: ev("error", `oops`),
			want: eventFailure{class: classUpstream, status: 500},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got := responsesSignal(tt.ev)
			if got.output || got.done || got.failure == nil {
				t.Fatalf("responsesSignal = %+v, want a failure", got)
			}
			checkOpenAIFailure(t, *got.failure, tt.want)
		})
	}
}

func TestChatSignal(t *testing.T) {
	t.Parallel()
	data := func(s string) sseEvent { return sseEvent{name: "message", data: []byte(s)} }
	const head = `{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1785700000,"model":"gpt-4.1","system_fingerprint":"fp_1",`
	tests := []struct {
		name string
		ev   sseEvent
		want streamSignal
	}{
		{"done", data("[DONE]"), streamSignal{done: true}},
		{"role-only first chunk", data(head + `"choices":[{"index":0,"delta":{"role":"assistant","content":"","refusal":null},"logprobs":null,"finish_reason":null}]}`), streamSignal{}},
		{"content chunk", data(head + `"choices":[{"index":0,"delta":{"content":"Hello"},"logprobs":null,"finish_reason":null}]}`), streamSignal{output: true}},
		{"reasoning chunk", data(head + `"choices":[{"index":0,"delta":{"reasoning_content":"Let me think"},"finish_reason":null}]}`), streamSignal{output: true}},
		{"refusal chunk", data(head + `"choices":[{"index":0,"delta":{"refusal":"I can't help with that."},"finish_reason":null}]}`), streamSignal{output: true}},
		{"tool call chunk", data(head + `"choices":[{"index":0,"delta":{"role":"assistant","content":null,"tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"get_weather","arguments":""}}]},"finish_reason":null}]}`), streamSignal{output: true}},
		{"function call chunk", data(head + `"choices":[{"index":0,"delta":{"function_call":{"name":"get_weather","arguments":""}},"finish_reason":null}]}`), streamSignal{output: true}},
		{"finish chunk", data(head + `"choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":"stop"}]}`), streamSignal{output: true}},
		{"usage chunk", data(head + `"choices":[],"usage":{"prompt_tokens":19,"completion_tokens":10,"total_tokens":29}}`), streamSignal{usage: usage{input: 19, output: 10}}},
		{"usage chunk with details", data(head + `"choices":[],"usage":{"prompt_tokens":1117,"completion_tokens":55,"total_tokens":1172,"prompt_tokens_details":{"cached_tokens":1024,"audio_tokens":0},"completion_tokens_details":{"reasoning_tokens":32,"audio_tokens":0,"accepted_prediction_tokens":0,"rejected_prediction_tokens":0}}}`),
			streamSignal{usage: usage{input: 93, output: 55, cacheRead: 1024, reasoning: 32}}},
		{"usage null", data(head + `"choices":[{"index":0,"delta":{"content":"x"},"finish_reason":null}],"usage":null}`), streamSignal{output: true}},
		{"empty tool calls", data(head + `"choices":[{"index":0,"delta":{"tool_calls":[]},"finish_reason":null}]}`), streamSignal{}},
		{"not JSON", data(`: keepalive`), streamSignal{}},
		{"empty", data(``), streamSignal{}},
	}
	for _, tt := range tests {
		if got := chatSignal(tt.ev); got != tt.want {
			t.Errorf("%s: chatSignal = %+v, want %+v", tt.name, got, tt.want)
		}
	}
}

func TestChatSignalFailure(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		data string
		want eventFailure
	}{
		{
			name: "error chunk",
			data: `{"error":{"message":"The server had an error while processing your request. Sorry about that!","type":"server_error","param":null,"code":null}}`,
			want: eventFailure{class: classOverload, errorType: "server_error", message: "The server had an error while processing your request. Sorry about that!", status: 503},
		},
		{
			name: "error chunk code wins over type",
			data: `{"error":{"message":"Rate limit reached.","type":"server_error","param":null,"code":"rate_limit_exceeded"}}`,
			want: eventFailure{class: classRate, errorType: "rate_limit_exceeded", message: "Rate limit reached.", status: 429},
		},
		{
			// An unknown code falls back to the type's class.
			name: "unknown code, known type",
			data: `{"error":{"message":"Bad.","type":"invalid_request_error","param":"messages","code":"some_new_code"}}`,
			want: eventFailure{class: classClient, errorType: "some_new_code", message: "Bad.", status: 400},
		},
		{
			name: "google error chunk",
			data: `{"error":{"code":429,"message":"Resource exhausted.","status":"RESOURCE_EXHAUSTED","details":[{"@type":"type.googleapis.com/google.rpc.ErrorInfo","reason":"QUOTA_EXHAUSTED"},{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"1.5s"}]}}`,
			want: eventFailure{class: classRate, errorType: "QUOTA_EXHAUSTED", message: "Resource exhausted.", status: 429,
				quota: &weirv1.QuotaEvidence{Kind: quotaGoogle, ResetAfter: durationpb.New(1500 * time.Millisecond), Message: "Resource exhausted."}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got := chatSignal(sseEvent{name: "message", data: []byte(tt.data)})
			if got.output || got.done || got.failure == nil {
				t.Fatalf("chatSignal = %+v, want a failure", got)
			}
			checkOpenAIFailure(t, *got.failure, tt.want)
		})
	}
}

func TestOpenAIUsage(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		body string
		want usage
	}{
		{"responses", `{"id":"resp_1","object":"response","status":"completed","usage":{"input_tokens":328,"input_tokens_details":{"cached_tokens":0},"output_tokens":52,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":380}}`,
			usage{input: 328, output: 52}},
		{"responses cached and reasoning", `{"usage":{"input_tokens":5230,"input_tokens_details":{"cached_tokens":4864},"output_tokens":412,"output_tokens_details":{"reasoning_tokens":256},"total_tokens":5642}}`,
			usage{input: 366, output: 412, cacheRead: 4864, reasoning: 256}},
		{"chat", `{"id":"chatcmpl-1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"Hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":19,"completion_tokens":10,"total_tokens":29,"prompt_tokens_details":{"cached_tokens":0}}}`,
			usage{input: 19, output: 10}},
		{"chat cached and reasoning", `{"usage":{"prompt_tokens":2006,"completion_tokens":300,"total_tokens":2306,"prompt_tokens_details":{"cached_tokens":1920,"audio_tokens":0},"completion_tokens_details":{"reasoning_tokens":192,"audio_tokens":0,"accepted_prediction_tokens":0,"rejected_prediction_tokens":0}}}`,
			usage{input: 86, output: 300, cacheRead: 1920, reasoning: 192}},
		// A part is never more than its whole.
		{"cached past the input", `{"usage":{"input_tokens":100,"input_tokens_details":{"cached_tokens":150},"output_tokens":5,"output_tokens_details":{"reasoning_tokens":9}}}`,
			usage{output: 5, cacheRead: 100, reasoning: 5}},
		{"details null", `{"usage":{"prompt_tokens":7,"completion_tokens":3,"prompt_tokens_details":null,"completion_tokens_details":null}}`, usage{input: 7, output: 3}},
		{"no usage", `{"id":"resp_1","object":"response"}`, usage{}},
		{"usage null", `{"usage":null}`, usage{}},
		{"negative", `{"usage":{"input_tokens":-5,"output_tokens":3,"input_tokens_details":{"cached_tokens":-2}}}`, usage{output: 3}},
		{"not JSON", `<html>`, usage{}},
	}
	for _, tt := range tests {
		if got, _ := openAIUsage([]byte(tt.body)); got != tt.want {
			t.Errorf("%s: openAIUsage = %+v, want %+v", tt.name, got, tt.want)
		}
	}
}

// checkUsageInvariants holds for every usage the readers make: no count
// below zero, no part above its whole.
func checkUsageInvariants(t *testing.T, u usage) {
	t.Helper()
	if u.input < 0 || u.output < 0 || u.cacheRead < 0 || u.cacheCreation < 0 || u.reasoning < 0 || u.reasoning > u.output {
		t.Fatalf("usage %+v", u)
	}
}

// checkFailureInvariants holds for every failure the OpenAI readers make.
func checkFailureInvariants(t *testing.T, f *eventFailure) {
	t.Helper()
	if len(f.message) > maxMessageBytes || !utf8.ValidString(f.message) || strings.ContainsAny(f.message, "\r\n") {
		t.Fatalf("message %q: not one valid line of at most %d bytes", f.message, maxMessageBytes)
	}
	if !utf8.ValidString(f.errorType) {
		t.Fatalf("errorType %q is not valid UTF-8", f.errorType)
	}
	q := f.quota
	if q == nil {
		return
	}
	if f.class != classRate {
		t.Fatalf("quota %v with class %v", q, f.class)
	}
	if q.Message != f.message {
		t.Fatalf("quota message %q, failure message %q", q.Message, f.message)
	}
	if q.ResetsAt != nil && q.ResetsAt.CheckValid() != nil {
		t.Fatalf("invalid resets_at %v", q.ResetsAt)
	}
	if q.ResetAfter != nil && (q.ResetAfter.CheckValid() != nil || q.ResetAfter.AsDuration() <= 0) {
		t.Fatalf("invalid reset_after %v", q.ResetAfter)
	}
	if q.WindowMinutes < 0 {
		t.Fatalf("window_minutes %d", q.WindowMinutes)
	}
	if _, err := proto.Marshal(q); err != nil {
		t.Fatalf("quota does not marshal: %v", err)
	}
}

func FuzzOpenAIErrorEvidence(f *testing.F) {
	f.Add(429, "", "", codexUsageLimitBody)
	f.Add(429, "30", "100", googleQuotaNoRetry)
	f.Add(429, "", "100", googleQuotaArrayBody)
	f.Add(503, "", "", overloadedBody)
	f.Add(502, "", "", "<html>502</html>")
	f.Fuzz(func(t *testing.T, status int, retryAfter, used string, body string) {
		h := codexHeaders(used, 1785736800, used, 1786000000)
		h.Set("Retry-After", retryAfter)
		got := openAIErrorEvidence(status, h, []byte(body), openAINow)
		if got.status != status {
			t.Fatalf("status %d, want %d", got.status, status)
		}
		checkFailureInvariants(t, &got)
		if q := got.quota; q != nil && q.ResetsAt != nil && !q.ResetsAt.AsTime().After(openAINow) {
			t.Fatalf("resets_at %v not after now", q.ResetsAt.AsTime())
		}
		if again := openAIErrorEvidence(status, h, []byte(body), openAINow); again.class != got.class ||
			again.errorType != got.errorType || !proto.Equal(again.quota, got.quota) {
			t.Fatalf("not deterministic")
		}
	})
}

func FuzzResponsesSignal(f *testing.F) {
	f.Add("response.failed", atCapacityFailed)
	f.Add("response.completed", responsesCompleted)
	f.Add("error", `{"type":"error","code":"usage_limit_reached","message":"x","resets_at":"1785736800"}`)
	f.Add("message", `{"type":"response.output_text.delta","delta":"x"}`)
	f.Add("message", `{"object":"chat.completion.chunk","choices":[],"usage":{"prompt_tokens":10,"completion_tokens":4,"prompt_tokens_details":{"cached_tokens":12},"completion_tokens_details":{"reasoning_tokens":9}}}`)
	f.Add("response.incomplete", `{"type":"response.incomplete","response":{"usage":{"input_tokens":-1,"input_tokens_details":{"cached_tokens":5},"output_tokens":7,"output_tokens_details":{"reasoning_tokens":-2}}}}`)
	f.Fuzz(func(t *testing.T, name, data string) {
		for _, s := range []streamSignal{
			responsesSignal(sseEvent{name: name, data: []byte(data)}),
			chatSignal(sseEvent{name: name, data: []byte(data)}),
		} {
			if n := boolCount(s.output) + boolCount(s.done) + boolCount(s.failure != nil); n > 1 {
				t.Fatalf("signal %+v is more than one of output, done, failure", s)
			}
			checkUsageInvariants(t, s.usage)
			if s.failure != nil {
				checkFailureInvariants(t, s.failure)
				if s.failure.status != openAIStatusForClass(s.failure.class) {
					t.Fatalf("status %d for class %v", s.failure.status, s.failure.class)
				}
			}
		}
	})
}

func boolCount(b bool) int {
	if b {
		return 1
	}
	return 0
}
