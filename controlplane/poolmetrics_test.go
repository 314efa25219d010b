package controlplane

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"

	"github.com/weirhq/weir/controlplane/db"
	weirv1 "github.com/weirhq/weir/gen/weir/v1"
)

// TestPoolMetrics: accounts by provider and state, and utilization per
// window (pool-wide, and per account label while the pool is small),
// read from Postgres at scrape time.
func TestPoolMetrics(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := t.Context()
	now := e.clock.Now()

	e.createAccount(acct{label: "api-active"})
	paused, _ := e.createAccount(acct{label: "api-paused"})
	e.pause(paused.Id)
	cooling, _ := e.createAccount(acct{label: "max-cooling", kind: weirv1.AuthKind_AUTH_KIND_OAUTH, credential: oauthToken()})
	broken, _ := e.createAccount(acct{label: "max-broken", kind: weirv1.AuthKind_AUTH_KIND_OAUTH, credential: oauthToken()})
	if _, err := e.pool.Exec(ctx, `INSERT INTO cooldowns (account_id, reason, transient, until, written_at, evidence)
		VALUES ($1, 'rate_limited', true, $2, $3, '{}')`, uuid.MustParse(cooling.Id), now.Add(time.Hour), now); err != nil {
		t.Fatalf("write cooldown: %v", err)
	}
	if _, err := e.pool.Exec(ctx, `UPDATE accounts SET broken_at = $2, broken_reason = 'test' WHERE id = $1`, uuid.MustParse(broken.Id), now); err != nil {
		t.Fatal(err)
	}
	reset := now.Add(2 * time.Hour)
	for _, r := range []struct {
		id   string
		util float64
	}{{cooling.Id, 0.2}, {broken.Id, 0.6}} {
		row := e.accountRow(r.id)
		n, err := e.q.UpsertUsageWindow(ctx, db.UpsertUsageWindowParams{
			WindowName: windowFiveHour, Utilization: &r.util, ResetsAt: &reset, Source: sourcePoll,
			Now: now, AccountID: row.ID, CredentialRevision: row.CredentialRevision,
		})
		if err != nil || n != 1 {
			t.Fatalf("upsert usage window: %d rows, %v", n, err)
		}
	}

	body := scrape(t, e)
	for _, want := range []string{
		`weir_controlplane_accounts{provider="anthropic",state="active"} 1`,
		`weir_controlplane_accounts{provider="anthropic",state="paused"} 1`,
		`weir_controlplane_accounts{provider="anthropic",state="cooling"} 1`,
		`weir_controlplane_accounts{provider="anthropic",state="broken"} 1`,
		`weir_controlplane_accounts{provider="codex",state="active"} 0`,
		`weir_controlplane_usage_utilization_ratio{stat="min",window="five_hour"} 0.2`,
		`weir_controlplane_usage_utilization_ratio{stat="max",window="five_hour"} 0.6`,
		`weir_controlplane_usage_utilization_ratio{stat="avg",window="five_hour"} 0.4`,
		`weir_controlplane_account_usage_utilization_ratio{account="max-cooling",window="five_hour"} 0.2`,
		`weir_controlplane_account_usage_utilization_ratio{account="max-broken",window="five_hour"} 0.6`,
		`weir_controlplane_cooldowns_written_total{reason="quota_exhausted"} 0`,
		`weir_controlplane_job_runs_total{kind="usage_poll",outcome="failed"} 0`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	if strings.Contains(body, `window="seven_day"`) {
		t.Error("a window without a reading has a series; no evidence is not 0")
	}

	// A pool larger than the limit, or a limit of "never", gets the pool
	// view only: per-account series would be unbounded.
	for _, limit := range []int{3, -1} {
		cfg := e.cfg
		cfg.Registry, cfg.Logger, cfg.MetricsAccountLabelsMax = nil, nil, limit
		r := newEnv(t, e.pool, cfg, e.clock)
		body := scrape(t, r)
		if strings.Contains(body, "weir_controlplane_account_usage_utilization_ratio{") {
			t.Errorf("limit %d, 4 accounts: per-account series present", limit)
		}
		if !strings.Contains(body, `weir_controlplane_usage_utilization_ratio{stat="avg",window="five_hour"} 0.4`) {
			t.Errorf("limit %d: pool series missing", limit)
		}
	}
}

// TestJobMetrics: River job runs are counted by kind and outcome.
func TestJobMetrics(t *testing.T) {
	t.Parallel()
	e := setup(t)
	cfg := e.cfg
	cfg.Registry, cfg.Logger, cfg.DisableJobs = nil, nil, false
	r := newEnv(t, e.pool, cfg, e.clock)
	events, cancel := r.srv.river.Subscribe(river.EventKindJobCompleted)
	defer cancel()
	if err := r.srv.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(t.Context()), 10*time.Second)
		defer cancel()
		r.srv.Stop(ctx) //nolint:errcheck // teardown
	})
	// The lease reaper runs on start.
	deadline := time.After(30 * time.Second)
	for done := false; !done; {
		select {
		case ev := <-events:
			done = ev.Job.Kind == "lease_reaper"
		case <-deadline:
			t.Fatal("River did not complete the lease reaper within 30s")
		}
	}
	if got := counterValue(t, r.srv.metrics.jobs.runs.WithLabelValues("lease_reaper", "completed")); got < 1 {
		t.Errorf("job runs lease_reaper completed = %v, want at least 1", got)
	}
}

// TestJobOutcome: what the middleware counts for each way a job ends.
func TestJobOutcome(t *testing.T) {
	t.Parallel()
	m := newJobMetrics(prometheus.NewRegistry())
	job := &rivertype.JobRow{Kind: "usage_poll"}
	for _, tc := range []struct {
		err  error
		want string
	}{
		{nil, "completed"},
		{errors.New("boom"), "failed"},
		{river.JobSnooze(time.Minute), "snoozed"},
		{river.JobCancel(errors.New("gone")), "cancelled"},
	} {
		before := counterValue(t, m.runs.WithLabelValues("usage_poll", tc.want))
		err := m.Work(t.Context(), job, func(context.Context) error { return tc.err })
		if !errors.Is(err, tc.err) && err != tc.err {
			t.Errorf("%v: middleware changed the error to %v", tc.err, err)
		}
		if got := counterValue(t, m.runs.WithLabelValues("usage_poll", tc.want)); got != before+1 {
			t.Errorf("%v: %s runs %v → %v", tc.err, tc.want, before, got)
		}
	}
	m.Work(t.Context(), &rivertype.JobRow{Kind: "made_up"}, func(context.Context) error { return nil }) //nolint:errcheck // nil
	if got := counterValue(t, m.runs.WithLabelValues("other", "completed")); got != 1 {
		t.Errorf("an unknown kind counts as other: %v", got)
	}
}

func counterValue(t *testing.T, c prometheus.Counter) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}
