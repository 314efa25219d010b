package controlplane

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	weirv1 "github.com/weirhq/weir/gen/weir/v1"
	"github.com/weirhq/weir/gen/weir/v1/weirv1connect"
)

// metrics are the control plane's own; labels are bounded enums.
type metrics struct {
	acquireSeconds  *prometheus.HistogramVec
	releases        *prometheus.CounterVec
	cooldowns       *prometheus.CounterVec
	rateLimits      *prometheus.CounterVec
	breakerOpens    prometheus.Counter
	probes          prometheus.Counter
	keyRateLimited  prometheus.Counter
	auditFailures   prometheus.Counter
	unauthenticated *prometheus.CounterVec
	jobs            *jobMetrics
}

func newMetrics(reg *prometheus.Registry) *metrics {
	m := &metrics{
		acquireSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "weir_controlplane_acquire_seconds",
			Help:    "Time to answer Acquire, by result (lease or the no-account reason).",
			Buckets: []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, 1},
		}, []string{"result"}),
		releases: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "weir_controlplane_releases_total",
			Help: "Leases released, by the attempt's outcome class.",
		}, []string{"class"}),
		cooldowns: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "weir_controlplane_cooldowns_written_total",
			Help: "Cooldowns written, by reason.",
		}, []string{"reason"}),
		rateLimits: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "weir_controlplane_rate_limit_decisions_total",
			Help: "429s decided, by the rung of the decision ladder that decided them.",
		}, []string{"rung"}),
		breakerOpens: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "weir_controlplane_breaker_opens_total",
			Help: "Times an overload breaker opened or reopened after a failed probe.",
		}),
		probes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "weir_controlplane_breaker_probes_total",
			Help: "Requests let through an open overload breaker as its probe.",
		}),
		keyRateLimited: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "weir_controlplane_key_rate_limited_total",
			Help: "Requests refused by their client key's own request rate limit.",
		}),
		auditFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "weir_controlplane_audit_write_failures_total",
			Help: "Admin calls whose audit row could not be written (the call itself went ahead).",
		}),
		unauthenticated: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "weir_controlplane_rpc_unauthenticated_total",
			Help: "Calls refused for a missing or wrong token, by service; not in the audit log.",
		}, []string{"service"}),
	}
	// Cooldown reasons are a closed enum: every series exists from the
	// start, so rate() and alerts see the first one.
	for v := range weirv1.CooldownReason_name {
		if r := weirv1.CooldownReason(v); r != weirv1.CooldownReason_COOLDOWN_REASON_UNSPECIFIED {
			m.cooldowns.WithLabelValues(enumName(r))
		}
	}
	for _, svc := range []string{weirv1connect.AccountServiceName, weirv1connect.KeyServiceName, weirv1connect.LeaseServiceName,
		weirv1connect.RouteServiceName, weirv1connect.SettingsServiceName, weirv1connect.AliasServiceName,
		weirv1connect.OpsServiceName, weirv1connect.DashboardServiceName, weirv1connect.AuditServiceName} {
		m.unauthenticated.WithLabelValues(svc)
	}
	m.jobs = newJobMetrics(reg)
	reg.MustRegister(m.acquireSeconds, m.releases, m.cooldowns, m.rateLimits, m.breakerOpens, m.probes, m.keyRateLimited,
		m.auditFailures, m.unauthenticated,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}
