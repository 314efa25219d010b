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
	}
	reg.MustRegister(m.requests, m.attempts, m.ttfb, m.routesDropped,
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
