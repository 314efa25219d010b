package controlplane

import (
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/google/uuid"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/weirhq/weir/controlplane/db"
	"github.com/weirhq/weir/controlplane/policy"
	weirv1 "github.com/weirhq/weir/gen/weir/v1"
)

func succeeded200() *weirv1.Outcome {
	return &weirv1.Outcome{Class: weirv1.OutcomeClass_OUTCOME_CLASS_SUCCESS, Status: 200}
}

// releaseBatch calls ReleaseBatch and fails the test on an RPC error.
func (e *env) releaseBatch(items ...*weirv1.ReleaseItem) *weirv1.ReleaseBatchResponse {
	e.t.Helper()
	resp, err := e.dp.leases.ReleaseBatch(e.t.Context(), connect.NewRequest(&weirv1.ReleaseBatchRequest{Items: items}))
	if err != nil {
		e.t.Fatalf("ReleaseBatch: %v", err)
	}
	return resp.Msg
}

func (e *env) leaseCount(id string) int {
	e.t.Helper()
	return e.count(`SELECT count(*) FROM leases WHERE id = $1`, uuid.MustParse(id))
}

// TestReleaseBatchKeepAndEnd: a kept success records the success and
// leaves the lease held; an ended one deletes it; an item without an
// outcome returns its lease and records nothing.
func TestReleaseBatchKeepAndEnd(t *testing.T) {
	t.Parallel()
	e := setup(t)
	_, key := e.createKey("")
	a, _ := e.createAccount(acct{maxConc: 4})
	b, _ := e.createAccount(acct{maxConc: 4})
	kept := e.mustLease(&weirv1.AcquireRequest{KeyHash: key, PreferAccountId: a.Id})
	ended := e.mustLease(&weirv1.AcquireRequest{KeyHash: key, PreferAccountId: a.Id})
	unused := e.mustLease(&weirv1.AcquireRequest{KeyHash: key, PreferAccountId: b.Id})
	if kept.AccountId != a.Id || unused.AccountId != b.Id {
		t.Fatalf("leases on %s and %s, want %s and %s", kept.AccountLabel, unused.AccountLabel, a.Label, b.Label)
	}
	now := e.clock.Advance(3 * time.Second)
	out := e.releaseBatch(
		&weirv1.ReleaseItem{LeaseId: kept.Id, Outcome: succeeded200(), Keep: true},
		&weirv1.ReleaseItem{LeaseId: ended.Id, Outcome: succeeded200()},
		&weirv1.ReleaseItem{LeaseId: unused.Id},
	)
	if len(out.MissingLeaseIds) != 0 {
		t.Errorf("missing %v, want none", out.MissingLeaseIds)
	}
	if e.leaseCount(kept.Id) != 1 || e.leaseCount(ended.Id) != 0 || e.leaseCount(unused.Id) != 0 {
		t.Errorf("leases kept %d ended %d unused %d, want 1 0 0", e.leaseCount(kept.Id), e.leaseCount(ended.Id), e.leaseCount(unused.Id))
	}
	if row := e.accountRow(a.Id); row.LastSuccessAt == nil || !row.LastSuccessAt.Equal(now) {
		t.Errorf("last_success_at %v, want %v", row.LastSuccessAt, now)
	}
	if row := e.accountRow(b.Id); row.LastSuccessAt != nil {
		t.Errorf("a returned lease recorded a success at %v", row.LastSuccessAt)
	}
	// The kept lease still counts: it can be renewed and released later.
	if got := e.renewBatch(kept.Id); len(got) != 1 {
		t.Errorf("the kept lease was not renewed: %v", got)
	}
	e.releaseBatch(&weirv1.ReleaseItem{LeaseId: kept.Id})
	if e.leaseCount(kept.Id) != 0 {
		t.Error("returning the kept lease left it held")
	}
}

// TestReleaseBatchMissing: a lease that no longer exists is reported,
// not an error; so is a kept lease that expired, which is ended.
func TestReleaseBatchMissing(t *testing.T) {
	t.Parallel()
	e, a, l, key := leased(t)
	gone := uuid.NewString()
	out := e.releaseBatch(
		&weirv1.ReleaseItem{LeaseId: gone, Outcome: succeeded200(), Keep: true},
		&weirv1.ReleaseItem{LeaseId: l.Id, Outcome: succeeded200(), Keep: true},
	)
	if !slices.Equal(out.MissingLeaseIds, []string{gone}) {
		t.Errorf("missing %v, want [%s]", out.MissingLeaseIds, gone)
	}
	e.clock.Advance(e.cfg.LeaseTTL + time.Second)
	out = e.releaseBatch(&weirv1.ReleaseItem{LeaseId: l.Id, Outcome: succeeded200(), Keep: true})
	if !slices.Equal(out.MissingLeaseIds, []string{l.Id}) || e.leaseCount(l.Id) != 0 {
		t.Errorf("expired kept lease: missing %v, rows %d; want it missing and ended", out.MissingLeaseIds, e.leaseCount(l.Id))
	}
	if row := e.accountRow(a.Id); row.LastSuccessAt == nil || !row.LastSuccessAt.Equal(e.clock.Now()) {
		t.Errorf("the expired lease's success was not recorded: %v", row.LastSuccessAt)
	}
	e.mustLease(&weirv1.AcquireRequest{KeyHash: key})
}

func TestReleaseBatchInvalid(t *testing.T) {
	t.Parallel()
	e, _, l, _ := leased(t)
	for _, tc := range []struct {
		name  string
		items []*weirv1.ReleaseItem
		field string
	}{
		{"bad lease id", []*weirv1.ReleaseItem{{LeaseId: l.Id}, {LeaseId: "nope"}}, "items[1].lease_id"},
		{"a failure", []*weirv1.ReleaseItem{{LeaseId: l.Id, Outcome: &weirv1.Outcome{Class: weirv1.OutcomeClass_OUTCOME_CLASS_RATE_LIMITED, Status: 429}}}, "items[0].outcome.class"},
		{"no class", []*weirv1.ReleaseItem{{LeaseId: l.Id, Outcome: &weirv1.Outcome{}}}, "items[0].outcome.class"},
		{"kept without outcome", []*weirv1.ReleaseItem{{LeaseId: l.Id, Keep: true}}, "items[0].keep"},
		{"too many", slices.Repeat([]*weirv1.ReleaseItem{{LeaseId: l.Id}}, maxReleaseBatch+1), "items:"},
	} {
		_, err := e.dp.leases.ReleaseBatch(t.Context(), connect.NewRequest(&weirv1.ReleaseBatchRequest{Items: tc.items}))
		ce := wantCode(t, err, connect.CodeInvalidArgument)
		if !strings.Contains(ce.Message(), tc.field) {
			t.Errorf("%s: message %q does not name %s", tc.name, ce.Message(), tc.field)
		}
	}
	// A refused call wrote nothing.
	if e.leaseCount(l.Id) != 1 {
		t.Error("a refused batch ended the lease")
	}
	// The admin token opens nothing here.
	_, err := e.admin.leases.ReleaseBatch(t.Context(), connect.NewRequest(&weirv1.ReleaseBatchRequest{}))
	wantCode(t, err, connect.CodeUnauthenticated)
}

// TestReleaseBatchOutOfCredits: a batched success clears an out-of-credits
// cooldown written before the attempt was admitted, not one written
// after; of several successes on one account, the latest admission counts.
func TestReleaseBatchOutOfCredits(t *testing.T) {
	t.Parallel()
	e, a, l, _ := leased(t)
	admitted := e.clock.Advance(10 * time.Second)
	e.clock.Advance(time.Second)
	writeOOC := func() {
		t.Helper()
		now := e.clock.Now()
		if _, err := e.q.WriteCooldown(t.Context(), dbCooldown(a.Id, "out_of_credits", now.Add(time.Hour), now)); err != nil {
			t.Fatal(err)
		}
	}
	// Written after the attempt started: the success says nothing of it.
	writeOOC()
	e.clock.Advance(time.Second)
	e.releaseBatch(&weirv1.ReleaseItem{LeaseId: l.Id, Outcome: succeeded200(), Keep: true, AdmittedAt: timestamppb.New(admitted)})
	if cd := e.cooldownRow(a.Id); cd == nil || cd.Reason != "out_of_credits" {
		t.Fatalf("a success admitted before the cooldown cleared it: %v", cd)
	}
	// A later attempt on the same lease, admitted after it: cleared, even
	// alongside an earlier one.
	later := e.clock.Advance(time.Second)
	e.clock.Advance(time.Second)
	e.releaseBatch(
		&weirv1.ReleaseItem{LeaseId: l.Id, Outcome: succeeded200(), Keep: true, AdmittedAt: timestamppb.New(later)},
		&weirv1.ReleaseItem{LeaseId: l.Id, Outcome: succeeded200(), Keep: true, AdmittedAt: timestamppb.New(admitted)},
	)
	if cd := e.cooldownRow(a.Id); cd != nil {
		t.Fatalf("a success admitted after the cooldown left it: %v", cd)
	}
	// Without admitted_at, the lease's grant is the admission.
	writeOOC()
	e.clock.Advance(time.Second)
	e.releaseBatch(&weirv1.ReleaseItem{LeaseId: l.Id, Outcome: succeeded200()})
	if cd := e.cooldownRow(a.Id); cd == nil {
		t.Fatal("a success admitted (by its lease) before the cooldown cleared it")
	}
}

// TestReleaseBatchTouchesSession: an item's session key keeps its binding
// alive, only where it is bound to the lease's account.
func TestReleaseBatchTouchesSession(t *testing.T) {
	t.Parallel()
	e := setup(t)
	_, key := e.createKey("")
	e.createAccount(acct{maxConc: 4})
	e.createAccount(acct{maxConc: 4})
	l := e.mustLease(&weirv1.AcquireRequest{KeyHash: key, SessionKey: "conv-1"})
	other := e.mustLease(&weirv1.AcquireRequest{KeyHash: key, SessionKey: "conv-2"})
	// conv-2 moved to the other account since its lease was granted.
	if _, err := e.pool.Exec(t.Context(), `UPDATE session_bindings SET account_id = (SELECT id FROM accounts WHERE id <> $1 LIMIT 1) WHERE session_key = 'conv-2'`,
		uuid.MustParse(other.AccountId)); err != nil {
		t.Fatal(err)
	}
	now := e.clock.Advance(time.Minute)
	e.releaseBatch(
		&weirv1.ReleaseItem{LeaseId: l.Id, Outcome: succeeded200(), Keep: true, SessionKey: "conv-1"},
		&weirv1.ReleaseItem{LeaseId: other.Id, Outcome: succeeded200(), Keep: true, SessionKey: "conv-2"},
	)
	seen := func(k string) time.Time {
		t.Helper()
		var at time.Time
		if err := e.pool.QueryRow(t.Context(), `SELECT last_seen_at FROM session_bindings WHERE session_key = $1`, k).Scan(&at); err != nil {
			t.Fatal(err)
		}
		return at
	}
	if got := seen("conv-1"); !got.Equal(now) {
		t.Errorf("conv-1 last_seen_at %v, want %v", got, now)
	}
	if got := seen("conv-2"); got.Equal(now) {
		t.Error("conv-2, bound to another account, was touched")
	}
}

// TestReleaseBatchMergesUsageHeaders: a batched success's unified headers
// land in the usage view as Release's do.
func TestReleaseBatchMergesUsageHeaders(t *testing.T) {
	t.Parallel()
	u, _ := setupUsage(t)
	_, key := u.createKey("")
	a, _ := u.createAccount(acct{label: "max", kind: weirv1.AuthKind_AUTH_KIND_OAUTH, credential: oauthToken()})
	headers := map[string]string{
		"anthropic-ratelimit-unified-status":         "allowed",
		"anthropic-ratelimit-unified-5h-status":      "allowed",
		"anthropic-ratelimit-unified-5h-utilization": "0.37",
		"anthropic-ratelimit-unified-5h-reset":       strconv.FormatInt(epoch.Add(2*time.Hour).Unix(), 10),
		"anthropic-ratelimit-unified-7d-status":      "allowed",
		"anthropic-ratelimit-unified-7d-utilization": "0.12",
		"anthropic-ratelimit-unified-7d-reset":       strconv.FormatInt(epoch.Add(90*time.Hour).Unix(), 10),
	}
	l := u.mustLease(&weirv1.AcquireRequest{KeyHash: key, Model: "claude-sonnet-4-5"})
	o := succeeded200()
	o.Headers = headers
	u.releaseBatch(&weirv1.ReleaseItem{LeaseId: l.Id, Outcome: o, Keep: true})
	got := u.getAccount(a.Id)
	fh, sd := window(got, windowFiveHour), window(got, windowSevenDay)
	if fh == nil || *fh.Utilization != 0.37 || fh.Source != sourceHeader || sd == nil || *sd.Utilization != 0.12 {
		t.Fatalf("usage after ReleaseBatch: %v", got.Usage)
	}
}

// TestReleaseBatchEndsRecoveryProbe: a batched success ends a recovery
// probe and closes the family's breaker, as Release's does.
func TestReleaseBatchEndsRecoveryProbe(t *testing.T) {
	t.Parallel()
	e, a, l, _ := leased(t)
	if _, err := e.pool.Exec(t.Context(), `UPDATE accounts SET recovery_probe = true WHERE id = $1`, uuid.MustParse(a.Id)); err != nil {
		t.Fatal(err)
	}
	e.releaseBatch(&weirv1.ReleaseItem{LeaseId: l.Id, Outcome: succeeded200()})
	if e.accountRow(a.Id).RecoveryProbe {
		t.Error("a batched success left the recovery probe")
	}
}

// TestSuccessGroups: one success record per account and family, at the
// latest admission, never ahead of now.
func TestSuccessGroups(t *testing.T) {
	t.Parallel()
	a, b := uuid.New(), uuid.New()
	now := epoch
	mk := func(id uuid.UUID, model string, admitted time.Time) released {
		row := db.ReleaseLeaseRow{AccountID: id, Model: model, Provider: "anthropic"}
		return releasedSuccess(row, succeeded200(), admitted, now)
	}
	groups := successGroups([]released{
		mk(a, "claude-sonnet-4-5", now.Add(-3*time.Second)),
		mk(b, "claude-sonnet-4-5", now.Add(-time.Second)),
		mk(a, "claude-sonnet-4-5", now.Add(-2*time.Second)),
		mk(a, "claude-opus-4-1", now.Add(time.Hour)),
	}, now)
	if len(groups) != 3 {
		t.Fatalf("%d groups, want 3: %+v", len(groups), groups)
	}
	for _, g := range groups {
		switch {
		case g.AccountID == a && g.Family == policy.ModelFamily("claude-sonnet-4-5"):
			if !g.AdmittedAt.Equal(now.Add(-2 * time.Second)) {
				t.Errorf("a sonnet admitted %v, want the latest", g.AdmittedAt)
			}
		case g.AccountID == a:
			if !g.AdmittedAt.Equal(now) {
				t.Errorf("a opus admitted %v, want now (never ahead)", g.AdmittedAt)
			}
		case !g.HasFamily || g.Family == "":
			t.Errorf("group %+v lost its family", g)
		}
	}
}
