package dataplane

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
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
}

func newMetrics(reg *prometheus.Registry) *metrics {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "weir_dataplane_requests_total",
			Help: "Client requests finished, by surface and status class.",
		}, []string{"surface", "status_class"}),
		attempts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "weir_dataplane_upstream_attempts_total",
			Help: "Upstream attempts, by provider and outcome class.",
		}, []string{"provider", "class"}),
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
	}
	reg.MustRegister(m.requests, m.attempts, m.ttfb, m.routesDropped, m.holds, m.holdSeconds, m.usageLimits,
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
	}
	return "other"
}
