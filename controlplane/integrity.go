package controlplane

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"connectrpc.com/connect"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/weirhq/weir/controlplane/db"
	weirv1 "github.com/weirhq/weir/gen/weir/v1"
	"github.com/weirhq/weir/jobs"
)

// CheckCredentials says which accounts' sealed credentials (access token
// or refresh token) open with none of this replica's secret keys (current
// or previous): a key retired before 'weir secrets rotate' re-sealed
// under its successor, or a corrupted row. It returns
// labels only; nothing it opened leaves this function.
func (j *AccountJobs) CheckCredentials(ctx context.Context) ([]string, error) {
	c, err := j.openSealed(ctx)
	if err != nil {
		return nil, err
	}
	return labels(c.unreadable), nil
}

// sealedRef names an account's credential at one revision, nothing secret.
type sealedRef struct {
	id       uuid.UUID
	label    string
	revision int64
}

// sealedCheck is what opening every stored credential found.
type sealedCheck struct {
	opened, unreadable []sealedRef
}

// openSealed tries every account's sealed credential, refresh token and
// egress proxy with this replica's keys and sorts the accounts into those that open
// and those that do not, by label.
func (j *AccountJobs) openSealed(ctx context.Context) (sealedCheck, error) {
	rows, err := j.q.SealedCredentials(ctx)
	if err != nil {
		return sealedCheck{}, fmt.Errorf("sealed credentials: %w", err)
	}
	var c sealedCheck
	for _, r := range rows {
		_, err := j.seal.Open(r.ID, r.CredentialRevision, r.CredentialSealed)
		if err == nil && r.RefreshSealed != nil {
			_, err = j.seal.OpenRefresh(r.ID, r.CredentialRevision, r.RefreshSealed)
		}
		if err == nil && r.EgressProxySealed != nil {
			_, err = j.seal.OpenProxy(r.ID, r.EgressProxySealed)
		}
		ref := sealedRef{id: r.ID, label: r.Label, revision: r.CredentialRevision}
		if err != nil {
			c.unreadable = append(c.unreadable, ref)
		} else {
			c.opened = append(c.opened, ref)
		}
	}
	return c, nil
}

// integrityMetrics counts the integrity check's findings.
type integrityMetrics struct {
	findings *prometheus.CounterVec
}

func newIntegrityMetrics(reg *prometheus.Registry) *integrityMetrics {
	m := &integrityMetrics{findings: prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "weir_controlplane_integrity_findings_total",
		Help: "Anomalies the integrity check found, by kind and whether it repaired or only reported them.",
	}, []string{"kind", "action"})}
	reg.MustRegister(m.findings)
	return m
}

// count is the jobs.Deps.IntegrityFindings hook.
func (m *integrityMetrics) count(kind, action string, n int) {
	m.findings.WithLabelValues(kind, action).Add(float64(n))
}

// opsService serves OpsService.
type opsService struct{ q *db.Queries }

// LastIntegrityReport answers the integrity check's last stored report, or
// no report when it has not run yet.
func (o opsService) LastIntegrityReport(ctx context.Context, _ *connect.Request[weirv1.LastIntegrityReportRequest]) (*connect.Response[weirv1.LastIntegrityReportResponse], error) {
	row, err := o.q.LastIntegrityReport(ctx)
	if errors.Is(err, pgx.ErrNoRows) {
		return connect.NewResponse(&weirv1.LastIntegrityReportResponse{}), nil
	}
	if err != nil {
		return nil, err
	}
	var findings []jobs.Finding
	if err := json.Unmarshal(row.Findings, &findings); err != nil {
		return nil, fmt.Errorf("decode report %d: %w", row.ID, err)
	}
	rep := &weirv1.IntegrityReport{RanAt: timestamppb.New(row.RanAt)}
	for _, f := range findings {
		pf := &weirv1.IntegrityFinding{Kind: f.Kind, Action: f.Action, Count: f.Count}
		for _, a := range f.Accounts {
			pf.Accounts = append(pf.Accounts, &weirv1.IntegrityAccount{Label: a.Label, Reason: a.Reason})
		}
		rep.Findings = append(rep.Findings, pf)
	}
	return connect.NewResponse(&weirv1.LastIntegrityReportResponse{Report: rep}), nil
}
