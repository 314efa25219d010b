package controlplane

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"connectrpc.com/connect"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/weirhq/weir/controlplane/db"
	"github.com/weirhq/weir/controlplane/policy"
	weirv1 "github.com/weirhq/weir/gen/weir/v1"
)

// maxReleaseBatch bounds one ReleaseBatch call.
const maxReleaseBatch = 10000

// successGroups folds the successes among rs into one success record per
// account and model family (the family names the breaker a success
// closes). A group's admitted time is its latest: a success admitted
// after an out-of-credits cooldown proves the credits, whichever of the
// group's it was. Times ahead of now (a worker's clock running fast)
// count as now, so no cooldown written after the call is cleared by it.
// Sorted by account, so concurrent batches lock accounts in one order.
func successGroups(rs []released, now time.Time) []db.RecordReleaseSuccessParams {
	type key struct {
		account uuid.UUID
		family  string
	}
	at := map[key]int{}
	var out []db.RecordReleaseSuccessParams
	for _, sc := range rs {
		if !sc.effects.Success {
			continue
		}
		admitted := sc.admittedAt
		if admitted.After(now) {
			admitted = now
		}
		k := key{sc.row.AccountID, policy.ModelFamily(sc.row.Model)}
		if i, ok := at[k]; ok {
			if admitted.After(out[i].AdmittedAt) {
				out[i].AdmittedAt = admitted
			}
			continue
		}
		at[k] = len(out)
		out = append(out, db.RecordReleaseSuccessParams{
			Now: now, AccountID: sc.row.AccountID, AdmittedAt: admitted, RewriteBefore: now.Add(-successRewrite),
			HasFamily: sc.effects.Breaker == policy.BreakerClose, Provider: sc.row.Provider, Family: k.family,
		})
	}
	slices.SortFunc(out, func(a, b db.RecordReleaseSuccessParams) int {
		if c := bytes.Compare(a.AccountID[:], b.AccountID[:]); c != 0 {
			return c
		}
		return cmp.Compare(a.Family, b.Family)
	})
	return out
}

// successRewrite is how stale an account's last success may get before a
// success rewrites it when nothing else changes (RecordReleaseSuccess).
const successRewrite = time.Second

// successRecordAttempts bounds the retries of a success batch that lost a
// deadlock: the batch runs as one implicit transaction locking accounts
// and then breakers, and two batches closing the same breaker can still
// cross. A lost one is rolled back whole, so running it again is safe.
const successRecordAttempts = 3

// writeSuccessRecords runs RecordReleaseSuccess for each group in one
// pipelined round trip, logging what the successes changed.
func (l leaseService) writeSuccessRecords(ctx context.Context, q *db.Queries, groups []db.RecordReleaseSuccessParams) error {
	if len(groups) == 0 {
		return nil
	}
	for attempt := 1; ; attempt++ {
		results, err := writeSuccessRecordsOnce(ctx, q, groups)
		var pgErr *pgconn.PgError
		if err != nil && attempt < successRecordAttempts && errors.As(err, &pgErr) && pgErr.Code == "40P01" { // deadlock_detected
			continue
		}
		if err != nil {
			return fmt.Errorf("record success: %w", err)
		}
		// Logged once the batch committed: a rolled-back one changed nothing.
		for i, res := range results {
			if res.ProbeEnded {
				l.log.InfoContext(ctx, "recovery probe succeeded", "account_id", groups[i].AccountID)
			}
			if res.CreditsCleared > 0 {
				l.log.InfoContext(ctx, "out-of-credits cooldown cleared by a success", "account_id", groups[i].AccountID)
			}
		}
		return nil
	}
}

func writeSuccessRecordsOnce(ctx context.Context, q *db.Queries, groups []db.RecordReleaseSuccessParams) ([]db.RecordReleaseSuccessRow, error) {
	results := make([]db.RecordReleaseSuccessRow, len(groups))
	var berr error
	q.RecordReleaseSuccess(ctx, groups).QueryRow(func(i int, res db.RecordReleaseSuccessRow, err error) {
		if err != nil {
			if berr == nil {
				berr = err
			}
			return
		}
		results[i] = res
	})
	return results, berr
}

// releaseItems is a ReleaseBatch request checked and taken apart for
// SettleLeases.
type releaseItems struct {
	// ids is every item's lease id, in item order.
	ids []uuid.UUID
	// end is the leases an item ends (keep false).
	end []uuid.UUID
	// sessionLeases and sessionKeys pair the items' session keys with
	// their leases.
	sessionLeases []uuid.UUID
	sessionKeys   []string
}

// parseReleaseItems checks every item first: one bad item refuses the
// call, naming it, before anything is written.
func parseReleaseItems(items []*weirv1.ReleaseItem) (releaseItems, error) {
	if n := len(items); n > maxReleaseBatch {
		return releaseItems{}, invalidf("items: at most %d per call, got %d", maxReleaseBatch, n)
	}
	p := releaseItems{ids: make([]uuid.UUID, 0, len(items))}
	for i, it := range items {
		id, err := uuid.Parse(it.LeaseId)
		if err != nil {
			return releaseItems{}, invalidf("items[%d].lease_id: not a lease id", i)
		}
		switch o := it.Outcome; {
		case o == nil && it.Keep:
			return releaseItems{}, invalidf("items[%d].keep: an item without an outcome returns its lease and cannot keep it", i)
		case o != nil && o.Class != weirv1.OutcomeClass_OUTCOME_CLASS_SUCCESS:
			return releaseItems{}, invalidf("items[%d].outcome.class: %s; only successes are batched, failures go through Release", i, enumName(o.Class))
		}
		if it.AdmittedAt != nil {
			if err := it.AdmittedAt.CheckValid(); err != nil {
				return releaseItems{}, invalidf("items[%d].admitted_at: %v", i, err)
			}
		}
		p.ids = append(p.ids, id)
		if !it.Keep {
			p.end = append(p.end, id)
		}
		if it.SessionKey != "" {
			p.sessionLeases = append(p.sessionLeases, id)
			p.sessionKeys = append(p.sessionKeys, it.SessionKey)
		}
	}
	return p, nil
}

// ReleaseBatch settles a worker's successes and returned leases: one
// statement reads the leases, ends those to end and touches the sessions;
// one pipelined round trip records the successes; a success whose headers
// carry a usage reading adds its upserts.
func (l leaseService) ReleaseBatch(ctx context.Context, req *connect.Request[weirv1.ReleaseBatchRequest]) (*connect.Response[weirv1.ReleaseBatchResponse], error) {
	items := req.Msg.Items
	p, err := parseReleaseItems(items)
	if err != nil {
		return nil, toConnect(err)
	}
	out := &weirv1.ReleaseBatchResponse{}
	if len(items) == 0 {
		return connect.NewResponse(out), nil
	}
	now := l.now()
	rows, err := l.q.SettleLeases(ctx, db.SettleLeasesParams{
		Now: now, Ids: p.ids, EndIds: p.end, SessionLeaseIds: p.sessionLeases, SessionKeys: p.sessionKeys,
	})
	if err != nil {
		return nil, err
	}
	found := make(map[uuid.UUID]db.SettleLeasesRow, len(rows))
	for _, r := range rows {
		found[r.ID] = r
	}
	var successes []released
	missing := map[uuid.UUID]bool{}
	for i, it := range items {
		id := p.ids[i]
		r, ok := found[id]
		// An expired lease was ended by SettleLeases: it no longer counts
		// against the cap, so the worker must not reuse it either.
		if (!ok || (r.Expired && it.Keep)) && !missing[id] {
			missing[id] = true
			out.MissingLeaseIds = append(out.MissingLeaseIds, it.LeaseId)
		}
		if !ok || it.Outcome == nil {
			continue
		}
		admitted := r.AcquiredAt
		if it.AdmittedAt != nil {
			admitted = it.AdmittedAt.AsTime()
		}
		successes = append(successes, releasedSuccess(settledRow(r), it.Outcome, admitted, now))
	}
	if _, err := l.applyEffects(ctx, l.q, successes, now); err != nil {
		return nil, err
	}
	for _, r := range successes {
		l.routes.afterSuccess(r.row.AccountID, r.outcome.GetHeaders(), now)
	}
	l.metrics.releases.WithLabelValues(enumName(weirv1.OutcomeClass_OUTCOME_CLASS_SUCCESS)).Add(float64(len(successes)))
	return connect.NewResponse(out), nil
}

// settledRow is a SettleLeases row in the shape Release's success path
// reads, so both apply successes through the same code.
func settledRow(r db.SettleLeasesRow) db.ReleaseLeaseRow {
	return db.ReleaseLeaseRow{
		AccountID: r.AccountID, KeyID: r.KeyID, Model: r.Model, CredentialRevision: r.CredentialRevision,
		AcquiredAt: r.AcquiredAt, Provider: r.Provider, AuthKind: r.AuthKind,
		QuotaBackoffs: r.QuotaBackoffs, RecoveryProbe: r.RecoveryProbe,
	}
}
