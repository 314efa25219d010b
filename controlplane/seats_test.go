package controlplane

import (
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"google.golang.org/protobuf/types/known/fieldmaskpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/weirhq/weir/controlplane/db"
	"github.com/weirhq/weir/controlplane/policy"
	weirv1 "github.com/weirhq/weir/gen/weir/v1"
	"github.com/weirhq/weir/internal/randid"
)

// seatOracle is what a key may use, said the simplest way: an account it
// is pinned to (when pinned), and under owners_only one without an owner
// or owned by the key or by its team.
type seatOracle struct {
	key, team  uuid.UUID
	pinned     bool
	pins       map[uuid.UUID]bool
	ownersOnly bool
}

func (o seatOracle) mayUse(a policy.Account) bool {
	if o.pinned && !o.pins[a.ID] {
		return false
	}
	if !o.ownersOnly {
		return true
	}
	return (a.OwnerKey == uuid.Nil && a.OwnerTeam == uuid.Nil) || a.OwnerKey == o.key ||
		(a.OwnerTeam != uuid.Nil && a.OwnerTeam == o.team)
}

// seatRank is whose seat a is for the key: its own, its team's, nobody's,
// another owner's.
func (o seatOracle) seatRank(a policy.Account) int {
	switch {
	case a.OwnerKey == uuid.Nil && a.OwnerTeam == uuid.Nil:
		return 2
	case a.OwnerKey == o.key:
		return 0
	case a.OwnerTeam != uuid.Nil && a.OwnerTeam == o.team:
		return 1
	}
	return 3
}

// TestSeatRoutingProperty checks, over random pools (accounts owned by a
// key, by a team, by nobody; API keys, which are never owned; accounts
// cooling on quota, at their cap, paused; a provider that does not serve
// the surface), random keys (with and without a team, pinned or not) and
// both modes, that what Acquire runs (the key's pins, then policy.Route,
// WaitingFor, QuotaBlock under the key's RouteRequest) agrees with the
// oracle: the order holds exactly the accounts the key may use that can
// serve now; the session's account, when among them, first; then the
// key's own seats, its team's, the accounts without an owner, and other
// owners' seats (shared mode only), in that order; a held request waits
// only for full accounts it may use; the pool's verdict (retry_at, the
// quota block) comes from the accounts it may use alone.
func TestSeatRoutingProperty(t *testing.T) {
	t.Parallel()
	r := rand.New(rand.NewPCG(30, 2030))
	now := epoch
	keys := []uuid.UUID{uuid.New(), uuid.New(), uuid.New()}
	teams := []uuid.UUID{uuid.New(), uuid.New()}
	modes := []string{"", "shared", "owners_only"}
	for iter := range 5000 {
		n := 1 + r.IntN(9)
		cands := make([]policy.Candidate, 0, n)
		for i := range n {
			a := policy.Account{ID: uuid.New(), Label: fmt.Sprintf("a%d", i), Provider: weirv1.Provider_PROVIDER_ANTHROPIC,
				AuthKind: weirv1.AuthKind_AUTH_KIND_OAUTH, MaxConcurrency: 1 + int32(r.IntN(3)), Priority: int32(r.IntN(3))}
			switch r.IntN(6) {
			case 0:
				a.AuthKind = weirv1.AuthKind_AUTH_KIND_API_KEY // metered: never owned
			case 1:
				a.Provider = weirv1.Provider_PROVIDER_CODEX // does not serve Messages
			}
			if a.AuthKind == weirv1.AuthKind_AUTH_KIND_OAUTH {
				switch r.IntN(3) {
				case 0:
					a.OwnerKey = keys[r.IntN(len(keys))]
				case 1:
					a.OwnerTeam = teams[r.IntN(len(teams))]
				}
			}
			c := policy.Candidate{Account: a}
			switch r.IntN(5) {
			case 0:
				until := now.Add(time.Duration(1+r.IntN(600)) * time.Minute)
				c.Cooldown = &policy.Cooldown{Reason: weirv1.CooldownReason_COOLDOWN_REASON_QUOTA_EXHAUSTED, Transient: true,
					Until: until, WrittenAt: now, Quota: &policy.QuotaRecord{Kind: weirv1.QuotaKind_QUOTA_KIND_ANTHROPIC_WINDOW,
						ResetsAt: until, WindowMinutes: 300, Message: "5-hour window spent"}}
			case 1:
				c.Live = a.MaxConcurrency
			case 2:
				c.Account.Paused = true
			}
			cands = append(cands, c)
		}
		o := seatOracle{key: keys[r.IntN(len(keys))], pins: map[uuid.UUID]bool{}}
		if r.IntN(2) == 0 {
			o.team = teams[r.IntN(len(teams))]
		}
		mode := modes[r.IntN(len(modes))]
		o.ownersOnly = mode == "owners_only"
		k := keyGrant{id: o.key}.withMetered("", "").withOwned(o.team, mode)
		if r.IntN(3) == 0 {
			k.pinned, o.pinned = true, true
			for _, c := range cands {
				if r.IntN(2) == 0 {
					k.pins = append(k.pins, c.Account.ID)
					o.pins[c.Account.ID] = true
				}
			}
		}
		var session uuid.UUID
		if r.IntN(2) == 0 {
			session = cands[r.IntN(n)].Account.ID
		}
		rr := k.route(policy.RouteRequest{Model: "claude-sonnet-4-5", Surface: weirv1.Surface_SURFACE_MESSAGES, SessionAccount: session})
		view := slices.DeleteFunc(slices.Clone(cands), func(c policy.Candidate) bool { return !k.allows(c.Account.ID) })
		order, none := policy.Route(view, rr, now)
		fail := func(format string, args ...any) {
			t.Helper()
			t.Fatalf("iteration %d (mode %q, pinned %v, team %v): %s", iter, mode, o.pinned, o.team != uuid.Nil, fmt.Sprintf(format, args...))
		}

		var want, full []uuid.UUID
		var usable []policy.Candidate
		var soonest time.Time
		for _, c := range cands {
			a := c.Account
			if a.Provider != weirv1.Provider_PROVIDER_ANTHROPIC || !o.mayUse(a) {
				continue
			}
			usable = append(usable, c)
			switch {
			case a.Paused:
			case c.Cooldown != nil:
				if soonest.IsZero() || c.Cooldown.Until.Before(soonest) {
					soonest = c.Cooldown.Until
				}
			case c.Live >= a.MaxConcurrency:
				full = append(full, a.ID)
			default:
				want = append(want, a.ID)
			}
		}
		var got []uuid.UUID
		for _, c := range order {
			got = append(got, c.Account.ID)
			if !o.mayUse(c.Account) {
				fail("%s is in the order, and the key may not use it", c.Account.Label)
			}
		}
		if !sameIDs(got, want) {
			fail("order %v, want the accounts %v", got, want)
		}
		if (none == nil) != (len(want) > 0) {
			fail("no account %v with %d eligible", none, len(want))
		}
		rest := order
		if len(order) > 0 && slices.Contains(want, session) {
			if order[0].Account.ID != session {
				fail("the session's account is not first: %s", order[0].Account.Label)
			}
			rest = order[1:]
		}
		for i := 1; i < len(rest); i++ {
			if o.seatRank(rest[i-1].Account) > o.seatRank(rest[i].Account) {
				fail("%s (seat rank %d) before %s (seat rank %d)", rest[i-1].Account.Label, o.seatRank(rest[i-1].Account),
					rest[i].Account.Label, o.seatRank(rest[i].Account))
			}
		}
		if none != nil {
			if waits := policy.WaitingFor(view, rr, now); !sameIDs(waits, full) {
				fail("a held request waits for %v, want %v", waits, full)
			}
			if len(full) == 0 && !soonest.IsZero() && (none.RetryAt == nil || !none.RetryAt.AsTime().Equal(soonest)) {
				fail("retry_at %v, want the soonest recovery of the accounts it may use, %v", none.RetryAt.AsTime(), soonest)
			}
			if len(full) == 0 && soonest.IsZero() && none.RetryAt != nil {
				fail("retry_at %v with no account it may use cooling", none.RetryAt.AsTime())
			}
		}
		// The quota block: every account the key may use (not paused) out
		// of quota; it names them all and the first reset among them.
		var blocked int32
		var first time.Time
		allBlocked := true
		for _, c := range usable {
			if c.Account.Paused {
				continue
			}
			if c.Cooldown == nil {
				allBlocked = false
				continue
			}
			blocked++
			if first.IsZero() || c.Cooldown.Until.Before(first) {
				first = c.Cooldown.Until
			}
		}
		qb := policy.QuotaBlock(view, rr, now)
		switch {
		case allBlocked && blocked > 0:
			if qb == nil || qb.Accounts != blocked || !qb.ResetsAt.AsTime().Equal(first) {
				fail("quota block %v, want %d accounts reopening at %v", qb, blocked, first)
			}
		case qb != nil:
			fail("quota block %v while an account the key may use is not out of quota", qb)
		}
	}
}

func sameIDs(a, b []uuid.UUID) bool {
	x, y := slices.Clone(a), slices.Clone(b)
	cmpID := func(p, q uuid.UUID) int { return strings.Compare(p.String(), q.String()) }
	slices.SortFunc(x, cmpID)
	slices.SortFunc(y, cmpID)
	return slices.Equal(x, y)
}

// createSeat creates an Anthropic OAuth account (a subscription).
func (e *env) createSeat(label string, priority, maxConc int32) *weirv1.Account {
	e.t.Helper()
	a, _ := e.createAccount(acct{label: label, kind: weirv1.AuthKind_AUTH_KIND_OAUTH, credential: oauthToken(),
		priority: priority, maxConc: maxConc})
	return a
}

// setOwner sets an account's owner (kind UNSPECIFIED: none).
func (e *env) setOwner(account string, kind weirv1.OwnerKind, name string) (*weirv1.Account, error) {
	e.t.Helper()
	req := &weirv1.UpdateAccountRequest{Id: account, UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"owner"}}}
	if kind != weirv1.OwnerKind_OWNER_KIND_UNSPECIFIED {
		req.Owner = &weirv1.AccountOwner{Kind: kind, Name: name}
	}
	resp, err := e.admin.accounts.UpdateAccount(e.t.Context(), connect.NewRequest(req))
	if err != nil {
		return nil, err
	}
	return resp.Msg.Account, nil
}

func (e *env) mustSetOwner(account string, kind weirv1.OwnerKind, name string) *weirv1.Account {
	e.t.Helper()
	a, err := e.setOwner(account, kind, name)
	if err != nil {
		e.t.Fatalf("set the owner of %s: %v", account, err)
	}
	return a
}

// setOwned sets the owned_accounts setting.
func (e *env) setOwned(m weirv1.OwnedAccounts) {
	e.t.Helper()
	if _, err := e.updateSettings(&weirv1.Settings{OwnedAccounts: m}, "owned_accounts"); err != nil {
		e.t.Fatalf("set owned_accounts: %v", err)
	}
}

// quotaCooldown puts account id out of quota until until, with the
// evidence's reset.
func (e *env) quotaCooldown(id string, until time.Time) {
	e.t.Helper()
	kind := "anthropic_window"
	if _, err := e.q.WriteCooldown(e.t.Context(), db.WriteCooldownParams{AccountID: uuid.MustParse(id), Reason: "quota_exhausted",
		Transient: true, Until: until, Now: e.clock.Now(), Evidence: []byte(`{"class":"rate_limited","status":429}`),
		QuotaKind: &kind, QuotaResetsAt: &until, QuotaWindowMinutes: 300, QuotaMessage: "5-hour window spent"}); err != nil {
		e.t.Fatalf("write cooldown: %v", err)
	}
}

// TestAccountOwner: an OAuth account takes a key or a team as its owner
// (by name or id), shown in GetAccount and ListAccounts and recorded in
// the audit; an API key cannot have one (the error names the field and
// why), nor can a revoked or unknown key; none clears it; deleting the
// owning team leaves the seat without an owner, and paused.
func TestAccountOwner(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := t.Context()
	seat := e.createSeat("alice-max", 0, 2)
	metered, _ := e.createAccount(acct{label: "api"})
	alice, _ := e.createKey("alice")
	bob, _ := e.createKey("bob")
	if _, err := e.admin.keys.CreateTeam(ctx, connect.NewRequest(&weirv1.CreateTeamRequest{Name: "infra"})); err != nil {
		t.Fatal(err)
	}

	got := e.mustSetOwner("alice-max", weirv1.OwnerKind_OWNER_KIND_KEY, "alice")
	if o := got.Owner; o == nil || o.Kind != weirv1.OwnerKind_OWNER_KIND_KEY || o.Name != "alice" || o.Id != alice.Id || o.Revoked {
		t.Fatalf("owner after set: %v", got.Owner)
	}
	if o := e.getAccount(seat.Id).Owner; o.GetName() != "alice" {
		t.Errorf("GetAccount owner %v", o)
	}
	got = e.mustSetOwner(seat.Id, weirv1.OwnerKind_OWNER_KIND_KEY, bob.Id) // by id
	if got.Owner.GetName() != "bob" {
		t.Errorf("owner by id: %v", got.Owner)
	}
	got = e.mustSetOwner(seat.Id, weirv1.OwnerKind_OWNER_KIND_TEAM, "infra")
	if o := got.Owner; o.GetKind() != weirv1.OwnerKind_OWNER_KIND_TEAM || o.GetName() != "infra" {
		t.Errorf("team owner: %v", o)
	}
	list, err := e.admin.accounts.ListAccounts(ctx, connect.NewRequest(&weirv1.ListAccountsRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range list.Msg.Accounts {
		switch a.Label {
		case "alice-max":
			if a.Owner.GetName() != "infra" {
				t.Errorf("ListAccounts: %s owner %v", a.Label, a.Owner)
			}
		case "api":
			if a.Owner != nil {
				t.Errorf("ListAccounts: %s owner %v, want none", a.Label, a.Owner)
			}
		}
	}

	// Refusals, each naming the field; nothing changes.
	for _, tc := range []struct {
		name, account string
		kind          weirv1.OwnerKind
		owner, want   string
	}{
		{"an API key", metered.Id, weirv1.OwnerKind_OWNER_KIND_KEY, "alice", "owner: account \"api\" is an API key; metered keys are not seats"},
		{"an unknown key", seat.Id, weirv1.OwnerKind_OWNER_KIND_KEY, "nobody", "owner.name: no key \"nobody\""},
		{"an unknown team", seat.Id, weirv1.OwnerKind_OWNER_KIND_TEAM, "nobody", "owner.name: no team \"nobody\""},
	} {
		_, err := e.setOwner(tc.account, tc.kind, tc.owner)
		if ce := wantCode(t, err, connect.CodeInvalidArgument); !strings.Contains(ce.Message(), tc.want) {
			t.Errorf("%s: %q, want it to say %q", tc.name, ce.Message(), tc.want)
		}
	}
	if _, err := e.admin.keys.RevokeKey(ctx, connect.NewRequest(&weirv1.RevokeKeyRequest{Id: bob.Id})); err != nil {
		t.Fatal(err)
	}
	_, err = e.setOwner(seat.Id, weirv1.OwnerKind_OWNER_KIND_KEY, "bob")
	if ce := wantCode(t, err, connect.CodeInvalidArgument); !strings.Contains(ce.Message(), "key \"bob\" is revoked") {
		t.Errorf("a revoked key: %q", ce.Message())
	}
	if o := e.getAccount(seat.Id).Owner; o.GetName() != "infra" {
		t.Errorf("a refused change changed the owner: %v", o)
	}
	// The database holds the rule too.
	if _, err := e.pool.Exec(ctx, `UPDATE accounts SET owner_key_id = $1 WHERE id = $2`, alice.Id, metered.Id); err == nil {
		t.Error("the database let an API key have an owner")
	}

	// The audit keeps who was made the owner.
	rows := e.auditRows(e.adminAPI(e.cfg.AdminToken, "t"), &weirv1.ListAuditEventsRequest{Procedure: "UpdateAccount"})
	var owners []string
	for _, r := range rows {
		if r.Outcome != "ok" {
			continue
		}
		var sum struct {
			Fields struct {
				Owner struct{ Kind, Name string } `json:"owner"`
			} `json:"fields"`
		}
		if err := json.Unmarshal([]byte(r.Summary), &sum); err != nil {
			t.Fatal(err)
		}
		owners = append(owners, sum.Fields.Owner.Kind+" "+sum.Fields.Owner.Name)
	}
	if want := []string{"OWNER_KIND_KEY alice", "OWNER_KIND_KEY " + bob.Id, "OWNER_KIND_TEAM infra"}; !slices.Equal(owners, want) {
		t.Errorf("audit of owner changes: %q, want %q", owners, want)
	}

	// Deleting the owning team: the seat has no owner, and is paused
	// until an operator decides whose it is.
	if _, err := e.admin.keys.DeleteTeam(ctx, connect.NewRequest(&weirv1.DeleteTeamRequest{Id: "infra"})); err != nil {
		t.Fatal(err)
	}
	after := e.getAccount(seat.Id)
	if after.Owner != nil || after.State != weirv1.AccountState_ACCOUNT_STATE_PAUSED {
		t.Errorf("after its team was deleted: owner %v, state %v; want none, paused", after.Owner, after.State)
	}
	// A key row removed (the API only revokes) does the same.
	e.mustSetOwner(seat.Id, weirv1.OwnerKind_OWNER_KIND_KEY, "alice")
	e.resume(seat.Id)
	if _, err := e.pool.Exec(ctx, `DELETE FROM client_keys WHERE id = $1`, alice.Id); err != nil {
		t.Fatal(err)
	}
	if after := e.getAccount(seat.Id); after.Owner != nil || after.State != weirv1.AccountState_ACCOUNT_STATE_PAUSED {
		t.Errorf("after its key was deleted: owner %v, state %v; want none, paused", after.Owner, after.State)
	}
	// none clears an owner.
	e.resume(seat.Id)
	e.createKey("carol")
	e.mustSetOwner(seat.Id, weirv1.OwnerKind_OWNER_KIND_KEY, "carol")
	if a := e.mustSetOwner(seat.Id, weirv1.OwnerKind_OWNER_KIND_UNSPECIFIED, ""); a.Owner != nil {
		t.Errorf("owner after none: %v", a.Owner)
	}
}

// TestOwnersOnlySeatNeverServesOthers: under owners_only a seat serves
// its owner and no other key, whatever the rest of the pool is doing: when
// the shared account is at its cap (a held request waits for it alone in
// lease_waiters), cooling, or out of quota (the answer is the usual one
// for the shared pool: its retry_at and quota block, not the seat's); a
// key pinned to the seat gets nothing; the owner's key pinned to its seat
// is served there; and a claim with a stale view cannot hand the seat to
// another key.
func TestOwnersOnlySeatNeverServesOthers(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := t.Context()
	// The seat ranks first by priority: only ownership keeps others off it.
	seat := e.createSeat("alice-max", 10, 4)
	shared := e.createSeat("shared-pro", 0, 1)
	alice, aliceHash := e.createKey("alice")
	_, bobHash := e.createKey("bob")
	e.mustSetOwner(seat.Id, weirv1.OwnerKind_OWNER_KIND_KEY, "alice")
	e.setOwned(weirv1.OwnedAccounts_OWNED_ACCOUNTS_OWNERS_ONLY)
	if st := e.getSettings(); st.OwnedAccounts != weirv1.OwnedAccounts_OWNED_ACCOUNTS_OWNERS_ONLY {
		t.Fatalf("owned_accounts %v", st.OwnedAccounts)
	}
	model := "claude-sonnet-4-5"

	// Bob takes the shared account, even though the seat ranks higher.
	held := e.mustLease(&weirv1.AcquireRequest{KeyHash: bobHash, Model: model})
	if held.AccountLabel != "shared-pro" {
		t.Fatalf("bob leased %s, want shared-pro", held.AccountLabel)
	}
	// At its cap: a held request of bob's waits for the shared account,
	// never for the seat, which has three free places.
	since := e.clock.Now()
	none := e.mustNoAccount(&weirv1.AcquireRequest{KeyHash: bobHash, Model: model, RequestId: "bob-held",
		WaitingSince: timestamppb.New(since)}, weirv1.NoAccountReason_NO_ACCOUNT_REASON_AT_CAPACITY)
	if !strings.Contains(none.Message, "all 1 eligible accounts") {
		t.Errorf("at capacity: %q", none.Message)
	}
	if n := e.count(`SELECT count(*) FROM lease_waiters WHERE request_id = 'bob-held' AND account_id = $1`, uuid.MustParse(shared.Id)); n != 1 {
		t.Errorf("bob's held request waits on the shared account %d times, want 1", n)
	}
	if n := e.count(`SELECT count(*) FROM lease_waiters WHERE account_id = $1`, uuid.MustParse(seat.Id)); n != 0 {
		t.Errorf("%d waiters on the seat, want none", n)
	}
	// Alice is served on her seat meanwhile.
	if l := e.mustLease(&weirv1.AcquireRequest{KeyHash: aliceHash, Model: model}); l.AccountLabel != "alice-max" {
		t.Errorf("alice leased %s, want her seat", l.AccountLabel)
	}
	e.release(held.Id, &weirv1.Outcome{Class: weirv1.OutcomeClass_OUTCOME_CLASS_SUCCESS})

	// The shared account out of quota: bob's answer is the shared pool's,
	// and the seat (out of quota too, reopening sooner) is no part of it.
	sharedUntil, seatUntil := e.clock.Now().Add(3*time.Hour), e.clock.Now().Add(time.Hour)
	e.quotaCooldown(shared.Id, sharedUntil)
	none = e.mustNoAccount(&weirv1.AcquireRequest{KeyHash: bobHash, Model: model}, weirv1.NoAccountReason_NO_ACCOUNT_REASON_ALL_COOLING)
	if none.RetryAt == nil || !none.RetryAt.AsTime().Equal(sharedUntil) {
		t.Errorf("bob's retry_at %v, want the shared account's %v", none.RetryAt.AsTime(), sharedUntil)
	}
	if qb := none.QuotaBlock; qb == nil || qb.Accounts != 1 || !qb.ResetsAt.AsTime().Equal(sharedUntil) {
		t.Errorf("bob's quota block %v, want the shared account alone", qb)
	}
	e.quotaCooldown(seat.Id, seatUntil)
	none = e.mustNoAccount(&weirv1.AcquireRequest{KeyHash: bobHash, Model: model}, weirv1.NoAccountReason_NO_ACCOUNT_REASON_ALL_COOLING)
	if qb := none.QuotaBlock; none.RetryAt == nil || !none.RetryAt.AsTime().Equal(sharedUntil) || qb == nil || qb.Accounts != 1 ||
		!qb.ResetsAt.AsTime().Equal(sharedUntil) {
		t.Errorf("with the seat out too, bob's answer: retry_at %v, quota block %v; want the shared account's", none.RetryAt.AsTime(), qb)
	}
	// Alice sees her seat and the shared account.
	none = e.mustNoAccount(&weirv1.AcquireRequest{KeyHash: aliceHash, Model: model}, weirv1.NoAccountReason_NO_ACCOUNT_REASON_ALL_COOLING)
	if qb := none.QuotaBlock; qb == nil || qb.Accounts != 2 || !qb.ResetsAt.AsTime().Equal(seatUntil) {
		t.Errorf("alice's quota block %v, want both, the seat first", qb)
	}
	// PoolQuota answers the same, per key.
	for _, tc := range []struct {
		hash     string
		accounts int32
		reset    time.Time
	}{{bobHash, 1, sharedUntil}, {aliceHash, 2, seatUntil}} {
		pq, err := e.dp.leases.PoolQuota(ctx, connect.NewRequest(&weirv1.PoolQuotaRequest{KeyHash: tc.hash, Model: model}))
		if err != nil {
			t.Fatal(err)
		}
		if qb := pq.Msg.QuotaBlock; qb == nil || qb.Accounts != tc.accounts || !qb.ResetsAt.AsTime().Equal(tc.reset) {
			t.Errorf("PoolQuota: %v, want %d accounts reopening at %v", qb, tc.accounts, tc.reset)
		}
	}
	// The seat back, the shared account still out: bob still gets the
	// shared pool's answer, cooling, never the seat.
	if _, err := e.pool.Exec(ctx, `DELETE FROM cooldowns WHERE account_id = $1`, uuid.MustParse(seat.Id)); err != nil {
		t.Fatal(err)
	}
	none = e.mustNoAccount(&weirv1.AcquireRequest{KeyHash: bobHash, Model: model}, weirv1.NoAccountReason_NO_ACCOUNT_REASON_ALL_COOLING)
	if none.RetryAt == nil || !none.RetryAt.AsTime().Equal(sharedUntil) || none.QuotaBlock.GetAccounts() != 1 {
		t.Errorf("bob with the seat free and the shared account out: %v", none)
	}
	pq, err := e.dp.leases.PoolQuota(ctx, connect.NewRequest(&weirv1.PoolQuotaRequest{KeyHash: aliceHash, Model: model}))
	if err != nil || pq.Msg.QuotaBlock != nil {
		t.Errorf("alice's PoolQuota with her seat free: %v, %v", pq.Msg.GetQuotaBlock(), err)
	}

	// Pins compose: a key pinned to the seat is not its owner, and gets
	// nothing, for good; the owner pinned to the seat is served there.
	_, pinnedHash := e.createLimitedKey(&weirv1.CreateKeyRequest{Name: "pinned-to-seat", PinnedAccounts: []string{"alice-max"}})
	none = e.mustNoAccount(&weirv1.AcquireRequest{KeyHash: pinnedHash, Model: model}, weirv1.NoAccountReason_NO_ACCOUNT_REASON_NONE_CONFIGURED)
	if !none.Permanent || !strings.Contains(none.Message, policy.OwnersOnly) {
		t.Errorf("a key pinned to another's seat: permanent %v, %q", none.Permanent, none.Message)
	}
	if _, err := e.updateKey(&weirv1.UpdateKeyRequest{Id: alice.Id, PinnedAccounts: []string{"alice-max"}}, "pinned_accounts"); err != nil {
		t.Fatal(err)
	}
	if l := e.mustLease(&weirv1.AcquireRequest{KeyHash: aliceHash, Model: model}); l.AccountLabel != "alice-max" {
		t.Errorf("alice pinned to her seat leased %s", l.AccountLabel)
	}

	// A claim from a stale view: the function itself refuses another
	// key, and grants the owner.
	claim := func(keyHash string) uuid.UUID {
		t.Helper()
		row := e.accountRow(seat.Id)
		got, err := e.q.ClaimLease(ctx, db.ClaimLeaseParams{AccountID: row.ID, Revision: row.CredentialRevision,
			KeyID: uuid.NullUUID{UUID: uuid.MustParse(keyIDByHash(e, keyHash)), Valid: true}, RequestID: "stale-" + randid.Hex(3),
			Model: model, Now: e.clock.Now(), ExpiresAt: e.clock.Now().Add(time.Minute)})
		if errors.Is(err, pgx.ErrNoRows) {
			return uuid.Nil // refused
		}
		if err != nil {
			t.Fatal(err)
		}
		return got.LeaseID
	}
	if id := claim(bobHash); id != uuid.Nil {
		t.Error("the claim handed the seat to bob under owners_only")
	}
	if id := claim(aliceHash); id == uuid.Nil {
		t.Error("the claim refused the seat to its owner")
	}
	e.setOwned(weirv1.OwnedAccounts_OWNED_ACCOUNTS_SHARED)
	if id := claim(bobHash); id == uuid.Nil {
		t.Error("the claim refused the seat to bob under shared")
	}
}

// TestOwnersOnlyBreakerProbe: with the overload breaker open, a key that
// does not own the seat takes the probe on an account it may use, never
// on the seat; with none left to it, it gets no lease (and gives the
// probe back), though the seat is free.
func TestOwnersOnlyBreakerProbe(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := t.Context()
	seat := e.createSeat("alice-max", 10, 4)
	shared := e.createSeat("shared-pro", 0, 4)
	e.createKey("alice")
	_, bobHash := e.createKey("bob")
	e.mustSetOwner(seat.Id, weirv1.OwnerKind_OWNER_KIND_KEY, "alice")
	e.setOwned(weirv1.OwnedAccounts_OWNED_ACCOUNTS_OWNERS_ONLY)
	model := "claude-sonnet-4-5"
	now := e.clock.Now()
	openBreaker := func() {
		t.Helper()
		if _, err := e.pool.Exec(ctx, `DELETE FROM overload_breakers`); err != nil {
			t.Fatal(err)
		}
		if _, err := e.pool.Exec(ctx, `INSERT INTO overload_breakers (provider, family, overloads, window_start, open_until, open_count, updated_at)
			VALUES ('anthropic', $1, 4, $2, $3, 1, $2)`, policy.ModelFamily(model), now, now.Add(-time.Second)); err != nil {
			t.Fatal(err)
		}
	}
	openBreaker()
	probe := e.mustLease(&weirv1.AcquireRequest{KeyHash: bobHash, Model: model})
	if !probe.Probe || probe.AccountLabel != "shared-pro" {
		t.Fatalf("bob's probe: %s (probe %v), want shared-pro", probe.AccountLabel, probe.Probe)
	}
	e.release(probe.Id, &weirv1.Outcome{Class: weirv1.OutcomeClass_OUTCOME_CLASS_SUCCESS})

	openBreaker()
	e.quotaCooldown(shared.Id, now.Add(time.Hour))
	resp := e.acquire(&weirv1.AcquireRequest{KeyHash: bobHash, Model: model})
	if l := resp.GetLease(); l != nil {
		t.Fatalf("bob's probe leased %s with only the seat free", l.AccountLabel)
	}
	if b := e.breaker(policy.ModelFamily(model)); b == nil || b.ProbeUntil != nil {
		t.Errorf("the probe was not given back: %v", b)
	}
}

// TestTeamSeat: a team's seat serves every key of the team under
// owners_only, and no key outside it.
func TestTeamSeat(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := t.Context()
	seat := e.createSeat("infra-max", 10, 4)
	e.createSeat("shared-pro", 0, 4)
	if _, err := e.admin.keys.CreateTeam(ctx, connect.NewRequest(&weirv1.CreateTeamRequest{Name: "infra"})); err != nil {
		t.Fatal(err)
	}
	var members []string
	for _, name := range []string{"ann", "ben"} {
		_, hash := e.createLimitedKey(&weirv1.CreateKeyRequest{Name: name, Team: "infra"})
		members = append(members, hash)
	}
	_, outsider := e.createKey("cy")
	e.mustSetOwner(seat.Id, weirv1.OwnerKind_OWNER_KIND_TEAM, "infra")
	e.setOwned(weirv1.OwnedAccounts_OWNED_ACCOUNTS_OWNERS_ONLY)
	for _, hash := range members {
		if l := e.mustLease(&weirv1.AcquireRequest{KeyHash: hash, Model: "claude-opus-4-1"}); l.AccountLabel != "infra-max" {
			t.Errorf("a member of the team leased %s, want the team's seat", l.AccountLabel)
		}
	}
	for range 3 {
		if l := e.mustLease(&weirv1.AcquireRequest{KeyHash: outsider, Model: "claude-opus-4-1"}); l.AccountLabel != "shared-pro" {
			t.Errorf("a key outside the team leased %s", l.AccountLabel)
		}
	}
}

// TestSharedSeatOwnerFirst: under shared (the default) the owner's
// request takes its own seat first, over a shared account ranked higher
// by priority; another key's request takes the seat only when the shared
// accounts are busy; and a session stays on the account it is bound to,
// even when its owner's seat is free.
func TestSharedSeatOwnerFirst(t *testing.T) {
	t.Parallel()
	e := setup(t)
	seat := e.createSeat("alice-max", 0, 1)
	e.createSeat("shared-pro", 5, 1)
	_, aliceHash := e.createKey("alice")
	_, bobHash := e.createKey("bob")
	e.mustSetOwner(seat.Id, weirv1.OwnerKind_OWNER_KIND_KEY, "alice")
	if st := e.getSettings(); st.OwnedAccounts != weirv1.OwnedAccounts_OWNED_ACCOUNTS_SHARED {
		t.Fatalf("the default owned_accounts is %v, want shared", st.OwnedAccounts)
	}
	lease := func(hash, session, want string) *weirv1.Lease {
		t.Helper()
		l := e.mustLease(&weirv1.AcquireRequest{KeyHash: hash, Model: "claude-sonnet-4-5", SessionKey: session})
		if l.AccountLabel != want {
			t.Fatalf("leased %s, want %s", l.AccountLabel, want)
		}
		return l
	}
	done := func(ls ...*weirv1.Lease) {
		t.Helper()
		for _, l := range ls {
			e.release(l.Id, &weirv1.Outcome{Class: weirv1.OutcomeClass_OUTCOME_CLASS_SUCCESS})
		}
	}
	// Another key: the shared account first, the seat when it is busy.
	b1 := lease(bobHash, "", "shared-pro")
	b2 := lease(bobHash, "", "alice-max")
	done(b1, b2)
	// The owner: its seat first, then the shared account.
	a1 := lease(aliceHash, "", "alice-max")
	a2 := lease(aliceHash, "s-1", "shared-pro")
	done(a1, a2)
	// The session bound to the shared account stays there; a new one
	// goes to the seat.
	a3 := lease(aliceHash, "s-1", "shared-pro")
	a4 := lease(aliceHash, "s-2", "alice-max")
	done(a3, a4)
}

// TestOwnedAccountsSettingRefusals: the setting takes shared or
// owners_only, and refuses anything else naming the field.
func TestOwnedAccountsSettingRefusals(t *testing.T) {
	t.Parallel()
	e := setup(t)
	for _, v := range []weirv1.OwnedAccounts{weirv1.OwnedAccounts_OWNED_ACCOUNTS_UNSPECIFIED, weirv1.OwnedAccounts(7)} {
		_, err := e.updateSettings(&weirv1.Settings{OwnedAccounts: v}, "owned_accounts")
		var ce *connect.Error
		if !errors.As(err, &ce) || ce.Code() != connect.CodeInvalidArgument || !strings.Contains(ce.Message(), "settings.owned_accounts") ||
			!strings.Contains(ce.Message(), "shared or owners_only") {
			t.Errorf("owned_accounts %v: %v", v, err)
		}
	}
	e.setOwned(weirv1.OwnedAccounts_OWNED_ACCOUNTS_OWNERS_ONLY)
	if st := e.getSettings(); st.OwnedAccounts != weirv1.OwnedAccounts_OWNED_ACCOUNTS_OWNERS_ONLY {
		t.Errorf("owned_accounts %v after set", st.OwnedAccounts)
	}
}

// TestDashboardShowsOwner: the accounts page shows whose seat an account
// is, and nothing for an account without an owner.
func TestDashboardShowsOwner(t *testing.T) {
	t.Parallel()
	e := setup(t)
	seat := e.createSeat("alice-max", 0, 2)
	e.createSeat("shared-pro", 0, 2)
	e.createKey("alice")
	e.mustSetOwner(seat.Id, weirv1.OwnerKind_OWNER_KIND_KEY, "alice")
	b := e.browser()
	b.login(e.cfg.AdminToken)
	p := b.get("/dashboard/")
	wantStatus(t, "accounts page", p, 200)
	if !strings.Contains(p.body, `seat of <strong>key alice</strong>`) {
		t.Errorf("the accounts page does not show alice-max's owner:\n%s", p.body)
	}
	if n := strings.Count(p.body, "seat of"); n != 1 {
		t.Errorf("%d owners on the page, want 1", n)
	}
}
