package controlplane

import (
	"context"
	"time"

	"github.com/weirhq/weir/controlplane/db"
)

// applyLadderState writes what a decision keeps besides the cooldown: the
// family gate and the step of the adaptive quota backoff (a success's
// writes are recordSuccess's). It runs inside Release's transaction.
func (s *Server) applyLadderState(ctx context.Context, q *db.Queries, row db.ReleaseLeaseRow, d decision, now time.Time) error {
	if d.rung != "" {
		s.metrics.rateLimits.WithLabelValues(string(d.rung)).Inc()
	}
	if d.quotaBackoff {
		if err := q.RecordQuotaBackoff(ctx, row.AccountID); err != nil {
			return err
		}
	}
	if g := d.gate; g != nil {
		merged, err := q.WriteFamilyGate(ctx, db.WriteFamilyGateParams{
			AccountID: row.AccountID,
			Family:    g.family,
			Until:     g.until,
			Now:       now,
			Evidence:  g.evidence,
		})
		if err != nil {
			return err
		}
		s.log.InfoContext(ctx, "family gate written", "account_id", row.AccountID, "family", merged.Family, "until", merged.Until)
	}
	return nil
}
