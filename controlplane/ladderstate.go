package controlplane

import (
	"context"
	"time"

	"github.com/weirhq/weir/controlplane/db"
)

// applyLadderState writes what a decision keeps besides the cooldown: the
// family gate, the step of the adaptive quota backoff, and the lifting of
// an out-of-credits cooldown by a success. It runs inside Release's
// transaction.
func (s *Server) applyLadderState(ctx context.Context, q *db.Queries, row db.ReleaseLeaseRow, d decision, now time.Time) error {
	if d.rung != "" {
		s.metrics.rateLimits.WithLabelValues(string(d.rung)).Inc()
	}
	if d.success {
		// Nothing routes to a cooling account, so today this only fires
		// for a request admitted after the cooldown was written: after an
		// operator's resume, or the recovery probe once it exists. A
		// request in flight when the credits ran out clears nothing.
		n, err := q.ClearOutOfCreditsCooldown(ctx, db.ClearOutOfCreditsCooldownParams{AccountID: row.AccountID, AdmittedAt: row.AcquiredAt})
		if err != nil {
			return err
		}
		if n > 0 {
			s.log.InfoContext(ctx, "out-of-credits cooldown cleared by a success", "account_id", row.AccountID)
		}
		if row.RecoveryProbe {
			n, err := q.ClearRecoveryProbe(ctx, row.AccountID)
			if err != nil {
				return err
			}
			if n > 0 {
				s.log.InfoContext(ctx, "recovery probe succeeded", "account_id", row.AccountID)
			}
		}
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
