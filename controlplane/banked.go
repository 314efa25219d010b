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
	"github.com/weirhq/weir/controlplane/policy"
	weirv1 "github.com/weirhq/weir/gen/weir/v1"
)

// Banked resets (issue 4): an OAuth account with banked resets enabled may
// hold reset grants that empty its weekly windows once. The applier reads
// the grants through the usage budget (readUsage asks for them), decides
// whether to claim one (policy.DecideBankedReset), writes a pending ledger
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
	grantStatusAvailable   = policy.GrantAvailable
	grantStatusUsed        = policy.GrantUsed
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

// ApplyBankedResets is the applier's tick (jobs.BankedResetter): for each
// OAuth account with banked resets enabled, it replays a pending claim or
// decides on a new one. It says how many claims it sent.
func (j *AccountJobs) ApplyBankedResets(ctx context.Context) (int, error) {
	ids, err := j.q.BankedResetAccounts(ctx)
	if err != nil {
		return 0, fmt.Errorf("banked reset accounts: %w", err)
	}
	sent := 0
	var errs []error
	for _, id := range ids {
		out, err := j.bankedReset(ctx, id, "")
		if errors.As(err, new(errInvalid)) {
			// Not ours to fix (no org_id): said, not retried as a failure.
			j.log.WarnContext(ctx, "banked resets skipped", "account_id", id, "err", err)
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
// policy.DecideBankedReset says so. manualGrant is an operator's claim.
func (j *AccountJobs) bankedReset(ctx context.Context, id uuid.UUID, manualGrant string) (bankedOutcome, error) {
	pending, err := j.q.PendingResetClaim(ctx, id)
	switch {
	case err == nil:
		// A claim sent before and not answered (a crash, a timeout): the
		// same request_id again; the provider spends nothing twice.
		out := bankedOutcome{claim: &pending, why: "replaying a pending claim"}
		if manualGrant != "" && manualGrant != pending.GrantID {
			return out, invalidf("a claim of grant %s is still pending", pending.GrantID)
		}
		row, err := j.sendResetClaim(ctx, pending)
		out.sent, out.claim = true, &row
		return out, err
	case !errors.Is(err, pgx.ErrNoRows):
		return bankedOutcome{}, err
	}

	acct, err := j.q.GetAccount(ctx, id)
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
	grants, err := j.q.ListResetGrants(ctx, id)
	if err != nil {
		return bankedOutcome{}, err
	}
	now := j.now()
	if j.grantsStale(ctx, id, grants, manualGrant, now) {
		// The grant status read is a usage read: through the budget.
		if _, err := j.readUsage(ctx, id); err != nil {
			return bankedOutcome{}, err
		}
		if grants, err = j.q.ListResetGrants(ctx, id); err != nil {
			return bankedOutcome{}, err
		}
		now = j.now()
	}
	in := policy.BankedInput{Now: now, ManualGrant: manualGrant, Grants: policyGrants(grants)}
	if in.WeeklyLimited, in.SevenDay, err = j.weeklyLimited(ctx, id, now); err != nil {
		return bankedOutcome{}, err
	}
	last, err := j.q.LastResetClaimAt(ctx, id)
	switch {
	case err == nil:
		in.LastClaim = &last
	case !errors.Is(err, pgx.ErrNoRows):
		return bankedOutcome{}, err
	}
	d := policy.DecideBankedReset(in)
	if !d.Claim {
		return bankedOutcome{why: d.Why}, nil
	}
	row, err := j.q.InsertResetClaim(ctx, db.InsertResetClaimParams{
		AccountID: id, GrantID: d.Grant.ID, Program: d.Grant.Program, RequestID: uuid.New(), Now: now,
	})
	if errors.Is(err, pgx.ErrNoRows) || errors.As(storeErr(err), new(errConflict)) {
		// Another replica claimed first: its claim is the hour's.
		return bankedOutcome{why: "another claim was written first"}, nil
	}
	if err != nil {
		return bankedOutcome{}, err
	}
	j.log.InfoContext(ctx, "claiming a reset grant", "account_id", id, "grant_id", row.GrantID, "request_id", row.RequestID, "why", d.Why)
	row, err = j.sendResetClaim(ctx, row)
	return bankedOutcome{sent: true, claim: &row, why: d.Why}, err
}

// grantsStale says whether the applier should read the grants itself: the
// last read that answered is older than bankedGrantsStale (or there was
// none), or an operator names a grant the stored ones do not have. The
// poller's reads keep them fresh otherwise.
func (j *AccountJobs) grantsStale(ctx context.Context, id uuid.UUID, grants []db.ResetGrant, manualGrant string, now time.Time) bool {
	if manualGrant != "" && !slices.ContainsFunc(grants, func(g db.ResetGrant) bool { return g.GrantID == manualGrant }) {
		return true
	}
	p, err := j.q.GetUsagePoll(ctx, id)
	if err != nil || p.LastOkAt == nil {
		return true
	}
	return now.Sub(*p.LastOkAt) >= bankedGrantsStale
}

// weeklyLimited says whether the account is at its weekly limit
// (policy.WeeklyLimited), and the usage view's weekly utilization.
func (j *AccountJobs) weeklyLimited(ctx context.Context, id uuid.UUID, now time.Time) (bool, *float64, error) {
	var sevenDay *float64
	rows, err := j.q.AccountWideUsage(ctx, db.AccountWideUsageParams{AccountID: id, Now: now})
	if err != nil {
		return false, nil, err
	}
	for _, r := range rows {
		if r.WindowName == windowSevenDay {
			u := r.Utilization
			sevenDay = &u
		}
	}
	var live *policy.Cooldown
	cd, err := j.q.GetLiveCooldown(ctx, db.GetLiveCooldownParams{AccountID: id, Now: now})
	switch {
	case errors.Is(err, pgx.ErrNoRows):
	case err != nil:
		return false, nil, err
	default:
		c := policyCooldown(cd)
		live = &c
	}
	return policy.WeeklyLimited(sevenDay, live), sevenDay, nil
}

// sendResetClaim sends (or resends) a pending ledger row's claim and
// writes what came of it: an answer with a result finishes the row done; a
// refusal the provider will repeat (4xx but 429) finishes it failed; no
// answer, a 429 or a 5xx leave it pending for the next tick, which replays
// it with the same request_id. After a reset, the grant is marked used and
// the usage read re-armed for now, so the fenced refetch restores capacity.
func (j *AccountJobs) sendResetClaim(ctx context.Context, row db.ResetClaim) (db.ResetClaim, error) {
	acct, err := j.q.GetAccount(ctx, row.AccountID)
	if err != nil {
		return row, storeErr(err)
	}
	status, result, err := j.postResetClaim(ctx, acct, row)
	if err != nil {
		j.log.WarnContext(ctx, "reset claim unanswered; it stays pending", "account_id", row.AccountID, "request_id", row.RequestID, "err", err)
		return row, nil
	}
	now := j.now()
	err = j.tx(ctx, func(q *db.Queries) error {
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
	j.log.InfoContext(ctx, "reset claim answered", "account_id", row.AccountID, "grant_id", row.GrantID,
		"request_id", row.RequestID, "status", status, "result", result)
	row.Status, row.Result, row.FinishedAt = status, &result, &now
	return row, nil
}

// postResetClaim POSTs the claim. It returns the ledger status and result
// for an answer, or an error when the claim must stay pending.
func (j *AccountJobs) postResetClaim(ctx context.Context, acct db.Account, row db.ResetClaim) (string, string, error) {
	if acct.OrgID == nil || *acct.OrgID == "" {
		return "", "", errors.New("the account has no org_id")
	}
	token, err := j.seal.Open(acct.ID, acct.CredentialRevision, acct.CredentialSealed)
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
	client, release, err := j.clientFor(ctx, j.egress.usage, j.cfg.UsageClient, acct)
	if err != nil {
		return "", "", err
	}
	defer release()
	resp, err := client.Do(req)
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
