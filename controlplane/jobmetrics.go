package controlplane

import (
	"context"
	"errors"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"

	"github.com/weirhq/weir/jobs"
)

// Job run outcomes, as River settles a worked job.
var jobOutcomes = []string{"completed", "failed", "cancelled", "snoozed"}

// jobMetrics is River worker middleware counting every job run by kind
// and outcome. Middleware rather than an event subscription: it runs in
// the worker's goroutine, so a count never lags or drops behind a full
// subscription channel.
type jobMetrics struct {
	river.WorkerMiddlewareDefaults
	runs    *prometheus.CounterVec
	seconds *prometheus.HistogramVec
}

func newJobMetrics(reg prometheus.Registerer) *jobMetrics {
	m := &jobMetrics{
		runs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "weir_controlplane_job_runs_total",
			Help: "River job runs, by job kind and outcome (completed, failed, cancelled, snoozed).",
		}, []string{"kind", "outcome"}),
		seconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "weir_controlplane_job_run_seconds",
			Help:    "Time one River job run took, by job kind.",
			Buckets: []float64{.005, .025, .1, .25, 1, 2.5, 10, 30, 60},
		}, []string{"kind"}),
	}
	for _, k := range jobs.Kinds() {
		for _, o := range jobOutcomes {
			m.runs.WithLabelValues(k, o)
		}
	}
	reg.MustRegister(m.runs, m.seconds)
	return m
}

func (m *jobMetrics) Work(ctx context.Context, job *rivertype.JobRow, doInner func(context.Context) error) (err error) {
	start := time.Now()
	kind := job.Kind
	if !slices.Contains(jobs.Kinds(), kind) {
		kind = "other"
	}
	defer func() {
		r := recover()
		outcome := jobOutcome(err)
		if r != nil {
			outcome = "failed"
		}
		m.runs.WithLabelValues(kind, outcome).Inc()
		m.seconds.WithLabelValues(kind).Observe(time.Since(start).Seconds())
		if r != nil {
			panic(r) // River records the panic as the job's failure
		}
	}()
	return doInner(ctx)
}

// jobOutcome is what River makes of a worker's return value. Pure.
func jobOutcome(err error) string {
	var snooze *rivertype.JobSnoozeError
	var cancel *rivertype.JobCancelError
	switch {
	case err == nil:
		return "completed"
	case errors.As(err, &snooze):
		return "snoozed"
	case errors.As(err, &cancel):
		return "cancelled"
	}
	return "failed"
}
