package dataplane

import (
	"net/http"
	"strings"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	weirv1 "github.com/weirhq/weir/gen/weir/v1"
)

// metrics are the worker's own; every label is a bounded enum.
type metrics struct {
	requests      *prometheus.CounterVec
	attempts      *prometheus.CounterVec
	ttfb          *prometheus.HistogramVec
	routesDropped prometheus.Counter
	holds         prometheus.Counter
	holdSeconds   prometheus.Histogram
	usageLimits   *prometheus.CounterVec
	meteredSpills *prometheus.CounterVec
	// translated counts attempts by crossing (translation.go) and class.
	translated *prometheus.CounterVec
	leasePool  *prometheus.CounterVec
	poolReady  prometheus.Gauge
	poolEvents *prometheus.CounterVec
	// The outbox: reports the control plane did not take when sent.
	reportsDropped *prometheus.CounterVec
	redelivered    *prometheus.CounterVec
	// The body buffer (bodybudget.go).
	bodyBuffered prometheus.Gauge
	bodyRefused  *prometheus.CounterVec
	refusals     *prometheus.CounterVec
	// tokens are the tokens upstream answers reported using;
	// tokenCounters its counters by provider and family ([2]string →
	// *[len(tokenKinds)]prometheus.Counter): a label lookup hashes its
	// values, five times a request.
	tokens        *prometheus.CounterVec
	tokenCounters sync.Map
}

// Token kinds, the label of weir_tokens_total: weirv1.TokenUsage's counts.
const (
	tokenInput         = "input"
	tokenOutput        = "output"
	tokenCacheRead     = "cache_read"
	tokenCacheCreation = "cache_creation"
	tokenReasoning     = "reasoning"
)

// countTokens adds an attempt's usage to weir_tokens_total, every kind
// (a kind it reported none of at 0, so that the provider and family show
// all five).
func (m *metrics) countTokens(provider, family string, u *weirv1.TokenUsage) {
	key := [2]string{provider, family}
	c, ok := m.tokenCounters.Load(key)
	if !ok {
		var cs [len(tokenKinds)]prometheus.Counter
		for i, kind := range tokenKinds {
			cs[i] = m.tokens.WithLabelValues(provider, family, kind)
		}
		c, _ = m.tokenCounters.LoadOrStore(key, &cs)
	}
	cs := c.(*[len(tokenKinds)]prometheus.Counter)
	for i, n := range [len(tokenKinds)]int64{u.GetInputTokens(), u.GetOutputTokens(), u.GetCacheReadTokens(),
		u.GetCacheCreationTokens(), u.GetReasoningTokens()} {
		cs[i].Add(float64(max(n, 0)))
	}
}

// tokenKinds are the kind label's values, in countTokens' order.
var tokenKinds = [...]string{tokenInput, tokenOutput, tokenCacheRead, tokenCacheCreation, tokenReasoning}

// Request outcomes: how a client request ended, one fixed set.
const (
	outcomeSuccess         = "success"          // answered 2xx, stream finished
	outcomeStreamError     = "stream_error"     // the stream broke after output started
	outcomeClientError     = "client_error"     // the request itself was at fault (4xx)
	outcomeUnauthenticated = "unauthenticated"  // missing or invalid weir key
	outcomeRateLimited     = "rate_limited"     // the last attempt was a 429
	outcomeOverloaded      = "overloaded"       // the last attempt was a 529/503 or overload event
	outcomeUsageLimit      = "usage_limit"      // a final usage limit (quota spent pool-wide)
	outcomeUpstreamError   = "upstream_error"   // the upstream answered another error
	outcomeTransportError  = "transport_error"  // the upstream could not be reached or broke
	outcomeAuthError       = "auth_error"       // an account's credential was rejected
	outcomeNoAccount       = "no_account"       // no account could serve, no attempt made
	outcomeUnavailable     = "unavailable"      // the control plane could not be reached
	outcomeCanceled        = "canceled"         // the client left first
	outcomeModelForbidden  = "model_forbidden"  // the key's allowlist does not allow the model
	outcomeKeyRateLimited  = "key_rate_limited" // the key's own request rate limit
	// every account that could serve was unreachable through the unreachable hold
	outcomeUpstreamUnreachable = "upstream_unreachable"
	// the worker's body buffer could not take the body (its key's bound or the worker's)
	outcomeBodyBuffer = "body_buffer_full"
	// the key, its team or its session is over a budget
	outcomeBudget = "budget_exceeded"
)

var requestOutcomes = []string{outcomeSuccess, outcomeStreamError, outcomeClientError, outcomeUnauthenticated,
	outcomeRateLimited, outcomeOverloaded, outcomeUsageLimit, outcomeUpstreamError, outcomeTransportError,
	outcomeAuthError, outcomeNoAccount, outcomeUnavailable, outcomeCanceled, outcomeModelForbidden, outcomeKeyRateLimited,
	outcomeUpstreamUnreachable, outcomeBodyBuffer, outcomeBudget}

var surfaceNames = []string{surfaceMessages.name, surfaceCount.name, surfaceModels.name, surfaceResp.name, surfaceChat.name}

func newMetrics(reg *prometheus.Registry) *metrics {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "weir_dataplane_requests_total",
			Help: "Client requests finished, by surface and outcome (success, client_error, rate_limited, overloaded, usage_limit, …).",
		}, []string{"surface", "outcome"}),
		attempts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "weir_dataplane_upstream_attempts_total",
			Help: "Upstream attempts, by provider, HTTP status class, reason (the attempt's outcome class) and cause (a transport failure's: dns, refused, tls, timeout, reset, proxy (its egress proxy failed) or other; none for an answer).",
		}, []string{"provider", "status_class", "reason", "cause"}),
		ttfb: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "weir_dataplane_time_to_first_byte_seconds",
			Help:    "Time from a request's arrival to its first byte to the client.",
			Buckets: prometheus.ExponentialBuckets(0.005, 2.5, 12),
		}, []string{"surface"}),
		routesDropped: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "weir_dataplane_route_events_dropped_total",
			Help: "Route events dropped because the report queue was full.",
		}),
		holds: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "weir_dataplane_holds_total",
			Help: "Capacity holds: waits before replaying a request (incl. same-account overload retries).",
		}),
		holdSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "weir_dataplane_hold_seconds",
			Help:    "Time spent in one capacity hold.",
			Buckets: []float64{.1, .25, .5, 1, 2, 4, 8, 15, 30, 60, 120, 300, 600, 1200},
		}),
		usageLimits: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "weir_dataplane_usage_limits_total",
			Help: "Requests answered with a final usage limit (quota_response_mode usage_limit), by surface.",
		}, []string{"surface"}),
		meteredSpills: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "weir_dataplane_metered_spills_total",
			Help: "Requests served by a metered account (an API key) because no subscription account that serves the surface could, by the metered account's provider and surface.",
		}, []string{"provider", "surface"}),
		translated: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "weir_dataplane_translated_attempts_total",
			Help: "Attempts served by an account of the other wire's provider, translated, by translation (client surface>upstream surface) and outcome class.",
		}, []string{"translation", "class"}),
		leasePool: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "weir_dataplane_lease_pool_total",
			Help: "Lease requests by how they were served: reused (a kept lease, no control-plane call), acquired (asked the control plane), retry (a retry asking with the accounts tried), class_probe (one Acquire for every held request parked on a refused model), prefetch (a fresh lease asked off the request path as a busy one nears its reuse deadline), shared_none (a held class's shared no-account answer, no call); queued counts the requests that waited for a lease to come back because their class already had 4 Acquires in flight.",
		}, []string{"result"}),
	}
	m.poolReady = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "weir_dataplane_lease_pool_ready",
		Help: "1 while the worker's pool watch is connected and leases may be reused; 0 otherwise.",
	})
	m.poolEvents = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "weir_dataplane_lease_pool_invalidations_total",
		Help: "Pool watch invalidations applied, by scope: account (one account's state changed) or all.",
	}, []string{"scope"})
	m.reportsDropped = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "weir_dataplane_outcomes_dropped_total",
		Help: "Outcome reports dropped, oldest first, because the worker's outbox was full while the control plane could not take them, by kind: release (a failure's or an unkept success's Release) or success (a batched success).",
	}, []string{"kind"})
	m.redelivered = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "weir_dataplane_reports_redelivered_total",
		Help: "Reports sent again and answered after the control plane had not taken them (unreachable, or its database down), by kind: release or route_events (a batch).",
	}, []string{"kind"})
	m.bodyBuffered = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "weir_dataplane_request_body_buffer_bytes",
		Help: "Request-body bytes this worker holds reserved: bodies being read, and bodies kept while their request may still be replayed (holds included).",
	})
	m.bodyRefused = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "weir_dataplane_request_body_buffer_refusals_total",
		Help: "Requests refused because their body did not fit the worker's body buffer, by scope: key (its key's bound, a 429), worker (the worker's, a 503), reserve (the key holds other bodies and only the part kept for keys that hold none is left, a 503) or over_bound (the body alone is larger than a bound, a 413).",
	}, []string{"scope"})
	m.refusals = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "weir_dataplane_refusals_total",
		Help: "Requests refused before routing (no account leased, no route event: counted per key and reason in the control plane's refusal counts), by surface and reason (missing_key, invalid_key, bad_request, key_rate_limit, control_plane, body_buffer, body_too_large, body_timeout, invalid_body, model_forbidden, websocket_limit, canceled); a key the control plane could not check is recorded as a route event instead.",
	}, []string{"surface", "reason"})
	m.tokens = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "weir_tokens_total",
		Help: "Tokens upstream answers reported using, per attempt that reported any, by provider (the account's), model family (of the model sent upstream: opus, sonnet, haiku, codex, gpt, o-series, other) and kind: input (neither read from nor written to the prompt cache), output (reasoning included), cache_read, cache_creation, reasoning (the part of output spent reasoning).",
	}, []string{"provider", "family", "kind"})
	for _, sf := range surfaceNames {
		for _, r := range refusalReasons {
			m.refusals.WithLabelValues(sf, r)
		}
	}
	for _, k := range []string{"key", "worker", "reserve", "over_bound"} {
		m.bodyRefused.WithLabelValues(k)
	}
	for _, k := range []string{"release", "success"} {
		m.reportsDropped.WithLabelValues(k)
	}
	for _, k := range []string{"release", "route_events"} {
		m.redelivered.WithLabelValues(k)
	}
	m.poolEvents.WithLabelValues("account")
	m.poolEvents.WithLabelValues("all")
	for _, r := range []string{"reused", "acquired", "retry", "class_probe", "prefetch", "shared_none", "queued"} {
		m.leasePool.WithLabelValues(r)
	}
	// Every series exists from the start, at 0: rate() and alerts see the
	// first event, and dashboards show the whole label set.
	for _, sf := range surfaceNames {
		for _, o := range requestOutcomes {
			m.requests.WithLabelValues(sf, o)
		}
		m.usageLimits.WithLabelValues(sf)
	}
	// The metered providers on the surfaces a subscription can serve.
	for _, sp := range [][2]string{{"anthropic", surfaceMessages.name}, {"openai", surfaceResp.name}} {
		m.meteredSpills.WithLabelValues(sp[0], sp[1])
	}
	reg.MustRegister(m.requests, m.attempts, m.ttfb, m.routesDropped, m.holds, m.holdSeconds, m.usageLimits, m.meteredSpills, m.translated,
		m.leasePool, m.poolReady, m.poolEvents,
		m.reportsDropped, m.redelivered, m.bodyBuffered, m.bodyRefused, m.refusals, m.tokens,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

func statusClass(status int) string {
	switch {
	case status >= 500:
		return "5xx"
	case status >= 400:
		return "4xx"
	case status >= 200 && status < 300:
		return "2xx"
	case status == 0:
		return "none" // no answer: transport error or canceled
	}
	return "other"
}

// requestOutcome names how a request ended: an explicit verdict when the
// worker answered on its own (set), else what the status and the last
// attempt's class say. Pure.
func requestOutcome(set string, status int, last weirv1.OutcomeClass) string {
	if set != "" {
		return set
	}
	switch last {
	case weirv1.OutcomeClass_OUTCOME_CLASS_CLIENT_CANCELED:
		return outcomeCanceled
	case weirv1.OutcomeClass_OUTCOME_CLASS_STREAM_ERROR:
		return outcomeStreamError
	}
	if status == 0 {
		return outcomeCanceled
	}
	if status < 400 {
		return outcomeSuccess
	}
	switch last {
	case weirv1.OutcomeClass_OUTCOME_CLASS_RATE_LIMITED:
		return outcomeRateLimited
	case weirv1.OutcomeClass_OUTCOME_CLASS_OVERLOADED:
		return outcomeOverloaded
	case weirv1.OutcomeClass_OUTCOME_CLASS_TRANSPORT_ERROR:
		return outcomeTransportError
	case weirv1.OutcomeClass_OUTCOME_CLASS_AUTH_ERROR:
		return outcomeAuthError
	case weirv1.OutcomeClass_OUTCOME_CLASS_UPSTREAM_ERROR:
		return outcomeUpstreamError
	case weirv1.OutcomeClass_OUTCOME_CLASS_CLIENT_ERROR:
		return outcomeClientError
	}
	switch {
	case status == http.StatusUnauthorized || status == http.StatusForbidden:
		return outcomeUnauthenticated
	case status < 500:
		return outcomeClientError
	}
	return outcomeNoAccount
}

// modelFamily maps a model name onto a small fixed set, for span
// attributes and metric labels: a model string is the client's and
// unbounded.
func modelFamily(model string) string {
	m := strings.ToLower(model)
	for _, f := range []string{"opus", "sonnet", "haiku", "codex", "gpt"} {
		if strings.Contains(m, f) {
			return f
		}
	}
	if len(m) >= 2 && m[0] == 'o' && m[1] >= '1' && m[1] <= '9' {
		return "o-series"
	}
	return "other"
}
