package controlplane

import (
	"errors"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/weirhq/weir/controlplane/db"
	"github.com/weirhq/weir/controlplane/policy"
	weirv1 "github.com/weirhq/weir/gen/weir/v1"
)

const (
	actFailover = weirv1.Action_ACTION_FAILOVER
	reasonRL    = weirv1.CooldownReason_COOLDOWN_REASON_RATE_LIMITED
	reasonQuota = weirv1.CooldownReason_COOLDOWN_REASON_QUOTA_EXHAUSTED
)

// Quota evidence through Postgres: Release stores it with the cooldown,
// operators see it, a restarted control plane still routes by it, and it
// goes with the deadline it justified.

const codexLimitMessage = "You've hit your usage limit. Upgrade to Pro or try again in 2 hours."

// quotaColumns is a cooldown row's quota evidence as stored.
type quotaColumns struct {
	reason   string
	until    time.Time
	kind     *string
	resetsAt *time.Time
	window   int32
	message  string
}

// quotaRow reads an account's cooldown row with its quota columns; ok is
// false when there is none.
func (e *env) quotaRow(id string) (quotaColumns, bool) {
	e.t.Helper()
	var q quotaColumns
	err := e.pool.QueryRow(e.t.Context(),
		`SELECT reason, until, quota_kind, quota_resets_at, quota_window_minutes, quota_message FROM cooldowns WHERE account_id = $1`,
		uuid.MustParse(id)).Scan(&q.reason, &q.until, &q.kind, &q.resetsAt, &q.window, &q.message)
	if errors.Is(err, pgx.ErrNoRows) {
		return q, false
	}
	if err != nil {
		e.t.Fatalf("read cooldown: %v", err)
	}
	return q, true
}

// strOf is *p, or "" for nil.
func strOf(p *string) string { return orZero(p) }

// dbCooldown is a transient cooldown write of reason until until, at now.
func dbCooldown(id, reason string, until, now time.Time) db.WriteCooldownParams {
	return db.WriteCooldownParams{AccountID: uuid.MustParse(id), Reason: reason, Transient: true, Until: until, Now: now,
		Evidence: []byte(`{"class":"rate_limited","status":429}`)}
}

// createCodex creates a Codex account from an auth.json.
func (e *env) createCodex(label string) *weirv1.Account {
	e.t.Helper()
	access, refresh := codexAccess("", epoch.Add(10*24*time.Hour)), codexRefresh()
	e.secrets.add(access)
	e.secrets.add(refresh)
	resp, err := e.admin.accounts.CreateAccount(e.t.Context(), connect.NewRequest(&weirv1.CreateAccountRequest{
		Provider: weirv1.Provider_PROVIDER_CODEX, AuthKind: weirv1.AuthKind_AUTH_KIND_OAUTH, Label: label,
		Credential: codexAuthJSON("", access, refresh, label+"-chatgpt-id"), MaxConcurrency: 4,
	}))
	if err != nil {
		e.t.Fatalf("CreateAccount %s: %v", label, err)
	}
	return resp.Msg.Account
}

// codexRequest asks for a Codex model on the Responses surface.
func codexRequest(keyHash string) *weirv1.AcquireRequest {
	return &weirv1.AcquireRequest{KeyHash: keyHash, Model: "gpt-5-codex", Surface: weirv1.Surface_SURFACE_RESPONSES}
}

// codexUsageLimit is Codex's usage_limit_reached answer, resetting at reset.
func codexUsageLimit(reset time.Time) *weirv1.Outcome {
	return &weirv1.Outcome{Class: weirv1.OutcomeClass_OUTCOME_CLASS_RATE_LIMITED, Status: 429, ErrorType: "usage_limit_reached",
		Quota: &weirv1.QuotaEvidence{Kind: kindCodex, ResetsAt: timestamppb.New(reset), WindowMinutes: 300, Message: codexLimitMessage}}
}

// wantQuotaEvidence checks an Account.cooldown.quota (or Decision's).
func wantQuotaEvidence(t *testing.T, what string, got *weirv1.QuotaEvidence, kind weirv1.QuotaKind, reset time.Time, window int32, message string) {
	t.Helper()
	if got == nil {
		t.Fatalf("%s: no quota evidence", what)
	}
	if got.Kind != kind || got.GetResetsAt() == nil || !got.GetResetsAt().AsTime().Equal(reset) ||
		got.WindowMinutes != window || got.Message != message || got.ResetAfter != nil {
		t.Errorf("%s: quota %v, want %v resetting %v, window %d, %q", what, got, kind, reset, window, message)
	}
}

// TestQuotaCooldownThroughRelease: a Codex usage limit released through
// the lease service is stored with its quota evidence, shown on the
// account, survives a restart (a new Server on the same database routes
// the pool as quota-blocked, in the mode the settings name), and is
// removed with the cooldown by a resume.
func TestQuotaCooldownThroughRelease(t *testing.T) {
	t.Parallel()
	e := setup(t)
	_, keyHash := e.createKey("")
	a := e.createCodex("codex-a")
	lease := e.mustLease(codexRequest(keyHash))
	if lease.AccountId != a.Id || lease.Provider != weirv1.Provider_PROVIDER_CODEX {
		t.Fatalf("lease on %s (%v), want codex-a", lease.AccountLabel, lease.Provider)
	}

	now := e.clock.Advance(time.Minute)
	reset := now.Add(2 * time.Hour)
	d := e.release(lease.Id, codexUsageLimit(reset))
	if d.Action != actFailover || d.GetCooldown().GetReason() != reasonQuota || !d.GetCooldown().GetUntil().AsTime().Equal(reset) {
		t.Fatalf("decision %v, want FAILOVER with quota_exhausted until %v", d, reset)
	}
	wantQuotaEvidence(t, "decision", d.GetCooldown().GetQuota(), kindCodex, reset, 300, codexLimitMessage)

	row, ok := e.quotaRow(a.Id)
	if !ok || row.reason != "quota_exhausted" || !row.until.Equal(reset) || row.kind == nil || *row.kind != "codex_usage_limit" ||
		row.resetsAt == nil || !row.resetsAt.Equal(reset) || row.window != 300 || row.message != codexLimitMessage {
		t.Fatalf("stored cooldown %+v (kind %v resets %v), want quota_exhausted until %v with the codex evidence", row, strOf(row.kind), row.resetsAt, reset)
	}
	got := e.getAccount(a.Id)
	if got.State != weirv1.AccountState_ACCOUNT_STATE_COOLING || got.GetCooldown().GetReason() != reasonQuota {
		t.Errorf("account state %v cooldown %v, want cooling on quota", got.State, got.GetCooldown())
	}
	wantQuotaEvidence(t, "GetAccount", got.GetCooldown().GetQuota(), kindCodex, reset, 300, codexLimitMessage)

	// A restart: another Server over the same database.
	r := e.replica()
	e.clock.Advance(time.Minute)
	none := r.mustNoAccount(codexRequest(keyHash), weirv1.NoAccountReason_NO_ACCOUNT_REASON_ALL_COOLING)
	b := none.GetQuotaBlock()
	if b == nil || !b.GetResetsAt().AsTime().Equal(reset) || b.WindowMinutes != 300 || b.Provider != weirv1.Provider_PROVIDER_CODEX ||
		b.LastUpstreamError != codexLimitMessage || b.Accounts != 1 {
		t.Fatalf("quota block %v, want codex-a's reset %v, window 300, its message, 1 account", b, reset)
	}
	if none.QuotaResponseMode != weirv1.QuotaResponseMode_QUOTA_RESPONSE_MODE_RETRYABLE || none.Permanent ||
		!none.GetRetryAt().AsTime().Equal(reset) {
		t.Errorf("mode %v permanent %v retry at %v, want RETRYABLE (the default), recoverable, at %v",
			none.QuotaResponseMode, none.Permanent, none.GetRetryAt().AsTime(), reset)
	}
	if _, err := r.updateSettings(&weirv1.Settings{QuotaResponseMode: weirv1.QuotaResponseMode_QUOTA_RESPONSE_MODE_USAGE_LIMIT}, "quota_response_mode"); err != nil {
		t.Fatalf("UpdateSettings: %v", err)
	}
	// Every replica answers by the mode in force, not a cached one.
	for _, x := range []*env{r, e} {
		none = x.mustNoAccount(codexRequest(keyHash), weirv1.NoAccountReason_NO_ACCOUNT_REASON_ALL_COOLING)
		if none.QuotaResponseMode != weirv1.QuotaResponseMode_QUOTA_RESPONSE_MODE_USAGE_LIMIT || none.GetQuotaBlock().GetAccounts() != 1 {
			t.Errorf("after the update: mode %v block %v, want USAGE_LIMIT over 1 account", none.QuotaResponseMode, none.GetQuotaBlock())
		}
	}
	// The Messages surface has no account: no quota block, no mode.
	none = r.mustNoAccount(&weirv1.AcquireRequest{KeyHash: keyHash, Model: "claude-sonnet-4-5"}, weirv1.NoAccountReason_NO_ACCOUNT_REASON_NONE_CONFIGURED)
	if none.QuotaBlock != nil || none.QuotaResponseMode != weirv1.QuotaResponseMode_QUOTA_RESPONSE_MODE_UNSPECIFIED {
		t.Errorf("messages: block %v mode %v, want neither", none.QuotaBlock, none.QuotaResponseMode)
	}

	// A resume clears the cooldown and its evidence with it.
	resumed := r.resume(a.Id)
	if resumed.Cooldown != nil || resumed.State != weirv1.AccountState_ACCOUNT_STATE_ACTIVE {
		t.Errorf("resumed: state %v cooldown %v, want active without a cooldown", resumed.State, resumed.Cooldown)
	}
	if row, ok := e.quotaRow(a.Id); ok {
		t.Errorf("after resume a cooldown row remains: %+v", row)
	}
	if got := e.getAccount(a.Id); got.Cooldown != nil {
		t.Errorf("GetAccount after resume: cooldown %v", got.Cooldown)
	}
	if l := r.mustLease(codexRequest(keyHash)); l.AccountId != a.Id {
		t.Errorf("after resume: lease on %s, want codex-a", l.AccountLabel)
	}
}

// TestQuotaCooldownMerge: the quota evidence follows the deadline that
// wins the merge. A shorter transport cooldown and a shorter rate limit
// change nothing; a longer rate limit takes the deadline and the quota
// evidence goes; a later quota cooldown brings its own.
func TestQuotaCooldownMerge(t *testing.T) {
	t.Parallel()
	e := setup(t)
	_, keyHash := e.createKey("")
	a := e.createCodex("codex-m")
	var leases []*weirv1.Lease
	for range 4 {
		leases = append(leases, e.mustLease(codexRequest(keyHash)))
	}

	now := e.clock.Advance(time.Second)
	reset := now.Add(2 * time.Hour)
	e.release(leases[0].Id, codexUsageLimit(reset))

	check := func(what, reason string, until time.Time, kind string, resetsAt *time.Time, window int32, message string) {
		t.Helper()
		row, ok := e.quotaRow(a.Id)
		if !ok {
			t.Fatalf("%s: no cooldown", what)
		}
		if row.reason != reason || !row.until.Equal(until) || strOf(row.kind) != kind || !sameTime(row.resetsAt, resetsAt) ||
			row.window != window || row.message != message {
			t.Errorf("%s: %s until %v, quota %q %v %d %q; want %s until %v, quota %q %v %d %q", what,
				row.reason, row.until, strOf(row.kind), row.resetsAt, row.window, row.message,
				reason, until, kind, resetsAt, window, message)
		}
		q := e.getAccount(a.Id).GetCooldown().GetQuota()
		if (kind == "") != (q == nil) {
			t.Errorf("%s: GetAccount quota %v, want present = %v", what, q, kind != "")
		}
	}
	check("usage limit", "quota_exhausted", reset, "codex_usage_limit", &reset, 300, codexLimitMessage)

	e.clock.Advance(time.Second)
	d := e.release(leases[1].Id, &weirv1.Outcome{Class: weirv1.OutcomeClass_OUTCOME_CLASS_TRANSPORT_ERROR, TransportError: "connection reset"})
	wantQuotaEvidence(t, "transport decision (the cooldown in force)", d.GetCooldown().GetQuota(), kindCodex, reset, 300, codexLimitMessage)
	check("after a shorter transport cooldown", "quota_exhausted", reset, "codex_usage_limit", &reset, 300, codexLimitMessage)

	// A rate limit without quota evidence: two prior bursts, so the
	// residual (Retry-After) rather than a same-account retry.
	rateLimit := func(retryAfter string) *weirv1.Outcome {
		return &weirv1.Outcome{Class: weirv1.OutcomeClass_OUTCOME_CLASS_RATE_LIMITED, Status: 429, PriorBursts: policy.BurstRetries,
			Headers: map[string]string{"retry-after": retryAfter}}
	}
	e.clock.Advance(time.Second)
	e.release(leases[2].Id, rateLimit("600"))
	check("after a shorter rate limit", "quota_exhausted", reset, "codex_usage_limit", &reset, 300, codexLimitMessage)

	now = e.clock.Advance(time.Second)
	later := now.Add(4 * time.Hour)
	d = e.release(leases[3].Id, rateLimit("14400"))
	if d.GetCooldown().GetReason() != reasonRL || d.GetCooldown().GetQuota() != nil {
		t.Errorf("longer rate limit decision: cooldown %v, want rate_limited without quota", d.GetCooldown())
	}
	check("after a longer rate limit", "rate_limited", later, "", nil, 0, "")

	// A quota cooldown later still takes the deadline and brings its own
	// evidence back. Written straight through the query Release uses.
	now = e.clock.Advance(time.Second)
	weekly := now.Add(100 * time.Hour)
	merged, err := e.q.WriteCooldown(t.Context(), withQuota(dbCooldown(a.Id, "quota_exhausted", weekly, now),
		&policy.QuotaRecord{Kind: kindCodex, ResetsAt: weekly, WindowMinutes: 10080, Message: "weekly"}))
	if err != nil {
		t.Fatal(err)
	}
	if merged.Reason != "quota_exhausted" || strOf(merged.QuotaKind) != "codex_usage_limit" || merged.QuotaWindowMinutes != 10080 {
		t.Errorf("merged %+v", merged)
	}
	check("after a longer quota cooldown", "quota_exhausted", weekly, "codex_usage_limit", &weekly, 10080, "weekly")

	// A later, still longer insufficient_quota (no reset) takes the
	// deadline: the evidence names no reset, so the account is out with no
	// known end.
	now = e.clock.Advance(time.Second)
	far := now.Add(101 * time.Hour)
	if _, err := e.q.WriteCooldown(t.Context(), withQuota(dbCooldown(a.Id, "out_of_credits", far, now),
		&policy.QuotaRecord{Kind: kindInsufficient, Message: "billing"})); err != nil {
		t.Fatal(err)
	}
	check("after insufficient_quota", "out_of_credits", far, "openai_insufficient_quota", nil, 0, "billing")
	none := e.mustNoAccount(codexRequest(keyHash), weirv1.NoAccountReason_NO_ACCOUNT_REASON_ALL_COOLING)
	if qb := none.QuotaBlock; qb == nil || qb.ResetsAt != nil || qb.Kind != kindInsufficient || qb.AccountsWithoutReset != 1 {
		t.Errorf("an insufficient_quota cooldown: quota block %v, want one without a reset", qb)
	}
}

// TestQuotaSettingsResponseMode: the mode is stored, served to operators
// and workers, audited on every change (not on a no-op), and a value
// outside the enum is refused with nothing changed.
func TestQuotaSettingsResponseMode(t *testing.T) {
	t.Parallel()
	e := setup(t)
	if got := e.getSettings().QuotaResponseMode; got != weirv1.QuotaResponseMode_QUOTA_RESPONSE_MODE_RETRYABLE {
		t.Fatalf("default mode %v, want RETRYABLE", got)
	}
	listChanges := func(limit int32) ([]*weirv1.SettingChange, error) {
		resp, err := e.settingsClient(e.cfg.AdminToken).ListSettingChanges(t.Context(), connect.NewRequest(&weirv1.ListSettingChangesRequest{Limit: limit}))
		if err != nil {
			return nil, err
		}
		return resp.Msg.Changes, nil
	}
	if changes, err := listChanges(0); err != nil || len(changes) != 0 {
		t.Fatalf("changes before any update: %v %v", changes, err)
	}

	first := e.clock.Advance(time.Minute)
	got, err := e.updateSettings(&weirv1.Settings{QuotaResponseMode: weirv1.QuotaResponseMode_QUOTA_RESPONSE_MODE_USAGE_LIMIT}, "quota_response_mode")
	if err != nil {
		t.Fatalf("UpdateSettings: %v", err)
	}
	if got.QuotaResponseMode != weirv1.QuotaResponseMode_QUOTA_RESPONSE_MODE_USAGE_LIMIT {
		t.Errorf("update response mode %v", got.QuotaResponseMode)
	}
	wantSettings(t, "other settings untouched", got, 20*time.Minute, 25*time.Minute)
	if got := e.getSettings().QuotaResponseMode; got != weirv1.QuotaResponseMode_QUOTA_RESPONSE_MODE_USAGE_LIMIT {
		t.Errorf("GetSettings mode %v, want USAGE_LIMIT", got)
	}
	ws, err := e.dp.leases.WorkerSettings(t.Context(), connect.NewRequest(&weirv1.WorkerSettingsRequest{}))
	if err != nil || ws.Msg.GetSettings().GetQuotaResponseMode() != weirv1.QuotaResponseMode_QUOTA_RESPONSE_MODE_USAGE_LIMIT {
		t.Errorf("WorkerSettings %v %v, want USAGE_LIMIT", ws.Msg.GetSettings(), err)
	}
	var stored string
	if err := e.pool.QueryRow(t.Context(), `SELECT value FROM settings WHERE name = 'quota_response_mode'`).Scan(&stored); err != nil || stored != "usage_limit" {
		t.Errorf("stored %q %v, want usage_limit", stored, err)
	}

	// Refused values: an unknown enum number, UNSPECIFIED, each with a
	// valid field beside it; nothing changes.
	for _, tc := range []struct {
		name string
		mode weirv1.QuotaResponseMode
		want string
	}{
		{"unknown number", weirv1.QuotaResponseMode(7), "settings.quota_response_mode: unknown value 7; want retryable or usage_limit"},
		{"unspecified", weirv1.QuotaResponseMode_QUOTA_RESPONSE_MODE_UNSPECIFIED, "settings.quota_response_mode: required (it is in update_mask); want retryable or usage_limit"},
	} {
		_, err := e.updateSettings(&weirv1.Settings{CapacityHold: durationpb.New(time.Minute), QuotaResponseMode: tc.mode},
			"capacity_hold", "quota_response_mode")
		ce := wantCode(t, err, connect.CodeInvalidArgument)
		if ce.Message() != tc.want {
			t.Errorf("%s: message %q, want %q", tc.name, ce.Message(), tc.want)
		}
		st := e.getSettings()
		if st.QuotaResponseMode != weirv1.QuotaResponseMode_QUOTA_RESPONSE_MODE_USAGE_LIMIT {
			t.Errorf("%s: mode changed to %v", tc.name, st.QuotaResponseMode)
		}
		wantSettings(t, tc.name+": capacity_hold unchanged", st, 20*time.Minute, 25*time.Minute)
	}

	// A no-op set writes no audit row; a real change does.
	e.clock.Advance(time.Minute)
	if _, err := e.updateSettings(&weirv1.Settings{QuotaResponseMode: weirv1.QuotaResponseMode_QUOTA_RESPONSE_MODE_USAGE_LIMIT}, "quota_response_mode"); err != nil {
		t.Fatalf("no-op UpdateSettings: %v", err)
	}
	second := e.clock.Advance(time.Minute)
	if _, err := e.updateSettings(&weirv1.Settings{QuotaResponseMode: weirv1.QuotaResponseMode_QUOTA_RESPONSE_MODE_RETRYABLE,
		CapacityHold: durationpb.New(5 * time.Minute)}, "quota_response_mode", "capacity_hold"); err != nil {
		t.Fatalf("UpdateSettings back: %v", err)
	}
	changes, err := listChanges(0)
	if err != nil {
		t.Fatalf("ListSettingChanges: %v", err)
	}
	type row struct {
		name, old, new, actor string
		at                    time.Time
	}
	want := []row{
		// Same instant: the later insert first (capacity_hold was put second).
		{"capacity_hold", "", "5m0s", "admin", second},
		{"quota_response_mode", "usage_limit", "retryable", "admin", second},
		{"quota_response_mode", "", "usage_limit", "admin", first},
	}
	var gotRows []row
	for _, c := range changes {
		gotRows = append(gotRows, row{c.Name, c.OldValue, c.NewValue, c.Actor, c.GetChangedAt().AsTime()})
	}
	if len(gotRows) != len(want) {
		t.Fatalf("changes %+v, want %+v", gotRows, want)
	}
	for i := range want {
		if gotRows[i].name != want[i].name || gotRows[i].old != want[i].old || gotRows[i].new != want[i].new ||
			gotRows[i].actor != want[i].actor || !gotRows[i].at.Equal(want[i].at) {
			t.Errorf("change %d: %+v, want %+v", i, gotRows[i], want[i])
		}
	}
	if n := e.count(`SELECT count(*) FROM setting_changes`); n != 3 {
		t.Errorf("%d audit rows, want 3", n)
	}
	if changes, err := listChanges(1); err != nil || len(changes) != 1 || changes[0].Name != "capacity_hold" {
		t.Errorf("limit 1: %v %v, want the newest change only", changes, err)
	}

	for _, limit := range []int32{-1, 501} {
		_, err := listChanges(limit)
		ce := wantCode(t, err, connect.CodeInvalidArgument)
		if !strings.Contains(ce.Message(), "limit:") || !strings.Contains(ce.Message(), "between 0 and 500") {
			t.Errorf("limit %d: message %q", limit, ce.Message())
		}
	}
	if changes, err := listChanges(500); err != nil || len(changes) != 3 {
		t.Errorf("limit 500: %d changes %v, want 3", len(changes), err)
	}

	// Only the admin token reads the audit.
	_, err = e.settingsClient(e.cfg.DataplaneToken).ListSettingChanges(t.Context(), connect.NewRequest(&weirv1.ListSettingChangesRequest{}))
	wantCode(t, err, connect.CodeUnauthenticated)
}

// TestQuotaReleaseUnknownKind: a worker newer than the control plane may
// send a quota kind this build does not know. Release still answers: the
// evidence is read as no quota evidence (the ladder decides: for a
// subscription without rejecting claims, a burst retried in place), the
// lease is released, and nothing is stored under a kind the vocabulary
// lacks.
func TestQuotaReleaseUnknownKind(t *testing.T) {
	t.Parallel()
	e := setup(t)
	_, keyHash := e.createKey("")
	a := e.createCodex("codex-u")
	lease := e.mustLease(codexRequest(keyHash))
	now := e.clock.Advance(time.Second)
	resp, err := e.dp.leases.Release(t.Context(), connect.NewRequest(&weirv1.ReleaseRequest{LeaseId: lease.Id,
		Outcome: &weirv1.Outcome{Class: weirv1.OutcomeClass_OUTCOME_CLASS_RATE_LIMITED, Status: 429,
			Quota: &weirv1.QuotaEvidence{Kind: weirv1.QuotaKind(99), ResetsAt: timestamppb.New(now.Add(time.Hour)), Message: "new kind"}}}))
	if err != nil {
		t.Fatalf("Release with quota kind 99: %v", err)
	}
	if resp.Msg.Decision.Action != weirv1.Action_ACTION_RETRY_SAME || resp.Msg.Decision.Cooldown != nil {
		t.Errorf("decision %v, want a burst retry without a cooldown", resp.Msg.Decision)
	}
	if n := e.count(`SELECT count(*) FROM leases WHERE id = $1`, uuid.MustParse(lease.Id)); n != 0 {
		t.Errorf("the lease is still held after its release")
	}
	if row, ok := e.quotaRow(a.Id); ok {
		t.Errorf("cooldown %+v written, want none", row)
	}
}

// TestQuotaSettingsRepeatedPath: a field named twice in the mask is one
// change, audited once (or the mask is refused).
func TestQuotaSettingsRepeatedPath(t *testing.T) {
	t.Parallel()
	e := setup(t)
	_, err := e.updateSettings(&weirv1.Settings{QuotaResponseMode: weirv1.QuotaResponseMode_QUOTA_RESPONSE_MODE_USAGE_LIMIT},
		"quota_response_mode", "quota_response_mode")
	if err != nil {
		wantCode(t, err, connect.CodeInvalidArgument)
		return
	}
	if n := e.count(`SELECT count(*) FROM setting_changes`); n != 1 {
		t.Errorf("%d audit rows for one change of quota_response_mode named twice in update_mask, want 1", n)
	}
}
