package jobs

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/riverqueue/river"
	"github.com/weirhq/weir/controlplane/db"
)

// CredentialChecker says which accounts' sealed credentials no longer open
// with the current secret key. The control plane implements it (it holds
// the sealer); jobs cannot import the control plane.
type CredentialChecker interface {
	// CheckCredentials returns the labels of the accounts whose credential
	// (or refresh token) cannot be opened. Labels only, never secrets.
	CheckCredentials(ctx context.Context) (unreadable []string, err error)
}

// IntegrityInterval is how often the integrity check runs.
const IntegrityInterval = 5 * time.Minute

// What the integrity check looks for, and how long it lets things be.
const (
	// staleLeaseSlack is how far beyond the reaper's grace an expired lease
	// must be before it says the reaper is behind: two reaper periods.
	staleLeaseSlack = 2 * ReapInterval
	// stuckRefreshAfter: a refresh claim that ended this long ago was
	// abandoned by its replica.
	stuckRefreshAfter = 5 * time.Minute
	// stuckProbeAfter: a recovery probe idle (no lease, no cooldown) this
	// long since the check first saw it is stuck.
	stuckProbeAfter = 10 * time.Minute
	// expiredKeep: expired family gates and cooldowns older than this are
	// housekeeping.
	expiredKeep = 7 * 24 * time.Hour
	// integrityReportsKept is how many reports integrity_reports keeps.
	integrityReportsKept = 100
)

// Finding kinds.
const (
	FindingCooldownWithoutEvidence = "cooldown_without_evidence"
	FindingStaleLease              = "stale_lease"
	FindingStuckRefresh            = "stuck_refresh"
	FindingStuckRecoveryProbe      = "stuck_recovery_probe"
	FindingExpiredFamilyGate       = "expired_family_gate"
	FindingExpiredCooldown         = "expired_cooldown"
	FindingBrokenAccount           = "broken_account"
	FindingUnreadableCredential    = "unreadable_credential"
)

// Finding actions.
const (
	ActionRepaired = "repaired"
	ActionReported = "reported"
)

// Finding is one kind of anomaly in a report: what the check did about it
// and how many it found. Accounts names them when an operator must act.
type Finding struct {
	Kind     string           `json:"kind"`
	Action   string           `json:"action"`
	Count    int64            `json:"count"`
	Accounts []FindingAccount `json:"accounts,omitempty"`
}

// FindingAccount is an account a reported finding concerns: its label and
// why, never a secret.
type FindingAccount struct {
	Label  string `json:"label"`
	Reason string `json:"reason,omitempty"`
}

// IntegrityArgs is the periodic integrity check.
type IntegrityArgs struct{}

// Kind names the job in River's tables and UI.
func (IntegrityArgs) Kind() string { return "integrity_check" }

// InsertOpts keeps one check queued at a time.
func (IntegrityArgs) InsertOpts() river.InsertOpts {
	return river.InsertOpts{UniqueOpts: river.UniqueOpts{ByArgs: true, ByPeriod: IntegrityInterval}}
}

// IntegrityChecker runs IntegrityArgs.
type IntegrityChecker struct {
	river.WorkerDefaults[IntegrityArgs]
	deps Deps
}

// Work finds what went wrong in the tables, repairs what it safely can,
// reports the rest, and stores the report. Every repair is a single
// compare-and-set on the condition that found it; none shortens a live
// cooldown or touches a live lease.
func (w *IntegrityChecker) Work(ctx context.Context, _ *river.Job[IntegrityArgs]) error {
	_, err := RunIntegrityCheck(ctx, w.deps)
	return err
}

// RunIntegrityCheck is one run of the check; it returns the findings it
// stored.
func RunIntegrityCheck(ctx context.Context, d Deps) ([]Finding, error) {
	now := d.Now()
	q := d.Queries
	var findings []Finding
	repair := func(kind string, fn func() (int64, error)) error {
		n, err := fn()
		if err != nil {
			return fmt.Errorf("integrity: %s: %w", kind, err)
		}
		findings = append(findings, Finding{Kind: kind, Action: ActionRepaired, Count: n})
		return nil
	}
	steps := []struct {
		kind string
		fn   func() (int64, error)
	}{
		// Housekeeping first, so nothing below works on rows about to go.
		{FindingExpiredCooldown, func() (int64, error) { return q.DeleteCooldownsExpiredBefore(ctx, now.Add(-expiredKeep)) }},
		{FindingExpiredFamilyGate, func() (int64, error) { return q.DeleteFamilyGatesExpiredBefore(ctx, now.Add(-expiredKeep)) }},
		{FindingCooldownWithoutEvidence, func() (int64, error) { return q.RepairCooldownsWithoutEvidence(ctx) }},
		{FindingStaleLease, func() (int64, error) {
			// After an outage, leases still in use are renewed first (the
			// lease clock), as the reaper does.
			if _, err := MoveLeaseClock(ctx, q, now, d.LeaseTTL); err != nil {
				return 0, err
			}
			return q.DeleteStaleLeases(ctx, now.Add(-d.LeaseGrace-staleLeaseSlack))
		}},
		{FindingStuckRefresh, func() (int64, error) { return q.ClearStuckRefreshClaims(ctx, now.Add(-stuckRefreshAfter)) }},
		{FindingStuckRecoveryProbe, func() (int64, error) {
			if _, err := q.UnmarkBusyRecoveryProbes(ctx, now); err != nil {
				return 0, err
			}
			n, err := q.ClearStuckRecoveryProbes(ctx, db.ClearStuckRecoveryProbesParams{Before: now.Add(-stuckProbeAfter), Now: now})
			if err != nil {
				return 0, err
			}
			_, err = q.MarkIdleRecoveryProbes(ctx, now)
			return n, err
		}},
	}
	for _, s := range steps {
		if err := repair(s.kind, s.fn); err != nil {
			return nil, err
		}
	}

	broken, err := q.BrokenAccounts(ctx)
	if err != nil {
		return nil, fmt.Errorf("integrity: broken accounts: %w", err)
	}
	f := Finding{Kind: FindingBrokenAccount, Action: ActionReported, Count: int64(len(broken))}
	for _, b := range broken {
		f.Accounts = append(f.Accounts, FindingAccount{Label: b.Label, Reason: b.Reason})
	}
	findings = append(findings, f)

	if d.Creds != nil {
		unreadable, err := d.Creds.CheckCredentials(ctx)
		if err != nil {
			return nil, fmt.Errorf("integrity: check credentials: %w", err)
		}
		f := Finding{Kind: FindingUnreadableCredential, Action: ActionReported}
		for _, label := range unreadable {
			f.Accounts = append(f.Accounts, FindingAccount{Label: label, Reason: "sealed credential does not open with the current secret key"})
		}
		// Every replica checks with its own keys and marks broken what it
		// cannot open (controlplane/credcheck.go): those marks are findings
		// too, though this replica's keys may open them.
		for _, b := range broken {
			if strings.HasPrefix(b.Reason, FindingUnreadableCredential) && !slices.Contains(unreadable, b.Label) {
				f.Accounts = append(f.Accounts, FindingAccount{Label: b.Label, Reason: "marked broken by a control plane whose secret keys do not open it"})
			}
		}
		slices.SortFunc(f.Accounts, func(a, b FindingAccount) int { return strings.Compare(a.Label, b.Label) })
		f.Count = int64(len(f.Accounts))
		findings = append(findings, f)
	}

	for _, f := range findings {
		if f.Count == 0 {
			continue
		}
		if d.Findings != nil {
			d.Findings(f.Kind, f.Action, int(f.Count))
		}
		level := slog.LevelInfo
		if f.Action == ActionReported {
			level = slog.LevelWarn
		}
		labels := make([]string, 0, len(f.Accounts))
		for _, a := range f.Accounts {
			labels = append(labels, a.Label)
		}
		attrs := []any{"kind", f.Kind, "action", f.Action, "count", f.Count}
		if len(labels) > 0 {
			attrs = append(attrs, "accounts", labels)
		}
		d.Logger.Log(ctx, level, "integrity finding", attrs...)
	}

	body, err := json.Marshal(findings)
	if err != nil {
		return nil, fmt.Errorf("integrity: encode report: %w", err)
	}
	if _, err := q.InsertIntegrityReport(ctx, db.InsertIntegrityReportParams{RanAt: now, Findings: body}); err != nil {
		return nil, fmt.Errorf("integrity: store report: %w", err)
	}
	if _, err := q.PruneIntegrityReports(ctx, integrityReportsKept); err != nil {
		return nil, fmt.Errorf("integrity: prune reports: %w", err)
	}
	return findings, nil
}
