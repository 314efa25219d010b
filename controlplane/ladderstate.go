package controlplane

import (
	"context"
	"time"

	"github.com/weirhq/weir/controlplane/db"
	"github.com/weirhq/weir/controlplane/policy"
)

// applyLadderState writes what a decision keeps besides the cooldown: the
// family gate and the step of the adaptive quota backoff (a success's
// writes are recordSuccess's). It runs inside Release's transaction.
func (l leaseService) applyLadderState(ctx context.Context, q *db.Queries, row db.ReleaseLeaseRow, d policy.Effects, now time.Time) error {
	if d.Rung != "" {
		l.metrics.rateLimits.WithLabelValues(string(d.Rung)).Inc()
	}
	if d.QuotaBackoff {
		if err := q.RecordQuotaBackoff(ctx, row.AccountID); err != nil {
			return err
		}
	}
	if g := d.Gate; g != nil {
		merged, err := q.WriteFamilyGate(ctx, db.WriteFamilyGateParams{
			AccountID: row.AccountID,
			Family:    g.Family,
			Until:     g.Until,
			Now:       now,
			Evidence:  g.Evidence,
		})
		if err != nil {
			return err
		}
		if err := q.InsertAccountHistory(ctx, db.InsertAccountHistoryParams{AccountID: row.AccountID, At: now, Kind: "gate",
			Reason: g.Family, Until: g.Until, Evidence: jsonObject(g.Evidence)}); err != nil {
			return err
		}
		l.log.InfoContext(ctx, "family gate written", "account_id", row.AccountID, "family", merged.Family, "until", merged.Until)
	}
	return nil
}
