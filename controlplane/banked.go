package controlplane

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"connectrpc.com/connect"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/weirhq/weir/controlplane/db"
	weirv1 "github.com/weirhq/weir/gen/weir/v1"
)

// Banked resets (issue 4): an OAuth account with banked resets enabled may
// hold reset grants that empty its weekly windows once. The applier reads
// the grants through the usage budget (readUsage asks for them), decides
// whether to claim one (decideBankedReset, pure), writes a pending ledger
// row before the call and replays a pending row with the same request_id,
// and after a reset lands re-arms the usage read so the fenced refetch and
// recoverQuota restore capacity, exactly as polling would.
//
// The wire shape (docs/wire.md, "Reset grants") is unverified: everything that
// knows it lives in parseResetGrants and sendResetClaim, and an answer we
// cannot read is recorded as it came, never guessed at.

const (
	// resetClaimPath is the claim endpoint, under the account's base URL.
	resetClaimPath = "/api/organizations/%s/reset_rate_limits"
	// bankedClaimEvery: at most one claim per account per hour, whatever
	// asked for it (the applier or an operator).
	bankedClaimEvery = time.Hour
	// bankedExpiringWithin: a grant expiring this soon is used rather than
	// lost...
	bankedExpiringWithin = 2 * time.Hour
	// bankedExpiringMinWeek: ...when the account has used at least this
	// much of its week. A reset of a mostly unused week buys little, and
	// the provider may answer not_limited (or, unverified, spend the grant
	// for nothing) on an account far from its limit.
	bankedExpiringMinWeek = 0.5
	// bankedGrantsStale: the applier reads the grants itself (through the
	// budget) only when the account's last answered usage read is older
	// than this; the poller keeps them fresh otherwise.
	bankedGrantsStale = 10 * time.Minute
	// maxClaimBody bounds a claim answer.
	maxClaimBody = 64 << 10
)

// Grant claim results, as docs/wire.md names them.
const (
	grantResultReset       = "reset"
	grantResultAlreadyUsed = "already_used"
	grantStatusAvailable   = "available"
	grantStatusUsed        = "used"
)

// resetGrant is one grant as the usage endpoint reported it.
type resetGrant struct {
	id, program, status string
	// expiresAt nil: never expires.
	expiresAt *time.Time
}

// parseResetGrants reads reset_grants from a usage answer; nil when the
// answer has none or not in a shape we know (the stored grants then stay).
func parseResetGrants(body []byte) *[]resetGrant {
	var doc struct {
		ResetGrants *[]struct {
			ID        string  `json:"id"`
			Program   string  `json:"program"`
			ExpiresAt *string `json:"expires_at"`
			Status    string  `json:"status"`
		} `json:"reset_grants"`
	}
	if err := json.Unmarshal(body, &doc); err != nil || doc.ResetGrants == nil {
		return nil
	}
	out := []resetGrant{}
	for _, g := range *doc.ResetGrants {
		if g.ID == "" {
			continue
		}
		rg := resetGrant{id: g.ID, program: g.Program, status: g.Status}
		if g.ExpiresAt != nil {
			if t, err := time.Parse(time.RFC3339Nano, *g.ExpiresAt); err == nil {
				t = t.UTC()
				rg.expiresAt = &t
			}
		}
		out = append(out, rg)
	}
	return &out
}

// storeResetGrants replaces an account's grants with a read's. readUsage
// calls it in the transaction that stores the readings, under their epoch.
func storeResetGrants(ctx context.Context, q *db.Queries, id uuid.UUID, grants []resetGrant, now time.Time) error {
	if err := q.DeleteResetGrants(ctx, id); err != nil {
		return fmt.Errorf("store reset grants: %w", err)
	}
	for _, g := range grants {
		if err := q.UpsertResetGrant(ctx, db.UpsertResetGrantParams{
			AccountID: id, GrantID: g.id, Program: g.program, ExpiresAt: g.expiresAt, Status: g.status, SeenAt: now,
		}); err != nil {
			return fmt.Errorf("store reset grants: %w", err)
		}
	}
	return nil
}

// bankedInput is what decideBankedReset decides on.
type bankedInput struct {
	now time.Time
	// weeklyLimited: a quota_exhausted cooldown on a 7d claim, or the
	// usage view's seven_day at spentAt or above.
	weeklyLimited bool
	// sevenDay is the usage view's weekly utilization; nil: no evidence.
	sevenDay *float64
	grants   []resetGrant
	// lastClaim is when the account's last claim was written; nil: never.
	lastClaim *time.Time
	// manualGrant, when set, is an operator's claim of that grant: it
	// overrides the weekly-limit condition, not the once-an-hour rule.
	manualGrant string
}

// bankedDecision says which grant to claim, if any, and why.
type bankedDecision struct {
	claim bool
	grant resetGrant
	why   string
}

// decideBankedReset decides whether to claim a grant now: never within an
// hour of the last claim; an operator's named grant when it is available;
// else the soonest-expiring available grant when the account is at its
// weekly limit; else a grant expiring within 2 hours when at least half
// the week is used.
func decideBankedReset(in bankedInput) bankedDecision {
	if in.lastClaim != nil && in.now.Sub(*in.lastClaim) < bankedClaimEvery {
		return bankedDecision{why: "a grant was claimed within the hour"}
	}
	var avail []resetGrant
	for _, g := range in.grants {
		if g.status == grantStatusAvailable && (g.expiresAt == nil || g.expiresAt.After(in.now)) {
			avail = append(avail, g)
		}
	}
	// Soonest expiry first; grants that never expire last.
	slices.SortStableFunc(avail, func(a, b resetGrant) int {
		switch {
		case a.expiresAt == nil && b.expiresAt == nil:
			return 0
		case a.expiresAt == nil:
			return 1
		case b.expiresAt == nil:
			return -1
		}
		return a.expiresAt.Compare(*b.expiresAt)
	})
	if in.manualGrant != "" {
		for _, g := range avail {
			if g.id == in.manualGrant {
				return bankedDecision{claim: true, grant: g, why: "claimed by an operator"}
			}
		}
		return bankedDecision{why: "the grant is not available"}
	}
	if len(avail) == 0 {
		return bankedDecision{why: "no grant available"}
	}
	if in.weeklyLimited {
		return bankedDecision{claim: true, grant: avail[0], why: "at the weekly limit"}
	}
	g := avail[0]
	if g.expiresAt != nil && g.expiresAt.Sub(in.now) <= bankedExpiringWithin &&
		in.sevenDay != nil && *in.sevenDay >= bankedExpiringMinWeek {
		return bankedDecision{claim: true, grant: g, why: "the grant expires within 2 hours"}
	}
	return bankedDecision{why: "not at the weekly limit"}
}

// ApplyBankedResets is the applier's tick (jobs.BankedResetter): for each
// OAuth account with banked resets enabled, it replays a pending claim or
// decides on a new one. It says how many claims it sent.
func (s *Server) ApplyBankedResets(ctx context.Context) (int, error) {
	ids, err := s.q.BankedResetAccounts(ctx)
	if err != nil {
		return 0, fmt.Errorf("banked reset accounts: %w", err)
	}
	sent := 0
	var errs []error
	for _, id := range ids {
		out, err := s.bankedReset(ctx, id, "")
		if errors.As(err, new(errInvalid)) {
			// Not ours to fix (no org_id): said, not retried as a failure.
			s.log.WarnContext(ctx, "banked resets skipped", "account_id", id, "err", err)
			err = nil
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("banked reset of %s: %w", id, err))
		}
		if out.sent {
			sent++
		}
	}
	return sent, errors.Join(errs...)
}

// bankedOutcome is what one look at an account came to.
type bankedOutcome struct {
	// sent: a claim (new or replayed) was sent.
	sent bool
	// claim is the ledger row, when one was written or replayed.
	claim *db.ResetClaim
	// why a claim was or was not made.
	why string
}

// bankedReset looks at one account: replays its pending claim, or reads
// its grants (within the usage budget, when stale) and claims one if
// decideBankedReset says so. manualGrant is an operator's claim.
func (s *Server) bankedReset(ctx context.Context, id uuid.UUID, manualGrant string) (bankedOutcome, error) {
	pending, err := s.q.PendingResetClaim(ctx, id)
	switch {
	case err == nil:
		// A claim sent before and not answered (a crash, a timeout): the
		// same request_id again; the provider spends nothing twice.
		out := bankedOutcome{claim: &pending, why: "replaying a pending claim"}
		if manualGrant != "" && manualGrant != pending.GrantID {
			return out, invalidf("a claim of grant %s is still pending", pending.GrantID)
		}
		row, err := s.sendResetClaim(ctx, pending)
		out.sent, out.claim = true, &row
		return out, err
	case !errors.Is(err, pgx.ErrNoRows):
		return bankedOutcome{}, err
	}

	acct, err := s.q.GetAccount(ctx, id)
	if err != nil {
		return bankedOutcome{}, storeErr(err)
	}
	if acct.AuthKind != "oauth" {
		return bankedOutcome{}, invalidf("id: only OAuth accounts have reset grants")
	}
	if !acct.BankedResetsEnabled {
		return bankedOutcome{}, invalidf("id: banked resets are not enabled for this account")
	}
	if acct.OrgID == nil || *acct.OrgID == "" {
		return bankedOutcome{why: "no org_id set"}, invalidf("id: the account has no org_id for the claim URL")
	}
	grants, err := s.q.ListResetGrants(ctx, id)
	if err != nil {
		return bankedOutcome{}, err
	}
	now := s.now()
	if s.grantsStale(ctx, id, grants, manualGrant, now) {
		// The grant status read is a usage read: through the budget.
		if _, err := s.readUsage(ctx, id); err != nil {
			return bankedOutcome{}, err
		}
		if grants, err = s.q.ListResetGrants(ctx, id); err != nil {
			return bankedOutcome{}, err
		}
		now = s.now()
	}
	in := bankedInput{now: now, manualGrant: manualGrant}
	for _, g := range grants {
		in.grants = append(in.grants, resetGrant{id: g.GrantID, program: g.Program, status: g.Status, expiresAt: g.ExpiresAt})
	}
	if in.weeklyLimited, in.sevenDay, err = s.weeklyLimited(ctx, id, now); err != nil {
		return bankedOutcome{}, err
	}
	last, err := s.q.LastResetClaimAt(ctx, id)
	switch {
	case err == nil:
		in.lastClaim = &last
	case !errors.Is(err, pgx.ErrNoRows):
		return bankedOutcome{}, err
	}
	d := decideBankedReset(in)
	if !d.claim {
		return bankedOutcome{why: d.why}, nil
	}
	row, err := s.q.InsertResetClaim(ctx, db.InsertResetClaimParams{
		AccountID: id, GrantID: d.grant.id, Program: d.grant.program, RequestID: uuid.New(), Now: now,
	})
	if errors.Is(err, pgx.ErrNoRows) || errors.As(storeErr(err), new(errConflict)) {
		// Another replica claimed first: its claim is the hour's.
		return bankedOutcome{why: "another claim was written first"}, nil
	}
	if err != nil {
		return bankedOutcome{}, err
	}
	s.log.InfoContext(ctx, "claiming a reset grant", "account_id", id, "grant_id", row.GrantID, "request_id", row.RequestID, "why", d.why)
	row, err = s.sendResetClaim(ctx, row)
	return bankedOutcome{sent: true, claim: &row, why: d.why}, err
}

// grantsStale says whether the applier should read the grants itself: the
// last read that answered is older than bankedGrantsStale (or there was
// none), or an operator names a grant the stored ones do not have. The
// poller's reads keep them fresh otherwise.
func (s *Server) grantsStale(ctx context.Context, id uuid.UUID, grants []db.ResetGrant, manualGrant string, now time.Time) bool {
	if manualGrant != "" && !slices.ContainsFunc(grants, func(g db.ResetGrant) bool { return g.GrantID == manualGrant }) {
		return true
	}
	p, err := s.q.GetUsagePoll(ctx, id)
	if err != nil || p.LastOkAt == nil {
		return true
	}
	return now.Sub(*p.LastOkAt) >= bankedGrantsStale
}

// weeklyLimited says whether the account is at its weekly limit: a live
// quota_exhausted cooldown on a 7d claim, or the usage view's seven_day at
// spentAt or above. It also returns the view's weekly utilization.
func (s *Server) weeklyLimited(ctx context.Context, id uuid.UUID, now time.Time) (bool, *float64, error) {
	var sevenDay *float64
	limited := false
	rows, err := s.q.AccountWideUsage(ctx, db.AccountWideUsageParams{AccountID: id, Now: now})
	if err != nil {
		return false, nil, err
	}
	for _, r := range rows {
		if r.WindowName == windowSevenDay {
			u := r.Utilization
			sevenDay = &u
			limited = u >= spentAt
		}
	}
	cd, err := s.q.GetLiveCooldown(ctx, db.GetLiveCooldownParams{AccountID: id, Now: now})
	switch {
	case errors.Is(err, pgx.ErrNoRows):
	case err != nil:
		return false, nil, err
	case cd.Reason == enumName(weirv1.CooldownReason_COOLDOWN_REASON_QUOTA_EXHAUSTED):
		var e storedEvidence
		_ = json.Unmarshal(cd.Evidence, &e)
		for _, c := range e.Claims {
			if c.Claim == "7d" {
				limited = true
			}
		}
	}
	return limited, sevenDay, nil
}

// sendResetClaim sends (or resends) a pending ledger row's claim and
// writes what came of it: an answer with a result finishes the row done; a
// refusal the provider will repeat (4xx but 429) finishes it failed; no
// answer, a 429 or a 5xx leave it pending for the next tick, which replays
// it with the same request_id. After a reset, the grant is marked used and
// the usage read re-armed for now, so the fenced refetch restores capacity.
func (s *Server) sendResetClaim(ctx context.Context, row db.ResetClaim) (db.ResetClaim, error) {
	acct, err := s.q.GetAccount(ctx, row.AccountID)
	if err != nil {
		return row, storeErr(err)
	}
	status, result, err := s.postResetClaim(ctx, acct, row)
	if err != nil {
		s.log.WarnContext(ctx, "reset claim unanswered; it stays pending", "account_id", row.AccountID, "request_id", row.RequestID, "err", err)
		return row, nil
	}
	now := s.now()
	err = s.tx(ctx, func(q *db.Queries) error {
		n, err := q.FinishResetClaim(ctx, db.FinishResetClaimParams{Status: status, Result: &result, Now: now, ID: row.ID})
		if err != nil || n == 0 {
			// n == 0: another replica finished the same claim first.
			return err
		}
		if status == "done" && (result == grantResultReset || result == grantResultAlreadyUsed) {
			if err := q.MarkResetGrantUsed(ctx, db.MarkResetGrantUsedParams{AccountID: row.AccountID, GrantID: row.GrantID}); err != nil {
				return err
			}
		}
		if status == "done" && result == grantResultReset {
			// Never the cooldown itself: the next read, in a new epoch,
			// sees the emptied window and recoverQuota lifts it by
			// compare-and-set, as for any recovery.
			if _, err := rearmUsage(ctx, q, row.AccountID, now); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return row, fmt.Errorf("record reset claim: %w", err)
	}
	s.log.InfoContext(ctx, "reset claim answered", "account_id", row.AccountID, "grant_id", row.GrantID,
		"request_id", row.RequestID, "status", status, "result", result)
	row.Status, row.Result, row.FinishedAt = status, &result, &now
	return row, nil
}

// postResetClaim POSTs the claim. It returns the ledger status and result
// for an answer, or an error when the claim must stay pending.
func (s *Server) postResetClaim(ctx context.Context, acct db.Account, row db.ResetClaim) (string, string, error) {
	if acct.OrgID == nil || *acct.OrgID == "" {
		return "", "", errors.New("the account has no org_id")
	}
	token, err := s.seal.Open(acct.ID, acct.CredentialRevision, acct.CredentialSealed)
	if err != nil {
		return "", "", errors.New("credential unreadable under this secret key")
	}
	base := acct.BaseUrl
	if base == "" {
		base = anthropicBaseURL
	}
	body, _ := json.Marshal(map[string]string{"program": row.Program, "grant_id": row.GrantID, "request_id": row.RequestID.String()})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+fmt.Sprintf(resetClaimPath, url.PathEscape(*acct.OrgID)), bytes.NewReader(body))
	if err != nil {
		return "", "", fmt.Errorf("reset claim request: %w", err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("anthropic-beta", oauthBeta)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json")
	resp, err := s.cfg.UsageClient.Do(req)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return "", "", fmt.Errorf("reset endpoint unreachable: %w", scrubbed{err, token})
	}
	defer resp.Body.Close()
	answer, err := io.ReadAll(io.LimitReader(resp.Body, maxClaimBody))
	switch {
	case resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode >= 500:
		return "", "", fmt.Errorf("reset endpoint answered %d", resp.StatusCode)
	case resp.StatusCode != http.StatusOK:
		return "failed", fmt.Sprintf("answered %d", resp.StatusCode), nil
	case err != nil:
		return "", "", fmt.Errorf("reset endpoint: read answer: %w", scrubbed{err, token})
	}
	var doc struct {
		Result string `json:"result"`
	}
	if err := json.Unmarshal(answer, &doc); err != nil || doc.Result == "" {
		// Not the shape we expect: recorded, never read as a reset.
		return "failed", "unrecognized answer", nil
	}
	return "done", doc.Result, nil
}

// bankedUpdate reads UpdateAccount's banked-reset fields into p.
func bankedUpdate(p *db.SetBankedResetsParams, path string, m *weirv1.UpdateAccountRequest) error {
	switch path {
	case "banked_resets_enabled":
		p.Enabled = pgtype.Bool{Bool: m.BankedResetsEnabled, Valid: true}
	case "org_id":
		org := strings.TrimSpace(m.OrgId)
		if len(org) > 200 || strings.ContainsAny(org, "/?#% \t\n") {
			return invalidf("org_id: not an organization id")
		}
		p.OrgID = &org
	}
	return nil
}

// ListResetGrants lists an account's grants as last read and its claims.
func (a accountService) ListResetGrants(ctx context.Context, req *connect.Request[weirv1.ListResetGrantsRequest]) (*connect.Response[weirv1.ListResetGrantsResponse], error) {
	row, err := a.findAccount(ctx, req.Msg.Id)
	if err != nil {
		return nil, err
	}
	grants, err := a.q.ListResetGrants(ctx, row.ID)
	if err != nil {
		return nil, err
	}
	claims, err := a.q.ListResetClaims(ctx, row.ID)
	if err != nil {
		return nil, err
	}
	out := &weirv1.ListResetGrantsResponse{Grants: []*weirv1.ResetGrant{}, Claims: []*weirv1.ResetClaim{}}
	for _, g := range grants {
		out.Grants = append(out.Grants, &weirv1.ResetGrant{
			GrantId: g.GrantID, Program: g.Program, Status: g.Status,
			ExpiresAt: timestampOrNil(g.ExpiresAt), SeenAt: timestamppb.New(g.SeenAt),
		})
	}
	for _, c := range claims {
		out.Claims = append(out.Claims, resetClaimProto(c))
	}
	return connect.NewResponse(out), nil
}

// ClaimResetGrant claims a grant by hand: the same ledger, replay and
// once-an-hour rule as the applier, without the weekly-limit condition.
func (a accountService) ClaimResetGrant(ctx context.Context, req *connect.Request[weirv1.ClaimResetGrantRequest]) (*connect.Response[weirv1.ClaimResetGrantResponse], error) {
	if req.Msg.GrantId == "" {
		return nil, toConnect(invalidf("grant_id: required"))
	}
	row, err := a.findAccount(ctx, req.Msg.Id)
	if err != nil {
		return nil, err
	}
	out, err := a.bankedReset(ctx, row.ID, req.Msg.GrantId)
	if err != nil {
		return nil, err
	}
	resp := &weirv1.ClaimResetGrantResponse{Sent: out.sent, Reason: out.why}
	if out.claim != nil {
		resp.Claim = resetClaimProto(*out.claim)
	}
	return connect.NewResponse(resp), nil
}

func resetClaimProto(c db.ResetClaim) *weirv1.ResetClaim {
	p := &weirv1.ResetClaim{
		Id: c.ID.String(), GrantId: c.GrantID, Program: c.Program, RequestId: c.RequestID.String(),
		Status: c.Status, CreatedAt: timestamppb.New(c.CreatedAt), FinishedAt: timestampOrNil(c.FinishedAt),
	}
	if c.Result != nil {
		p.Result = *c.Result
	}
	return p
}
