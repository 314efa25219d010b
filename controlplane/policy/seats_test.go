package policy

import (
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	weirv1 "github.com/weirhq/weir/gen/weir/v1"
)

// TestRouteSeats: where seats rank for their owners and for other keys,
// and what owners_only answers a key left with other owners' seats only.
func TestRouteSeats(t *testing.T) {
	t.Parallel()
	alice, bob, infra := uuid.New(), uuid.New(), uuid.New()
	ownedBy := func(key, team uuid.UUID) func(*Candidate) {
		return func(x *Candidate) {
			x.Account.AuthKind = weirv1.AuthKind_AUTH_KIND_OAUTH
			x.Account.OwnerKey, x.Account.OwnerTeam = key, team
		}
	}
	pool := func(extra ...Candidate) []Candidate {
		return append([]Candidate{
			c("shared", prio(9)),
			c("alice-seat", ownedBy(alice, uuid.Nil)),
			c("infra-seat", prio(5), ownedBy(uuid.Nil, infra)),
		}, extra...)
	}
	shared, ownersOnly := weirv1.OwnedAccounts_OWNED_ACCOUNTS_SHARED, weirv1.OwnedAccounts_OWNED_ACCOUNTS_OWNERS_ONLY
	for _, tc := range []struct {
		name      string
		cands     []Candidate
		key, team uuid.UUID
		mode      weirv1.OwnedAccounts
		session   string
		prefer    string
		want      string
	}{
		{"the owner: its seat, its team's, then the rest, whatever the priority", pool(), alice, infra, shared, "", "", "alice-seat,infra-seat,shared"},
		{"the same under owners_only", pool(), alice, infra, ownersOnly, "", "", "alice-seat,infra-seat,shared"},
		{"another key under shared: seats last", pool(), bob, uuid.Nil, shared, "", "", "shared,infra-seat,alice-seat"},
		{"unspecified is shared", pool(), bob, uuid.Nil, weirv1.OwnedAccounts_OWNED_ACCOUNTS_UNSPECIFIED, "", "", "shared,infra-seat,alice-seat"},
		{"another key under owners_only: no seat", pool(), bob, uuid.Nil, ownersOnly, "", "", "shared"},
		{"a team member under owners_only", pool(), bob, infra, ownersOnly, "", "", "infra-seat,shared"},
		{"the session stays on another's seat under shared", pool(), bob, uuid.Nil, shared, "alice-seat", "", "alice-seat,shared,infra-seat"},
		{"the session on another's seat is not followed under owners_only", pool(), bob, uuid.Nil, ownersOnly, "alice-seat", "", "shared"},
		{"the owner's session on a shared account stays", pool(), alice, uuid.Nil, ownersOnly, "shared", "", "shared,alice-seat"},
		{"a preferred account first", pool(), alice, uuid.Nil, shared, "", "shared", "shared,alice-seat,infra-seat"},
		{"an own seat that just answered overloaded after those that answer",
			[]Candidate{c("shared"), c("alice-seat", ownedBy(alice, uuid.Nil), overloadedAgo(time.Second))}, alice, uuid.Nil, ownersOnly, "", "", "shared,alice-seat"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rr := RouteRequest{Model: "claude-sonnet-4-5", Key: tc.key, Team: tc.team, Owned: tc.mode}
			if tc.session != "" {
				rr.SessionAccount = c(tc.session).Account.ID
			}
			if tc.prefer != "" {
				rr.PreferAccount = c(tc.prefer).Account.ID
			}
			order, none := Route(tc.cands, rr, epoch)
			if none != nil {
				t.Fatalf("no account: %v", none)
			}
			if got := labelsOf(order); got != tc.want {
				t.Errorf("order %s, want %s", got, tc.want)
			}
		})
	}

	// Nothing but other owners' seats: a permanent "none configured" that
	// names the setting, and no quota block from seats out of quota.
	seats := []Candidate{c("alice-seat", ownedBy(alice, uuid.Nil), cooling(time.Hour, true)), c("infra-seat", ownedBy(uuid.Nil, infra))}
	rr := RouteRequest{Model: "claude-sonnet-4-5", Key: bob, Owned: ownersOnly}
	_, none := Route(seats, rr, epoch)
	if none == nil || none.Reason != weirv1.NoAccountReason_NO_ACCOUNT_REASON_NONE_CONFIGURED || !none.Permanent ||
		none.RetryAt != nil || !strings.Contains(none.Message, "2 are seats kept for their owners ("+OwnersOnly+")") {
		t.Errorf("only others' seats: %v", none)
	}
	if w := WaitingFor([]Candidate{c("alice-seat", ownedBy(alice, uuid.Nil), live(4))}, rr, epoch); len(w) != 0 {
		t.Errorf("a held request waits for another's full seat: %v", w)
	}
	// A metered account is served where a seat is kept away, and is then
	// no spill: the key has no subscription it may use.
	pool2 := []Candidate{c("alice-seat", ownedBy(alice, uuid.Nil)), c("api")}
	order, _ := Route(pool2, rr, epoch)
	if labelsOf(order) != "api" || SpillFrom(pool2, order, rr) != len(order) {
		t.Errorf("order %s, spill from %d", labelsOf(order), SpillFrom(pool2, order, rr))
	}
}
