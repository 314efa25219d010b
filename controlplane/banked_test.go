package controlplane

import (
	"bytes"
	"net/http"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgtype"
	"google.golang.org/protobuf/types/known/fieldmaskpb"

	"github.com/weirhq/weir/controlplane/db"
	weirv1 "github.com/weirhq/weir/gen/weir/v1"
	"github.com/weirhq/weir/internal/sim"
)

func TestParseResetGrants(t *testing.T) {
	t.Parallel()
	if g := parseResetGrants([]byte(`{"seven_day":null}`)); g != nil {
		t.Errorf("grants %v from an answer without them", g)
	}
	g := parseResetGrants([]byte(`{"reset_grants":[{"id":"g1","program":"p","status":"available","expires_at":"2026-03-07T10:00:00Z"},{"id":"g2","status":"used","expires_at":null},{"program":"no id"}]}`))
	if g == nil || len(*g) != 2 || (*g)[0].expiresAt == nil || (*g)[1].expiresAt != nil || (*g)[1].status != "used" {
		t.Fatalf("grants %+v", g)
	}
}

// bankedAccount is an OAuth account with its week spent and one grant.
func bankedAccount(name string, weekUsed int64) sim.AccountScript {
	return sim.AccountScript{
		Name: name, Kind: sim.KindOAuth, Credential: oauthToken(),
		Windows: &sim.Windows{
			FiveHour: &sim.Window{Limit: 1000, Used: 100, ResetIn: sim.Duration(3 * time.Hour)},
			SevenDay: &sim.Window{Limit: 10000, Used: weekUsed, ResetIn: sim.Duration(100 * time.Hour)},
		},
		Grants: []sim.Grant{{ID: "g1", Program: "max-resets", ExpiresIn: sim.Duration(168 * time.Hour)}},
	}
}

func (u *usageEnv) enableBanked(id string) {
	u.t.Helper()
	org := "org-1"
	if _, err := u.q.SetBankedResets(u.t.Context(), db.SetBankedResetsParams{
		ID: uuid.MustParse(id), Enabled: pgtype.Bool{Bool: true, Valid: true}, OrgID: &org,
	}); err != nil {
		u.t.Fatal(err)
	}
}

// resetClaims are the claims that reached the simulator, by outcome.
func (u *usageEnv) resetClaims() map[string]int {
	out := map[string]int{}
	for _, a := range u.sim.Attempts() {
		if strings.HasSuffix(a.Path, "/reset_rate_limits") {
			out[a.Outcome]++
		}
	}
	return out
}

func (u *usageEnv) claims(id string) []db.ResetClaim {
	u.t.Helper()
	rows, err := u.pool.Query(u.t.Context(), `SELECT id, account_id, grant_id, program, request_id, status, result, created_at, finished_at FROM reset_claims WHERE account_id = $1 ORDER BY created_at`, uuid.MustParse(id))
	if err != nil {
		u.t.Fatal(err)
	}
	defer rows.Close()
	var out []db.ResetClaim
	for rows.Next() {
		var c db.ResetClaim
		if err := rows.Scan(&c.ID, &c.AccountID, &c.GrantID, &c.Program, &c.RequestID, &c.Status, &c.Result, &c.CreatedAt, &c.FinishedAt); err != nil {
			u.t.Fatal(err)
		}
		out = append(out, c)
	}
	return out
}

func (u *usageEnv) grantStatus(id, grant string) string {
	u.t.Helper()
	rows, err := u.q.ListResetGrants(u.t.Context(), uuid.MustParse(id))
	if err != nil {
		u.t.Fatal(err)
	}
	for _, g := range rows {
		if g.GrantID == grant {
			return g.Status
		}
	}
	return ""
}

func (u *usageEnv) apply() int {
	u.t.Helper()
	n, err := u.srv.acct.ApplyBankedResets(u.t.Context())
	if err != nil {
		u.t.Fatalf("ApplyBankedResets: %v", err)
	}
	return n
}

// TestBankedResetRecoversThroughTheRefetch: an account at its weekly limit
// with a grant is reset once; the cooldown is not nulled by the claim but
// lifted by the refetch that follows, and the account routes again.
func TestBankedResetRecoversThroughTheRefetch(t *testing.T) {
	t.Parallel()
	u, accts := setupUsage(t, bankedAccount("max", 10000))
	a := accts["max"]
	u.enableBanked(a.Id)
	_, keyHash := u.createKey("")

	l := u.mustLease(&weirv1.AcquireRequest{KeyHash: keyHash, Model: sonnetModel})
	u.release(l.Id, rateLimited(hdr("status", "rejected", "7d-status", "rejected", "7d-reset", epochAfter(u.clock.Now(), 100*time.Hour))))
	if cd := u.cooldownRow(a.Id); cd == nil || cd.Reason != "quota_exhausted" {
		t.Fatalf("cooldown %+v", cd)
	}
	u.clock.Advance(time.Second)

	if n := u.apply(); n != 1 {
		t.Fatalf("claims sent %d, want 1", n)
	}
	cs := u.claims(a.Id)
	if len(cs) != 1 || cs[0].Status != "done" || cs[0].Result == nil || *cs[0].Result != grantResultReset {
		t.Fatalf("ledger %+v", cs)
	}
	if got := u.grantStatus(a.Id, "g1"); got != grantStatusUsed {
		t.Errorf("grant %q, want used", got)
	}
	// The claim never touches the cooldown itself.
	if cd := u.cooldownRow(a.Id); cd == nil {
		t.Fatal("the claim nulled the cooldown")
	}
	// It re-armed the read: the poller reads as soon as the budget allows,
	// and the reading lifts the cooldown.
	u.clock.Advance(151 * time.Second)
	if n, err := u.srv.acct.ReadDue(t.Context()); err != nil || n != 1 {
		t.Fatalf("ReadDue %d, %v", n, err)
	}
	if cd := u.cooldownRow(a.Id); cd != nil {
		t.Fatalf("cooldown %+v survived the refetch after a reset", cd)
	}
	probe := u.mustLease(&weirv1.AcquireRequest{KeyHash: keyHash, Model: sonnetModel})
	u.release(probe.Id, succeeded())
	u.mustLease(&weirv1.AcquireRequest{KeyHash: keyHash, Model: sonnetModel})

	// Nothing more to claim, an hour on or not.
	if n := u.apply(); n != 0 {
		t.Errorf("a second claim within the hour: %d", n)
	}
	u.clock.Advance(2 * time.Hour)
	if n := u.apply(); n != 0 {
		t.Errorf("a second claim of a spent grant: %d", n)
	}
	if got := u.resetClaims(); got[sim.GrantReset] != 1 || len(got) != 1 {
		t.Errorf("claims at the simulator %v, want one reset", got)
	}
}

// TestBankedResetReplaysPending: a claim that reached the provider but
// whose answer was lost (a crash) is replayed with the same request_id;
// the grant is spent once.
func TestBankedResetReplaysPending(t *testing.T) {
	t.Parallel()
	script := bankedAccount("max", 10000)
	u, accts := setupUsage(t, script)
	a := accts["max"]
	u.enableBanked(a.Id)
	id := uuid.MustParse(a.Id)

	row, err := u.q.InsertResetClaim(t.Context(), db.InsertResetClaimParams{
		AccountID: id, GrantID: "g1", Program: "max-resets", RequestID: uuid.New(), Now: u.clock.Now(),
	})
	if err != nil {
		t.Fatal(err)
	}
	// The first send reached the provider; its answer never came back.
	body := `{"program":"max-resets","grant_id":"g1","request_id":"` + row.RequestID.String() + `"}`
	req, _ := http.NewRequest(http.MethodPost, u.simURL+"/api/organizations/org-1/reset_rate_limits", bytes.NewBufferString(body))
	req.Header.Set("Authorization", "Bearer "+script.Credential)
	req.Header.Set("anthropic-beta", oauthBeta)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()

	u.clock.Advance(time.Minute)
	if n := u.apply(); n != 1 {
		t.Fatalf("replays %d, want 1", n)
	}
	cs := u.claims(a.Id)
	if len(cs) != 1 || cs[0].RequestID != row.RequestID || cs[0].Status != "done" || *cs[0].Result != grantResultReset {
		t.Fatalf("ledger %+v", cs)
	}
	// Both sends answered reset: the provider's replay of its first answer.
	if got := u.resetClaims(); got[sim.GrantReset] != 2 || len(got) != 1 {
		t.Errorf("claims at the simulator %v", got)
	}
	// The grant was spent once: a read shows it used, and a new request
	// for it would be already_used (none is sent).
	u.clock.Advance(time.Hour + time.Minute)
	u.refresh(a.Id)
	if got := u.grantStatus(a.Id, "g1"); got != grantStatusUsed {
		t.Errorf("grant %q, want used", got)
	}
	if n := u.apply(); n != 0 {
		t.Errorf("claims %d after the grant was spent", n)
	}
}

// TestBankedResetNotLimitedAndHourly: a manual claim on an account far from
// its limit answers not_limited and leaves the grant; a second claim
// within the hour is refused, one an hour later is sent.
func TestBankedResetNotLimitedAndHourly(t *testing.T) {
	t.Parallel()
	u, accts := setupUsage(t, bankedAccount("max", 1000))
	a := accts["max"]
	u.enableBanked(a.Id)
	id := uuid.MustParse(a.Id)

	// The applier alone does not claim: not at the limit.
	if n := u.apply(); n != 0 {
		t.Fatalf("claims %d on an account with headroom", n)
	}
	out, err := u.srv.acct.bankedReset(t.Context(), id, "g1")
	if err != nil || !out.sent || out.claim == nil || *out.claim.Result != "not_limited" {
		t.Fatalf("manual claim %+v, %v", out, err)
	}
	if got := u.grantStatus(a.Id, "g1"); got != grantStatusAvailable {
		t.Errorf("grant %q after not_limited, want available", got)
	}
	u.clock.Advance(59 * time.Minute)
	if out, err := u.srv.acct.bankedReset(t.Context(), id, "g1"); err != nil || out.sent {
		t.Fatalf("a second claim within the hour: %+v, %v", out, err)
	}
	u.clock.Advance(time.Minute)
	if out, err := u.srv.acct.bankedReset(t.Context(), id, "g1"); err != nil || !out.sent {
		t.Fatalf("a claim an hour later: %+v, %v", out, err)
	}
	if got := u.resetClaims(); got[sim.GrantNotLimited] != 2 {
		t.Errorf("claims at the simulator %v", got)
	}
}

// TestResetGrantRPCs: UpdateAccount turns banked resets on; the manual
// claim goes through the ledger; ListResetGrants shows grant and claim.
func TestResetGrantRPCs(t *testing.T) {
	t.Parallel()
	u, accts := setupUsage(t, bankedAccount("max", 10000))
	a := accts["max"]
	ctx := t.Context()

	// Not enabled: the manual claim is refused.
	_, err := u.admin.accounts.ClaimResetGrant(ctx, connect.NewRequest(&weirv1.ClaimResetGrantRequest{Id: "max", GrantId: "g1"}))
	wantCode(t, err, connect.CodeInvalidArgument)

	up, err := u.admin.accounts.UpdateAccount(ctx, connect.NewRequest(&weirv1.UpdateAccountRequest{
		Id: "max", BankedResetsEnabled: true, OrgId: "org-1",
		UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"banked_resets_enabled", "org_id"}},
	}))
	if err != nil || !up.Msg.Account.BankedResetsEnabled || up.Msg.Account.OrgId != "org-1" {
		t.Fatalf("UpdateAccount %v, %v", up, err)
	}
	_, err = u.admin.accounts.UpdateAccount(ctx, connect.NewRequest(&weirv1.UpdateAccountRequest{
		Id: "max", OrgId: "../x", UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"org_id"}},
	}))
	wantCode(t, err, connect.CodeInvalidArgument)

	cl, err := u.admin.accounts.ClaimResetGrant(ctx, connect.NewRequest(&weirv1.ClaimResetGrantRequest{Id: "max", GrantId: "g1"}))
	if err != nil || !cl.Msg.Sent || cl.Msg.Claim.GetResult() != grantResultReset || cl.Msg.Claim.GetStatus() != "done" {
		t.Fatalf("ClaimResetGrant %v, %v", cl, err)
	}
	// Again at once: the hourly rule holds for operators too.
	cl, err = u.admin.accounts.ClaimResetGrant(ctx, connect.NewRequest(&weirv1.ClaimResetGrantRequest{Id: "max", GrantId: "g1"}))
	if err != nil || cl.Msg.Sent {
		t.Fatalf("second ClaimResetGrant %v, %v", cl, err)
	}
	ls, err := u.admin.accounts.ListResetGrants(ctx, connect.NewRequest(&weirv1.ListResetGrantsRequest{Id: a.Id}))
	if err != nil {
		t.Fatal(err)
	}
	if len(ls.Msg.Grants) != 1 || ls.Msg.Grants[0].Status != grantStatusUsed || ls.Msg.Grants[0].ExpiresAt == nil ||
		len(ls.Msg.Claims) != 1 || ls.Msg.Claims[0].Result != grantResultReset {
		t.Fatalf("ListResetGrants %v", ls.Msg)
	}
	if got := u.resetClaims(); got[sim.GrantReset] != 1 || len(got) != 1 {
		t.Errorf("claims at the simulator %v", got)
	}
}
