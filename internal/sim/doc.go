// Package sim is an upstream simulator for the Anthropic Messages API, and
// for the OpenAI Responses (also as the Codex backend) and Chat Completions
// APIs.
//
// It speaks the real wire format (headers, error bodies, SSE events; see
// docs/wire.md) and maps each request's credential to a named account whose
// behaviour is scripted: queues of faults such as 429s with unified
// rate-limit headers, 529s, overloaded events inside a 200 stream, dropped
// connections and slow headers. weir's tests and `weir dev --simulate` use it
// so that nothing needs the real API.
//
// A Server is an http.Handler serving both the API (/v1/...) and a JSON
// control API under /_sim/ for changing the script and reading the log of
// attempts while it runs. Each attempt records when it started, when the
// simulator was done with it and when it first sent output (Attempt.Ended,
// Attempt.Output), so a harness can tell from the log alone how many
// requests an account had in flight and whether one was replayed after
// output (`weir chaos` does).
//
// # Subscription accounts
//
// OAuth accounts can opt into more of the real service's behaviour through
// script fields that are absent by default (an account without them
// behaves exactly as before):
//
//   - windows: live usage windows, a five-hour and a seven-day one, weekly
//     windows per model family ("opus", "sonnet") and an overage state.
//     Each has a token limit, what is used when the script loads and its
//     reset (resets_at, or reset_in from the sim clock). A successful
//     /v1/messages request adds its input and output tokens to five_hour,
//     seven_day and the window of its model's family; at its reset a
//     window empties and the next reset is one period later. A request
//     that draws on a full window gets a 429 rate_limit_error with
//     anthropic-ratelimit-unified-status: rejected, the rejecting windows
//     at 1.0, the representative claim (the rejecting window that resets
//     last) and its reset, retry-after until then and x-should-retry: true;
//     it uses up no fault. A full family window rejects only its family.
//     Successes report the live windows in the unified headers, this
//     request included, saturated at 0.99 as production does; a family
//     window's headers use the infix "7d_oi" unless it sets another.
//   - GET /api/oauth/usage (bearer plus the oauth beta): the windows in
//     percent (0..100), null where the account has none, extra_usage, and
//     with ?include_grants=true the reset grants. It allows 4 reads in any
//     rolling 10 minutes per account (usage_reads_per_10m; -1: no limit),
//     then 429 with retry-after until a read frees up. Accounts without
//     windows report their static five_hour/seven_day utilizations.
//   - refresh_token: POST /v1/oauth/token with
//     {"grant_type":"refresh_token","refresh_token":…,"client_id":…}
//     rotates both tokens. The refresh token is spent at once (a second
//     use, even a concurrent one, gets 400 invalid_grant); the replaced
//     access token works for 60 seconds more, then gets 401 "OAuth token
//     has expired"; issued access tokens live access_expires_in, or 8
//     hours. access_expires_in also makes the scripted credential expire.
//     Server.TokenRefreshes counts the calls per account.
//   - grants: banked resets, claimed with POST
//     /api/organizations/{org}/reset_rate_limits and
//     {"program","grant_id","request_id"}. The result is reset (the weekly
//     and family windows were full and are now empty), not_limited (nothing
//     spent), already_used, unavailable (expired) or ineligible (unknown
//     grant); a request_id seen before gets its first result again.
//   - GET /api/oauth/profile (bearer plus the oauth beta):
//     {"account":{"uuid","email","display_name"},"organization":{"uuid","name"}},
//     the uuids derived from the account's name (stable across runs and
//     logins). Profile reads are not logged as attempts.
//   - logins (login.go): GET /oauth/authorize approves at once, with a
//     302 to redirect_uri?code=…&state=…, or that as JSON
//     {"code","state","redirect_uri"} when asked with Accept:
//     application/json. Claude Code's client_id makes an oauth login,
//     Codex CLI's a chatgpt one; account=NAME logs in as a scripted
//     account, else each login is a new account. grant_type
//     authorization_code on the login's token endpoint (Claude JSON,
//     Codex form) checks the client_id, redirect_uri, state (when sent) and
//     the PKCE verifier against the S256 challenge, spends the code, and
//     issues tokens as a refresh does (Claude's answer adds account and
//     organization); anything wrong is 400 invalid_grant.
//
// Every read of the usage endpoint, token request and grant claim is
// logged in the attempt log under its path.
//
// # OpenAI and Codex accounts
//
// Two more account kinds serve OpenAI's surfaces (see docs/wire.md); they are
// never inferred from the credential, so the script names them:
//
//   - "chatgpt", a ChatGPT/Codex login: POST /backend-api/codex/responses
//     with Authorization: Bearer <token> and a chatgpt-account-id header
//     equal to the account's id (missing or different, 401). The id is
//     chatgpt_account_id when scripted, else the
//     "https://api.openai.com/auth".chatgpt_account_id claim of a
//     JWT-shaped credential, else a UUID-shaped id derived from the name
//     (Server.ChatGPTAccountID). An account discovered under
//     accept_unknown takes any non-empty id.
//   - "openai_key", an API key: POST /v1/responses and POST
//     /v1/chat/completions with Authorization: Bearer sk-….
//
// A credential used on another kind's path, including the Anthropic paths
// and kinds, gets 401; errors have OpenAI's shape
// {"error":{"message","type","param","code"}}. Responses requests need
// model and input, chat requests model and messages; stream is optional.
// A Responses stream is event: NAME / data: {"type":NAME,…,
// "sequence_number":n} blocks: response.created,
// response.output_item.added, response.output_text.delta per delta,
// response.output_item.done, response.completed (with usage), and no
// [DONE]; a chat stream is data: chat.completion.chunk lines ending with
// data: [DONE]. Every answer on the two Responses paths to an
// authenticated request carries x-codex-{primary,secondary}-used-percent,
// -window-minutes (300, 10080), -reset-after-seconds and -reset-at, the
// percentages being the account's five_hour_utilization and
// seven_day_utilization times 100.
//
// chatgpt accounts may opt into the subscription fields windows (five_hour
// and seven_day only), refresh_token, access_expires_in and
// usage_reads_per_10m:
//
//   - windows: successful requests fill them as on /v1/messages, the
//     x-codex-* headers report them (as they stand before the request,
//     used-percent with one decimal; an absent window sends no headers),
//     and while the five-hour or weekly window is full the Codex backend
//     answers the usage_limit_reached 429 below with resets_at and
//     resets_in_seconds of the full window that resets last, outcome
//     usage_limit, using up no fault. Static utilizations never reject.
//   - GET /backend-api/wham/usage (Bearer plus chatgpt-account-id, chatgpt
//     accounts only, else 401):
//     {"plan_type":"plus","rate_limit":{"allowed":true,"limit_reached":false,
//     "primary_window":{"used_percent":12,"limit_window_seconds":18000,
//     "reset_after_seconds":3600,"reset_at":EPOCH},"secondary_window":{…
//     604800…}},"credits":null}. used_percent is a whole percent (rounded
//     down; only a full window says 100, and then limit_reached is true and
//     allowed false); a scripted account without a window has it null. Reads
//     are limited per account as on /api/oauth/usage (429
//     rate_limit_exceeded with retry-after).
//   - POST /oauth/token (auth.openai.com), JSON or form
//     {"client_id","grant_type":"refresh_token","refresh_token","scope"}:
//     rotates the tokens as POST /v1/oauth/token does and answers
//     {"id_token","access_token","refresh_token","expires_in","token_type"}.
//     Both tokens are JWT-shaped (unsigned) with the account id claim; the
//     access token's exp is an hour ahead (access_expires_in), after which
//     it gets 401 token_expired. A spent or unknown refresh token gets 401
//     {"error":"invalid_grant","error_description":…}. Refresh tokens of
//     one endpoint are unknown at the other. Server.TokenRefreshes counts.
//
// Faults are queued and consumed as on /v1/messages. Three kinds are
// meant for these paths:
//
//   - usage_limit_reached: 429 {"error":{"type":"usage_limit_reached",
//     "message":"The usage limit has been reached","plan_type":"plus",
//     "resets_at":EPOCH,"resets_in_seconds":N}}, N being retry_after or
//     3600.
//   - at_capacity_event: a stream of response.created then response.failed
//     whose response.error is {"code":"server_is_overloaded","message":
//     "Selected model is at capacity. Please try a different model."};
//     without a stream (and on chat completions), 503 with that error.
//   - insufficient_quota: 429 {"error":{"message":"You exceeded your
//     current quota…","type":"insufficient_quota","param":null,
//     "code":"insufficient_quota"}}.
//
// More kinds for these paths:
//
//   - usage_limit_event: a stream of response.created then response.failed
//     whose response.error is {"code":"usage_limit_reached","message":"The
//     usage limit has been reached","resets_at":EPOCH,
//     "resets_in_seconds":N}; on chat the only line is data:
//     {"error":{"message":…,"type":"usage_limit_reached","param":null,
//     "code":"usage_limit_reached","resets_at":EPOCH,"resets_in_seconds":N}}.
//     Without a stream, usage_limit_reached.
//   - at_capacity_after_output: response.created, output_item.added,
//     after_deltas (2) output_text.delta events, then response.failed with
//     server_is_overloaded; on chat the role chunk, the content chunks, then
//     data: {"error":{"message":"Selected model is at capacity…",
//     "type":"server_error","param":null,"code":"server_is_overloaded"}} and
//     no [DONE]. Without a stream, the 503.
//   - at_capacity_error_event: response.created then an error event
//     {"type":"error","code":"server_is_overloaded","message":…,
//     "param":null,"sequence_number":1}; on chat that error line alone.
//     Without a stream, the 503.
//   - google_quota_exhausted and google_rate_limit: Google's 429
//     {"error":{"code":429,"message":"Resource has been exhausted (e.g.
//     check quota).","status":"RESOURCE_EXHAUSTED","details":[{"@type":
//     "type.googleapis.com/google.rpc.ErrorInfo","reason":"QUOTA_EXHAUSTED"
//     (or "RATE_LIMIT_EXCEEDED"),"domain":"googleapis.com"},{"@type":
//     "type.googleapis.com/google.rpc.RetryInfo","retryDelay":"22s"}]}},
//     the RetryInfo only with retry_after; "array": true wraps it in [ ].
//
// The generic kinds work there too: rate_limit (429 rate_limit_exceeded),
// overloaded and unavailable (503 server_error), api_error (500), revoked
// (401 invalid_api_key), bad_request (400), overloaded_event (as
// at_capacity_event), error_after_content (response.failed after some
// deltas), drop_mid_stream, drop_connection and slow_headers. On
// /v1/messages the three new kinds become a 429 rate_limit_error
// (usage_limit_reached, insufficient_quota) and the overloaded event
// (at_capacity_event), and so do usage_limit_event and the Google kinds
// (a 429), at_capacity_error_event (the overloaded event) and
// at_capacity_after_output (error_after_content). Attempts on these paths,
// the usage endpoint and the token endpoint are logged like the others.
//
// # Protocol misbehaviour
//
// Some faults break the protocol instead of answering with an error, on
// every path (misbehave.go): no_headers (accepts the request, never
// answers); reset_before_output and reset_after_output (a TCP reset
// mid-stream, or after half a non-streamed body whose Content-Length was
// promised); stall_before_output and stall_after_output (silence at the
// same points, the connection kept open); malformed_before_output and
// malformed_after_output (one malformed event, "malformed": garbage,
// non_json_data, broken_json or no_event_name, then the stream goes on;
// without a stream a 200 that is not JSON); oversized_line_before_output
// and oversized_line_after_output (one data line of "size" bytes, default
// 17 MiB); body_longer_than_length (the whole reply, then "size" bytes of
// junk past its Content-Length); huge_body ("size" bytes, default 65 MiB,
// with "status", default 200, and no Content-Length). "Before output" is
// right after the stream's first event, "after output" after after_deltas
// deltas.
//
// /v1/messages checks max_tokens as the real API does: not an integer,
// below 1 or above 128000 is a 400 invalid_request_error naming it (a
// body without it is still accepted).
//
//	{
//	  "accounts": [
//	    {"name": "codex", "credential": "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJ4In0.c2ln", "kind": "chatgpt",
//	     "refresh_token": "rt_codex0000000000000000000000",
//	     "five_hour_utilization": 0.4, "seven_day_utilization": 0.9,
//	     "faults": [{"kind": "at_capacity_event"}, {"kind": "usage_limit_reached", "retry_after": 1800}]},
//	    {"name": "platform", "credential": "sk-proj-platform000000000000000", "kind": "openai_key",
//	     "faults": [{"kind": "insufficient_quota"}]},
//	    {"name": "gemini", "credential": "AIzaSyGemini000000000000000000", "kind": "openai_key",
//	     "faults": [{"kind": "google_rate_limit", "retry_after": 22, "array": true}]}
//	  ]
//	}
//
// # How long a fault lasts
//
// A fault applies to "times" attempts (0 means 1, -1 means forever), or
// for a time instead: "for" (a Go duration such as "60s") makes it answer
// every matching attempt from the first one it applies to until that long
// has passed on the sim clock, and "until" (RFC 3339) every matching
// attempt until that time on the sim clock. Then it is consumed, and the
// next fault in the queue applies. At most one of times, for and until may
// be set. GET /_sim/script shows a begun for as the until it ends at, and
// leaves out faults whose time is over. A 60-second overload storm, then
// a rate limit until a fixed time:
//
//	[{"kind": "overloaded", "for": "60s"}, {"kind": "rate_limit", "until": "2026-03-04T11:00:00Z"}]
//
// # Tool calls
//
// A request that offers tools the client runs (Messages tools, without a
// server tool's versioned type; Responses tools of type function or
// custom, also inside a namespace and in the input's additional_tools
// items, where Codex 0.171 puts them for its default model; Chat
// Completions tools of type function) is answered with a call of one of
// them instead of text, whatever the model, so that an agent's turn takes
// several requests, each of which meets the account's faults as a text
// answer would (tools.go):
//
//   - /v1/messages: one tool_use block {"type":"tool_use","id":"toolu_…",
//     "name","input"} and stop_reason tool_use; streamed, content_block_start
//     opens it with an empty input, input_json_delta events carry the input
//     in partial_json pieces (the first one empty), then content_block_stop
//     and message_delta.
//   - the Responses paths: a function_call output item {"type":
//     "function_call","id":"fc_…","call_id":"call_…","name","arguments"};
//     streamed, response.output_item.added (arguments ""),
//     response.function_call_arguments.delta pieces,
//     response.function_call_arguments.done, response.output_item.done and
//     response.completed with the item in its output. A custom tool gets a
//     custom_tool_call item {"type":"custom_tool_call","id":"ctc_…",
//     "call_id":"call_…","name","input"} with
//     response.custom_tool_call_input.delta and .done events instead. A
//     tool declared in a namespace is called with its "namespace".
//   - /v1/chat/completions: message.tool_calls and finish_reason
//     tool_calls; streamed, after the role-only chunk one names the call
//     (index, id, type function, function.name, arguments ""), the next
//     ones carry its arguments in pieces.
//
// The tool called is the one tool_choice names, else the first of
// prefer_tools that is offered (default Bash, Read, LS, Glob,
// exec_command, shell_command, shell, exec), else the first offered;
// tool_choice "none" gets text. A custom tool's input is free text:
// JavaScript that runs "echo weir-sim" through exec_command for exec
// (Codex's code mode), "weir-sim" for others. A function's input fills
// the required properties of the tool's schema with harmless values:
// "echo weir-sim" for a command (["echo", "weir-sim"] where the schema
// wants an array, as Codex's shell does), README.md for a file path, "."
// for another path, "weir-sim" for other strings, 1, false, the first
// enum value; and a description where the schema has one. A turn (what follows the last user message that answers
// no tool call) gets tool_calls_per_turn calls (default 3; 0: never): once
// it holds that many tool results (tool_result blocks, *_call_output
// items, role tool messages), or when the conversation does not end with a
// user message or a tool result, the answer is the text. Both are script
// fields, and an account's own override the script's. The output tokens of
// a tool call count its arguments as those of text count the text.
//
// # Token usage
//
// Every answer reports its tokens the way its wire does, streamed and not
// (usage.go), counted by size (about four bytes a token; a request's
// input is its body's), and the attempt log has what each reported
// (Attempt.Usage, in one vocabulary: input neither read from nor written
// to the cache, output with reasoning, cache reads and writes,
// reasoning), as far as it went out: a stream cut midway logs what came
// before the cut.
//
//   - /v1/messages: usage.input_tokens, cache_read_input_tokens,
//     cache_creation_input_tokens and output_tokens; streamed,
//     message_start's message.usage has the input and both cache fields
//     (and output_tokens 1), message_delta's usage output_tokens alone.
//   - the Responses paths: usage.input_tokens (cached tokens included),
//     input_tokens_details.cached_tokens, output_tokens (reasoning
//     included), output_tokens_details.reasoning_tokens, total_tokens;
//     streamed, in response.completed's response.
//   - /v1/chat/completions: usage.prompt_tokens (cached included),
//     completion_tokens, total_tokens, prompt_tokens_details.cached_tokens,
//     completion_tokens_details.reasoning_tokens; streamed only when the
//     request sets stream_options.include_usage, as a last chunk with
//     "choices":[] before [DONE], every chunk before it saying "usage":
//     null.
//
// Each account has a prompt cache. A request's prefix is its model,
// system prompt (instructions), tools and every message (input item) but
// the last; an account remembers the prefixes of the requests it served
// for 5 minutes of the sim clock from their last use. A request reads the
// longest of its prefixes cut at a message that the account remembers
// (the same request again reads all of it, the next turn of a
// conversation what the turn before wrote) and writes its own. On
// /v1/messages only a request that asks for caching (a cache_control in
// its system, messages or tools) reads or writes, reporting what it wrote
// as cache_creation_input_tokens; the OpenAI paths cache on their own and
// report only what they read. The output of a reasoning model (gpt-5 and
// later, the codex models, the o-series) or of a request asking for
// reasoning (reasoning, reasoning_effort) includes reasoning tokens: 64,
// or by effort 0 (none), 8 (minimal), 16 (low), 256 (high), 512 (xhigh).
// Usage windows are charged the input and the answer's text or tool call,
// reasoning left out.
//
// # Time
//
// Windows, token expiry, grant expiry, timed faults and the usage read
// limit all run on Config.Now. With Config.ManualClock the simulator keeps its own virtual
// time, starting at Config.Now(), that moves only with Server.Advance or
// POST /_sim/clock {"advance":"2h"} (409 without a manual clock), so that a
// test can cross a weekly reset without waiting. GET
// /_sim/accounts/{name}/windows and Server.Windows show an account's live
// windows.
//
// # Example script
//
//	{
//	  "accept_unknown": false,
//	  "tool_calls_per_turn": 3,
//	  "accounts": [
//	    {"name": "team", "credential": "sk-ant-api03-team0000000000000000", "kind": "api_key"},
//	    {"name": "max", "credential": "sk-ant-oat01-max00000000000000000", "kind": "oauth",
//	     "refresh_token": "sk-ant-ort01-max00000000000000000",
//	     "access_expires_in": "8h",
//	     "usage_reads_per_10m": 4,
//	     "windows": {
//	       "five_hour": {"limit": 200000, "used": 50000, "reset_in": "3h"},
//	       "seven_day": {"limit": 2000000, "used": 1880000, "resets_at": "2026-03-07T10:00:00Z"},
//	       "families": {
//	         "opus": {"limit": 500000, "used": 500000, "reset_in": "51811s",
//	                  "claim": "seven_day_overage_included", "header": "7d_oi"}
//	       },
//	       "overage": {"status": "rejected", "disabled_reason": "org_level_disabled"}
//	     },
//	     "grants": [{"id": "g1", "program": "max-resets", "expires_in": "168h"}],
//	     "faults": [{"kind": "overloaded", "times": 2}]}
//	  ]
//	}
package sim
